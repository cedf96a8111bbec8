"""Probes and the holdout priced by the fleet plan (``rules.planprobes``): a share is what it could
teach the plan, on the step model of tests/rules/test_planner.py."""

from __future__ import annotations

import math
import random

import pytest

from specguard.exporters.config import PoolConfig
from specguard.exporters.routing import Router
from specguard.rules import planner as pl
from specguard.rules import planprobes, probes
from tests.rules.test_planner import CHAT, FIXED, HEAVY, QA, STEP, cell, make


def plan_of(inp):
    return pl.plan(inp)


def test_a_class_off_speculation_is_probed_where_the_favourable_end_beats_its_pool():
    """QA runs on no-spec; K=4 could beat it at its interval's lower end (rc 2.0 [1.0, 3.0] at 16
    in flight, where K=4's step is 1.6x no-spec's), K=2 cannot even there (2.6 [2.44, 2.76]): the
    probe goes to K=4 at the price the rule sets, and K=2 is worth nothing."""
    inp = make(
        {QA: 2.0, CHAT: 1.0},
        {QA: "nospec", CHAT: "spec-k4"},
        {
            QA: {"spec-k4": cell("spec-k4", 2.0, spread=0.5), "spec-k2": cell("spec-k2", 2.6, spread=0.06)},
            CHAT: {"spec-k4": cell("spec-k4", 0.6)},
        },
    )
    plan = plan_of(inp)
    assert plan.pools[QA] == "nospec"  # its worst case on K=4 loses
    found = planprobes.shares(inp, plan, probe_cap=0.5, holdout_cap=0.05)
    probe = found.probes[QA[:2]]
    # by hand: 2 in flight on no-spec (1 replica), 1 on K=4 (2 replicas); the cell measured at 16
    a0, b0 = pl.line(STEP, 0, 1)
    a4, b4 = pl.line(STEP, 4, 2)
    shift = STEP.predict(16, 0) / STEP.predict(16, 4)
    here = 2.0 / (a0 + b0 * 2.0)
    upside = 2.0 / (1.0 * shift * (a4 + b4 * 3.0)) - here  # all of it moved, at the lower end
    cost = here - 2.0 / (2.0 * shift * (a4 + b4 * 1.0))  # a unit share, at the point estimate
    assert upside > 0 and cost > 0
    assert (
        probe.pool == "spec-k4"
        and probe.upside == pytest.approx(upside)
        and probe.cost == pytest.approx(cost)
    )
    assert probe.share == pytest.approx(pl.INFORMATION_PRICE * upside / cost) and probe.share < 0.5
    assert planprobes.shares(inp, plan, probe_cap=0.05, holdout_cap=0.05).probes[QA[:2]].share == 0.05
    lines, loads = _lines(inp), _loads(inp, plan)
    k2 = next(w for w in planprobes._worth(inp, QA, "nospec", 2.0, lines, loads) if w.pool == "spec-k2")
    assert k2.upside == 0.0 and planprobes._capped(k2, 0.5).share == 0.0  # nothing there beats no-spec


def _lines(inp):
    return {p.name: pl.line(inp.step, p.k, p.replicas) for p in inp.pools}


def _loads(inp, plan):
    loads = dict.fromkeys(_lines(inp), 0.0)
    for key, pool in plan.pools.items():
        loads[pool] += inp.demand[key].in_flight
    return loads


def test_a_class_sure_to_pay_is_not_held_out_and_a_doubtful_one_is():
    """On K=4: code's RC 0.5 [0.48, 0.52] leaves nothing for the holdout to learn; chat's 1.2
    [0.96, 1.44] at 16 in flight might lose to no-spec where the plan runs it, so it is held out."""
    inp = make(
        {HEAVY: 4.0, CHAT: 2.0},
        dict.fromkeys((HEAVY, CHAT), "spec-k4"),
        {HEAVY: {"spec-k4": cell("spec-k4", 0.5)}, CHAT: {"spec-k4": cell("spec-k4", 1.2, spread=0.2)}},
    )
    plan = plan_of(inp)
    assert plan.pools == {HEAVY: "spec-k4", CHAT: "spec-k4"}
    found = planprobes.shares(inp, plan, probe_cap=0.05, holdout_cap=0.1)
    assert found.probes == {}
    assert found.holdouts[HEAVY[:2]].share == 0.0 and found.holdouts[HEAVY[:2]].upside == 0.0
    chat = found.holdouts[CHAT[:2]]
    assert chat.pool == "nospec" and chat.upside > 0 and chat.cost > 0
    assert chat.share == pytest.approx(min(0.1, pl.INFORMATION_PRICE * chat.upside / chat.cost))


