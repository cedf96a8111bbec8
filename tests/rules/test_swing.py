"""A load swinging faster than the evaluation interval (``rules.swing``): detected from the window's
slices, and one plan held for both of its loads."""

from __future__ import annotations

from dataclasses import replace

from specguard.rules import planfeed, swing
from specguard.rules import planner as pl
from tests.rules.test_planner import HEAVY, heavy_case

CODE, CHAT = ("code", "greedy", "low"), ("chat", "medium", "low")


def series(*totals):
    """Slices with the fleet's demand split 3:1 between two classes."""
    return [{CODE: t * 0.75, CHAT: t * 0.25} for t in totals]


def test_a_load_jumping_between_two_levels_is_a_swing_with_both_loads():
    found = swing.detect(series(24, 24, 128, 128, 24, 24, 128))
    assert found is not None
    assert found.peak == 128 and found.trough == 24 and found.high_share == 3 / 7
    assert found.high == {CODE: 96.0, CHAT: 32.0} and found.low == {CODE: 18.0, CHAT: 6.0}


def test_steps_ramps_flat_loads_and_small_wobbles_are_not():
    assert swing.detect(series(24, 24, 24, 128, 128, 128, 128)) is None  # one step: one crossing
    assert swing.detect(series(24, 24, 128, 128, 24, 24, 24)) is None  # one burst: two
    assert swing.detect(series(128, 128, 24, 128, 128, 24, 128)) is None  # one-slice dips: jitter
    assert swing.detect(series(10, 20, 30, 40, 50, 60, 70)) is None  # a ramp
    assert swing.detect(series(50, 50, 50, 50, 50, 50, 50)) is None
    assert swing.detect(series(50, 60, 50, 60, 50, 60, 50)) is None  # within RATIO
    assert swing.detect(series(0, 0, 0, 0, 0, 0, 0)) is None
    assert swing.detect(series(10, 100)) is None  # too few slices to see a swing


def swinging_case():
    """The heavy class of tests/rules/test_planner.py swinging between 10 and 100 in flight, the
    light ones busy only at the high load; no-spec on two replicas."""
    pools = (pl.Pool("spec-k4", 4, 2), pl.Pool("spec-k2", 2, 1), pl.Pool("nospec", 0, 2))
    base = heavy_case()
    high = {k: pl.Demand(100.0 if k == HEAVY else base.demand[k].in_flight * 2) for k in base.demand}
    low = {k: pl.Demand(10.0 if k == HEAVY else 0.0) for k in base.demand}
    mean = {k: pl.Demand((high[k].in_flight + low[k].in_flight) / 2) for k in base.demand}
    return replace(base, pools=pools, demand=mean, scenarios=((0.5, high), (0.5, low)))


def test_the_held_plan_keeps_every_class_within_its_slo_at_both_loads():
    """The plan for the mean load moves the heavy class to no-spec, which at the low load puts it
    above its SLO (two no-spec replicas, never-speculate spreads it over five): the held plan keeps
    it on K=4, and says why."""
    inp = swinging_case()
    mean = pl.plan(replace(inp, scenarios=()))
    assert mean.pools[HEAVY] == "nospec"
    (_, high), (_, low) = inp.scenarios
    assert pl.slo_breaks(replace(inp, demand=low, scenarios=()), mean.pools) == [HEAVY]
    held = swing.hold(inp, mean)
    assert held.pools == inp.current and not held.moves
    for _, demand in inp.scenarios:
        assert pl.slo_breaks(replace(inp, demand=demand, scenarios=()), held.pools) == []
    assert (
        "one plan held for a load swinging between 10.0 and 108.0 requests in decode" in held.reasons[HEAVY]
    )
    assert held.reasons[HEAVY].startswith("stays on spec-k4")


def test_without_a_swing_the_plan_is_the_planners():
    inp = replace(swinging_case(), scenarios=())
    assert planfeed.decide(inp).plan == pl.plan(inp)
    swung = planfeed.decide(swinging_case())
    assert swung.plan is not None and swung.plan.pools[HEAVY] == "spec-k4"
    assert swung.planned[HEAVY[:2]][0] == "spec-k4" and "swinging" in swung.planned[HEAVY[:2]][1]


def test_a_held_plan_that_gains_at_both_loads_replaces_the_plan_now():
    """Everything on no-spec, the heavy class sure to pay on K=4 (rc 0.5): the high load's plan
    moves it, and the held plan takes that move."""
    inp = swinging_case()
    cells = {**inp.cells, HEAVY: {"spec-k4": pl.Estimate("spec-k4", 0.5, "measured", 100, "", 0.48, 0.52)}}
    inp = replace(inp, cells=cells, current=dict.fromkeys(inp.current, "nospec"))
    held = swing.hold(inp, pl.plan(replace(inp, scenarios=())))
    assert held.pools[HEAVY] == "spec-k4" and HEAVY in held.moves
    assert held.tokens > held.tokens_now * (1 + inp.margin)
    assert "plan gains" in held.reasons[HEAVY]
