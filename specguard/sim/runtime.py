"""Real-time pacing of one pool's engine core for the HTTP front ends.

Each step's model duration (times ``time_scale``) is slept against an absolute schedule: step n
ends at ``anchor + sum of durations``, so wake-up jitter does not accumulate into drift. When the
loop falls behind by more than ``max_lag_seconds`` (or the engine was idle) the schedule restarts
at "now", and the time lost is lost: on a busy CPU at a small ``time_scale`` the steps then take
longer than the model says, and every time the simulator serves (TPOT, so RC) is skewed. The
runtime knows: ``schedule()`` is the wall time its recent steps took over the time they should
have taken (``stretch``), ``late`` above ``LATE_STRETCH``. Emissions go to per-request queues after
the step ends; metrics sinks see every step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from specguard.sim.config import PoolConfig, SimConfig
from specguard.sim.engine import Emission, EngineCore, SimRequest, StepOutcome
from specguard.sim.truth import TruthRecorder

log = logging.getLogger("specguard.sim")

SCHEDULE_WINDOW_SECONDS = 10.0
"""The recent wall time ``schedule()`` looks at."""
LATE_STRETCH = 1.25
"""Steps taking more than this times their scaled model time: the times served are skewed."""


class MetricsSink(Protocol):
    def observe_step(
        self, outcome: StepOutcome, end: float, running: int, waiting: int, kv_tokens: int
    ) -> None: ...

    def observe_finished(self, request: SimRequest) -> None: ...


class PoolRuntime:
    """An engine core driven in (scaled) real time on the running asyncio loop."""

    def __init__(
        self,
        config: SimConfig,
        pool: PoolConfig,
        *,
        time_scale: float = 1.0,
        max_lag_seconds: float = 1.0,
        clock: Callable[[], float] | None = None,
    ):
        self.config = config
        self.pool = pool
        self.time_scale = time_scale
        self.max_lag_seconds = max_lag_seconds
        self.engine = EngineCore(config, pool)
        self.truth = TruthRecorder(config, pool.name)
        self.sinks: list[MetricsSink] = []
        self._clock = clock
        self._queues: dict[int, asyncio.Queue[Emission | None]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.step_log: list[dict[str, Any]] = []  # recent steps: model vs realised duration
        self.keep_step_log = 0  # how many recent steps to keep (0 = none)
        self._occurrences: dict[str, int] = {}
        self.error: Exception | None = None  # set when the engine loop died
        self._paced: deque[tuple[float, float, float]] = deque()  # (end, scheduled, realised) per step

    def now(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    def request_key(self, text: str) -> str:
        """A reproducible key for a request: its prompt plus how often that prompt was seen."""
        count = self._occurrences.get(text, 0)
        self._occurrences[text] = count + 1
        return f"{text}\x00{count}"

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"sim-engine-{self.pool.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- requests ------------------------------------------------------------------------------
    def submit(self, request: SimRequest, queue: asyncio.Queue[Emission | None]) -> None:
        """Queue ``request``; its emissions (one per step) are put on ``queue``."""
        if self.error is not None:
            raise RuntimeError(f"pool {self.pool.name}: the simulated engine failed: {self.error}")
        request.times["arrival"] = self.now()
        self._queues[id(request)] = queue
        self.engine.add(request)
        self._wake.set()

    def cancel(self, request: SimRequest) -> None:
        """The client went away: drop the request from the engine and count it as aborted."""
        self._queues.pop(id(request), None)
        if self.engine.abort(request):
            request.times.setdefault("finished", self.now())
            self.truth.observe_finished(request)
            for sink in self.sinks:
                sink.observe_finished(request)

    # ---- the loop ------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a simulator bug: fail the waiting clients instead of hanging them
            log.exception("sim-engine-%s: engine loop failed", self.pool.name)
            self.error = exc
            for queue in self._queues.values():
                queue.put_nowait(None)
            self._queues.clear()

    async def _loop(self) -> None:
        next_start: float | None = None
        last_end: float | None = None
        while True:
            if self.engine.idle:
                self._wake.clear()
                await self._wake.wait()
                next_start = None
                last_end = None
            now = self.now()
            if next_start is None or now - next_start > self.max_lag_seconds:
                next_start = now
            start = next_start
            outcome = self.engine.step()
            if outcome is None:
                continue
            end = start + outcome.duration * self.time_scale
            delay = end - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            actual = self.now()
            realised = actual - last_end if last_end is not None else None
            if realised is not None:
                self._paced.append((actual, outcome.duration * self.time_scale, realised))
            self._deliver(outcome, start, actual, realised, actual - end)
            last_end = actual
            next_start = end

    def schedule(self, window_seconds: float = SCHEDULE_WINDOW_SECONDS) -> dict[str, Any]:
        """How well the last ``window_seconds`` of steps kept their scaled model time.

        ``stretch`` is the wall time they took over the time they should have taken (1.0 on time;
        1.6: every time served is 60% too long, and not by the same share on every pool, so RC
        is skewed too); ``late`` when it is above ``LATE_STRETCH``."""
        now = self.now()
        while self._paced and self._paced[0][0] < now - window_seconds:
            self._paced.popleft()
        scheduled = sum(s for _, s, _ in self._paced)
        realised = sum(r for _, _, r in self._paced)
        stretch = realised / scheduled if scheduled > 0 else 1.0
        return {
            "stretch": round(stretch, 4),
            "late": stretch > LATE_STRETCH,
            "steps": len(self._paced),
            "window_seconds": window_seconds,
            "time_scale": self.time_scale,
        }

    def _deliver(
        self, outcome: StepOutcome, start: float, end: float, realised: float | None, late: float = 0.0
    ) -> None:
        for e in outcome.emissions:
            if e.prefill:
                e.request.times["scheduled"] = start
        running = len(self.engine.running)
        waiting = len(self.engine.waiting)
        kv_tokens = sum(r.prompt_tokens + r.generated for r in self.engine.running)
        for sink in self.sinks:
            sink.observe_step(outcome, end, running, waiting, kv_tokens)
        self.truth.observe_step(outcome, wall_seconds=realised)
        if self.keep_step_log:
            self.step_log.append(
                {
                    "batch": outcome.batch_size,
                    "model": outcome.duration * self.time_scale,
                    "realised": realised,
                    "late": late,
                }
            )
            if len(self.step_log) > self.keep_step_log:
                del self.step_log[: len(self.step_log) - self.keep_step_log]
        for e in outcome.emissions:
            request = e.request
            times = request.times
            if e.prefill:
                times["first_token"] = end
            times["previous_token"] = end
            times["last_token"] = end
            if e.finished:
                times["finished"] = end
                self.truth.observe_finished(request)
                for sink in self.sinks:
                    sink.observe_finished(request)
            queue = self._queues.get(id(request))
            if queue is not None:
                queue.put_nowait(e)
                if e.finished:
                    del self._queues[id(request)]
