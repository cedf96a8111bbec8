"""The fleet planner (``rules.planner``) and its solver (``rules.plansearch``) on a step-cost model.

Step model throughout: ``T_step(B, K) = 20 ms + 0.5 ms*B + 0.3 ms*B*(K+1)`` per replica, so a K=4
step at B=16 takes 52 ms and a no-spec one 32.8 ms.
"""

from __future__ import annotations

import itertools
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from specguard.errors import InputError
from specguard.rules import planner as pl
from specguard.rules import plansearch
from specguard.rules.bestpool import Estimate
from specguard.rules.stepfit import StepFit

STEP = StepFit(("batch", "verify_tokens"), 0.020, (0.0005, 0.0003), 1.0, 0.0, 10)
FIXED = (pl.Pool("spec-k4", 4, 2), pl.Pool("spec-k2", 2, 1), pl.Pool("nospec", 0, 1))
LOADS = {"low": 2.0, "mid": 16.0, "high": 24.0}
HEAVY, CHAT, QA = ("code", "greedy", "mid"), ("chat", "sampled", "mid"), ("qa", "greedy", "mid")


def cell(pool, rc, spread=0.04, samples=100, basis="measured"):
    return Estimate(pool, rc, basis, samples, lower=rc * (1 - spread), upper=rc * (1 + spread))


def make(demand, current, cells, pools=FIXED, **kw):
    return pl.PlanInput(
        pools, STEP, LOADS, {k: pl.Demand(n) for k, n in demand.items()}, current, cells, **kw
    )


def heavy_case():
    """A heavy class that loses a little on K=4 (rc 1.04-1.12), two light ones, all on K=4."""
    return make(
        {HEAVY: 40.0, CHAT: 3.0, QA: 1.0},
        dict.fromkeys((HEAVY, CHAT, QA), "spec-k4"),
        {
            HEAVY: {"spec-k4": cell("spec-k4", 1.08), "spec-k2": cell("spec-k2", 1.05)},
            CHAT: {"spec-k4": cell("spec-k4", 1.3)},
            QA: {"spec-k4": cell("spec-k4", 0.7)},
        },
    )


def test_a_heavy_class_is_not_moved_onto_a_one_replica_pool_it_would_overload():
    inp = heavy_case()
    old = pl.per_class(inp)
    assert old[HEAVY] == "nospec"  # the per-class rule: no-spec (1.0) is below rc's lower end 1.04
    plan = pl.plan(inp)
    assert plan.pools[HEAVY] == "spec-k4"
    old_tokens, old_tpot = pl.tokens_of(inp, old)
    assert plan.tokens > old_tokens * 1.2  # forty requests on one no-spec replica: 54 ms a token
    assert old_tpot[HEAVY] > 0.054 - 1e-9
    assert HEAVY in pl.slo_breaks(inp, old) and pl.slo_breaks(inp, plan.pools) == []
    _, tpot = pl.tokens_of(inp, plan.pools)
    assert tpot[HEAVY] < 0.042


def test_the_same_class_moves_when_the_no_spec_pool_has_the_replicas():
    pools = (pl.Pool("spec-k4", 4, 2), pl.Pool("spec-k2", 2, 1), pl.Pool("nospec", 0, 8))
    inp = replace(heavy_case(), pools=pools)
    plan = pl.plan(inp)
    assert plan.pools[HEAVY] == "nospec"
    assert plan.reasons[HEAVY].startswith("move spec-k4 -> nospec")
    assert plan.benefit_lower > 0 and plan.tokens > plan.tokens_now


def test_slo_respected_every_class_within_its_slo_or_no_worse_than_now():
    rng = random.Random(3)
    for _ in range(25):
        inp = random_case(rng, classes=8)
        plan = pl.plan(inp)
        _, now = pl.tokens_of(inp, inp.current)
        _, got = pl.tokens_of(inp, plan.pools)
        never = STEP.predict(sum(d.in_flight for d in inp.demand.values()) / 4, 0)
        for key, tpot in got.items():
            assert tpot <= max(1.1 * never, now[key]) * (1 + 1e-9), (key, plan.reasons[key])
        assert pl.slo_breaks(inp, plan.pools) == []


def test_a_class_slo_blocks_a_move_that_pays_for_the_fleet():
    """CHAT loses on K=4 (rc 1.3) and would gain on the no-spec replicas, where HEAVY runs: with
    HEAVY's SLO just above its TPOT now, the move that would slow HEAVY past it is not made."""
    pools = (pl.Pool("spec-k4", 4, 2), pl.Pool("nospec", 0, 4))
    current = {HEAVY: "nospec", CHAT: "spec-k4"}
    cells = {HEAVY: {"spec-k4": cell("spec-k4", 1.3)}, CHAT: {"spec-k4": cell("spec-k4", 2.0)}}
    free = make({HEAVY: 40.0, CHAT: 32.0}, current, cells, pools=pools, slo_factor=2.0)
    assert pl.plan(free).pools == {HEAVY: "nospec", CHAT: "nospec"}
    _, now = pl.tokens_of(free, current)
    _, moved = pl.tokens_of(free, {HEAVY: "nospec", CHAT: "nospec"})
    assert moved[HEAVY] > now[HEAVY] * 1.01
    strict = replace(free, demand={**free.demand, HEAVY: pl.Demand(40.0, slo_seconds=now[HEAVY] * 1.01)})
    plan = pl.plan(strict)
    assert plan.pools == current
    assert "SLO" in plan.reasons[HEAVY]


