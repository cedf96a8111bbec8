"""The engine core in virtual time: no HTTP, no sleeping, fully deterministic for a seed.

``VirtualCluster`` runs several pools on one event clock (model seconds). Submit requests to a
pool (now or at a later time), advance with ``run_until`` / ``run_until_idle``; every finished
request comes back as a ``RequestResult`` (and through ``on_finish``, where a closed-loop client
may submit its next request). ``simulate`` (open loop, scripted arrivals) and ``simulate_closed``
(fixed concurrency) are one-call wrappers. Step semantics are exactly the HTTP runtime's: a step's
batch is fixed when it starts, arrivals during a step join the next one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specguard.exporters.records import SpecStats
from specguard.sim.config import SimConfig
from specguard.sim.engine import EngineCore, SimRequest, StepOutcome
from specguard.sim.truth import TruthRecorder, model_table


@dataclass(frozen=True)
class RequestResult:
    request_id: str
    pool: str
    task_type: str
    temperature: float
    num_speculative_tokens: int
    arrival: float  # model seconds
    scheduled: float
    first_token: float
    finished: float
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    rounds: int
    draft_tokens: int
    accepted_tokens: int
    histogram: tuple[int, ...]
    spec: SpecStats | None = None  # what vLLM's per-request summary reports (engine.SimRequest)

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finished - self.arrival

    @property
    def decode_seconds(self) -> float:
        return self.finished - self.first_token

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (None for a single-token request)."""
        return self.decode_seconds / (self.output_tokens - 1) if self.output_tokens > 1 else None

    @property
    def full_rollback_rounds(self) -> int:
        return self.histogram[0] if self.histogram else 0

    def spec_stats(self) -> SpecStats | None:
        """The normalised per-request spec numbers (None on a K = 0 pool), as the tap builds them."""
        return self.spec


@dataclass(frozen=True)
class StepLog:
    pool: str
    index: int
    start: float
    duration: float
    decode_requests: int
    prefill_requests: int
    verify_tokens: int
    padded_tokens: int
    generated_tokens: int
    waiting: int

    @property
    def batch_size(self) -> int:
        return self.decode_requests + self.prefill_requests


@dataclass(frozen=True)
class WorkItem:
    """One scripted request: when it arrives, its class, and optional lengths."""

    arrival: float
    task_type: str
    temperature: float
    max_tokens: int | None = None
    prompt_tokens: int | None = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class VirtualRun:
    results: list[RequestResult]
    steps: list[StepLog]
    truth: dict[str, Any]
    end: float  # model seconds when the run stopped


class VirtualCluster:
    def __init__(
        self,
        config: SimConfig,
        *,
        pools: Sequence[str] | None = None,
        seed: int | None = None,
        keep_steps: bool = True,
        on_finish: Callable[[RequestResult], None] | None = None,
    ):
        self.config = config
        names = list(pools) if pools else [p.name for p in config.pools]
        self.engines = {name: EngineCore(config, config.pool(name), seed=seed) for name in names}
        self.truths = {name: TruthRecorder(config, name) for name in names}
        self.now = 0.0
        self.steps: list[StepLog] = []
        self.keep_steps = keep_steps
        self.on_finish = on_finish
        self._events: list[tuple[float, int, str, Any]] = []  # (time, seq, kind, payload)
        self._seq = 0
        self._stepping: dict[str, tuple[float, float, StepOutcome] | None] = dict.fromkeys(names)
        self._submitted = 0

    # ---- submitting -------------------------------------------------------------------------------
    def submit(
        self,
        pool: str,
        task_type: str | None,
        temperature: float,
        *,
        at: float | None = None,
        max_tokens: int | None = None,
        prompt_tokens: int | None = None,
        ignore_eos: bool = False,
        key: str | None = None,
    ) -> str:
        """Queue a request on ``pool`` arriving at ``at`` (default: now); returns its id."""
        if pool not in self.engines:
            raise KeyError(f"no pool named {pool!r} (pools: {', '.join(self.engines)})")
        self._submitted += 1
        request = self.engines[pool].new_request(
            task=task_type,
            temperature=temperature,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            key=key if key is not None else f"v{self._submitted}",
            request_id=f"{pool}-{self._submitted}",
            ignore_eos=ignore_eos,
        )
        when = self.now if at is None else max(at, self.now)
        self._push(when, "arrival", (pool, request))
        return request.request_id

    def _push(self, when: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, payload))

    # ---- running ----------------------------------------------------------------------------------
    def run_until(self, t: float) -> list[RequestResult]:
        """Process every event up to model time ``t``; returns the requests that finished."""
        finished: list[RequestResult] = []
        while self._events and self._events[0][0] <= t:
            when, _, kind, payload = heapq.heappop(self._events)
            self.now = when
            if kind == "arrival":
                pool, request = payload
                request.times["arrival"] = when
                self.engines[pool].add(request)
                if self._stepping[pool] is None:
                    self._start_step(pool)
            else:
                finished.extend(self._end_step(payload))
        self.now = max(self.now, t)
        return finished

    def run_until_idle(self, limit: float = float("inf")) -> list[RequestResult]:
        """Run until no work is left (or model time ``limit``)."""
        finished: list[RequestResult] = []
        while self._events and self._events[0][0] <= limit:
            finished.extend(self.run_until(self._events[0][0]))
        return finished

    def _start_step(self, pool: str) -> None:
        outcome = self.engines[pool].step()
        if outcome is None:
            self._stepping[pool] = None
            return
        start = self.now
        for e in outcome.emissions:
            if e.prefill:
                e.request.times["scheduled"] = start
        self._stepping[pool] = (start, start + outcome.duration, outcome)
        self._push(start + outcome.duration, "step_end", pool)

    def _end_step(self, pool: str) -> list[RequestResult]:
        state = self._stepping[pool]
        assert state is not None
        start, end, outcome = state
        self.truths[pool].observe_step(outcome)
        if self.keep_steps:
            self.steps.append(
                StepLog(
                    pool,
                    outcome.index,
                    start,
                    outcome.duration,
                    outcome.decode_requests,
                    outcome.prefill_requests,
                    outcome.verify_tokens,
                    outcome.padded_tokens,
                    outcome.generated_tokens,
                    outcome.waiting,
                )
            )
        done: list[RequestResult] = []
        for e in outcome.emissions:
            times = e.request.times
            if e.prefill:
                times["first_token"] = end
            times["last_token"] = end
            if e.finished:
                times["finished"] = end
                self.truths[pool].observe_finished(e.request)
                if e.request.k:
                    self.truths[pool].observe_reported()
                done.append(_result(pool, e.request))
        self._stepping[pool] = None
        self._start_step(pool)
        if self.on_finish:
            for result in done:
                self.on_finish(result)
        return done

    def truth(self) -> dict[str, Any]:
        """The same JSON as the HTTP cluster's /sim/truth (wall times absent)."""
        return {
            "seed": self.config.seed,
            "dialect": "virtual",
            "time_scale": None,
            "model_name": self.config.model_name,
            "pools": {name: t.to_json() for name, t in self.truths.items()},
            "model": model_table(self.config),
        }


