"""The per-class guard: a pure state machine ``step(state, evidence, now, policy) -> (state, Decision)``.

One class (task_type x temperature_bucket x load_bucket) at a time. Each evaluation yields
one phase of ``ok / act / hold / error``, combined with one precedence (error > act > hold > ok);
a hold also says its kind (``Decision.hold``: too little data, bad within limits, rate-limited...):

* the rules look at the class's current pool ("watch": is speculation hurting?) and, when the
  class is not on its default pool, at the best pool to go back to ("recover");
* too little data is hold (counts neither way); a failing source is error, and consecutive
  errors beyond the limit freeze the class in the declared safe state;
* breached failure limits move the class down: to a shorter-K pool whose predicted rc is good
  (pending confirmation by measurement; reverted to no-spec if the measurement disagrees), else
  to the no-spec pool; restoring needs a success streak, hysteresis and a stabilisation window;
* a speculating class moves to the pool with the lowest relative cost per token when that pool is
  cheaper by a margin for several evaluations in a row (``rules.bestpool``: measured, remembered,
  predicted or profile estimates); a class with no live evidence yet starts on the profile's choice;
* every action respects the cooldown, the cap per hour, dry-run and operator pins/pauses.

No clock, no I/O, no logging: the daemon does all of that. The state and decision types live in
``classstate``, the wall-clock rules (intervals, cooldown, cap, stabilisation, clock steps) in ``timing``,
the pools a rule moves a class to in ``targets``, the cheapest-pool choice in ``bestpool``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from specguard.rules import bestpool, timing
from specguard.rules import policy as policy_mod
from specguard.rules.assess import PRECEDENCE, Assessment, Phase, assess, worst
from specguard.rules.classstate import (
    HOLD_BAD,
    HOLD_CONFIRMING,
    HOLD_DATA,
    HOLD_NOT_DUE,
    HOLD_OPERATOR,
    HOLD_RATE,
    HOLD_RECOVERING,
    HOLD_REVERSAL,
    HOLD_STUCK,
    ClassState,
    Decision,
    Pending,
    RuleState,
)
from specguard.rules.evidence import ClassKey, Evidence
from specguard.rules.targets import k_of, lower_target, recover_candidate

__all__ = [  # re-exported: one vocabulary
    "PRECEDENCE",
    "Assessment",
    "ClassState",
    "Decision",
    "Pending",
    "Phase",
    "RuleState",
    "assess",
    "worst",
]

ACTIONS = ("none", "off", "shorten", "lengthen", "revert", "restore", "confirm", "freeze", "unfreeze")
OPERATOR_ACTIONS = ("pin", "unpin", "pause", "resume")


def initial_state(key: ClassKey, policy: policy_mod.Policy) -> ClassState:
    return ClassState(key=key, pool=policy.default_pool or "")


# ---------------------------------------------------------------- counters


def _count_watch(rs: RuleState, a: Assessment, now: float) -> RuleState:
    window = a.rule.limits.failure_window_seconds
    times = tuple(t for t in rs.failure_times if now - t < window)
    if a.phase is Phase.ACT:
        return replace(rs, consecutive_failures=rs.consecutive_failures + 1, failure_times=times + (now,))
    if a.phase is Phase.OK:
        return replace(rs, consecutive_failures=0, failure_times=times)
    return replace(rs, failure_times=times)


def _count_recover(rs: RuleState, a: Assessment, now: float) -> RuleState:
    if a.phase is Phase.OK:
        since = rs.good_since if rs.good_since is not None else now
        return replace(rs, consecutive_successes=rs.consecutive_successes + 1, good_since=since)
    if a.phase is Phase.ACT:
        return replace(rs, consecutive_successes=0, good_since=None)
    return rs


def failure_breach(rs: RuleState, limits: policy_mod.Limits) -> str | None:
    """The reason a rule's failure limits are breached, or None."""
    if limits.consecutive_failure_limit >= 0 and rs.consecutive_failures > limits.consecutive_failure_limit:
        return f"consecutive_failures ({rs.consecutive_failures}) > consecutive_failure_limit " + (
            f"({limits.consecutive_failure_limit})"
        )
    if limits.failure_limit >= 0 and len(rs.failure_times) > limits.failure_limit:
        return (
            f"failures in {limits.failure_window_seconds:.0f} s ({len(rs.failure_times)}) > failure_limit "
            f"({limits.failure_limit})"
        )
    return None


