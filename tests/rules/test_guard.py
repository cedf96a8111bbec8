"""The guard state machine, one table row per rule of the policy, on a fake clock (plain floats)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard.rules import guard
from specguard.rules import policy as policy_mod
from specguard.rules.evidence import AlertEvidence, Evidence, PoolEvidence
from specguard.rules.guard import ClassState, Pending, Phase, RuleState

KEY = ("chat", "t0", "low")
LIMITS = policy_mod.Limits(
    consecutive_failure_limit=1,  # act on the 2nd bad evaluation in a row
    failure_limit=3,  # ... or the 4th in the failure window
    failure_window_seconds=600,
    consecutive_success_limit=2,
    consecutive_error_limit=2,
    stabilization_window_seconds=60,
    min_samples=10,
    interval_seconds=10,
)
RC = policy_mod.Rule(name="rc", measure="rc", threshold=1.0, restore_threshold=0.95, limits=LIMITS)
POLICY = policy_mod.Policy(
    rules=(RC,),
    cooldown_seconds=30,
    max_actions_per_hour=3,
    alerts=policy_mod.AlertsPolicy(enabled=False),
    default_pool="spec-k4",
    nospec_pool="nospec",
    pools={"spec-k4": 4, "spec-k2": 2, "nospec": 0},
)


def pool(name, rc, samples=50, predicted=False, **values):
    """A pool's evidence; its interval is the point itself unless given (a certain measurement: the
    rules read the bounds, never the point)."""
    bounds = {"rc_lower": rc, "rc_upper": rc}
    return PoolEvidence(
        pool=name, values={"rc": rc, **bounds, **values}, samples=samples, predicted=predicted
    )


def ev(*pools, alerts=(), error=None):
    return Evidence(pools={p.pool: p for p in pools}, alerts=tuple(alerts), error=error)


def st(pool="spec-k4", **fields):
    return ClassState(key=KEY, pool=pool, **fields)


def rs(**fields):
    return {"rc": RuleState(**fields)}


BAD = ev(pool("spec-k4", 1.2))
GOOD = ev(pool("spec-k4", 0.8))
BAD_K2_GOOD = ev(pool("spec-k4", 1.2), pool("spec-k2", 0.85, predicted=True))


# (prior, evidence, now, expected phase, action, pool after, reason fragment)
CASES = [
    # --- too little data is hold, and counts neither way
    pytest.param(
        st(),
        ev(pool("spec-k4", 1.5, samples=3)),
        100,
        "hold",
        "none",
        "spec-k4",
        "samples (3) < min_samples (10)",
        id="few-samples-hold",
    ),
    pytest.param(st(), ev(), 100, "hold", "none", "spec-k4", "no data for pool spec-k4", id="no-data-hold"),
    pytest.param(
        st(),
        ev(pool("spec-k4", float("nan"))),
        100,
        "hold",
        "none",
        "spec-k4",
        "no value for rc",
        id="nan-hold",
    ),
    # --- good evidence on the default pool: ok
    pytest.param(
        st(), GOOD, 100, "ok", "none", "spec-k4", "rc_lower (0.800) within threshold (1.0)", id="good-ok"
    ),
    # --- consecutive failure limit: 1st bad evaluation holds, 2nd acts
    pytest.param(
        st(),
        BAD,
        100,
        "hold",
        "none",
        "spec-k4",
        "consecutive_failures (1) <= consecutive_failure_limit (1)",
        id="first-failure-holds",
    ),
    pytest.param(
        st(rules=rs(consecutive_failures=1, failure_times=(90,))),
        BAD,
        100,
        "act",
        "off",
        "nospec",
        "consecutive_failures (2) > consecutive_failure_limit (1)",
        id="second-failure-acts-off",
    ),
    # --- cumulative failure limit: intermittent badness (never 2 in a row) acts on the 4th in the window
    pytest.param(
        st(rules=rs(consecutive_failures=0, failure_times=(10, 30, 50))),
        BAD,
        100,
        "act",
        "off",
        "nospec",
        "failures in 600 s (4) > failure_limit (3)",
        id="cumulative-failures-act",
    ),
    pytest.param(
        st(rules=rs(consecutive_failures=0, failure_times=(-600, -550, 50))),
        BAD,
        100,
        "hold",
        "none",
        "spec-k4",
        "consecutive_failures (1)",
        id="old-failures-leave-the-window",
    ),
    # --- a good evaluation resets the consecutive counter
    pytest.param(
        st(rules=rs(consecutive_failures=1, failure_times=(90,))),
        GOOD,
        100,
        "ok",
        "none",
        "spec-k4",
        "within threshold",
        id="good-resets-streak",
    ),
    # --- shorten K: a shorter pool predicted good wins over off
    pytest.param(
        st(rules=rs(consecutive_failures=1, failure_times=(90,))),
        BAD_K2_GOOD,
        100,
        "act",
        "shorten",
        "spec-k2",
        "rc_lower (1.200) > threshold (1.0)",
        id="shorten-to-k2",
    ),
    pytest.param(
        st(rules=rs(consecutive_failures=1, failure_times=(90,))),
        ev(pool("spec-k4", 1.2), pool("spec-k2", 0.97, predicted=True)),
        100,
        "act",
        "off",
        "nospec",
        "consecutive_failures (2)",
        id="k2-not-good-enough-goes-off",
    ),
    # --- a shortened pool measured bad is reverted to no-spec
    pytest.param(
        st(
            "spec-k2",
            pending=Pending("spec-k4", "spec-k2", 0.85, 0),
            rules=rs(consecutive_failures=1, failure_times=(90,)),
        ),
        ev(pool("spec-k2", 1.1)),
        100,
        "act",
        "revert",
        "nospec",
        "measurement disagrees with the prediction (0.850)",
        id="revert-disagreeing-shorten",
    ),
    pytest.param(
        st("spec-k2", pending=Pending("spec-k4", "spec-k2", 0.85, 0), confirm_successes=1),
        ev(pool("spec-k2", 0.86)),
        100,
        "ok",
        "confirm",
        "spec-k2",
        "(predicted 0.850)",
        id="confirm-shorten",
    ),
    pytest.param(
        st("spec-k2", pending=Pending("spec-k4", "spec-k2", 0.85, 0)),
        ev(pool("spec-k2", 0.86)),
        100,
        "hold",
        "none",
        "spec-k2",
        "confirming spec-k2: consecutive_successes (1) < 2",
        id="confirm-needs-a-streak",
    ),
    # --- cooldown and the cap per hour
    pytest.param(
        st(rules=rs(consecutive_failures=1, failure_times=(90,)), last_action_at=80),
        BAD,
        100,
        "hold",
        "none",
        "spec-k4",
        "cooldown: 20 s since the last action < cooldown_seconds (30)",
        id="cooldown-blocks",
    ),
    pytest.param(
        st(
            rules=rs(consecutive_failures=1, failure_times=(90,)),
            last_action_at=60,
            action_times=(-3000, 0, 60),
        ),
        BAD,
        100,
        "hold",
        "none",
        "spec-k4",
        "actions in the last hour (3) >= max_actions_per_hour (3)",
        id="cap-per-hour-blocks",
    ),
    pytest.param(
        st(
            rules=rs(consecutive_failures=1, failure_times=(90,)),
            last_action_at=60,
            action_times=(-3600, 0, 60),
        ),
        BAD,
        100,
        "act",
        "off",
        "nospec",
        "consecutive_failures (2)",
        id="cap-counts-only-the-last-hour",
    ),
    # --- restore: hysteresis, success streak, stabilisation window
    pytest.param(
        st("nospec"),
        ev(pool("spec-k4", 0.97)),
        100,
        "ok",
        "none",
        "nospec",
        "rc_upper (0.970) not < restore_threshold (0.95)",
        id="hysteresis-0.97-stays-off",
    ),
    pytest.param(
        st("nospec"),
        ev(pool("spec-k4", 0.9)),
        100,
        "hold",
        "none",
        "nospec",
        "consecutive_successes (1) < consecutive_success_limit (2)",
        id="restore-needs-streak",
    ),
    pytest.param(
        st("nospec", candidate="spec-k4", rules=rs(consecutive_successes=1, good_since=80)),
        ev(pool("spec-k4", 0.9)),
        100,
        "hold",
        "none",
        "nospec",
        "good for 20 s < stabilization_window_seconds (60)",
        id="restore-waits-stabilisation",
    ),
    pytest.param(
        st("nospec", candidate="spec-k4", rules=rs(consecutive_successes=5, good_since=30)),
        ev(pool("spec-k4", 0.9)),
        100,
        "act",
        "restore",
        "spec-k4",
        "rc_upper (0.900) < restore_threshold",
        id="restore-after-window",
    ),
    pytest.param(
        st("nospec", candidate="spec-k4", rules=rs(consecutive_successes=5, good_since=30)),
        ev(pool("spec-k4", 0.9, samples=2)),
        100,
        "hold",
        "none",
        "nospec",
        "samples (2) < min_samples",
        id="restore-needs-data",
    ),
    pytest.param(
        st("nospec", candidate="spec-k4", rules=rs(consecutive_successes=5, good_since=30)),
        ev(pool("spec-k4", 0.9, predicted=True)),
        100,
        "hold",
        "none",
        "nospec",
        "only a prediction for pool spec-k4",
        id="no-restore-on-prediction",
    ),
    pytest.param(
        st("nospec", candidate="spec-k4", rules=rs(consecutive_successes=5, good_since=30)),
        ev(pool("spec-k4", 1.05)),
        100,
        "ok",
        "none",
        "nospec",
        "staying on nospec",
        id="bad-evidence-breaks-streak",
    ),
    pytest.param(
        st(
            "nospec", candidate="spec-k4", rules=rs(consecutive_successes=5, good_since=30), last_action_at=90
        ),
        ev(pool("spec-k4", 0.9)),
        100,
        "hold",
        "none",
        "nospec",
        "waiting: cooldown",
        id="restore-respects-cooldown",
    ),
    # --- a shortened class recovers to the default pool when it is measured good there
    pytest.param(
        st("spec-k2", candidate="spec-k4", rules=rs(consecutive_successes=5, good_since=30)),
        ev(pool("spec-k2", 0.9), pool("spec-k4", 0.8)),
        100,
        "act",
        "restore",
        "spec-k4",
        "on spec-k4",
        id="restore-from-shortened",
    ),
    # --- errors: counted, then the safe state is frozen; one good evaluation unfreezes without moving
    pytest.param(
        st(),
        ev(error="connection refused"),
        100,
        "error",
        "none",
        "spec-k4",
        "consecutive_errors (1) <= consecutive_error_limit (2)",
        id="first-error",
    ),
    pytest.param(
        st(consecutive_errors=2),
        ev(error="timeout"),
        100,
        "error",
        "freeze",
        "spec-k4",
        "consecutive_errors (3) > consecutive_error_limit (2): freeze in safe state last",
        id="error-freeze-last",
    ),
    pytest.param(
        st(consecutive_errors=5, frozen=True),
        ev(error="timeout"),
        100,
        "error",
        "none",
        "spec-k4",
        "frozen in safe state",
        id="frozen-stays",
    ),
    pytest.param(
        st(consecutive_errors=5, frozen=True),
        BAD,
        100,
        "ok",
        "unfreeze",
        "spec-k4",
        "unfrozen on spec-k4",
        id="unfreeze",
    ),
    pytest.param(
        st(rules=rs(consecutive_failures=1)),
        ev(PoolEvidence("spec-k4", {"rc": 1.3}, 50, errors={"rc": "HTTP 503"})),
        100,
        "error",
        "none",
        "spec-k4",
        "query failed: HTTP 503",
        id="rule-error-is-not-a-failure",
    ),
    # --- operator: pinned classes are not evaluated; paused classes are evaluated but never moved
    pytest.param(
        st("nospec", pin="nospec"), GOOD, 100, "hold", "none", "nospec", "pinned to nospec", id="pinned"
    ),
    pytest.param(
        st(paused=True, rules=rs(consecutive_failures=1, failure_times=(90,))),
        BAD,
        100,
        "hold",
        "none",
        "spec-k4",
        "waiting: paused by operator",
        id="paused",
    ),
    # --- interval: a rule evaluated 5 s ago (interval 10 s) is not due
    pytest.param(
        st(rules=rs(consecutive_failures=1, last_evaluated_at=95)),
        BAD,
        100,
        "hold",
        "none",
        "spec-k4",
        "no rule due",
        id="not-due",
    ),
    # --- clock jumps: a backward step never blinds the guard, a forward one is not stabilisation
    pytest.param(
        st(rules=rs(consecutive_failures=1, failure_times=(7290,), last_evaluated_at=7290)),
        BAD,
        100,
        "act",
        "off",
        "nospec",
        "consecutive_failures (2) > consecutive_failure_limit (1)",
        id="back-jump-is-due-now",
    ),
    pytest.param(
        st(rules=rs(consecutive_failures=1, failure_times=(90,)), last_action_at=7200, action_times=(7200,)),
        BAD,
        100,
        "hold",
        "none",
        "spec-k4",
        "cooldown: 0 s since the last action < cooldown_seconds (30)",
        id="back-jump-restarts-cooldown-from-now",
    ),
    pytest.param(
        st("nospec", candidate="spec-k4", rules=rs(consecutive_successes=2, good_since=30)),
        ev(pool("spec-k4", 0.9)),
        86400,
        "hold",
        "none",
        "nospec",
        "good for 40 s < stabilization_window_seconds (60)",
        id="forward-jump-credits-2-intervals-per-evaluation",
    ),
    pytest.param(
        st("nospec", candidate="spec-k4", rules=rs(consecutive_successes=5, good_since=7000)),
        ev(pool("spec-k4", 0.9)),
        100,
        "hold",
        "none",
        "nospec",
        "good for 0 s < stabilization_window_seconds (60)",
        id="back-jump-restarts-stabilisation-from-now",
    ),
]


@pytest.mark.parametrize(("prior", "evidence", "now", "phase", "action", "pool_after", "reason"), CASES)
def test_step(prior, evidence, now, phase, action, pool_after, reason):
    state, decision = guard.step(prior, evidence, now, POLICY)
    assert (decision.phase.value, decision.action, state.pool) == (phase, action, pool_after), decision.reason
    assert reason in decision.reason
    assert decision.from_pool == prior.pool
    assert decision.to_pool == (pool_after if action != "confirm" else prior.pool)


def test_every_decision_carries_the_numbers():
    _, decision = guard.step(st(rules=rs(consecutive_failures=1, failure_times=(90,))), BAD, 100, POLICY)
    assert decision.numbers["rules"]["rc@spec-k4"] == {
        "pool": "spec-k4",
        "phase": "act",
        "value": 1.2,
        "samples": 50,
    }
    record = decision.to_json()
    assert (record["from"], record["to"], record["load_bucket"]) == ("spec-k4", "nospec", "low")


def test_action_resets_counters_and_records_time():
    state, decision = guard.step(st(rules=rs(consecutive_failures=1, failure_times=(90,))), BAD, 100, POLICY)
    assert decision.action == "off"
    assert state.rule("rc").consecutive_failures == 0 and state.rule("rc").failure_times == ()
    assert (state.last_action_at, state.action_times) == (100, (100,))


def test_shorten_sets_pending_with_the_prediction():
    state, _ = guard.step(st(rules=rs(consecutive_failures=1, failure_times=(90,))), BAD_K2_GOOD, 100, POLICY)
    assert state.pending == Pending("spec-k4", "spec-k2", 0.85, 100)


@pytest.mark.parametrize(
    ("safe_state", "expected"), [("last", "spec-k4"), ("nospec", "nospec"), ("default", "spec-k4")]
)
def test_error_freeze_goes_to_the_declared_safe_state(safe_state, expected):
    policy = replace(POLICY, safe_state=safe_state)
    state, decision = guard.step(st(consecutive_errors=2), ev(error="down"), 100, policy)
    assert (decision.action, state.pool, state.frozen) == ("freeze", expected, True)


def test_dry_run_decides_but_keeps_the_plan():
    policy = replace(POLICY, dry_run=True)
    state, decision = guard.step(st(rules=rs(consecutive_failures=1, failure_times=(90,))), BAD, 100, policy)
    assert (decision.phase, decision.action, decision.to_pool, decision.dry_run) == (
        Phase.ACT,
        "off",
        "nospec",
        True,
    )
    assert not decision.changes_plan
    # nothing but the record: no cooldown, nothing counted against max_actions_per_hour
    assert (state.pool, state.last_action_at, state.action_times, state.pending) == (
        "spec-k4",
        None,
        (),
        None,
    )
    assert state.rule("rc").consecutive_failures == 0  # the next would-be action needs a new breach


def test_dry_run_rule_is_reported_never_acted_on():
    shadow = replace(RC, name="shadow", dry_run=True, limits=replace(LIMITS, consecutive_failure_limit=0))
    policy = replace(POLICY, rules=(replace(RC, threshold=2.0, restore_threshold=1.5), shadow))
    state, decision = guard.step(st(), BAD, 100, policy)
    assert (decision.phase, decision.action, state.pool) == (Phase.OK, "none", "spec-k4")
    assert decision.numbers["rules"]["shadow@spec-k4"]["phase"] == "act"
    assert decision.numbers["rules"]["shadow@spec-k4"]["dry_run"] is True


def test_disabled_limit_never_breaches():
    limits = replace(LIMITS, consecutive_failure_limit=-1, failure_limit=0)
    policy = replace(POLICY, rules=(replace(RC, limits=limits),))
    state, decision = guard.step(st(rules=rs(consecutive_failures=9)), BAD, 100, policy)
    assert decision.action == "off" and "failures in 600 s (1) > failure_limit (0)" in decision.reason


ALERT_POLICY = replace(
    POLICY,
    rules=(),
    alerts=policy_mod.AlertsPolicy(
        limits=policy_mod.Limits(
            consecutive_failure_limit=0,
            failure_limit=-1,
            consecutive_success_limit=2,
            stabilization_window_seconds=60,
            interval_seconds=10,
        )
    ),
)
FIRING = AlertEvidence("fp1", "SpecGuardRelativeCostAboveOne", firing=True)
RESOLVED = AlertEvidence("fp1", "SpecGuardRelativeCostAboveOne", firing=False)


def test_firing_alert_is_a_failed_evaluation_not_a_toggle():
    limits = replace(ALERT_POLICY.alerts.limits, consecutive_failure_limit=1)
    policy = replace(ALERT_POLICY, alerts=replace(ALERT_POLICY.alerts, limits=limits))
    state, first = guard.step(st(), ev(alerts=[FIRING]), 100, policy)
    assert (first.phase, first.action) == (Phase.HOLD, "none")
    state, second = guard.step(state, ev(alerts=[FIRING]), 110, policy)
    assert (second.action, state.pool) == ("off", "nospec")
    assert "alert SpecGuardRelativeCostAboveOne firing" in second.reason


def test_resolved_alert_is_recovery_evidence():
    state = st("nospec", last_action_at=0)
    decisions = []
    for now in range(100, 200, 10):
        state, decision = guard.step(state, ev(alerts=[RESOLVED]), now, ALERT_POLICY)
        decisions.append(decision)
    restored = [d for d in decisions if d.action == "restore"]
    assert [d.at for d in restored] == [160]  # 2 successes are not enough: 60 s of good evidence are
    assert state.pool == "spec-k4"


def test_alert_for_another_pool_is_ignored():
    state, decision = guard.step(st(), ev(alerts=[replace(FIRING, pool="spec-k2")]), 100, ALERT_POLICY)
    assert (decision.phase, decision.action) == (Phase.OK, "none")


@pytest.mark.parametrize(
    ("prior", "action", "pool", "expected"),
    [
        pytest.param(st(), "pin", "nospec", ("nospec", "nospec", False, "act"), id="pin-moves-at-once"),
        pytest.param(
            st("nospec", pin="nospec"), "unpin", None, ("nospec", None, False, "ok"), id="unpin-stays"
        ),
        pytest.param(st(), "pause", None, ("spec-k4", None, True, "hold"), id="pause"),
        pytest.param(st(paused=True), "resume", None, ("spec-k4", None, False, "ok"), id="resume"),
    ],
)
def test_operator_overrides(prior, action, pool, expected):
    state, decision = guard.override(prior, action, 5.0, pool=pool, reason="incident 42")
    assert (state.pool, state.pin, state.paused, decision.phase.value) == expected
    assert decision.action == action and decision.reason == "operator: incident 42"


def test_unknown_override_is_rejected():
    with pytest.raises(ValueError, match="unknown override action 'toggle'"):
        guard.override(st(), "toggle", 0.0)


def test_phase_precedence_is_one_order():
    assert guard.worst([Phase.OK, Phase.HOLD]) is Phase.HOLD
    assert guard.worst([Phase.HOLD, Phase.ACT]) is Phase.ACT
    assert guard.worst([Phase.ACT, Phase.ERROR, Phase.OK]) is Phase.ERROR
    assert guard.worst([]) is Phase.OK


def test_backward_jump_is_bounded_cooldown_then_acts():
    """After a 2 h backward step the cooldown lasts cooldown_seconds from now, not 2 h more."""
    prior = st(
        rules=rs(consecutive_failures=1, failure_times=(90,)), last_action_at=7200, action_times=(7200,)
    )
    state, first = guard.step(prior, BAD, 100, POLICY)
    assert first.action == "none" and state.last_action_at == 100
    state, later = guard.step(state, BAD, 130, POLICY)
    assert later.action == "off", later.reason


def exact_whatif(name, rc, samples=50, bounds=(0.95, 1.05)):
    """A what-if for a shorter K from the histograms measured on a longer one (exact acceptance),
    with the relative interval of the measurement it came from."""
    values = {"rc": rc, "rc_lower": rc * bounds[0], "rc_upper": rc * bounds[1]}
    return PoolEvidence(pool=name, values=values, samples=samples, predicted=True, method="histogram")


OFF_PROBES = ev(pool("spec-k4", 1.15, rc_lower=1.1), exact_whatif("spec-k2", 0.85))
K2_MEASURED_BAD = ev(pool("spec-k2", 1.1, rc_lower=1.05), pool("spec-k4", 1.15, rc_lower=1.1))


def test_an_off_class_comes_back_to_a_shorter_k_on_its_probes():
    """Probes on K=4 (losing) once showed K=2 would pay, but restore looked only at
    K=4, so the class stayed off for good. An exact what-if (acceptance measured on the probes) now
    counts as restore evidence for the shorter K; the move is pending until measured there."""
    state, decisions = st("nospec"), []
    for tick in range(12):
        state, decision = guard.step(state, OFF_PROBES, 100.0 + 10 * tick, POLICY)
        decisions.append(decision)
    moves = [(d.action, d.to_pool) for d in decisions if d.changes_plan]
    assert moves == [("restore", "spec-k2")]
    restored = next(d for d in decisions if d.changes_plan)
    assert restored.at - 100.0 >= LIMITS.stabilization_window_seconds
    assert state.pending is not None and (state.pending.from_pool, state.pending.to_pool) == (
        "nospec",
        "spec-k2",
    )
    # measured on K=2 and losing: back off, and the memory of that measurement keeps it off
    later = []
    now = restored.at + POLICY.cooldown_seconds
    for evidence in [K2_MEASURED_BAD] * 3 + [OFF_PROBES] * 20:
        state, decision = guard.step(state, evidence, now, POLICY)
        later.append(decision)
        now += 10
    assert [(d.action, d.to_pool) for d in later if d.changes_plan] == [("revert", "nospec")]
    assert state.pool == "nospec"


def test_a_restore_needs_the_what_ifs_upper_bound_below_the_threshold_not_its_point():
    """No move on a point estimate: K=2's what-if at 0.85 with an interval up to 1.02 is no reason
    to turn speculation back on; the same point with an interval up to 0.89 is."""
    wide = ev(pool("spec-k4", 1.15, rc_lower=1.1), exact_whatif("spec-k2", 0.85, bounds=(0.7, 1.2)))
    state = st("nospec")
    for tick in range(20):
        state, decision = guard.step(state, wide, 100.0 + 10 * tick, POLICY)
        assert not decision.changes_plan, decision.reason
    assert "rc_upper (1.020) not < restore_threshold (0.95)" in decision.reason


def test_a_longer_k_still_needs_a_measurement_to_restore():
    extrapolated = ev(
        pool("spec-k2", 1.2, rc_lower=1.1),
        PoolEvidence("spec-k4", {"rc": 0.8}, 50, True, method="extrapolated"),
    )
    state = st("nospec")
    for tick in range(12):
        state, decision = guard.step(state, extrapolated, 100.0 + 10 * tick, POLICY)
        assert not decision.changes_plan
