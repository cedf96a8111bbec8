"""A hold says its kind, what it waits for and until when: "too little data" is told apart from
"bad, within limits" (the engine's phase stays ``hold`` for both)."""

from __future__ import annotations

from dataclasses import replace

from specguard.rules import guard, holds
from specguard.rules.classstate import HOLD_BAD, HOLD_DATA, HOLD_OPERATOR, HOLD_RATE, HOLD_RECOVERING
from tests.rules.test_guard import BAD, GOOD, POLICY, ev, pool, st


def step(state, evidence, now):
    new, decision = guard.step(state, evidence, now, POLICY)
    return new, decision, holds.wait(decision, new, POLICY)


def test_too_little_data_and_bad_within_limits_are_two_kinds_of_hold():
    few = ev(pool("spec-k4", 1.5, samples=4))  # min_samples is 10
    new, decision, wait = step(st(), few, 100.0)
    assert decision.phase is guard.Phase.HOLD and decision.hold == HOLD_DATA
    assert wait.words == "too little data"
    assert wait.waiting_for.startswith("6 more requests of this class on spec-k4")
    assert (wait.until, wait.until_what) == (110.0, holds.NEXT_EVALUATION)  # interval 10 s

    new, decision, wait = step(st(), BAD, 100.0)  # the 1st bad evaluation; it acts on the 2nd
    assert decision.phase is guard.Phase.HOLD and decision.hold == HOLD_BAD
    assert wait.words == "bad, within limits"
    assert wait.waiting_for.startswith("1 more bad evaluation of rc before it moves the class")
    assert (wait.until, wait.until_what) == (110.0, holds.EARLIEST_MOVE)
    assert decision.to_json()["hold"] == HOLD_BAD and decision.to_json()["phase"] == "hold"

    moved, decision, _ = step(new, BAD, 110.0)
    assert (
        decision.phase is guard.Phase.ACT
        and decision.hold == ""
        and holds.wait(decision, moved, POLICY) is None
    )


def test_a_move_held_by_the_cooldown_says_when_it_opens():
    recent = st(last_action_at=95.0, action_times=(95.0,))
    new, _, _ = step(recent, BAD, 100.0)
    new, decision, wait = step(new, BAD, 110.0)  # breached, but the cooldown (30 s) runs to 125
    assert decision.hold == HOLD_RATE and wait.words == "move waits (rate limit)"
    assert wait.until == 125.0 and "cooldown" in wait.waiting_for


def test_recovering_counts_the_good_evaluations_and_the_window():
    off = st(pool="nospec")
    back = ev(pool("spec-k4", 0.8, samples=50))
    new, decision, wait = step(off, back, 100.0)
    assert decision.hold == HOLD_RECOVERING and wait.words == "recovering"
    assert "1 more good evaluation of rc on spec-k4 (1 of 2)" in wait.waiting_for
    assert wait.until == 160.0  # the 60 s stabilisation window outlasts the second evaluation


def test_pinned_is_held_by_an_operator_with_no_time():
    pinned = replace(st(), pin="nospec")
    _, decision, wait = step(pinned, GOOD, 100.0)
    assert decision.hold == HOLD_OPERATOR and wait.until is None
    assert wait.waiting_for == "an operator to unpin it (pinned to nospec)"