def _reset_counters(state: ClassState) -> ClassState:
    rules = {name: RuleState(last_evaluated_at=rs.last_evaluated_at) for name, rs in state.rules.items()}
    return replace(
        state, rules=rules, confirm_successes=0, candidate=None, favoured=None, consecutive_favoured=0
    )


# ---------------------------------------------------------------- the step


def step(
    state: ClassState,
    evidence: Evidence,
    now: float,
    policy: policy_mod.Policy,
    planned: tuple[str, str] | None = None,
) -> tuple[ClassState, Decision]:
    """One evaluation of one class; ``planned``: the fleet plan's pool for it and why (``guard.decider:
    planner``, ``rules.planner``), which then replaces the best-pool choice and the restore rule (a
    class the plan does not cover, with no requests in decode yet, still gets the profile's warm
    start)."""

    def decide(
        new: ClassState,
        phase: Phase,
        reason: str,
        action: str = "none",
        to: str | None = None,
        dry_run: bool = False,
        cause: str = "",
        hold: str = "",
        **extra: Any,
    ) -> tuple[ClassState, Decision]:
        numbers = {"rules": {f"{a.rule.name}@{a.pool}": a.numbers() for a in assessments}, **extra}
        numbers.update(_counters(new))
        to_pool = to or state.pool
        kind = hold if phase is Phase.HOLD else ""
        return new, Decision(
            state.key, now, phase, action, state.pool, to_pool, reason, numbers, dry_run, cause, reports, kind
        )

    assessments: list[Assessment] = []
    reports: dict[str, str] = {}
    state = timing.rebase(state, now)
    if state.pin is not None:
        return decide(state, Phase.HOLD, f"pinned to {state.pin} by operator", hold=HOLD_OPERATOR)
    due = [r for r in policy.all_rules if timing.due(state, r, now)]
    if not due:
        return decide(state, Phase.HOLD, "no rule due", hold=HOLD_NOT_DUE)
    rules = dict(state.rules)
    for rule in due:
        rules[rule.name] = replace(state.rule(rule.name), last_evaluated_at=now)

    watching = k_of(policy, state.pool) > 0
    lb = state.key[2]
    watch = [
        a
        for r in due
        if watching and (a := assess(r, state.pool, evidence, policy, restoring=False, load_bucket=lb))
    ]
    came_from = state.pending.from_pool if state.pending is not None else None
    planning = policy.decider == "planner"
    choice = None
    if not planning or planned is None:  # a class the plan does not cover yet: the profile's warm start
        choice = bestpool.choose(state.pool, evidence, state.memory, now, policy, came_from, load_bucket=lb)
        choice = choice if not planning or (choice is not None and choice.warm_start) else None
    candidate = None if planning else recover_candidate(state, evidence, policy)
    if policy.best_pool and candidate and k_of(policy, state.pool) > 0:
        # between speculative pools: restore only towards the pool the best-pool choice favours
        candidate = candidate if choice is not None and choice.best.pool == candidate else None
    recover = [
        a
        for r in due
        if candidate and (a := assess(r, candidate, evidence, policy, restoring=True, load_bucket=lb))
    ]
    assessments = watch + recover
    acting = [a for a in assessments if not a.rule.dry_run]

    # error: never act on stale or partial data; freeze the safe state past the limit
    errors = [a for a in acting if a.phase is Phase.ERROR]
    if errors or (evidence.error is not None and not acting):
        count = state.consecutive_errors + 1
        limits = [a.rule.limits.consecutive_error_limit for a in errors] or [
            min((r.limits.consecutive_error_limit for r in policy.rules), default=4)
        ]
        limit = min((x for x in limits if x >= 0), default=-1)
        first = errors[0].reason if errors else f"data source error: {evidence.error}"
        new = replace(state, rules=rules, consecutive_errors=count)
        if limit < 0 or count <= limit:
            return decide(
                new,
                Phase.ERROR,
                f"{first}; consecutive_errors ({count}) <= consecutive_error_limit ({limit})",
            )
        if state.frozen:
            return decide(new, Phase.ERROR, f"frozen in safe state: {first}")
        target = {"last": state.pool, "nospec": policy.nospec_pool, "default": policy.default_pool}[
            policy.safe_state
        ]
        target = target or state.pool
        reason = (
            f"consecutive_errors ({count}) > consecutive_error_limit ({limit}): "
            f"freeze in safe state {policy.safe_state}"
        )
        if policy.dry_run:  # say once what it would do; the class is not frozen (nothing changes)
            if count == limit + 1:
                return decide(
                    new,
                    Phase.ERROR,
                    f"dry-run: {reason}",
                    "freeze",
                    target,
                    dry_run=True,
                    cause="source_errors",
                )
            return decide(
                new, Phase.ERROR, f"{first}; dry-run: would be frozen in safe state {policy.safe_state}"
            )
        frozen = _reset_counters(replace(new, frozen=True, pending=None))
        return decide(
            replace(frozen, pool=target), Phase.ERROR, reason, "freeze", target, cause="source_errors"
        )

    if state.frozen:
        new = _reset_counters(replace(state, rules=rules, frozen=False, consecutive_errors=0))
        return decide(
            new,
            Phase.OK,
            f"data source answers again: unfrozen on {state.pool}",
            "unfreeze",
            cause="source_recovered",
        )

    # count
    if candidate != state.candidate:
        rules = {n: replace(rs, consecutive_successes=0, good_since=None) for n, rs in rules.items()}
    for a in watch:
        rules[a.rule.name] = _count_watch(rules[a.rule.name], a, now)
    for a in recover:
        rules[a.rule.name] = _count_recover(rules[a.rule.name], a, now)
    # report-only rules: counted like the others; a breach is reported, never acted on
    for a in watch:
        if a.rule.dry_run and (why := failure_breach(rules[a.rule.name], a.rule.limits)):
            reports[a.rule.name] = f"{a.rule.name} on {state.pool}: {a.reason}; {why} (report only)"
    watch_phase = worst(a.phase for a in watch if not a.rule.dry_run)
    confirm = state.confirm_successes
    if state.pending is not None:
        confirm = (
            confirm + 1 if watch_phase is Phase.OK and watch else 0 if watch_phase is Phase.ACT else confirm
        )
    favoured = choice.best.pool if choice is not None else None
    streak = state.consecutive_favoured + 1 if favoured is not None and favoured == state.favoured else 1
    new = replace(
        state,
        rules=rules,
        consecutive_errors=0,
        candidate=candidate,
        confirm_successes=confirm,
        memory=bestpool.remember(state.memory, evidence, now, policy),
        favoured=favoured,
        consecutive_favoured=streak if favoured is not None else 0,
    )

    # act: leave a pool that hurts
    breaches = [
        (a, why)
        for a in watch
        if not a.rule.dry_run and (why := failure_breach(rules[a.rule.name], a.rule.limits))
    ]
    if breaches:
        a, why = breaches[0]
        cause = f"{a.rule.name} on {state.pool}: {a.reason}; {why}"
        target = lower_target(new, evidence, policy)
        if target is None:
            return decide(new, Phase.HOLD, f"{cause}; no lower pool to move to", hold=HOLD_STUCK)
        action, pool, extra = target
        gate = timing.rate_gate(new, now, policy)
        if gate is not None:
            return decide(new, Phase.HOLD, f"{cause}; waiting: {gate}", hold=HOLD_RATE, **extra)
        if action == "revert" and state.pending is not None:
            cause = f"measurement disagrees with the prediction ({state.pending.predicted_rc:.3f}): {cause}"
        pending = None
        if action == "shorten":
            pending = Pending(state.pool, pool, extra["target_rc"], now)
        extra["cause"] = a.rule.name
        return _act(new, action, pool, cause, now, policy, decide, pending, extra)

    if planning and planned is not None and planned[0] != state.pool and planned[0] in policy.pools:
        return _planned(new, planned, now, policy, decide)

    # best pool: a cheaper pool by the margin, for more than the limit of evaluations in a row
    if choice is not None and (choice.warm_start or streak > policy.best_pool_consecutive_limit):
        limit = policy.best_pool_consecutive_limit
        why = choice.reason + (
            "; no live evidence yet: the calibration profile's choice"
            if choice.warm_start
            else f"; consecutive evaluations ({streak}) > best_pool_consecutive_limit ({limit})"
        )
        wait, reversals = (None, state.reversal_times)
        correcting = state.pending is not None and choice.best.pool == state.pending.from_pool
        if not choice.warm_start and not correcting:  # undoing an unconfirmed prediction is no flap
            wait, reversals = bestpool.reversal_wait(
                state.left_pool, state.reversal_times, choice.best.pool, streak, now, policy
            )
        if wait is not None:
            reason = f"{choice.reason}; {wait}"
            return decide(replace(new, reversal_times=reversals), Phase.HOLD, reason, hold=HOLD_REVERSAL)
        gate = timing.rate_gate(new, now, policy)
        if gate is not None:
            return decide(new, Phase.HOLD, f"{why}; waiting: {gate}", hold=HOLD_RATE)
        new = replace(new, reversal_times=reversals)
        target_k = k_of(policy, choice.best.pool)
        action = "off" if target_k == 0 else "shorten" if target_k < k_of(policy, state.pool) else "lengthen"
        pending = None
        if target_k > 0 and choice.best.basis not in bestpool.LIVE:
            pending = Pending(state.pool, choice.best.pool, choice.best.rc, now)
        extra = {
            "cause": "profile" if choice.warm_start else "best_pool",
            "current_rc": round(choice.current.rc, 6),
            "target_rc": round(choice.best.rc, 6),
            "target_basis": choice.best.basis,
        }
        return _act(new, action, choice.best.pool, why, now, policy, decide, pending, extra)

    # restore: back towards the default pool on a streak of good evidence, after the window
    recover_acting = [a for a in recover if not a.rule.dry_run]
    if recover_acting and worst(a.phase for a in recover_acting) is Phase.OK:
        waiting = _restore_wait(rules, recover_acting, now)
        if waiting is None:
            gate = timing.rate_gate(new, now, policy)
            if gate is not None:
                return decide(new, Phase.HOLD, f"{candidate} recovered; waiting: {gate}", hold=HOLD_RATE)
            reasons = "; ".join(f"{a.rule.name} on {a.pool}: {a.reason}" for a in recover_acting)
            pending = None
            found = evidence.pools.get(candidate)
            if found is not None and found.predicted and "rc" in found.values:  # to be measured there
                pending = Pending(state.pool, candidate, found.values["rc"], now)
                reasons += " (predicted: pending a measurement there)"
            return _act(
                new, "restore", candidate, reasons, now, policy, decide, pending, {"cause": "recovered"}
            )
        return decide(new, Phase.HOLD, f"recovering towards {candidate}: {waiting}", hold=HOLD_RECOVERING)

    if state.pending is not None and watch_phase is Phase.OK and choice is None:
        needed = max(a.rule.limits.consecutive_success_limit for a in watch if not a.rule.dry_run)
        if confirm >= needed:
            reason = f"measured on {state.pool}: " + "; ".join(a.reason for a in watch if not a.rule.dry_run)
            done = replace(new, pending=None, confirm_successes=0)
            return decide(
                done,
                Phase.OK,
                f"{reason} (predicted {state.pending.predicted_rc:.3f})",
                "confirm",
                cause="measured",
            )
        return decide(
            new,
            Phase.HOLD,
            f"confirming {state.pool}: consecutive_successes ({confirm}) < {needed}",
            hold=HOLD_CONFIRMING,
        )

    if watch_phase is Phase.ACT:
        a = next(a for a in watch if a.phase is Phase.ACT and not a.rule.dry_run)
        rs = rules[a.rule.name]
        return decide(
            new,
            Phase.HOLD,
            f"{a.rule.name} on {state.pool}: {a.reason}; consecutive_failures ({rs.consecutive_failures}) "
            f"<= consecutive_failure_limit ({a.rule.limits.consecutive_failure_limit})",
            hold=HOLD_BAD,
        )
    if watch_phase is Phase.HOLD:
        a = next(a for a in watch if a.phase is Phase.HOLD and not a.rule.dry_run)
        return decide(new, Phase.HOLD, f"{a.rule.name} on {state.pool}: {a.reason}", hold=HOLD_DATA)
    if recover_acting and worst(a.phase for a in recover_acting) is Phase.HOLD:
        a = next(a for a in recover_acting if a.phase is Phase.HOLD)
        phase = Phase.HOLD if not watch else Phase.OK
        return decide(new, phase, f"{a.rule.name} on {a.pool}: {a.reason}", hold=HOLD_DATA)
    if recover_acting:
        a = next(a for a in recover_acting if a.phase is Phase.ACT)
        return decide(new, Phase.OK, f"staying on {state.pool}: {a.rule.name} on {a.pool}: {a.reason}")
    return decide(new, Phase.OK, "; ".join(a.reason for a in watch if not a.rule.dry_run) or "nothing to do")


