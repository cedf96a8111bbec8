"""Kill a pool during load and measure what the clients saw: the failover experiment.

Load runs through a tap (``monitor.app.Monitor``) while one pool (the *victim*) is killed,
left dead for a while and started again. The outcome counts the requests that failed and
times the two transitions of the victim's health (``exporters.health``): from the kill to
the tap marking it down (time to failover), and from the restarted engine answering its
health endpoint to the tap sending it traffic again (time back).

Used by ``tests/reliability/test_failover.py`` (the simulator, SIGKILLed as a subprocess),
``tests/vllm/test_real_failover.py`` (a real vLLM engine) and ``bench/bench_failover.py``
(the figures in docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from specguard.lab import loadgen


class Victim(Protocol):
    """The engine behind one pool, which the experiment kills and starts again."""

    pool: str

    async def kill(self) -> None: ...

    async def restart(self) -> None:
        """Start it again; return once it answers its health endpoint."""


@dataclass(frozen=True)
class Outcome:
    """What one kill did to the clients, and how fast the tap routed around it and back."""

    requests: int
    failed: int
    """Requests that did not end in a whole 2xx answer (status, error or broken stream)."""
    failed_after_failover: int
    """Of those, the ones sent after the victim was marked down (0: only requests in flight died)."""
    time_to_failover_s: float | None
    """From the kill to the victim marked down (None: never marked)."""
    time_back_s: float | None
    """From the restarted victim answering /health to it marked up again (None: never)."""
    failover_requests: int
    """Requests planned for the victim that another pool served."""
    served_by: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "failed": self.failed,
            "failed_after_failover": self.failed_after_failover,
            "time_to_failover_s": self.time_to_failover_s,
            "time_back_s": self.time_back_s,
            "failover_requests": self.failover_requests,
            "served_by": self.served_by,
            "errors": self.errors[:10],
        }


async def kill_during_load(
    monitor: Any,
    url: str,
    victim: Victim,
    mix: Sequence[loadgen.RequestClass],
    *,
    concurrency: int = 8,
    before_s: float = 3.0,
    down_s: float = 3.0,
    after_s: float = 3.0,
    stream: bool = True,
    seed: int = 0,
    back_timeout_s: float = 60.0,
    load_during_restart: bool = True,
    max_down_s: float | None = None,
) -> Outcome:
    """Run ``mix`` through the tap at ``url``; kill ``victim`` after ``before_s``, restart it after
    ``down_s`` more, and keep the load on for ``after_s`` once the tap uses it again.

    With ``max_down_s`` the victim stays dead past ``down_s`` (up to ``max_down_s``) until the tap
    has marked it down and served a request planned for it elsewhere, and the load stays on past
    ``after_s`` (up to ``back_timeout_s``) until the victim has served a request sent after it
    came back: on a slow engine under a loaded machine a fixed window may see no such request.

    ``load_during_restart=False`` pauses the load (requests in flight finish) while the victim
    starts: a real engine pinned to a core that a busy engine spins on may otherwise take many
    minutes to start on a 2-core machine, which tests nothing about the tap.
    """
    changes: list[tuple[bool, float]] = []

    def seen(pool: str, healthy: bool) -> None:
        if pool == victim.pool:
            changes.append((healthy, monitor.health.state(pool).since or time.time()))

    monitor.health.listeners.append(seen)
    failovers_before = sum(n for (pool, _), n in monitor.health.failovers.items() if pool == victim.pool)
    records_before = len(monitor.stats.records())
    results: list[loadgen.LoadResult] = []
    stop = asyncio.Event()

    def start_load(round_seed: int) -> asyncio.Task:
        stop.clear()
        return asyncio.create_task(
            loadgen.run_load(
                url, mix, concurrency, duration_s=3600, stream=stream, seed=round_seed, stop=stop
            )
        )

    async def finish(task: asyncio.Task) -> None:
        stop.set()
        results.extend(await task)

    def failed_over() -> bool:
        return (
            sum(n for (pool, _), n in monitor.health.failovers.items() if pool == victim.pool)
            > failovers_before
        )

    def served_since(at: float) -> bool:
        return any(
            r.pool == victim.pool and r.started_at > at for r in monitor.stats.records()[records_before:]
        )

    load: asyncio.Task | None = start_load(seed)
    try:
        await asyncio.sleep(before_s)
        killed_at = time.time()
        await victim.kill()
        await asyncio.sleep(down_s)
        if max_down_s is not None:
            await _until(
                lambda: not monitor.health.healthy(victim.pool) and failed_over(), max_down_s - down_s
            )
        if not load_during_restart:
            await finish(load)
            load = None
        await victim.restart()
        ready_at = time.time()
        if load is None:
            load = start_load(seed + 1)
        deadline = time.monotonic() + back_timeout_s
        await _until(lambda: monitor.health.healthy(victim.pool), back_timeout_s)
        back_at = time.time()
        await asyncio.sleep(after_s)
        if max_down_s is not None:
            await _until(lambda: served_since(back_at), deadline - time.monotonic())
    finally:
        if load is not None:  # None only when the restart failed with the load paused
            await finish(load)
        monitor.health.listeners.remove(seen)
    down_at = next((t for healthy, t in changes if not healthy and t >= killed_at), None)
    up_at = next((t for healthy, t in changes if healthy and down_at is not None and t >= down_at), None)
    failed = [r for r in results if not _whole(r)]
    served = Counter(r.pool for r in monitor.stats.records()[records_before:])
    failovers = sum(n for (pool, _), n in monitor.health.failovers.items() if pool == victim.pool)
    return Outcome(
        requests=len(results),
        failed=len(failed),
        failed_after_failover=sum(1 for r in failed if down_at is not None and r.started_at > down_at),
        time_to_failover_s=None if down_at is None else round(down_at - killed_at, 3),
        time_back_s=None if up_at is None else round(max(0.0, up_at - ready_at), 3),
        failover_requests=failovers - failovers_before,
        served_by=dict(sorted(served.items())),
        errors=[f"#{r.index} {r.task_type}: {r.status} {r.error or ''}".rstrip() for r in failed],
    )


async def _until(done: Callable[[], bool], timeout_s: float) -> None:
    """Poll ``done()`` until it is true or ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def _whole(result: loadgen.LoadResult) -> bool:
    return result.ok and (not result.stream or result.finish_reason is not None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url``/health until it answers 200; RuntimeError after ``timeout_s`` or if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{url}: the engine exited with code {proc.returncode}")
            try:
                async with session.get(url + "/health") as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url}: no healthy answer within {timeout_s:g} s")


class SimVictim:
    """One simulated pool in its own process (``specguard simulate``), killed with SIGKILL."""

    def __init__(self, pool: str, *, time_scale: float = 0.05, seed: int = 0, port: int | None = None):
        self.pool = pool
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._argv = [
            sys.executable,
            "-m",
            "specguard",
            "simulate",
            "--pools",
            pool,
            "--port-base",
            str(self.port),
            "--time-scale",
            str(time_scale),
            "--seed",
            str(seed),
        ]
        self.proc: subprocess.Popen | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            self._argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        await wait_healthy(self.url, 30.0, self.proc)

    async def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            await asyncio.to_thread(self.proc.wait, 10)

    async def restart(self) -> None:
        await self.start()

    async def stop(self) -> None:
        await self.kill()
