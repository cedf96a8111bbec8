"""The rows specguard is compared with: fixed plans, the plans chosen in hindsight, and the oracle.

Every row is a replay of the same scenario and seed on the same fleet of N engines (``lab.fleet``),
through the simulator's engine core (``sim.engine``): the same engine model that serves the
requests, co-location and prefill included. Each row states what it knows that specguard does not:

- always / never speculate: nothing (one pool for everything, chosen in advance);
- best single pool: which one pool serves the whole run best (every pool replayed, the best kept);
- best per phase: when each phase starts and which single pool serves it best;
- best per-class static plan: the best fixed pool per class over the whole run (a greedy search on
  the true model, ``lab.fluid``, from the best single pool; replayed);
- oracle: the traffic of every time slice in advance and the simulator's true acceptance and step
  costs. Per slice (no longer than the guard's evaluation interval) it plans every class, at every
  load bucket, with the fluid model's best plan for that slice's traffic (co-location, prefill and
  the fleet's packing included); a second plan changes only where that gains more than 2% (every
  change drains engines). Its row is the best of those plans and every other hindsight plan, each
  replayed: so no hindsight row can beat it, by construction; that specguard does not beat it by
  more than the run-to-run noise is checked (``summary.bound``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specguard.lab import fluid, replay, summary
from specguard.lab import replay_policies as rp
from specguard.lab.scenario import Phase, Scenario
from specguard.sim.config import SimConfig

Slices = list[tuple[float, rp.ClassPlan]]
STICKY = 0.02  # the oracle's second plan keeps the previous phase's plan unless 2% better (modelled)
Progress = Callable[[str], None] | None

KNOWS = {
    "always_speculate": "nothing: every class on the default pool",
    "never_speculate": "nothing: every class on the no-spec pool",
    "best_single_pool": "which single pool serves the whole run best (each one replayed)",
    "best_per_phase": "when each phase starts, and which single pool serves it best",
    "best_per_class_static": "every class's traffic over the whole run and its best fixed pool "
    "(greedy search on the true model, replayed)",
    "oracle": "every time slice's traffic in advance and the simulator's true acceptance and step "
    "costs; plans each class per slice; the best of every hindsight plan, replayed",
}


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
    """Replay ``slices`` (a plan per slice) on the case's fleet."""
    policy = rp.SlicedPolicy(name, case.default_pool, slices, case.interval)
    return replay.Replay(
        case.sim, case.scenario, policy, case.buckets, seed=case.seed, fleet=case.fleet, **kwargs
    ).run()


def single(case: Case, pool: str) -> replay.ReplayResult:
    policy = rp.StaticPolicy(f"static-{pool}", pool)
    return replay.Replay(
        case.sim, case.scenario, policy, case.buckets, seed=case.seed, pools=[pool], fleet=case.fleet
    ).run()


def per_class_static(case: Case, model: fluid.Model, start_pool: str) -> rp.ClassPlan:
    """Greedy search for the best fixed pool per class over the whole run (modelled throughput)."""
    phases = [(phase.duration_s, traffic(phase, case.buckets)) for phase in case.scenario.phases]
    keys = sorted({t.key for _, ts in phases for t in ts})

    def value(plan: rp.ClassPlan) -> float:
        return sum(d * model.evaluate(ts, plan, case.default_pool).throughput for d, ts in phases)

    plan = dict.fromkeys(keys, start_pool)
    best = value(plan)
    while True:
        moves = [(value({**plan, k: p}), k, p) for k in keys for p in case.pools if p != plan[k]]
        top = max(moves, default=None)
        if top is None or top[0] <= best * (1 + 1e-6):
            return plan
        best, key, pool = top
        plan = {**plan, key: pool}


def oracle_slices(
    case: Case, model: fluid.Model, sticky: float = 0.0, seeds: Sequence[rp.ClassPlan] = ()
) -> Slices:
    """Per slice, the modelled best plan for that slice's traffic.

    The search starts from every single pool, the previous slice's plan and ``seeds``. With
    ``sticky`` > 0 a new phase keeps the plan nearest the previous one (greedy from it) unless the
    best plan is modelled more than ``sticky`` better: the model has no cost for changing plans,
    and every change drains and reconfigures engines.
    """
    out: Slices = []
    previous: rp.ClassPlan = {}
    cache: dict[int, rp.ClassPlan] = {}
    for start in slice_starts(case.scenario, case.interval):
        index = case.scenario.phase_at(start)
        if index not in cache:
            ts = traffic(case.scenario.phases[index], case.buckets)
            starts = ([previous] if previous else []) + list(seeds)
            best, value = model.best_plan(ts, case.pools, case.default_pool, starts)
            if sticky and previous:
                keys = sorted(t.key for t in ts)
                near, near_value = model.climb(
                    ts, {k: previous.get(k, case.default_pool) for k in keys}, case.pools, case.default_pool
                )
                if value <= near_value * (1 + sticky):
                    best = near
            cache[index] = best
        previous = cache[index]
        out.append((start, previous))
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
                    "plan": {f"{t}/{b}": pool for (t, b), pool in sorted(plan.items())},
                }
            )
            last = plan
    return out


