"""The rows specguard is compared with: what a user would run instead, on the same engines.

Every row replays the same scenario and seed through the simulator's engine core on the same
fleet shape (``lab.shapes``). The rows that use one pool run it on all the shape's engines; the
routing rows run on the shape's pools. Each says what it knows that specguard does not:

- always / never speculate: nothing (one pool of every engine: the default K, or no speculation);
- best single pool: which one pool configuration serves the whole run best (each one replayed);
- best in-engine schedule: one pool of every engine running the vLLM K schedule (one K per
  batch-size range, for every class) that serves the run best, searched on the true model and
  replayed (``lab.schedule_search``): what a team with one pool would tune instead of routing;
- best per phase (fluid shape only: with fixed or autoscaled pools a pool cannot become another
  between phases): when each phase starts and which single pool serves it best;
- best static plan per class: the best fixed pool per class over the whole run, on the shape's pools;
- oracle: the upper bound of the shape, by construction the best replay of every hindsight plan:
  the per-slice plan on the shape's pools (``hindsight.oracle_slices``, planned with the engines
  each pool has, the start delay and stabilisation of an autoscaled fleet included), on fixed or
  autoscaled pools also every class spread over their engines and the best static split per
  class, every row above, and each specguard run's own routing replayed request by request
  (``realised``): a plan the hindsight search may miss (an autoscaled fleet's replicas follow the
  plan, and the search does not look ahead to them) is still a plan the oracle knows. So no row
  can beat it; that none does by more than the run-to-run noise is checked in every run
  (``summary.bound``), and ``plan_from`` says which plan it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from specguard.lab import hindsight, replay, schedule_search, shapes, summary
from specguard.lab import replay_policies as rp

Progress = Callable[[str], None] | None

KNOWS = {
    "always_speculate": "nothing: every class on the default pool, all engines",
    "never_speculate": "nothing: every class without speculation, all engines",
    "best_single_pool": "which single pool configuration of all the engines serves the whole run best "
    "(each one replayed)",
    "best_in_engine_schedule": "the whole run's traffic and the simulator's true acceptance and step costs: "
    "the in-engine K schedule (one K per batch-size range, for every class) of all the engines that "
    "serves the run best (searched on the true model, replayed)",
    "best_per_phase": "when each phase starts, and which single pool serves it best",
    "best_per_class_static": "every class's traffic over the whole run and its best fixed pool "
    "(greedy search on the true model, replayed)",
    "oracle": "every time slice's traffic in advance and the simulator's true acceptance and step "
    "costs; plans each class per slice on the same pools with the same engines and delays; the best "
    "replay of that plan, of every row above and of specguard's own routing",
}


@dataclass
class Candidate:
    """A replayed hindsight plan: its summary and how to replay it again (other acceptance draws)."""

    summary: dict
    rerun: Callable[..., replay.ReplayResult]


def rows(
    case: hindsight.Case, progress: Progress = None, realised: Mapping[str, rp.Choices] | None = None
) -> tuple[dict[str, dict], Candidate]:
    """Every non-specguard row (summaries with ``knows``), the oracle last; and the oracle's plan.
    ``realised``: each specguard row's routing (``SpecguardPolicy.choices``), candidates of the oracle."""

    def say(text: str) -> None:
        if progress:
            progress(text)

    k = {p.name: p.num_speculative_tokens for p in case.sim.pools}
    shape = case.fleet_shape
    seen: dict[tuple, replay.ReplayResult] = {}

    def replayed(name: str, slices: hindsight.Slices) -> replay.ReplayResult:
        """Each distinct plan on the shape's pools is replayed once (rows often find the same plan)."""
        key = hindsight.canonical(slices)
        if key not in seen:
            seen[key] = hindsight.run(case, name, slices)
        return seen[key]

    statics, single_results = {}, {}
    for pool in case.pools:
        say(f"replaying every class on {pool} (K={k[pool]}), all engines")
        single_results[pool] = result = hindsight.single(case, pool)
        statics[pool] = summary.summarize(result, f"every class on {pool} (K={k[pool]})", config=pool)

    def single_candidate(pool: str) -> Candidate:
        return Candidate(statics[pool], lambda **kw: hindsight.single(case, pool, **kw))

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
    candidates: dict[str, Candidate] = {p: single_candidate(p) for p in case.pools}

    say("searching the best in-engine K schedule (true model) and replaying it")
    found = schedule_search.best(case)
    if found is not None:
        schedule, result = found
        row = summary.summarize(
            result,
            f"best in-engine schedule (hindsight): {schedule.describe()}",
            knows=KNOWS["best_in_engine_schedule"],
            config=schedule.to_json(),
        )
        candidates["best_in_engine_schedule"] = Candidate(
            row, lambda s=schedule, **kw: schedule_search.replay_schedule(case, s, **kw)
        )
        best_static = max(case.pools, key=lambda p: (statics[p]["throughput_tokens_per_second"], p))
        if statics[best_static]["throughput_tokens_per_second"] > row["throughput_tokens_per_second"]:
            # a constant K is a schedule too: the best single pool when no range schedule beats it
            row = {
                **statics[best_static],
                "label": f"best in-engine schedule (hindsight): K={k[best_static]} at every batch size",
                "knows": KNOWS["best_in_engine_schedule"],
                "config": {"constant_k": k[best_static]},
            }
        out["best_in_engine_schedule"] = row

    if shape.kind == shapes.FLUID:
        say("replaying the best single pool per phase (hindsight)")
        phase_pools = [
            max(case.pools, key=lambda p, i=i: statics[p]["phases"][i]["throughput_tokens_per_second"])
            for i in range(len(case.scenario.phases))
        ]
        slices = hindsight.per_phase(case, [hindsight.everything(case, p) for p in phase_pools])
        result = replayed("best-per-phase", slices)
        out["best_per_phase"] = summary.summarize(
            result,
            "best single pool per phase (hindsight)",
            knows=KNOWS["best_per_phase"],
            config=phase_pools,
        )
        candidates["best_per_phase"] = _sliced(case, out["best_per_phase"], slices)

    model = case.model()
    say("searching the best static plan per class (greedy, true model) and replaying it")
    plan = hindsight.per_class_static(case, model, best_pool)
    slices = [(0.0, plan)]
    out["best_per_class_static"] = summary.summarize(
        replayed("best-per-class", slices),
        "best static plan per class (hindsight, greedy)",
        knows=KNOWS["best_per_class_static"],
        plan=hindsight.plan_json(slices, case.scenario),
    )
    candidates["best_per_class_static"] = _sliced(case, out["best_per_class_static"], slices)

    say("planning the oracle per time slice (true model) and replaying it")
    routing: dict[str, tuple[hindsight.Slices, dict]] = {}
    if case.quantum:  # pools that keep their engines: a class spread over them, statically
        for name, static in (
            ("spread", hindsight.spread(case)),
            (
                "split_static",
                hindsight.per_class_static(case, model, best_pool, case.quantum, hindsight.spread(case)),
            ),
        ):
            slices = [(0.0, static)]
            routing[name] = (slices, summary.summarize(replayed(name, slices), name))
    for name, sticky in (("oracle", 0.0), ("oracle_sticky", hindsight.STICKY)):
        slices = hindsight.oracle_slices(case, model, sticky, seeds=[plan])
        result = replayed(name, slices)
        routing[name] = (slices, summary.summarize(result, name))
        if shape.kind == shapes.AUTOSCALED:  # again, with the replicas that plan actually had
            counts = hindsight.replicas_per_slice(case, result)
            again = hindsight.oracle_slices(case, model, sticky, seeds=[plan], replicas=counts)
            routing[f"{name}_replicas"] = (again, summary.summarize(replayed(name, again), name))
    for name, (slices, row) in routing.items():
        candidates[name] = _sliced(case, row, slices)
    if realised:
        say("replaying each specguard row's own routing request by request")
    for name, choices in (realised or {}).items():
        row = summary.summarize(
            hindsight.run_choices(case, name, choices), f"{name}'s routing", config=f"{name}'s routing"
        )
        candidates[f"{name}_routing"] = Candidate(
            row, lambda c=choices, n=name, **kw: hindsight.run_choices(case, n, c, **kw)
        )
    best_routing = max(routing, key=lambda n: routing[n][1]["throughput_tokens_per_second"])
    winner = max(candidates, key=lambda n: candidates[n].summary["throughput_tokens_per_second"])
    best = candidates[winner].summary
    out["oracle"] = {
        **best,
        "label": "oracle (hindsight, true model, per time slice)",
        "knows": KNOWS["oracle"],
        "slice_seconds": case.interval,
        "plan_from": winner,
        "plan": hindsight.plan_json(routing[winner][0], case.scenario)
        if winner in routing
        else best.get("config"),
        "routing_plan_tokens_per_second": routing[best_routing][1]["throughput_tokens_per_second"],
        "routing_plan_phases": routing[best_routing][1]["phases"],
    }
    return out, candidates[winner]


def _sliced(case: hindsight.Case, row: dict, slices: hindsight.Slices) -> Candidate:
    return Candidate(row, lambda **kw: hindsight.run(case, "noise", slices, **kw))
