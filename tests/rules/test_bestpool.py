"""The best-pool choice (``rules.bestpool``) and its use by the state machine, on a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard.rules import bestpool, guard
from specguard.rules.evidence import Evidence, PoolEvidence
from tests.rules.test_guard import POLICY, st

SPREAD = 0.03  # the relative half-width of every interval here unless given


def bounds(rc, spread=SPREAD):
    return {"rc_lower": rc * (1 - spread), "rc_upper": rc * (1 + spread)}


def measured(name, rc, samples=50, spread=SPREAD):
    return PoolEvidence(pool=name, values={"rc": rc, **bounds(rc, spread)}, samples=samples)


def whatif(name, rc, method="histogram", samples=50, spread=SPREAD):
    values = {"rc": rc, **bounds(rc, spread)}
    return PoolEvidence(pool=name, values=values, samples=samples, predicted=True, method=method)


def ev(*pools, prior=None, spread=SPREAD):
    prior = dict(prior or {})
    return Evidence(
        pools={p.pool: p for p in pools},
        prior=prior,
        prior_bounds={name: (rc * (1 - spread), rc * (1 + spread)) for name, rc in prior.items()},
    )


# (pool now, evidence, memory, policy changes, expected (pool, basis) or None)
CHOICES = [
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.70), whatif("spec-k2", 0.63)),
        {},
        {},
        ("spec-k2", "what-if"),
        id="shorter-k-cheaper-by-the-margin",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.70), whatif("spec-k2", 0.69)),
        {},
        {},
        None,
        id="within-the-margin-stays",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.70), whatif("spec-k2", 0.63)),
        {"spec-k2": (0.75, 95.0)},
        {},
        None,
        id="memory-of-a-worse-measurement-beats-the-prediction",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.70), whatif("spec-k2", 0.63)),
        {"spec-k2": (0.75, -4000.0)},
        {},
        ("spec-k2", "what-if"),
        id="expired-memory-is-forgotten",
    ),
    pytest.param(
        "spec-k4",
        ev(prior={"spec-k4": 1.36, "spec-k2": 1.15}),
        {},
        {},
        ("nospec", "definition"),
        id="warm-start-from-the-profile",
    ),
    pytest.param(
        "spec-k4",
        ev(prior={"spec-k4": 1.36, "spec-k2": 1.15}),
        {},
        {"prior": "none"},
        None,
        id="prior-none-ignores-the-profile",
    ),
    pytest.param(  # the thin what-if once hid the profile's K=2, so the warm start went off
        "spec-k4",
        ev(
            measured("spec-k4", 1.12, samples=4),
            whatif("spec-k2", 0.871, samples=4),
            prior={"spec-k4": 1.08, "spec-k2": 0.886},
        ),
        {},
        {},
        ("spec-k2", "profile"),
        id="a-thin-what-if-does-not-hide-the-profile",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.70), whatif("spec-k2", 0.60), prior={"spec-k4": 0.69, "spec-k2": 0.70}),
        {},
        {},
        ("spec-k2", "what-if"),
        id="a-well-supported-what-if-beats-the-profile",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.40), prior={"spec-k4": 0.39, "spec-k2": 0.47}),
        {},
        {},
        None,
        id="live-evidence-overrides-the-profile",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.80), prior={"spec-k4": 0.668, "spec-k2": 0.55}),
        {},
        {},
        ("spec-k2", "profile"),
        id="profile-ratio-scaled-to-the-live-level",
    ),
    pytest.param(
        "spec-k2",
        ev(measured("spec-k2", 0.63), whatif("spec-k4", 0.50, "extrapolated")),
        {},
        {},
        None,
        id="longer-k-not-on-an-extrapolation",
    ),
    pytest.param(
        "spec-k2",
        ev(measured("spec-k2", 0.63), whatif("spec-k4", 0.50, "extrapolated")),
        {},
        {"restore_on_prediction": True},
        ("spec-k4", "extrapolated"),
        id="longer-k-on-an-extrapolation-when-allowed",
    ),
    pytest.param(
        "spec-k2",
        ev(measured("spec-k2", 0.75)),
        {"spec-k4": (0.66, 90.0)},
        {},
        None,
        id="an-old-measurement-alone-moves-nothing",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 1.08)),
        {},
        {},
        ("nospec", "definition"),
        id="no-spec-costs-one-by-definition",
    ),
    pytest.param(
        "nospec",
        ev(measured("spec-k4", 0.5)),
        {},
        {},
        None,
        id="back-from-no-spec-is-the-restore-rule",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.70), whatif("spec-k2", 0.5)),
        {},
        {"best_pool": False},
        None,
        id="disabled",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.70, samples=5), whatif("spec-k2", 0.5)),
        {},
        {},
        None,
        id="too-few-samples-on-the-current-pool",
    ),
    pytest.param(  # the real tier's creative class, moved off on its point with n=12
        "spec-k4",
        ev(PoolEvidence("spec-k4", {"rc": 1.239, "rc_lower": 0.88, "rc_upper": 1.63}, samples=50)),
        {},
        {},
        None,
        id="off-speculation-needs-the-lower-bound-past-one",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.70), whatif("spec-k2", 0.63, spread=0.2)),
        {},
        {},
        None,
        id="a-what-if-whose-interval-does-not-clear-moves-nothing",
    ),
    pytest.param(
        "spec-k4",
        ev(measured("spec-k4", 0.70), PoolEvidence("spec-k2", {"rc": 0.5}, 50, True, method="histogram")),
        {},
        {},
        None,
        id="an-estimate-without-an-interval-moves-nothing",
    ),
    pytest.param(
        "spec-k4",
        ev(prior={"spec-k4": 1.36, "spec-k2": 1.15}, spread=0.3),
        {},
        {},
        None,
        id="a-warm-start-on-a-wide-profile-interval-waits",
    ),
]


@pytest.mark.parametrize(("pool", "evidence", "memory", "changes", "expected"), CHOICES)
def test_choose(pool, evidence, memory, changes, expected):
    choice = bestpool.choose(pool, evidence, memory, 100.0, replace(POLICY, **changes))
    assert (None if choice is None else (choice.best.pool, choice.best.basis)) == expected
    if choice is not None:
        assert choice.best.upper < choice.current.lower * (1 - POLICY.best_pool_margin)
        assert choice.best.pool in choice.reason and "cheaper per token" in choice.reason
        assert "beyond" in choice.reason and "interval" in choice.reason


def test_memory_moves_back_only_to_where_an_unconfirmed_move_came_from():
    evidence, memory = ev(measured("spec-k2", 0.75)), {"spec-k4": (0.66, 90.0, 0.64, 0.68)}
    choice = bestpool.choose("spec-k2", evidence, memory, 100.0, POLICY, came_from="spec-k4")
    assert (choice.best.pool, choice.best.basis) == ("spec-k4", "memory")
    assert bestpool.choose("spec-k2", evidence, memory, 100.0, POLICY, came_from="nospec") is None
    # a memory without its interval blocks but never moves
    assert bestpool.choose("spec-k2", evidence, {"spec-k4": (0.66, 90.0)}, 100.0, POLICY, "spec-k4") is None


def test_scaled_profile_value():
    found = bestpool.estimates(
        "spec-k4", ev(measured("spec-k4", 0.80), prior={"spec-k4": 0.64, "spec-k2": 0.60}), {}, 0.0, POLICY
    )
    assert found["spec-k2"].rc == pytest.approx(0.60 * 0.80 / 0.64)
    assert found["nospec"].rc == 1.0


def test_remember_keeps_fresh_measurements_only():
    memory = {"spec-k2": (0.7, 0.0), "spec-k4": (0.5, 90.0)}
    policy = replace(POLICY, memory_seconds=50)
    out = bestpool.remember(memory, ev(measured("spec-k4", 0.6), whatif("spec-k2", 0.5)), 100.0, policy)
    # k2's memory expired; a prediction is never remembered; a measurement with its interval
    assert out == {"spec-k4": pytest.approx((0.6, 100.0, 0.6 * (1 - SPREAD), 0.6 * (1 + SPREAD)))}


# ---------------------------------------------------------------- in the state machine


def run(evidences, state=None, policy=POLICY, start=10.0, every=10.0):
    state = state or st()
    decisions = []
    now = start
    for evidence in evidences:
        state, decision = guard.step(state, evidence, now, policy)
        decisions.append(decision)
        now += every
    return state, decisions


CHEAPER_K2 = ev(measured("spec-k4", 0.70), whatif("spec-k2", 0.63))


def test_moves_after_the_consecutive_limit_and_waits_for_confirmation():
    state, decisions = run([CHEAPER_K2] * 3)
    assert [d.action for d in decisions] == ["none", "none", "shorten"]
    last = decisions[-1]
    assert (last.cause, last.to_pool, state.pool) == ("best_pool", "spec-k2", "spec-k2")
    assert "consecutive evaluations (3) > best_pool_consecutive_limit (2)" in last.reason
    assert last.numbers["target_basis"] == "what-if"
    assert state.pending is not None and state.pending.predicted_rc == pytest.approx(0.63)
    assert state.memory["spec-k4"][:2] == (0.70, 30.0)


def test_a_streak_favouring_another_pool_starts_over():
    cheaper_nospec = ev(measured("spec-k4", 1.2), whatif("spec-k2", 1.1))
    _, decisions = run([CHEAPER_K2, CHEAPER_K2, cheaper_nospec, CHEAPER_K2])
    assert all(d.action == "none" for d in decisions[:2]) and decisions[3].action == "none"


def test_warm_start_acts_on_the_first_evaluation():
    state, decisions = run([ev(prior={"spec-k4": 0.668, "spec-k2": 0.55})])
    assert (decisions[0].action, decisions[0].cause, state.pool) == ("shorten", "profile", "spec-k2")
    assert "no live evidence yet" in decisions[0].reason


def test_best_pool_respects_cooldown_and_dry_run():
    state = st(last_action_at=25.0)
    state, decisions = run([CHEAPER_K2] * 3, state=state)
    assert decisions[-1].action == "none" and "waiting: cooldown" in decisions[-1].reason
    _, decisions = run([CHEAPER_K2] * 3, policy=replace(POLICY, dry_run=True))
    assert decisions[-1].dry_run and decisions[-1].action == "shorten" and not decisions[-1].changes_plan


def test_no_flapping_when_the_prediction_was_wrong():
    """K=2 predicted 0.63 but measures 0.80: back to K=4 once, then the memory holds it there."""
    on_k2 = ev(measured("spec-k2", 0.80), whatif("spec-k4", 0.55, "extrapolated"))
    state, first = run([CHEAPER_K2] * 3)
    state, second = run([on_k2] * 8, state=state, start=100.0)
    state, third = run([CHEAPER_K2] * 60, state=state, start=200.0)
    moves = [(d.action, d.to_pool) for d in first + second + third if d.changes_plan]
    assert moves == [("shorten", "spec-k2"), ("lengthen", "spec-k4")]
    assert state.pool == "spec-k4"
    back = next(d for d in second if d.changes_plan)
    assert back.at == 120.0  # undoing a wrong prediction is a correction: no reversal wait
    assert state.reversal_times == ()


K4_CHEAPER = ev(measured("spec-k4", 0.60), measured("spec-k2", 0.70))
K2_CHEAPER = ev(measured("spec-k4", 0.70), measured("spec-k2", 0.60))
FLAP_POLICY = replace(POLICY, max_actions_per_hour=6, cooldown_seconds=20)


def test_no_flapping_when_the_cheaper_pool_alternates_faster_than_the_stabilization_window():
    """A load bucket spanning the knee made K=4 and K=2 alternate as the cheaper
    pool; the class moved back and forth up to the cap. A move back to the pool the class just left
    now needs the cheaper estimate to hold for the stabilization window (doubling per reversal)."""
    blocks = ([K2_CHEAPER] * 4 + [K4_CHEAPER] * 4) * 45  # one hour at 10 s
    state, decisions = run(blocks, policy=FLAP_POLICY)
    moves = [(d.at, d.action, d.to_pool) for d in decisions if d.changes_plan]
    assert [m[1:] for m in moves] == [("shorten", "spec-k2")]
    waiting = [d.reason for d in decisions if "back to spec-k4" in d.reason]
    assert waiting and "stabilization" in waiting[0]


def test_a_lasting_change_is_still_followed_after_the_window():
    window = FLAP_POLICY.rules[0].limits.stabilization_window_seconds
    needed = int(window / FLAP_POLICY.interval_seconds)
    state, decisions = run([K2_CHEAPER] * 3 + [K4_CHEAPER] * (needed + 2), policy=FLAP_POLICY)
    moves = [(d.action, d.to_pool) for d in decisions if d.changes_plan]
    assert moves == [("shorten", "spec-k2"), ("lengthen", "spec-k4")]
    back = next(d for d in decisions if d.changes_plan and d.to_pool == "spec-k4")
    assert back.at - decisions[2].at >= window
    assert state.reversal_times == (back.at,)
    # the next reversal needs twice the window
    state, decisions = run([K2_CHEAPER] * (needed + 2), state=state, policy=FLAP_POLICY, start=back.at + 10)
    assert not any(d.changes_plan for d in decisions)


# ---------------------------------------------------------------- provenance


def test_a_stale_memory_of_the_current_pool_never_moves_the_class():
    """The live demo moved code/greedy off spec-k4 on "spec-k4 1.040 (memory)" while this window's
    few requests there measured 0.49: the pool a class is on needs this window's measurement."""
    memory = {"spec-k4": (1.04, 100.0 - 1800)}
    few = ev(measured("spec-k4", 0.49, samples=5))
    assert bestpool.choose("spec-k4", few, memory, 100.0, POLICY, load_bucket="medium") is None
    _, decisions = run([few] * 4, state=st(memory=memory), start=100.0)
    assert [d.action for d in decisions] == ["none"] * 4


