"""Drive the simulator's engine core in virtual time at a fixed concurrency and keep RequestRecords.

Closed loop: ``concurrency`` requests are in the engine at all times (a finished request is
replaced by a new one before the next step), so every request runs at the operating point the
simulator's truth table is computed for. No clock, no HTTP: model seconds add up step by step.
"""

from __future__ import annotations

import random

from specguard.exporters.records import RequestRecord
from specguard.sim import config as sim_config
from specguard.sim.engine import EngineCore, SimRequest

TEMPERATURE_BUCKETS = ((0.0, "greedy"), (0.5, "low"), (0.9, "medium"), (float("inf"), "high"))


def temperature_bucket(temperature: float) -> str:
    return next(name for limit, name in TEMPERATURE_BUCKETS if temperature <= limit)


def run_closed_loop(
    config: sim_config.SimConfig,
    pool: str,
    mix: list[tuple[str, float]],
    *,
    concurrency: int,
    requests: int,
    load_bucket: str,
    seed: int = 0,
    route: str = "plan",
) -> list[RequestRecord]:
    """``requests`` finished requests of ``mix`` (drawn uniformly) on ``pool`` at ``concurrency``."""
    core = EngineCore(config, config.pool(pool), seed=seed)
    pick = random.Random(seed)
    now = 0.0
    submitted = 0
    out: list[RequestRecord] = []

    def submit() -> None:
        nonlocal submitted
        task, temperature = mix[pick.randrange(len(mix))]
        request = core.new_request(task=task, temperature=temperature, key=f"{pool}-{submitted}")
        request.times["arrival"] = now
        core.add(request)
        submitted += 1

    for _ in range(concurrency):
        submit()
    while len(out) < requests:
        outcome = core.step()
        assert outcome is not None
        now += outcome.duration
        for emission in outcome.emissions:
            request = emission.request
            if emission.prefill:
                request.times["first_token"] = now
            if emission.finished:
                out.append(_record(request, pool, now, load_bucket, route))
                submit()
    return out


def _record(request: SimRequest, pool: str, now: float, load_bucket: str, route: str) -> RequestRecord:
    spec = request.spec_stats()
    return RequestRecord(
        pool=pool,
        task_type=request.task,
        temperature_bucket=temperature_bucket(request.temperature),
        load_bucket=load_bucket,
        route=route,
        started_at=request.times["arrival"],
        status=200,
        streamed=True,
        temperature=request.temperature,
        output_tokens=request.generated,
        decode_seconds=now - request.times["first_token"],
        spec=spec,
    )