def rows(case: Case, progress: Progress = None) -> tuple[dict[str, dict], Slices]:
    """Every non-specguard row (summaries with ``knows``), the oracle last; and the oracle's plan."""

    def say(text: str) -> None:
        if progress:
            progress(text)

    k = {p.name: p.num_speculative_tokens for p in case.sim.pools}
    seen: dict[tuple, replay.ReplayResult] = {}

    def replayed(name: str, slices: Slices) -> replay.ReplayResult:
        """Each distinct plan is replayed once (rows often find the same plan)."""
        key = _canonical(slices)
        if key not in seen:
            seen[key] = run(case, name, slices)
        return seen[key]

    statics = {}
    for pool in case.pools:
        say(f"replaying every class on {pool} (K={k[pool]})")
        seen[_canonical([(0.0, _everything(case, pool))])] = result = single(case, pool)
        statics[pool] = summary.summarize(result, f"every class on {pool} (K={k[pool]})", config=pool)
    out: dict[str, dict] = {
        "always_speculate": {**statics[case.default_pool], "knows": KNOWS["always_speculate"]},
        "never_speculate": {**statics[case.nospec_pool], "knows": KNOWS["never_speculate"]},
    }
    best_pool = max(case.pools, key=lambda p: statics[p]["throughput_tokens_per_second"])
    out["best_single_pool"] = {
        **statics[best_pool],
        "label": f"best single pool (hindsight): {best_pool}",
        "knows": KNOWS["best_single_pool"],
    }
    candidates: dict[str, tuple[Slices, dict]] = {
        "best_single_pool": ([(0.0, _everything(case, best_pool))], statics[best_pool])
    }

    say("replaying the best single pool per phase (hindsight)")
    phase_pools = [
        max(case.pools, key=lambda p, i=i: statics[p]["phases"][i]["throughput_tokens_per_second"])
        for i in range(len(case.scenario.phases))
    ]
    slices = per_phase(case, [_everything(case, p) for p in phase_pools])
    result = replayed("best-per-phase", slices)
    out["best_per_phase"] = summary.summarize(
        result, "best single pool per phase (hindsight)", knows=KNOWS["best_per_phase"], config=phase_pools
    )
    candidates["best_per_phase"] = (slices, out["best_per_phase"])

    model = fluid.Model(case.sim, case.fleet)
    say("searching the best static plan per class (greedy, true model) and replaying it")
    plan = per_class_static(case, model, best_pool)
    slices = [(0.0, plan)]
    result = replayed("best-per-class", slices)
    out["best_per_class_static"] = summary.summarize(
        result,
        "best static plan per class (hindsight, greedy)",
        knows=KNOWS["best_per_class_static"],
        plan=plan_json(slices, case.scenario),
    )
    candidates["best_per_class_static"] = (slices, out["best_per_class_static"])

    say("planning the oracle per time slice (true model) and replaying it")
    for name, sticky in (("oracle", 0.0), ("oracle_sticky", STICKY)):
        slices = oracle_slices(case, model, sticky, seeds=[plan])
        candidates[name] = (slices, summary.summarize(replayed(name, slices), name))
    winner = max(candidates, key=lambda n: candidates[n][1]["throughput_tokens_per_second"])
    slices, best = candidates[winner]
    out["oracle"] = {
        **best,
        "label": "oracle (hindsight, true model, per time slice)",
        "knows": KNOWS["oracle"],
        "slice_seconds": case.interval,
        "plan_from": winner,
        "plan": plan_json(slices, case.scenario),
    }
    return out, slices


def _canonical(slices: Slices) -> tuple:
    """The plan as a hashable value: slices whose plan repeats the previous one's are dropped."""
    out, last = [], None
    for start, plan in slices:
        items = tuple(sorted(plan.items()))
        if items != last:
            out.append((0.0 if last is None else start, items))
            last = items
    return tuple(out)


def _everything(case: Case, pool: str) -> rp.ClassPlan:
    """A plan sending every class of the scenario to ``pool``."""
    keys = {t.key for phase in case.scenario.phases for t in traffic(phase, case.buckets)}
    return dict.fromkeys(sorted(keys), pool)


def noise(case: Case, slices: Slices, reference: float, draws: Sequence[int] = (1, 2)) -> dict:
    """Run-to-run noise: the same plan and traffic, other acceptance draws (``engine_seed``).

    Returns the relative throughput deviations from ``reference`` and their largest magnitude.
    """
    deviations = []
    for draw in draws:
        result = run(case, "noise", slices, engine_seed=case.seed + 7919 * draw)
        tput = sum(result.tokens.values()) / case.scenario.duration_s
        deviations.append(tput / reference - 1.0)
    return {
        "method": "the oracle's plan replayed with other acceptance draws (same traffic)",
        "draws": len(deviations),
        "deviations": deviations,
        "max_abs": max((abs(d) for d in deviations), default=0.0),
    }