def test_every_estimate_says_which_measurement_when_and_at_which_load():
    evidence = ev(
        PoolEvidence("spec-k4", {"rc": 0.70, **bounds(0.70)}, samples=88, baseline_source="live"),
        PoolEvidence(
            "spec-k2",
            {"rc": 0.60, **bounds(0.60)},
            samples=88,
            predicted=True,
            method="histogram",
            made_from="spec-k4",
        ),
        prior={"spec-k4": 0.64, "spec-k4x": 0.5},
    )
    found = bestpool.estimates("spec-k4", evidence, {"spec-k2": (0.9, 45.0)}, 100.0, POLICY, "medium")
    assert found["spec-k4"].text() == (
        "spec-k4 0.700 [0.679, 0.721] (measured: last 300 s at load medium, n=88, baseline live)"
    )
    assert found["spec-k2"].text() == "spec-k2 0.900 (no interval) (memory: measured 55 s ago at load medium)"
    assert found["nospec"].text() == "nospec 1.000 (definition: no speculation)"
    without_memory = bestpool.estimates("spec-k4", evidence, {}, 100.0, POLICY, "medium")
    assert without_memory["spec-k2"].text() == (
        "spec-k2 0.600 [0.582, 0.618] (what-if: from 88 requests measured on spec-k4 at load medium)"
    )
    choice = bestpool.choose("spec-k4", evidence, {}, 100.0, POLICY, load_bucket="medium")
    assert "(what-if: from 88 requests measured on spec-k4 at load medium)" in choice.reason
    assert "(measured: last 300 s at load medium, n=88, baseline live)" in choice.reason
    assert "beyond both intervals: 0.618 < 0.679 x (1 - best_pool_margin 0.03)" in choice.reason