def test_no_move_on_an_interval_that_straddles_no_benefit():
    pools = (pl.Pool("spec-k4", 4, 4), pl.Pool("spec-k2", 2, 4), pl.Pool("nospec", 0, 4))
    cells = {QA: {"spec-k4": cell("spec-k4", 1.02, 0.05), "spec-k2": cell("spec-k2", 0.98, 0.05)}}
    inp = make({QA: 64.0}, {QA: "spec-k4"}, cells, pools=pools)  # 16 a replica, as measured
    plan = pl.plan(inp)
    assert plan.pools[QA] == "spec-k4" and not plan.moves
    assert "no plan that moves it gains" in plan.reasons[QA]
    narrow = make({QA: 64.0}, {QA: "spec-k4"}, {QA: {"spec-k4": cell("spec-k4", 1.2, 0.05)}}, pools=pools)
    assert pl.plan(narrow).pools[QA] == "nospec"  # clear of 1.0 at the same load: it moves


def test_thin_evidence_stays_put():
    cells = {QA: {"spec-k4": cell("spec-k4", 1.6, samples=3), "spec-k2": cell("spec-k2", 0.5)}}
    inp = make({QA: 1.0}, {QA: "spec-k4"}, cells, min_samples=20)
    plan = pl.plan(inp)
    assert plan.pools[QA] == "spec-k4"
    assert "too thin" in plan.reasons[QA]
    no_interval = {QA: {"spec-k4": Estimate("spec-k4", 1.6, "what-if", 50)}}
    assert pl.plan(make({QA: 1.0}, {QA: "spec-k4"}, no_interval)).pools[QA] == "spec-k4"
    # a thin target: no move to it, though its point estimate is far cheaper
    to_thin = {QA: {"spec-k4": cell("spec-k4", 0.9), "spec-k2": cell("spec-k2", 0.4, samples=3)}}
    assert pl.plan(make({QA: 1.0}, {QA: "spec-k4"}, to_thin, min_samples=20)).pools[QA] == "spec-k4"


def test_deterministic_whatever_the_input_order():
    rng = random.Random(11)
    inp = random_case(rng, classes=12)
    first = pl.plan(inp)
    keys = list(inp.demand)
    rng.shuffle(keys)
    shuffled = replace(
        inp,
        demand={k: inp.demand[k] for k in keys},
        current={k: inp.current[k] for k in keys},
        cells={k: inp.cells[k] for k in reversed(keys)},
    )
    again = pl.plan(shuffled)
    assert again.pools == first.pools and again.reasons == first.reasons
    assert again.tokens == first.tokens


def test_never_worse_than_never_speculate_or_now_on_its_own_model():
    rng = random.Random(5)
    for _ in range(30):
        inp = replace(
            random_case(rng, classes=7, spread=0.0), node_budget=100_000, margin=0.0
        )  # the model's own
        plan = pl.plan(inp)
        assert all(plan.exact.values())
        nospec = {k: "nospec" for k in inp.demand}
        assert plan.tokens >= pl.tokens_of(inp, nospec)[0] * (1 - 1e-9) or not _feasible(inp, nospec)
        assert plan.tokens >= plan.tokens_now * (1 - 1e-9)


def test_solver_exact_against_every_plan():
    rng = random.Random(7)
    for _ in range(40):
        pools = rng.randint(2, 4)
        classes = rng.randint(1, 6)
        options = []
        for _c in range(classes):
            chosen = rng.sample(range(pools), rng.randint(1, pools))
            options.append(
                tuple((j, rng.uniform(0.5, 1.5), rng.uniform(0, 3) * (o > 0)) for o, j in enumerate(chosen))
            )
        n = tuple(rng.uniform(0.1, 20) for _ in range(classes))
        a = tuple(rng.uniform(0.01, 0.03) for _ in range(pools))
        b = tuple(rng.uniform(0.0, 0.003) for _ in range(pools))
        stay = plansearch.Problem(n, tuple(options), (9.9,) * classes, a, b)
        caps = tuple(o[0][1] * (a[o[0][0]] + b[o[0][0]] * 60) * rng.uniform(1.0, 1.5) for o in options)
        problem = replace(stay, cap=caps) if plansearch.value(stay, [0] * classes) else stay
        if plansearch.value(problem, [0] * classes) is None:
            problem = stay
        result = plansearch.solve(problem, 100_000)
        every = [
            plansearch.value(problem, list(c)) for c in itertools.product(*(range(len(o)) for o in options))
        ]
        assert result.exact
        assert result.value == pytest.approx(max(v for v in every if v is not None), rel=1e-9)


