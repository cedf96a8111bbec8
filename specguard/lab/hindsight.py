"""Hindsight plans and their replays: the pieces the comparison's rows (``lab.rows``) are made of.

Every row is a replay of the same scenario and seed on the same engines (a fleet shape,
``lab.shapes``), through the simulator's engine core (``sim.engine``): the same engine model that
serves the requests, co-location and prefill included. Plans are searched on the true model
(``lab.fluid``), which knows the shape's engines per pool, and only proposed there: every figure a
row reports comes from a replay.

- ``per_class_static``: the best fixed pool per class over the whole run (greedy on the model);
- ``oracle_slices``: per time slice (no longer than the guard's evaluation interval) the model's
  best plan for every class for that slice's traffic (co-location, prefill and the engines each
  pool has included); on fixed or autoscaled pools a class may be spread over several pools in
  shares of one engine's worth (``Case.quantum``: their engines cannot move to it); a second plan
  changes only where that gains more than 2% (every change costs); an autoscaled fleet is planned
  twice, the second time with the replicas the first plan's replay actually had in each slice (the
  start delay and stabilisation included);
- ``noise``: a plan replayed with other acceptance draws, the run-to-run noise the bound allows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specguard.lab import fluid, replay, shapes
from specguard.lab import replay_policies as rp
from specguard.lab.scenario import Phase, Scenario
from specguard.sim.config import SimConfig

Slices = list[tuple[float, rp.ClassPlan]]
STICKY = 0.02  # the oracle's second plan keeps the previous phase's plan unless 2% better (modelled)
Progress = Callable[[str], None] | None


@dataclass(frozen=True)
class Case:
    """One comparison: a world, a scenario and seed, and the fleet every row gets."""

    sim: SimConfig
    scenario: Scenario
    buckets: replay.Buckets
    pools: tuple[str, ...]
    default_pool: str
    nospec_pool: str
    fleet: int = 3
    seed: int = 0
    interval: float = 10.0  # time slice: the guard's evaluation interval
    shape: shapes.FleetShape | None = None  # None: a fluid fleet of ``fleet`` engines

    @property
    def quantum(self) -> float | None:
        """The share of a class the oracle may move at a time: one engine's worth of the fixed or
        autoscaled fleet (its engines are not moved, so a class may be spread over them); none on a
        fluid fleet (engines follow the traffic there)."""
        shape = self.fleet_shape
        return None if shape.kind == shapes.FLUID else 1.0 / max(1, shape.size)

    @property
    def fleet_shape(self) -> shapes.FleetShape:
        if self.shape is not None:
            return self.shape
        return shapes.FleetShape(shapes.FLUID, dict.fromkeys(self.pools, 1), self.fleet)

    def model(self) -> fluid.Model:
        """The true model of this case's world and engines."""
        return fluid.Model(self.sim, self.fleet_shape.size, self.fleet_shape)


def traffic(phase: Phase, buckets: replay.Buckets) -> list[fluid.ClassTraffic]:
    """A phase's clients per class (a task type's temperature mix split by temperature bucket)."""
    out: dict[tuple[str, str], list] = {}
    for load in phase.loads:
        total = sum(w for _, w in load.temperatures)
        for t, w in load.temperatures:
            key = (load.task_type, buckets.temperature_bucket(t))
            entry = out.setdefault(key, [0.0, []])
            entry[0] += load.clients * w / total
            entry[1].append((t, load.clients * w / total))
    return [fluid.ClassTraffic(k, v[0], tuple(v[1])) for k, v in sorted(out.items()) if v[0] > 0]


def slice_starts(scenario: Scenario, interval: float) -> list[float]:
    """Slice starts: every phase start and every multiple of ``interval`` (the guard's ticks)."""
    starts = {start for start, _, _ in scenario.boundaries()}
    starts.update(k * interval for k in range(math.ceil(scenario.duration_s / interval)))
    return sorted(s for s in starts if s < scenario.duration_s)