def test_a_pool_without_an_interval_is_worth_the_cap_and_caps_zero_mean_none():
    inp = make({QA: 2.0}, {QA: "nospec"}, {QA: {"spec-k2": cell("spec-k2", 1.6, spread=0.06)}})
    plan = plan_of(inp)
    found = planprobes.shares(inp, plan, probe_cap=0.05, holdout_cap=0.05)
    probe = found.probes[QA[:2]]
    assert (probe.pool, probe.share, probe.expected_rc) == ("spec-k4", 0.05, None)
    assert math.isinf(probe.upside) and probe.basis == planprobes.UNKNOWN
    assert planprobes.shares(inp, plan, probe_cap=0.0, holdout_cap=0.0).probes[QA[:2]].share == 0.0


def test_pinned_and_idle_classes_are_not_priced_and_keep_the_expected_cost_probe():
    inp = make(
        {QA: 2.0, CHAT: 0.0},
        {QA: "nospec", CHAT: "nospec"},
        {QA: {"spec-k4": cell("spec-k4", 0.9)}, CHAT: {"spec-k4": cell("spec-k4", 0.9)}},
        fixed=frozenset({QA}),
    )
    found = planprobes.shares(inp, plan_of(inp), probe_cap=0.05, holdout_cap=0.05)
    assert found.probes == {} and found.holdouts == {}
    expected = {("qa", "greedy", "low"): probes.Probe("spec-k2", 0.01, 1.2, "measured")}
    assert planprobes.merged(expected, found) == expected
    priced = planprobes.Shares({("qa", "greedy"): planprobes.Worth("spec-k4", 0.03, 5.0, 10.0, 0.9)}, {})
    got = planprobes.merged(expected, priced)[("qa", "greedy", "low")]
    assert (got.pool, got.share, got.expected_rc) == ("spec-k4", 0.03, 0.9) and "planned" in got.reason


def test_the_router_holds_out_at_least_a_classs_planned_share():
    pools = [PoolConfig("spec-k4", "http://a", "vllm", 4), PoolConfig("nospec", "http://b", "vllm", 0)]
    router = Router(
        pools, default_pool="spec-k4", nospec_pool="nospec", holdout_share=0.2, rng=random.Random(1)
    )
    router.set_holdout_shares({"low": 0.0})
    router.set_class_holdouts({("chat", "high"): 0.1})

    def held(task):
        return sum(router.choose(task, "high", lambda pool: "low").route == "holdout" for _ in range(4000))

    assert held("code") == 0 and 300 < held("chat") < 500  # 10% of 4000
    assert router.holdout_report()["class_shares"] == {"chat/high": 0.1}
    with pytest.raises(Exception, match="between 0 and 1"):
        router.set_class_holdouts({("chat", "high"): 1.5})
    assert router.class_holdouts() == {("chat", "high"): 0.1}  # a bad set changes nothing
    off = Router(pools, default_pool="spec-k4", nospec_pool="nospec", holdout_share=0.0, rng=random.Random(1))
    off.set_class_holdouts({("chat", "high"): 0.5})
    assert all(off.choose("chat", "high", lambda pool: "low").route != "holdout" for _ in range(500))


def test_no_plan_prices_nothing():
    from specguard.rules import planfeed

    assert planfeed.Decided({}, reason="planner: no step-cost fit").shares(0.05, 0.05) is None
    inp = make({QA: 2.0}, {QA: "nospec"}, {QA: {"spec-k4": cell("spec-k4", 0.9)}}, pools=FIXED)
    found = planfeed.decide(inp).shares(0.05, 0.05)
    assert found is not None and set(found.probes) | set(found.holdouts) == {QA[:2]}
