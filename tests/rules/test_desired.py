"""Desired replicas per pool from the fleet plan (``rules.desired``), on the planner tests' step
model: ``T_K(B) = 20 ms + 0.5 ms*B + 0.3 ms*B*(K+1)``, so ``T_0 = 20 + 0.8 B`` and ``T_4 = 20 + 2 B``
(ms); a class of unit ``u`` on K=4 pays up to ``B* = 20 (1 - u) / (2u - 0.8)``."""

from __future__ import annotations

import pytest

from specguard.rules import desired
from specguard.rules import planner as pl
from specguard.rules.policy import Scaling
from tests.rules.test_planner import CHAT, FIXED, HEAVY, QA, STEP, cell, make

SCALING = Scaling(target_in_flight=16.0, start_delay_seconds=120.0, min_replicas=1, max_replicas=0)


def b_star(unit: float) -> float:
    return 20 * (1 - unit) / (2 * unit - 0.8)


@pytest.mark.parametrize("unit", [0.5, 0.6, 0.7])
def test_crossover_is_where_speculation_stops_paying(unit):
    found = desired.crossover(unit, 4, STEP, cap=1000.0)
    assert found == pytest.approx(b_star(unit), rel=1e-6)
    assert unit * STEP.predict(found * 1.01, 4) > STEP.predict(found * 1.01, 0)  # past it: it does not
    assert desired.crossover(unit, 4, STEP, cap=5.0) == 5.0  # pays at every load up to the cap
    assert desired.crossover(1.1, 4, STEP, cap=16.0) == 0.0  # never pays


def plan_of(inp, pools):
    return pl.Plan(pools, dict.fromkeys(pools, "stays"), 0.0, 0.0, 0.0)


def case(heavy=30.0, chat=4.0, qa=2.0):
    """code and chat planned on K=4 (unit 0.7 and 0.65 at the load they were measured at), qa on
    no-spec; all measured at 16 a replica."""
    shift = STEP.predict(16.0, 0) / STEP.predict(16.0, 4)
    inp = make(
        {HEAVY: heavy, CHAT: chat, QA: qa},
        {HEAVY: "spec-k4", CHAT: "spec-k4", QA: "nospec"},
        {HEAVY: {"spec-k4": cell("spec-k4", 0.7 / shift)}, CHAT: {"spec-k4": cell("spec-k4", 0.65 / shift)}},
    )
    return inp, plan_of(inp, {HEAVY: "spec-k4", CHAT: "spec-k4", QA: "nospec"})


def test_a_speculative_pool_is_sized_below_its_classes_crossover_and_no_spec_at_the_target():
    inp, plan = case()
    per = desired.targets(inp, plan, SCALING)
    assert per["spec-k4"] == pytest.approx(b_star(0.7), rel=1e-6)  # the lower crossover: 10
    assert per["nospec"] == 16.0 and per["spec-k2"] == 16.0  # no class there: the target
    sizer = desired.Sizer(SCALING)
    assert sizer.desired(inp, plan, 0.0) == {"spec-k4": 4, "spec-k2": 1, "nospec": 1}  # ceil(34 / 10)
    capped = desired.Sizer(Scaling(max_replicas=3, min_replicas=0))
    assert capped.desired(inp, plan, 0.0) == {"spec-k4": 3, "spec-k2": 0, "nospec": 1}


def test_scale_up_only_for_demand_that_lasted_a_start_delay_and_down_at_once():
    sizer = desired.Sizer(SCALING)
    inp, plan = case(heavy=6.0)
    assert sizer.desired(inp, plan, 0.0)["spec-k4"] == 1  # 10 in flight, 10 a replica
    busy, plan = case(heavy=46.0)  # 50 in flight: 5 replicas' worth
    seen = {t: sizer.desired(busy, plan, t)["spec-k4"] for t in (15.0, 60.0, 119.0, 135.0)}
    assert seen == {15.0: 1, 60.0: 1, 119.0: 1, 135.0: 5}  # only once it lasted 120 s
    quiet, plan = case(heavy=6.0)
    assert sizer.desired(quiet, plan, 150.0)["spec-k4"] == 1  # down at once (the HPA stabilises)
    at_once = desired.Sizer(Scaling(target_in_flight=16.0, sustain_seconds=0))  # sustain_seconds: 0
    at_once.desired(*case(heavy=6.0), 0.0)
    assert at_once.desired(busy, plan, 15.0)["spec-k4"] == 5  # asked for at once
    # a burst shorter than the start delay never scales the pool up
    burst = desired.Sizer(SCALING)
    for t in range(0, 600, 15):
        inp, plan = case(heavy=46.0 if t % 240 >= 135 else 6.0)  # 90 s bursts
        assert burst.desired(inp, plan, float(t))["spec-k4"] == 1


def test_a_class_the_plan_moves_brings_the_demand_it_has_had_to_its_new_pool():
    """The start delay asks whether the traffic has lasted, not where the plan put it. Before: each
    pool kept its own history, so a busy class moved between pools read as a burst on the pool it
    reached (its history 0 a start delay back), and no pool was ever sized for it (in a lab run of
    96 chat clients moved between no-spec and K=4, every pool stayed at 1 replica)."""
    sizer = desired.Sizer(SCALING)
    inp, on_k4 = case(heavy=46.0)  # 50 in flight on K=4 (two classes), 2 on no-spec
    on_nospec = plan_of(inp, {HEAVY: "nospec", CHAT: "nospec", QA: "nospec"})
    for t in range(0, 135, 15):  # 135 s of the same traffic, the plan flipping every evaluation
        sized = sizer.desired(inp, on_nospec if t % 30 else on_k4, float(t))
    assert sized == {"spec-k4": 5, "spec-k2": 1, "nospec": 1}  # ceil(50 / 10): the demand lasted
    assert sizer.desired(inp, on_nospec, 150.0) == {"spec-k4": 1, "spec-k2": 1, "nospec": 4}  # ceil(52 / 16)


def test_a_class_that_never_pays_on_its_pool_sets_no_target():
    shift = STEP.predict(16.0, 0) / STEP.predict(16.0, 4)
    inp = make({HEAVY: 20.0}, {HEAVY: "spec-k4"}, {HEAVY: {"spec-k4": cell("spec-k4", 1.2 / shift)}})
    plan = plan_of(inp, {HEAVY: "spec-k4"})  # e.g. pinned there
    assert desired.targets(inp, plan, SCALING)["spec-k4"] == 16.0
    assert [p.name for p in FIXED] == ["spec-k4", "spec-k2", "nospec"]
