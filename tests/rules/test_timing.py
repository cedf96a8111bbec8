"""The guard's wall-clock rules on plain floats: due, rebase after a backward step, stabilisation credit."""

from __future__ import annotations

import pytest

from specguard.rules import policy as policy_mod
from specguard.rules import timing
from specguard.rules.classstate import ClassState, Pending, RuleState

KEY = ("chat", "t0", "low")
LIMITS = policy_mod.Limits(interval_seconds=10, stabilization_window_seconds=60)
RULE = policy_mod.Rule(name="rc", measure="rc", threshold=1.0, restore_threshold=0.95, limits=LIMITS)


def st(**fields):
    return ClassState(key=KEY, pool="spec-k4", **fields)


@pytest.mark.parametrize(
    ("last", "now", "expected"),
    [
        pytest.param(None, 100.0, True, id="never-evaluated"),
        pytest.param(95.0, 100.0, False, id="inside-the-interval"),
        pytest.param(91.0, 100.0, True, id="a-little-early-within-10pct-slack"),
        pytest.param(500.0, 100.0, True, id="last-in-the-future-after-a-backward-step"),
    ],
)
def test_due(last, now, expected):
    state = st(rules={"rc": RuleState(last_evaluated_at=last)})
    assert timing.due(state, RULE, now) is expected


def test_rebase_leaves_a_sane_state_alone_and_clamps_future_times_to_now():
    sane = st(last_action_at=50.0, action_times=(50.0,), rules={"rc": RuleState(failure_times=(40.0,))})
    assert timing.rebase(sane, 100.0) is sane
    stale = st(
        last_action_at=900.0,
        action_times=(50.0, 900.0),
        pending=Pending("spec-k4", "spec-k2", 0.8, 950.0),
        rules={"rc": RuleState(failure_times=(40.0, 800.0), good_since=700.0, last_evaluated_at=990.0)},
    )
    rebased = timing.rebase(stale, 100.0)
    assert rebased.last_action_at == 100.0 and rebased.action_times == (50.0, 100.0)
    assert rebased.pending.at == 100.0
    rs = rebased.rule("rc")
    assert (rs.failure_times, rs.good_since, rs.last_evaluated_at) == ((40.0, 100.0), 100.0, 990.0)


@pytest.mark.parametrize(
    ("good_since", "successes", "now", "expected"),
    [
        pytest.param(None, 0, 100.0, 0.0, id="no-streak"),
        pytest.param(70.0, 4, 100.0, 30.0, id="real-time-when-evaluations-kept-up"),
        pytest.param(0.0, 2, 10_000.0, 20.0, id="forward-jump-credits-2-intervals-per-gap"),
    ],
)
def test_good_for(good_since, successes, now, expected):
    rs = RuleState(good_since=good_since, consecutive_successes=successes)
    assert timing.good_for(rs, LIMITS, now) == expected


def test_rate_gate_and_recent_count_the_last_hour_only():
    policy = policy_mod.Policy(rules=(RULE,), cooldown_seconds=30, max_actions_per_hour=2)
    assert timing.recent((0.0, 3000.0, 3700.0), 4000.0) == (3000.0, 3700.0)
    assert timing.rate_gate(st(paused=True), 100.0, policy) == "paused by operator"
    assert "cooldown" in timing.rate_gate(st(last_action_at=3990.0), 4000.0, policy)
    capped = st(last_action_at=3700.0, action_times=(0.0, 3000.0, 3700.0))
    expected = "actions in the last hour (2) >= max_actions_per_hour (2)"
    assert timing.rate_gate(capped, 4000.0, policy) == expected
    assert timing.rate_gate(st(action_times=(0.0, 100.0)), 4000.0, policy) is None
