"""Helpers for the hostile-input suite: memory peaks measured in this process, the latency of
normal traffic with and without an attack (as a ratio, in one test), and log checks.

Normal traffic goes to an engine that takes ``DELAY`` seconds per answer, so a stalled event
loop (the failure these tests guard against) shows as a multiple of a known latency rather
than as noise on a busy machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from tests.reliability import relkit

DELAY = 0.05  # seconds the normal engine takes per answer
MB = 1 << 20


# ------------------------------------------------------------------ memory
def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


class PeakRSS:
    """The peak resident memory of this process inside a ``with`` block, above where it started.

    Linux resets the high-water mark on ``clear_refs`` 5; where that is refused a thread samples
    the resident size every 2 ms instead.
    """

    def __init__(self) -> None:
        self.start = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def growth(self) -> int:
        return max(0, self.peak - self.start)

    def __enter__(self) -> PeakRSS:
        self.start = _status("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.peak = self.start
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _status("VmRSS"))

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        else:
            self.peak = _status("VmHWM")


# ------------------------------------------------------------------ normal traffic
def chat(stream: bool = False, text: str = "hello") -> dict:
    return {
        "model": "m",
        "max_tokens": 4,
        "temperature": 0,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }


async def probe(url: str, count: int = 12) -> list[float]:
    """Seconds each of ``count`` normal requests took through the tap, one after the other."""
    timings = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for _ in range(count):
            start = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=chat()) as response:
                await response.read()
                assert response.status == 200, response.status
            timings.append(time.perf_counter() - start)
    return timings


@contextlib.asynccontextmanager
async def running(attack: Callable[[], Awaitable[object]]) -> AsyncIterator[asyncio.Task]:
    """Run ``attack`` in the background for the block; cancelled (and awaited) at its end."""
    task = asyncio.create_task(attack())
    await asyncio.sleep(0)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def ratio(loud: list[float], quiet: list[float], q: float = 0.5) -> float:
    """Latency under attack over latency without it, at quantile ``q`` (the median by default)."""
    if q == 0.5:
        return statistics.median(loud) / statistics.median(quiet)
    return (
        statistics.quantiles(loud, n=10)[int(q * 10) - 1] / statistics.quantiles(quiet, n=10)[int(q * 10) - 1]
    )


async def latency_ratio(
    url: str, attack: Callable[[], Awaitable[object]], count: int = 12, q: float = 0.5, rounds: int = 3
) -> float:
    """The same normal traffic without and with ``attack`` running: the ratio at quantile ``q``.

    Measured in alternating rounds (quiet, attack, quiet, ...), so a change in the shared
    machine's load during the test weighs on both sides alike."""
    quiet: list[float] = []
    loud: list[float] = []
    for _ in range(rounds):
        quiet += await probe(url, max(1, count // rounds))
        async with running(attack):
            loud += await probe(url, max(1, count // rounds))
    return ratio(loud, quiet, q)


# ------------------------------------------------------------------ logs
def tracebacks(caplog) -> list[str]:
    """Log records that carry a traceback (a malformed input must never produce one).

    ``aiohttp.server`` is left out: the tap's server logs as ``specguard.http``, so that logger
    only carries the test's own engines (which may see the tap hang up on them, as intended).
    """
    found = []
    for record in caplog.records:
        if record.name == "aiohttp.server":
            continue
        text = record.getMessage()
        if record.exc_info or "Traceback (most recent call last)" in text:
            found.append(f"{record.name}: {text[:200]}")
    return found


# ------------------------------------------------------------------ an engine to attack with
class Engine:
    """An OpenAI-style engine whose answers, /metrics page and response bodies a test sets."""

    def __init__(self) -> None:
        self.page = b"# nothing yet\n"
        self.body: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None
        self.requests = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        await request.read()
        if self.body is not None and request.path == "/v1/completions":
            return await self.body(request)
        await asyncio.sleep(DELAY)
        return web.json_response(relkit.COMPLETION)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        view = memoryview(self.page)
        try:
            for start in range(0, len(view), 256 * 1024):  # no Content-Length: read to the end
                await response.write(view[start : start + 256 * 1024])
            await response.write_eof()
        except ConnectionError:  # the tap refused the page and hung up: expected
            pass
        return response

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * MB)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


def vllm_page(extra: str = "") -> bytes:
    """A small valid vLLM page plus ``extra`` lines."""
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu-ngram-k4.metrics.txt"
    return fixture.read_bytes() + extra.encode()


def sse_event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