def test_the_size_the_guard_is_built_for_is_handled_within_the_budget():
    rng = random.Random(1)
    inp = random_case(rng, classes=60, buckets=("low", "mid", "high"), pools=4)
    plan = pl.plan(inp)
    assert set(plan.pools) == set(inp.demand)
    assert plan.nodes <= 3 * (pl.NODE_BUDGET + 1)
    assert plan.tokens >= plan.tokens_now * (1 - 1e-9)
    assert set(plan.exact) == {"low", "mid", "high"}
    for key, why in plan.reasons.items():  # a plan the search did not prove says so
        if why.startswith(("move", "stays on")):
            assert ("not proven optimal" in why) == (not plan.exact[key[2]])


def test_bad_input_says_what_and_where():
    inp = heavy_case()
    with pytest.raises(InputError, match="code/greedy/mid is on 'gone'"):
        pl.plan(replace(inp, current={**inp.current, HEAVY: "gone"}))
    with pytest.raises(InputError, match="load bucket 'mid' has no representative load"):
        pl.plan(replace(inp, loads={}))


def test_information_share_prices_what_a_probe_could_find():
    assert pl.information_share(0.0, 10.0, 0.05) == 0.0  # nothing to learn: no probe
    assert pl.information_share(100.0, 0.0, 0.05) == 0.05
    assert pl.information_share(100.0, 1000.0, 0.05) == pytest.approx(0.01)  # 10% of 100 / 1000
    assert pl.information_share(1e6, 1.0, 0.05) == 0.05
    assert pl.Demand.from_rate(2.0, 100, 0.05).in_flight == pytest.approx(10.0)


# ---------------------------------------------------------------- helpers


def _feasible(inp, assignment):
    _, tpot = pl.tokens_of(inp, assignment)
    _, now = pl.tokens_of(inp, inp.current)
    never = STEP.predict(
        sum(d.in_flight for d in inp.demand.values()) / sum(p.replicas for p in inp.pools), 0
    )
    return all(t <= max(1.1 * never, now[k]) * (1 + 1e-9) for k, t in tpot.items())


def random_case(rng, classes, spread=None, buckets=("mid",), pools=3):
    shape = FIXED if pools == 3 else (*FIXED[:2], pl.Pool("spec-k3", 3, 1), FIXED[2])
    demand, current, cells = {}, {}, {}
    for c in range(classes):
        accept = rng.uniform(0.2, 0.9)
        for bucket in buckets:
            key = (f"task{c:02d}", "greedy", bucket)
            demand[key] = rng.paretovariate(1.3) * LOADS[bucket] / 4
            current[key] = rng.choice([p.name for p in shape])
            cells[key] = {}
            for p in shape:
                if p.k:
                    rc = (1 + 0.3 * p.k) / (1 + accept * p.k) * rng.uniform(0.9, 1.1)
                    w = rng.uniform(0.01, 0.2) if spread is None else spread
                    cells[key][p.name] = Estimate(
                        p.name, rc, "measured", 100, lower=rc * (1 - w), upper=rc * (1 + w)
                    )
    return make(demand, current, cells, pools=shape)


def test_the_first_plan_finds_moves_no_single_move_reaches():
    """Twelve classes where the best plan moves a heavy class onto the no-spec replica and two light
    ones off it at once: the local search alone (no node budget) finds the proven optimum."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import bench_planner

    inp = bench_planner.instance(1, classes=12)
    one = replace(inp, demand={k: d for k, d in inp.demand.items() if k[2] == "mid"})
    proven = pl.plan(replace(one, node_budget=200_000))
    assert all(proven.exact.values())
    quick = pl.plan(replace(one, node_budget=0))
    assert quick.benefit_lower == pytest.approx(proven.benefit_lower, rel=1e-9)
    assert len(proven.moves) >= 3


def test_a_plan_that_gains_less_than_the_margin_at_its_worst_case_is_not_taken():
    pools = (pl.Pool("spec-k4", 4, 4), pl.Pool("nospec", 0, 4))
    cells = {QA: {"spec-k4": cell("spec-k4", 1.06, 0.01)}, CHAT: {"spec-k4": cell("spec-k4", 0.7)}}
    inp = make({QA: 1.0, CHAT: 64.0}, {QA: "spec-k4", CHAT: "spec-k4"}, cells, pools=pools)
    free = pl.plan(replace(inp, margin=0.0))
    assert free.pools[QA] == "nospec" and 0 < free.benefit_lower < 0.02 * free.tokens_now
    kept = pl.plan(inp)  # the default 2%: not worth a change
    assert kept.pools[QA] == "spec-k4" and not kept.moves


def test_a_step_fit_through_the_origin_still_plans():
    """A non-negative fit may put the intercept at 0 (no step cost at no load): an idle pool's step
    then priced at 0 s and the search divided by it (a lab run on autoscaled pools without a
    profile stopped on a ZeroDivisionError). The least step time keeps every rate finite."""
    origin = StepFit(("batch", "verify_tokens"), 0.0, (0.0005, 0.0003), 1.0, 0.0, 10)
    inp = replace(heavy_case(), step=origin)
    plan = pl.plan(inp)
    assert set(plan.pools) == {HEAVY, CHAT, QA} and 0 < plan.tokens < float("inf")