def _result(pool: str, request: SimRequest) -> RequestResult:
    t = request.times
    return RequestResult(
        request_id=request.request_id,
        pool=pool,
        task_type=request.task,
        temperature=request.temperature,
        num_speculative_tokens=request.k,
        arrival=t["arrival"],
        scheduled=t["scheduled"],
        first_token=t["first_token"],
        finished=t["finished"],
        prompt_tokens=request.prompt_tokens,
        output_tokens=request.generated,
        finish_reason=request.finish_reason or "stop",
        rounds=request.rounds,
        draft_tokens=request.draft_tokens,
        accepted_tokens=request.accepted_tokens,
        histogram=tuple(request.histogram),
        spec=request.spec_stats(),
    )


def simulate(
    config: SimConfig, pool: str, workload: Iterable[WorkItem], *, seed: int | None = None
) -> VirtualRun:
    """Run scripted arrivals through one pool until every request finished."""
    cluster = VirtualCluster(config, pools=[pool], seed=seed)
    for item in sorted(workload, key=lambda w: w.arrival):
        cluster.submit(
            pool,
            item.task_type,
            item.temperature,
            at=item.arrival,
            max_tokens=item.max_tokens,
            prompt_tokens=item.prompt_tokens,
            ignore_eos=item.ignore_eos,
        )
    results = cluster.run_until_idle()
    return VirtualRun(results, cluster.steps, cluster.truth(), cluster.now)


def simulate_closed(
    config: SimConfig,
    pool: str,
    classes: Sequence[tuple[str, float, float]],
    concurrency: int,
    requests: int,
    *,
    seed: int | None = None,
    max_tokens: int | None = None,
    ignore_eos: bool = False,
    prompt_tokens: int | None = None,
) -> VirtualRun:
    """``concurrency`` closed-loop clients send ``requests`` in total; classes are
    (task_type, temperature, weight), cycled deterministically in proportion to their weights.
    ``max_tokens`` / ``prompt_tokens`` fix the workload geometry (None: each task's own lengths)."""
    import random

    rng = random.Random(f"closed/{config.seed if seed is None else seed}/{pool}")
    weights = [w for _, _, w in classes]
    sent = 0

    def send() -> None:
        nonlocal sent
        if sent >= requests:
            return
        sent += 1
        task, temperature, _ = rng.choices(list(classes), weights)[0]
        cluster.submit(
            pool,
            task,
            temperature,
            max_tokens=max_tokens,
            prompt_tokens=prompt_tokens,
            ignore_eos=ignore_eos,
        )

    cluster = VirtualCluster(config, pools=[pool], seed=seed, on_finish=lambda _r: send())
    for _ in range(min(concurrency, requests)):
        send()
    results = cluster.run_until_idle()
    return VirtualRun(results, cluster.steps, cluster.truth(), cluster.now)
