"""The best in-engine K schedule in hindsight: what a team with one pool would tune instead of routing.

One pool of all the engines runs vLLM's ``num_speculative_tokens_per_batch_size`` (``specguard.
schedules``): one K per batch-size range, the same for every class. The best one for a run is
found on the true model (``lab.fluid``): each phase puts its clients on the pool's engines (the
shape's engines for one pool: all of them fixed or fluid, the HPA's count autoscaled), so each
phase runs at a batch size; every K from 0 to the largest the pools use is modelled at each, the
schedule gives every batch size seen the K that serves its phases best (weighted by their
durations), with boundaries half-way between neighbouring batch sizes. The best candidates are
replayed through the engine core and the best replay kept: what it knows that specguard does not
is the whole run's traffic and the simulator's true acceptance and step costs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from specguard import schedules
from specguard.lab import fluid, hindsight, replay
from specguard.sim.config import SimConfig

SCHEDULE_POOL = "k-schedule"  # the pool name a scheduled engine is replayed under
CLOSE = 0.02  # a candidate modelled within 2% of the best is replayed too


@dataclass(frozen=True)
class Point:
    """One phase as the scheduled pool sees it."""

    batch: int  # requests in flight per engine
    duration: float
    traffic: tuple[fluid.ClassTraffic, ...]
    engines: int


def reference_pool(case: hindsight.Case) -> str:
    """The pool whose engine configuration (drafter, capacity) the scheduled pool runs: the largest K."""
    ks = {p.name: p.num_speculative_tokens for p in case.sim.pools if p.name in case.pools}
    return max(ks, key=lambda p: (ks[p], p == case.default_pool))


def world(case: hindsight.Case, schedule: schedules.Schedule) -> SimConfig:
    """The case's world with one more pool: the reference engine running ``schedule``."""
    base = case.sim.pool(reference_pool(case))
    pool = replace(base, name=SCHEDULE_POOL, num_speculative_tokens=schedule.max_k, k_schedule=schedule)
    return replace(case.sim, pools=(*(p for p in case.sim.pools if p.name != SCHEDULE_POOL), pool))


def points(case: hindsight.Case) -> list[Point]:
    """Every phase with traffic: its batch size per engine on one pool of all the engines."""
    shape = case.fleet_shape.single(SCHEDULE_POOL)
    model = fluid.Model(case.sim, shape.size, shape)
    out = []
    for phase in case.scenario.phases:
        ts = tuple(hindsight.traffic(phase, case.buckets))
        clients = sum(t.clients for t in ts)
        if clients <= 0:
            continue
        engines = max(1, model.replicas_for({SCHEDULE_POOL: clients}).get(SCHEDULE_POOL, 1))
        out.append(Point(max(1, round(clients / engines)), phase.duration_s, ts, engines))
    return out


def candidates(case: hindsight.Case, limit: int = 3) -> list[tuple[float, schedules.Schedule]]:
    """Schedules by modelled output tokens (best first), at most ``limit``."""
    pts = points(case)
    if not pts:
        return []
    model = case.model()
    top_k = max(case.sim.pool(reference_pool(case)).num_speculative_tokens, 1)
    cap = case.sim.pool(reference_pool(case)).max_num_seqs
    value = {
        (i, k): p.duration * model.evaluate_k(p.traffic, k, p.engines)
        for i, p in enumerate(pts)
        for k in range(top_k + 1)
    }
    batches = sorted({p.batch for p in pts})
    per_batch = {
        b: sorted(
            range(top_k + 1),
            key=lambda k, b=b: -sum(value[(i, k)] for i, p in enumerate(pts) if p.batch == b),
        )
        for b in batches
    }
    choices = [{b: per_batch[b][0] for b in batches}]
    for b in batches:  # runner-up K at one batch size, where the model can hardly tell them apart
        best, second = per_batch[b][0], per_batch[b][1]
        at = [i for i, p in enumerate(pts) if p.batch == b]
        lead = sum(value[(i, best)] for i in at) - sum(value[(i, second)] for i in at)
        if lead <= CLOSE * sum(value[(i, best)] for i in at):
            choices.append({**choices[0], b: second})
    out = []
    for choice in choices:
        runs = _runs(choice, cap)
        schedule = schedules.from_runs(schedules.VLLM, runs, cap) or schedules.vllm([[1, cap, 0]], top_k)
        schedule = replace(schedule, max_k=top_k)
        modelled = sum(value[(i, schedule.k_at(p.batch))] for i, p in enumerate(pts))
        out.append((modelled, schedule))
    unique = {s.entries: (v, s) for v, s in out}
    return sorted(unique.values(), key=lambda vs: -vs[0])[:limit]


def _runs(choice: dict[int, int], cap: int) -> list[tuple[int, int, int]]:
    """Ranges 1..``cap`` giving each chosen batch size its K, boundaries half-way between them."""
    batches = sorted(choice)
    runs: list[tuple[int, int, int]] = []
    start = 1
    for j, b in enumerate(batches):
        end = cap if j == len(batches) - 1 else max(start, math.floor((b + batches[j + 1]) / 2))
        end = min(end, cap)
        if runs and runs[-1][2] == choice[b]:
            runs[-1] = (runs[-1][0], end, choice[b])
        elif start <= end:
            runs.append((start, end, choice[b]))
        start = end + 1
    return runs


def replay_schedule(case: hindsight.Case, schedule: schedules.Schedule, **kwargs) -> replay.ReplayResult:
    """Every class on one pool of all the case's engines, each engine running ``schedule``."""
    return hindsight.single(case, SCHEDULE_POOL, sim=world(case, schedule), **kwargs)


def best(
    case: hindsight.Case, tried: Sequence[schedules.Schedule] = ()
) -> tuple[schedules.Schedule, replay.ReplayResult] | None:
    """The best replayed schedule among the modelled candidates and ``tried``."""
    found = None
    for schedule in [s for _, s in candidates(case)] + list(tried):
        result = replay_schedule(case, schedule)
        tokens = sum(result.tokens.values())
        if found is None or tokens > found[0]:
            found = (tokens, schedule, result)
    return None if found is None else (found[1], found[2])