def _planned(new, planned, now, policy, decide):
    """The fleet plan's move, through the same gates as any other (cooldown, cap, dry-run)."""
    pool, why = planned
    gate = timing.rate_gate(new, now, policy)
    if gate is not None:
        return decide(new, Phase.HOLD, f"planner: {why}; waiting: {gate}", hold=HOLD_RATE)
    k, here = k_of(policy, pool), k_of(policy, new.pool)
    action = "off" if k == 0 else "shorten" if k < here else "lengthen" if k > here else "restore"
    return _act(new, action, pool, f"planner: {why}", now, policy, decide, None, {"cause": "planner"})


def _restore_wait(rules: Mapping[str, RuleState], recover: list[Assessment], now: float) -> str | None:
    for a in recover:
        rs, limits = rules[a.rule.name], a.rule.limits
        if rs.consecutive_successes < limits.consecutive_success_limit:
            return (
                f"{a.rule.name}: consecutive_successes ({rs.consecutive_successes}) "
                f"< consecutive_success_limit ({limits.consecutive_success_limit})"
            )
        good_for = timing.good_for(rs, limits, now)
        if good_for < limits.stabilization_window_seconds:
            return (
                f"{a.rule.name}: good for {good_for:.0f} s < stabilization_window_seconds "
                f"({limits.stabilization_window_seconds:.0f})"
            )
    return None