def per_phase(case: Case, plans: Sequence[rp.ClassPlan]) -> Slices:
    """One plan per phase, as slices."""
    return [(start, dict(plans[i])) for i, (start, _, _) in enumerate(case.scenario.boundaries())]


def run(case: Case, name: str, slices: Slices, **kwargs) -> replay.ReplayResult:
    """Replay ``slices`` (a plan per slice) on the case's engines and pools."""
    return run_policy(case, rp.SlicedPolicy(name, case.default_pool, slices, case.interval), **kwargs)


def run_choices(case: Case, name: str, choices: rp.Choices, **kwargs) -> replay.ReplayResult:
    """Replay a run's routing request by request (``rp.ReplayedChoices``) on the case's engines."""
    return run_policy(case, rp.ReplayedChoices(name, case.default_pool, choices, case.interval), **kwargs)


def run_policy(case: Case, policy: replay.Policy, **kwargs) -> replay.ReplayResult:
    """Replay any routing ``policy`` on the case's engines and pools."""
    return replay.Replay(
        case.sim,
        case.scenario,
        policy,
        case.buckets,
        seed=case.seed,
        pools=list(case.pools),
        fleet=case.fleet,
        shape=case.shape,
        **kwargs,
    ).run()


def single(case: Case, pool: str, sim: SimConfig | None = None, **kwargs) -> replay.ReplayResult:
    """Every class on ``pool``, one pool of all the case's engines (``sim``: a world with that pool)."""
    policy = rp.StaticPolicy(f"static-{pool}", pool)
    return replay.Replay(
        sim or case.sim,
        case.scenario,
        policy,
        case.buckets,
        seed=case.seed,
        pools=[pool],
        fleet=case.fleet,
        shape=case.fleet_shape.single(pool),
        **kwargs,
    ).run()


def classes(case: Case) -> list[fluid.ClassKey]:
    return sorted({t.key for phase in case.scenario.phases for t in traffic(phase, case.buckets)})


def per_class_static(
    case: Case,
    model: fluid.Model,
    start_pool: str,
    quantum: float | None = None,
    start: rp.ClassPlan | None = None,
) -> rp.ClassPlan:
    """Greedy search for the best fixed pool per class over the whole run (modelled throughput);
    with ``quantum`` the best fixed split per class, from ``start``."""
    phases = [(phase.duration_s, traffic(phase, case.buckets)) for phase in case.scenario.phases]

    def value(plan: rp.ClassPlan) -> float:
        return sum(d * model.evaluate(ts, plan, case.default_pool).throughput for d, ts in phases)

    plan = dict(start) if start else dict.fromkeys(classes(case), start_pool)
    best = value(plan)
    while True:
        moves = [
            (value({**plan, k: target}), k, target)
            for k in sorted(plan)
            for target in fluid.Model.moves(plan[k], case.pools, quantum)
        ]
        top = max(moves, default=None, key=lambda m: m[0])
        if top is None or top[0] <= best * (1 + 1e-6):
            return plan
        best, key, target = top
        plan = {**plan, key: target}


def spread(case: Case) -> rp.ClassPlan:
    """Every class over every pool in proportion to its engines: the shape's engines all used."""
    counts = {p: n for p, n in case.fleet_shape.replicas.items() if p in case.pools and n > 0}
    total = sum(counts.values())
    split = fluid.assignment({p: n / total for p, n in counts.items()})
    return dict.fromkeys(classes(case), split)


