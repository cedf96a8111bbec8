"""What a class waits for, and until when: the hold's kind in a user's words, from the class's last
decision, its counters and the policy.

The engine's phase stays ``ok / act / hold / error``; a hold says its kind (``Decision.hold``), and
this module turns kind and counters into what ``specguard status`` and ``/status`` show: "too
little data" is told apart from "bad, within limits", with the evidence still missing and the
earliest time something can change (the next evaluation, or the earliest move if the evidence
stays as it is). Pure: the decision's own time stands for "now".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specguard.rules import classstate as cs
from specguard.rules import policy as policy_mod
from specguard.rules import timing
from specguard.rules.classstate import ClassState, Decision

WORDS = {
    cs.HOLD_DATA: "too little data",
    cs.HOLD_BAD: "bad, within limits",
    cs.HOLD_RATE: "move waits (rate limit)",
    cs.HOLD_RECOVERING: "recovering",
    cs.HOLD_CONFIRMING: "confirming a move",
    cs.HOLD_REVERSAL: "move back waits (no flapping)",
    cs.HOLD_STUCK: "bad, nowhere to go",
    cs.HOLD_OPERATOR: "held by an operator",
    cs.HOLD_NOT_DUE: "not due",
}
"""A hold's kind as the phase column shows it: ``hold: too little data``."""

NEXT_EVALUATION = "next evaluation"
EARLIEST_MOVE = "earliest move"


@dataclass(frozen=True)
class Wait:
    """What a held class waits for and until when (``until`` None: no time can be given)."""

    kind: str
    words: str
    waiting_for: str
    until: float | None = None
    until_what: str = NEXT_EVALUATION


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _rule_entries(decision: Decision, phase: str, on: str | None = None, off: str | None = None) -> list:
    """(rule name, pool, numbers) of the decision's acting rules in ``phase``, on/off a pool."""
    out = []
    for key, numbers in (decision.numbers.get("rules") or {}).items():
        name, _, pool = key.rpartition("@")
        if numbers.get("phase") != phase or numbers.get("dry_run"):
            continue
        if (on is not None and pool != on) or (off is not None and pool == off):
            continue
        out.append((name, pool, numbers))
    return out


def _rule(policy: policy_mod.Policy, name: str) -> policy_mod.Rule | None:
    return next((r for r in policy.all_rules if r.name == name), None)


def _interval(policy: policy_mod.Policy, name: str | None = None) -> float:
    rule = _rule(policy, name) if name else None
    return rule.limits.interval_seconds if rule is not None else policy.interval_seconds


def _gate_until(state: ClassState, at: float, policy: policy_mod.Policy) -> tuple[str, float | None]:
    """What rate gate holds a move (cooldown, hourly cap, pause) and when it opens."""
    if state.paused:
        return "an operator to resume it", None
    waits = []
    if state.last_action_at is not None and at - state.last_action_at < policy.cooldown_seconds:
        waits.append(
            (
                f"the cooldown ({policy.cooldown_seconds:.0f} s after the last move)",
                state.last_action_at + policy.cooldown_seconds,
            )
        )
    recent = sorted(t for t in state.action_times if at - t < timing.HOUR)
    if 0 <= policy.max_actions_per_hour <= len(recent):
        cap = policy.max_actions_per_hour
        waits.append((f"the hourly cap ({cap} moves per class)", recent[len(recent) - cap] + timing.HOUR))
    if not waits:
        return "the cooldown or the hourly cap", None
    text, until = max(waits, key=lambda w: w[1])
    return text, until


def wait(decision: Decision | None, state: ClassState, policy: policy_mod.Policy) -> Wait | None:
    """What the class ``state`` waits for after ``decision``; None when it is not held."""
    if decision is None or not decision.hold:
        return None
    kind, at = decision.hold, decision.at
    words = WORDS.get(kind, kind)
    nxt = at + _interval(policy)
    if kind == cs.HOLD_OPERATOR:
        what = f"an operator to unpin it (pinned to {state.pin})" if state.pin else "an operator to resume it"
        return Wait(kind, words, what)
    if kind == cs.HOLD_DATA:
        return Wait(kind, words, _data_wanted(decision, state, policy), nxt)
    if kind == cs.HOLD_BAD:
        return _bad(decision, state, policy, words)
    if kind == cs.HOLD_RATE:
        text, until = _gate_until(state, at, policy)
        return Wait(kind, words, text, until, EARLIEST_MOVE)
    if kind == cs.HOLD_RECOVERING:
        return _recovering(decision, state, policy, words)
    if kind == cs.HOLD_CONFIRMING:
        limits = [r.limits.consecutive_success_limit for r in policy.rules if not r.dry_run]
        need = max(limits, default=1)
        more = max(1, need - state.confirm_successes)
        what = (
            f"{_plural(more, 'more good evaluation')} on {state.pool} to confirm the predicted move "
            f"({state.confirm_successes} of {need})"
        )
        return Wait(kind, words, what, at + more * _interval(policy), EARLIEST_MOVE)
    if kind == cs.HOLD_REVERSAL:
        return Wait(kind, words, "the cheaper pool to stay cheaper for longer before moving back", nxt)
    if kind == cs.HOLD_STUCK:
        return Wait(kind, words, f"nothing: no pool below {state.pool} to move to (see its reason)")
    if kind == cs.HOLD_NOT_DUE:
        due = [
            state.rule(r.name).last_evaluated_at + r.limits.interval_seconds
            for r in policy.all_rules
            if state.rule(r.name).last_evaluated_at is not None
        ]
        return Wait(kind, words, "the next rule interval", min(due, default=nxt))
    return Wait(kind, words, decision.reason, nxt)