def _act(new, action, pool, reason, now, policy, decide, pending, extra):
    if policy.dry_run:
        # what it would do, recorded; nothing else changes: no cooldown, no action counted against
        # max_actions_per_hour, no pending move, the same pool. The rule counters start over, as
        # after a real move, so the same would-be action is reported at the pace a real one could be.
        return decide(
            _reset_counters(new), Phase.ACT, f"dry-run: {reason}", action, pool, dry_run=True, **extra
        )
    moved = _reset_counters(
        replace(
            new, last_action_at=now, action_times=timing.recent(new.action_times, now) + (now,), pending=None
        )
    )
    left = replace(moved, pool=pool, pending=pending, left_pool=new.pool)
    return decide(left, Phase.ACT, reason, action, pool, **extra)


def _counters(state: ClassState) -> dict[str, Any]:
    out: dict[str, Any] = {"consecutive_errors": state.consecutive_errors}
    for name, rs in sorted(state.rules.items()):
        if rs.consecutive_failures or rs.failure_times:
            out[f"{name}.consecutive_failures"] = rs.consecutive_failures
            out[f"{name}.failures"] = len(rs.failure_times)
        if rs.consecutive_successes:
            out[f"{name}.consecutive_successes"] = rs.consecutive_successes
    if state.favoured is not None:
        out["best_pool.favoured"] = state.favoured
        out["best_pool.consecutive_favoured"] = state.consecutive_favoured
    return out