def test_a_rule_breach_says_where_its_number_comes_from():
    bad = ev(PoolEvidence("spec-k4", {"rc": 1.2, **bounds(1.2)}, samples=50, baseline_source="profile"))
    _, decisions = run([bad, bad], state=st())
    off = decisions[-1]
    assert off.action == "off"
    assert (
        "rc_lower (1.164) > threshold (1.0) [measured on spec-k4 at load low over the last 300 s, n=50, "
        "baseline profile]"
    ) in off.reason
    predicted = PoolEvidence("spec-k2", {"rc": 0.8}, samples=50, predicted=True, made_from="spec-k4")
    assert predicted.provenance("high", 300) == (
        "what-if from 50 requests measured on spec-k4 at load high over the last 300 s"
    )


def on_model(name, rc, lower, upper=None):
    """A measurement whose baseline is the step-cost model (no live or profile one)."""
    values = {"rc": rc, "rc_lower": lower, "rc_upper": upper if upper is not None else rc * 1.2}
    return PoolEvidence(pool=name, values=values, samples=50, baseline_source="model")


def test_off_speculation_only_on_the_lower_bound_and_between_pools_beyond_both_intervals():
    # point estimate 1.10 (no-spec at 1.0 is cheaper by 9%), but the lower bound 0.96 is not past 1.0
    unsure = bestpool.choose("spec-k4", ev(on_model("spec-k4", 1.10, 0.96)), {}, 0.0, POLICY)
    assert unsure is None
    sure = bestpool.choose("spec-k4", ev(on_model("spec-k4", 1.30, 1.12)), {}, 0.0, POLICY)
    assert sure is not None and sure.best.pool == "nospec"
    assert "spec-k4 1.300 [1.120, 1.560]" in sure.reason
    # the K=2 what-if made from that measurement carries its relative interval: [0.698, 0.960]
    # does not clear 0.96 x 0.97, so no move on its point 0.80 either
    k2 = PoolEvidence(
        "spec-k2", {"rc": 0.80, "rc_lower": 0.698, "rc_upper": 0.96}, 50, True, method="histogram"
    )
    assert bestpool.choose("spec-k4", ev(on_model("spec-k4", 1.10, 0.96), k2), {}, 0.0, POLICY) is None