def _data_wanted(decision: Decision, state: ClassState, policy: policy_mod.Policy) -> str:
    """The evidence a rule still lacks: requests (``n of min_samples``) or a measurement."""
    for name, pool, numbers in _rule_entries(decision, "hold"):
        rule = _rule(policy, name)
        samples = numbers.get("samples")
        if rule is not None and samples is not None and samples < rule.limits.min_samples:
            need = rule.limits.min_samples
            return (
                f"{_plural(need - samples, 'more request')} of this class on {pool} in the evidence window "
                f"({samples} of min_samples {need})"
            )
        if numbers.get("predicted"):
            return f"requests measured on {pool} (it has only a prediction there)"
        return f"a number {name} can judge on {pool}: a baseline or enough requests (see its reason)"
    return "evidence: see its reason"


def _bad(decision: Decision, state: ClassState, policy: policy_mod.Policy, words: str) -> Wait:
    """How many more bad evaluations move the class, and when that is at the earliest."""
    entries = _rule_entries(decision, "act", on=state.pool)
    rule = _rule(policy, entries[0][0]) if entries else None
    if rule is None:
        return Wait(
            cs.HOLD_BAD, words, "more bad evaluations", decision.at + _interval(policy), EARLIEST_MOVE
        )
    limits, counters = rule.limits, state.rule(rule.name)
    more = []
    if limits.consecutive_failure_limit >= 0:
        more.append(limits.consecutive_failure_limit + 1 - counters.consecutive_failures)
    if limits.failure_limit >= 0:
        more.append(limits.failure_limit + 1 - len(counters.failure_times))
    left = max(1, min(more)) if more else math.inf
    if left == math.inf:
        return Wait(cs.HOLD_BAD, words, f"nothing: {rule.name}'s failure limits are off (-1)")
    left = int(left)
    until = decision.at + left * limits.interval_seconds
    gate, opens = _gate_until(state, until, policy)
    if opens is not None:
        until = max(until, opens)
    what = (
        f"{_plural(left, 'more bad evaluation')} of {rule.name} before it moves the class "
        f"({counters.consecutive_failures} in a row so far; it acts after "
        f"{limits.consecutive_failure_limit} in a row, or {limits.failure_limit} in "
        f"{limits.failure_window_seconds:.0f} s); sooner back to good and nothing moves"
    )
    return Wait(cs.HOLD_BAD, words, what, until, EARLIEST_MOVE)


def _recovering(decision: Decision, state: ClassState, policy: policy_mod.Policy, words: str) -> Wait:
    """The good evaluations and the stabilisation a restore still needs."""
    entries = _rule_entries(decision, "ok", off=state.pool)
    rule = _rule(policy, entries[0][0]) if entries else None
    if rule is None:
        return Wait(cs.HOLD_RECOVERING, words, "more good evaluations", decision.at + _interval(policy))
    limits, counters = rule.limits, state.rule(rule.name)
    pool = entries[0][1]
    left = max(0, limits.consecutive_success_limit - counters.consecutive_successes)
    until = decision.at + left * limits.interval_seconds
    stable = timing.good_for(counters, limits, decision.at)
    until = max(until, decision.at + max(0.0, limits.stabilization_window_seconds - stable))
    what = (
        f"{_plural(left, 'more good evaluation')} of {rule.name} on {pool} "
        f"({counters.consecutive_successes} of {limits.consecutive_success_limit}) and "
        f"{limits.stabilization_window_seconds:.0f} s of good evidence ({stable:.0f} s so far)"
    )
    return Wait(cs.HOLD_RECOVERING, words, what, until, EARLIEST_MOVE)