# ---------------------------------------------------------------- operator overrides


def override(
    state: ClassState, action: str, now: float, *, pool: str | None = None, reason: str = ""
) -> tuple[ClassState, Decision]:
    """An operator's pin / unpin / pause / resume: applied at once, never rate-limited.

    One that would change nothing (unpin a class that is not pinned, pin it where it is pinned
    already, pause a paused one, resume a running one) is action ``none``: no plan version, no
    action counted."""
    why = f"operator: {reason}" if reason else "operator"
    noop = {
        "pin": state.pin is not None and state.pin == pool,
        "unpin": state.pin is None,
        "pause": state.paused,
        "resume": not state.paused,
    }
    if noop.get(action):
        already = {
            "pin": f"already pinned to {pool}",
            "unpin": "not pinned",
            "pause": "already paused",
            "resume": "not paused",
        }[action]
        decision = Decision(
            state.key, now, Phase.OK, "none", state.pool, state.pool, f"{already}: nothing to do"
        )
        return state, decision
    if action == "pin":
        if pool is None:
            raise ValueError("pin needs a pool")
        new = _reset_counters(replace(state, pin=pool, pool=pool, pending=None))
        return new, Decision(state.key, now, Phase.ACT, "pin", state.pool, pool, why, cause="operator")
    if action == "unpin":
        new = _reset_counters(replace(state, pin=None))
        return new, Decision(state.key, now, Phase.OK, "unpin", state.pool, state.pool, why, cause="operator")
    if action == "pause":
        return replace(state, paused=True), Decision(
            state.key,
            now,
            Phase.HOLD,
            "pause",
            state.pool,
            state.pool,
            why,
            cause="operator",
            hold=HOLD_OPERATOR,
        )
    if action == "resume":
        return replace(state, paused=False), Decision(
            state.key, now, Phase.OK, "resume", state.pool, state.pool, why, cause="operator"
        )
    raise ValueError(f"unknown override action {action!r} (known: {', '.join(OPERATOR_ACTIONS)})")