def test_a_what_if_from_the_current_pool_is_judged_on_its_ratios_interval():
    """K=2's what-if made from K=4's own requests: the baseline cancels in the benefit, so a K=4
    interval of +-10% (most of it the baseline's) does not hide an 11% gain whose ratio is known to
    +-3%; the same what-if with a ratio known to +-10% moves nothing."""
    current = measured("spec-k4", 0.70, spread=0.10)
    tight = PoolEvidence(
        "spec-k2",
        {"rc": 0.62, **bounds(0.62, 0.10), "ratio_spread": 0.03},
        50,
        True,
        method="histogram",
        made_from="spec-k4",
    )
    choice = bestpool.choose("spec-k4", ev(current, tight), {}, 0.0, POLICY)
    assert choice is not None and choice.best.pool == "spec-k2"
    assert "beyond the ratio's interval: 0.886, up to 0.913 < 1 - margin 0.03" in choice.reason
    loose = replace(tight, values={**tight.values, "ratio_spread": 0.10})
    assert bestpool.choose("spec-k4", ev(current, loose), {}, 0.0, POLICY) is None
    # made from another pool's requests: the two intervals, each whole
    other = replace(tight, made_from="spec-k8")
    assert bestpool.choose("spec-k4", ev(current, other), {}, 0.0, POLICY) is None


def test_two_measured_pools_are_compared_on_their_spec_sides():
    k4 = PoolEvidence("spec-k4", {"rc": 0.70, **bounds(0.70, 0.10), "spec_spread": 0.03}, samples=50)
    k2 = PoolEvidence("spec-k2", {"rc": 0.62, **bounds(0.62, 0.10), "spec_spread": 0.03}, samples=50)
    choice = bestpool.choose("spec-k4", ev(k4, k2), {}, 0.0, POLICY)
    assert choice is not None and "ratio's interval: 0.886, up to 0.924" in choice.reason