def oracle_slices(
    case: Case,
    model: fluid.Model,
    sticky: float = 0.0,
    seeds: Sequence[rp.ClassPlan] = (),
    replicas: Sequence[dict[str, int]] | None = None,
) -> Slices:
    """Per slice, the modelled best plan for that slice's traffic.

    The search starts from every single pool, the previous slice's plan and ``seeds``. With
    ``sticky`` > 0 a new phase keeps the plan nearest the previous one (greedy from it) unless the
    best plan is modelled more than ``sticky`` better: the model has no cost for changing plans,
    and every change drains and reconfigures engines. ``replicas``: each slice's engines per pool
    (default: the shape's steady state for the plan).
    """
    out: Slices = []
    previous: rp.ClassPlan = {}
    cache: dict[tuple, rp.ClassPlan] = {}
    for slot, start in enumerate(slice_starts(case.scenario, case.interval)):
        index = case.scenario.phase_at(start)
        counts = replicas[slot] if replicas is not None else None
        key = (index, tuple(sorted(counts.items())) if counts else None)
        if key not in cache:
            ts = traffic(case.scenario.phases[index], case.buckets)
            starts = ([previous] if previous else []) + list(seeds)
            best, value = model.best_plan(ts, case.pools, case.default_pool, starts, counts, case.quantum)
            if sticky and previous:
                keys = sorted(t.key for t in ts)
                near, near_value = model.climb(
                    ts,
                    {k: previous.get(k, case.default_pool) for k in keys},
                    case.pools,
                    case.default_pool,
                    counts,
                    case.quantum,
                )
                if value <= near_value * (1 + sticky):
                    best = near
            cache[key] = best
        previous = cache[key]
        out.append((start, previous))
    return out


def replicas_per_slice(case: Case, result: replay.ReplayResult) -> list[dict[str, int]]:
    """The serving replicas per pool an autoscaled replay had in each slice (time-weighted, rounded)."""
    timeline = getattr(result.fleet_stats, "timeline", None) or [(0.0, dict(case.fleet_shape.replicas))]
    starts = slice_starts(case.scenario, case.interval)
    ends = [*starts[1:], case.scenario.duration_s]
    out = []
    for start, end in zip(starts, ends, strict=True):
        weights: dict[str, float] = {}
        for i, (at, counts) in enumerate(timeline):
            until = timeline[i + 1][0] if i + 1 < len(timeline) else math.inf
            overlap = min(end, until) - max(start, at)
            if overlap > 0:
                for pool, n in counts.items():
                    weights[pool] = weights.get(pool, 0.0) + n * overlap
        span = max(end - start, 1e-9)
        out.append({p: max(1, round(w / span)) for p, w in weights.items()})
    return out


def plan_json(slices: Slices, scenario: Scenario) -> list[dict]:
    """The plan as it changed: the slices whose plan differs from the previous slice's."""
    out, last = [], None
    for start, plan in slices:
        if plan != last:
            out.append(
                {
                    "from_seconds": start,
                    "phase": scenario.phases[scenario.phase_at(start)].name,
                    "plan": {
                        f"{t}/{b}": pool if isinstance(pool, str) else dict(pool)
                        for (t, b), pool in sorted(plan.items())
                    },
                }
            )
            last = plan
    return out


def canonical(slices: Slices) -> tuple:
    """The plan as a hashable value: slices whose plan repeats the previous one's are dropped."""
    out, last = [], None
    for start, plan in slices:
        items = tuple(sorted(plan.items()))
        if items != last:
            out.append((0.0 if last is None else start, items))
            last = items
    return tuple(out)


def everything(case: Case, pool: str) -> rp.ClassPlan:
    """A plan sending every class of the scenario to ``pool``."""
    return dict.fromkeys(classes(case), pool)


def noise(
    case: Case,
    rerun: Callable[..., replay.ReplayResult],
    reference: float,
    draws: Sequence[int] = (1, 2),
) -> dict:
    """Run-to-run noise: the same plan and traffic, other acceptance draws (``rerun(engine_seed=)``).

    Returns the relative throughput deviations from ``reference`` and their largest magnitude.
    """
    deviations = []
    for draw in draws:
        result = rerun(engine_seed=case.seed + 7919 * draw)
        tput = sum(result.tokens.values()) / case.scenario.duration_s
        deviations.append(tput / reference - 1.0)
    return {
        "method": "the oracle's plan replayed with other acceptance draws (same traffic)",
        "draws": len(deviations),
        "deviations": deviations,
        "max_abs": max((abs(d) for d in deviations), default=0.0),
    }
