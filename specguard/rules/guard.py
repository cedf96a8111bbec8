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

``step`` runs the phases in precedence order, each a function that decides or passes: ``_error``,
``_safety``, ``_plan`` (the fleet plan's move with ``decider: planner``; else the per-class
decider's ``_best_pool`` and ``_restore``), ``_confirm``, and ``_settle`` for what is left.

No clock, no I/O, no logging: the daemon does all of that. The state and decision types live in
``classstate``, the wall-clock rules (intervals, cooldown, cap, stabilisation, clock steps) in ``timing``,
the pools a rule moves a class to in ``targets``, the cheapest-pool choice in ``bestpool``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
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


@dataclass
class _Evaluation:
    """One evaluation of one class: what its phases read (the state it starts from, the evidence,
    the rules' assessments on the current pool and on the way back) and how they word a decision."""

    state: ClassState
    evidence: Evidence
    now: float
    policy: policy_mod.Policy
    rules: dict[str, RuleState] = field(default_factory=dict)
    watch: list[Assessment] = field(default_factory=list)
    recover: list[Assessment] = field(default_factory=list)
    candidate: str | None = None
    choice: bestpool.Choice | None = None
    reports: dict[str, str] = field(default_factory=dict)

    @property
    def watch_acting(self) -> list[Assessment]:
        return [a for a in self.watch if not a.rule.dry_run]

    @property
    def watch_phase(self) -> Phase:
        return worst(a.phase for a in self.watch_acting)

    @property
    def recover_acting(self) -> list[Assessment]:
        return [a for a in self.recover if not a.rule.dry_run]

    def decide(
        self,
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
        numbers = {
            "rules": {f"{a.rule.name}@{a.pool}": a.numbers() for a in self.watch + self.recover},
            **extra,
        }
        numbers.update(_counters(new))
        state = self.state
        kind = hold if phase is Phase.HOLD else ""
        return new, Decision(
            state.key,
            self.now,
            phase,
            action,
            state.pool,
            to or state.pool,
            reason,
            numbers,
            dry_run,
            cause,
            self.reports,
            kind,
        )


Decided = tuple[ClassState, Decision]


def step(
    state: ClassState,
    evidence: Evidence,
    now: float,
    policy: policy_mod.Policy,
    planned: tuple[str, str] | None = None,
) -> Decided:
    """One evaluation of one class; ``planned``: the fleet plan's pool for it and why (``guard.decider:
    planner``, ``rules.planner``), which then replaces the best-pool choice and the restore rule (a
    class the plan does not cover, with no requests in decode yet, still gets the profile's warm
    start).

    The phases in precedence order, each a function that decides or passes: error (stale or
    partial data), safety (leave a pool that hurts), plan (the fleet plan's move, or the per-class
    decider's cheaper pool or way back), confirm (a move made on a prediction, measured), and the
    hold or ok that is left."""
    state = timing.rebase(state, now)
    unassessed = _Evaluation(state, evidence, now, policy)
    if state.pin is not None:
        return unassessed.decide(state, Phase.HOLD, f"pinned to {state.pin} by operator", hold=HOLD_OPERATOR)
    due = [r for r in policy.all_rules if timing.due(state, r, now)]
    if not due:
        return unassessed.decide(state, Phase.HOLD, "no rule due", hold=HOLD_NOT_DUE)
    ev = _assess(state, evidence, now, policy, due, planned)
    decided = _error(ev)
    if decided is not None:
        return decided
    new = _count(ev)
    return _safety(ev, new) or _plan(ev, new, planned) or _confirm(ev, new) or _settle(ev, new)


def _assess(
    state: ClassState,
    evidence: Evidence,
    now: float,
    policy: policy_mod.Policy,
    due: list[policy_mod.Rule],
    planned: tuple[str, str] | None,
) -> _Evaluation:
    """The due rules on the current pool (when it speculates) and on the pool to go back to."""
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
    return _Evaluation(state, evidence, now, policy, rules, watch, recover, candidate, choice)


def _error(ev: _Evaluation) -> Decided | None:
    """error: never act on stale or partial data; freeze the safe state past the limit (and unfreeze
    once the source answers)."""
    state, policy = ev.state, ev.policy
    acting = ev.watch_acting + ev.recover_acting
    errors = [a for a in acting if a.phase is Phase.ERROR]
    if errors or (ev.evidence.error is not None and not acting):
        count = state.consecutive_errors + 1
        limits = [a.rule.limits.consecutive_error_limit for a in errors] or [
            min((r.limits.consecutive_error_limit for r in policy.rules), default=4)
        ]
        limit = min((x for x in limits if x >= 0), default=-1)
        first = errors[0].reason if errors else f"data source error: {ev.evidence.error}"
        new = replace(state, rules=ev.rules, consecutive_errors=count)
        if limit < 0 or count <= limit:
            return ev.decide(
                new,
                Phase.ERROR,
                f"{first}; consecutive_errors ({count}) <= consecutive_error_limit ({limit})",
            )
        if state.frozen:
            return ev.decide(new, Phase.ERROR, f"frozen in safe state: {first}")
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
                return ev.decide(
                    new,
                    Phase.ERROR,
                    f"dry-run: {reason}",
                    "freeze",
                    target,
                    dry_run=True,
                    cause="source_errors",
                )
            return ev.decide(
                new, Phase.ERROR, f"{first}; dry-run: would be frozen in safe state {policy.safe_state}"
            )
        frozen = _reset_counters(replace(new, frozen=True, pending=None))
        return ev.decide(
            replace(frozen, pool=target), Phase.ERROR, reason, "freeze", target, cause="source_errors"
        )
    if state.frozen:
        new = _reset_counters(replace(state, rules=ev.rules, frozen=False, consecutive_errors=0))
        return ev.decide(
            new,
            Phase.OK,
            f"data source answers again: unfrozen on {state.pool}",
            "unfreeze",
            cause="source_recovered",
        )
    return None


def _count(ev: _Evaluation) -> ClassState:
    """The state after this evaluation's counts: rule failures and successes, confirmations of a
    pending move, the best-pool streak and the remembered estimates. Report-only rules are counted
    like the others; their breaches go to the decision's reports, never acted on."""
    state, now = ev.state, ev.now
    rules = ev.rules
    if ev.candidate != state.candidate:
        rules = {n: replace(rs, consecutive_successes=0, good_since=None) for n, rs in rules.items()}
    else:
        rules = dict(rules)
    for a in ev.watch:
        rules[a.rule.name] = _count_watch(rules[a.rule.name], a, now)
    for a in ev.recover:
        rules[a.rule.name] = _count_recover(rules[a.rule.name], a, now)
    for a in ev.watch:
        if a.rule.dry_run and (why := failure_breach(rules[a.rule.name], a.rule.limits)):
            ev.reports[a.rule.name] = f"{a.rule.name} on {state.pool}: {a.reason}; {why} (report only)"
    confirm = state.confirm_successes
    if state.pending is not None:
        phase = ev.watch_phase
        confirm = confirm + 1 if phase is Phase.OK and ev.watch else 0 if phase is Phase.ACT else confirm
    favoured = ev.choice.best.pool if ev.choice is not None else None
    streak = state.consecutive_favoured + 1 if favoured is not None and favoured == state.favoured else 1
    return replace(
        state,
        rules=rules,
        consecutive_errors=0,
        candidate=ev.candidate,
        confirm_successes=confirm,
        memory=bestpool.remember(state.memory, ev.evidence, now, ev.policy),
        favoured=favoured,
        consecutive_favoured=streak if favoured is not None else 0,
    )


def _safety(ev: _Evaluation, new: ClassState) -> Decided | None:
    """safety: leave a pool whose failure limits are breached, for a shorter K whose predicted rc is
    good (pending a measurement there) or for the no-spec pool."""
    state, now, policy = ev.state, ev.now, ev.policy
    breaches = [
        (a, why)
        for a in ev.watch
        if not a.rule.dry_run and (why := failure_breach(new.rules[a.rule.name], a.rule.limits))
    ]
    if not breaches:
        return None
    a, why = breaches[0]
    cause = f"{a.rule.name} on {state.pool}: {a.reason}; {why}"
    target = lower_target(new, ev.evidence, policy)
    if target is None:
        return ev.decide(new, Phase.HOLD, f"{cause}; no lower pool to move to", hold=HOLD_STUCK)
    action, pool, extra = target
    gate = timing.rate_gate(new, now, policy)
    if gate is not None:
        return ev.decide(new, Phase.HOLD, f"{cause}; waiting: {gate}", hold=HOLD_RATE, **extra)
    if action == "revert" and state.pending is not None:
        cause = f"measurement disagrees with the prediction ({state.pending.predicted_rc:.3f}): {cause}"
    pending = Pending(state.pool, pool, extra["target_rc"], now) if action == "shorten" else None
    extra["cause"] = a.rule.name
    return _act(ev, new, action, pool, cause, pending, extra)


def _plan(ev: _Evaluation, new: ClassState, planned: tuple[str, str] | None) -> Decided | None:
    """plan: the fleet plan's move (``decider: planner``); else the per-class decider's cheaper pool
    or its way back towards the default pool."""
    policy = ev.policy
    if policy.decider == "planner" and planned is not None:
        if planned[0] != ev.state.pool and planned[0] in policy.pools:
            return _planned(ev, new, planned)
    return _best_pool(ev, new) or _restore(ev, new)


def _planned(ev: _Evaluation, new: ClassState, planned: tuple[str, str]) -> Decided:
    """The fleet plan's move, through the same gates as any other (cooldown, cap, dry-run)."""
    pool, why = planned
    gate = timing.rate_gate(new, ev.now, ev.policy)
    if gate is not None:
        return ev.decide(new, Phase.HOLD, f"planner: {why}; waiting: {gate}", hold=HOLD_RATE)
    k, here = k_of(ev.policy, pool), k_of(ev.policy, new.pool)
    action = "off" if k == 0 else "shorten" if k < here else "lengthen" if k > here else "restore"
    return _act(ev, new, action, pool, f"planner: {why}", None, {"cause": "planner"})


def _best_pool(ev: _Evaluation, new: ClassState) -> Decided | None:
    """A cheaper pool by the margin, for more than the limit of evaluations in a row (at once for
    the profile's warm start); a move back to the pool just left waits out the reversal rule."""
    state, choice, now, policy = ev.state, ev.choice, ev.now, ev.policy
    streak = new.consecutive_favoured
    if choice is None or not (choice.warm_start or streak > policy.best_pool_consecutive_limit):
        return None
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
        return ev.decide(replace(new, reversal_times=reversals), Phase.HOLD, reason, hold=HOLD_REVERSAL)
    gate = timing.rate_gate(new, now, policy)
    if gate is not None:
        return ev.decide(new, Phase.HOLD, f"{why}; waiting: {gate}", hold=HOLD_RATE)
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
    return _act(ev, new, action, choice.best.pool, why, pending, extra)


def _restore(ev: _Evaluation, new: ClassState) -> Decided | None:
    """Back towards the default pool on a streak of good evidence, after the stabilisation window."""
    recover_acting, candidate = ev.recover_acting, ev.candidate
    if not recover_acting or worst(a.phase for a in recover_acting) is not Phase.OK:
        return None
    waiting = _restore_wait(new.rules, recover_acting, ev.now)
    if waiting is not None:
        return ev.decide(new, Phase.HOLD, f"recovering towards {candidate}: {waiting}", hold=HOLD_RECOVERING)
    gate = timing.rate_gate(new, ev.now, ev.policy)
    if gate is not None:
        return ev.decide(new, Phase.HOLD, f"{candidate} recovered; waiting: {gate}", hold=HOLD_RATE)
    reasons = "; ".join(f"{a.rule.name} on {a.pool}: {a.reason}" for a in recover_acting)
    pending = None
    found = ev.evidence.pools.get(candidate) if candidate is not None else None
    if found is not None and found.predicted and "rc" in found.values:  # to be measured there
        pending = Pending(ev.state.pool, candidate, found.values["rc"], ev.now)
        reasons += " (predicted: pending a measurement there)"
    return _act(ev, new, "restore", candidate, reasons, pending, {"cause": "recovered"})


def _confirm(ev: _Evaluation, new: ClassState) -> Decided | None:
    """confirm: a move made on a prediction stays pending until the rules measure it good there for
    a streak."""
    state, watch = ev.state, ev.watch_acting
    if state.pending is None or ev.watch_phase is not Phase.OK or ev.choice is not None:
        return None
    needed = max(a.rule.limits.consecutive_success_limit for a in watch)
    confirm = new.confirm_successes
    if confirm < needed:
        return ev.decide(
            new,
            Phase.HOLD,
            f"confirming {state.pool}: consecutive_successes ({confirm}) < {needed}",
            hold=HOLD_CONFIRMING,
        )
    reason = f"measured on {state.pool}: " + "; ".join(a.reason for a in watch)
    done = replace(new, pending=None, confirm_successes=0)
    return ev.decide(
        done, Phase.OK, f"{reason} (predicted {state.pending.predicted_rc:.3f})", "confirm", cause="measured"
    )


def _settle(ev: _Evaluation, new: ClassState) -> Decided:
    """No move: the hold or ok the rules leave (bad within its limits, too little data, or fine)."""
    state, watch, watch_phase, recover_acting = ev.state, ev.watch_acting, ev.watch_phase, ev.recover_acting
    if watch_phase is Phase.ACT:
        a = next(a for a in watch if a.phase is Phase.ACT)
        rs = new.rules[a.rule.name]
        return ev.decide(
            new,
            Phase.HOLD,
            f"{a.rule.name} on {state.pool}: {a.reason}; consecutive_failures ({rs.consecutive_failures}) "
            f"<= consecutive_failure_limit ({a.rule.limits.consecutive_failure_limit})",
            hold=HOLD_BAD,
        )
    if watch_phase is Phase.HOLD:
        a = next(a for a in watch if a.phase is Phase.HOLD)
        return ev.decide(new, Phase.HOLD, f"{a.rule.name} on {state.pool}: {a.reason}", hold=HOLD_DATA)
    if recover_acting and worst(a.phase for a in recover_acting) is Phase.HOLD:
        a = next(a for a in recover_acting if a.phase is Phase.HOLD)
        phase = Phase.HOLD if not ev.watch else Phase.OK
        return ev.decide(new, phase, f"{a.rule.name} on {a.pool}: {a.reason}", hold=HOLD_DATA)
    if recover_acting:
        a = next(a for a in recover_acting if a.phase is Phase.ACT)
        return ev.decide(new, Phase.OK, f"staying on {state.pool}: {a.rule.name} on {a.pool}: {a.reason}")
    return ev.decide(new, Phase.OK, "; ".join(a.reason for a in watch) or "nothing to do")


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


def _act(
    ev: _Evaluation,
    new: ClassState,
    action: str,
    pool: str,
    reason: str,
    pending: Pending | None,
    extra: dict[str, Any],
) -> Decided:
    now = ev.now
    if ev.policy.dry_run:
        # what it would do, recorded; nothing else changes: no cooldown, no action counted against
        # max_actions_per_hour, no pending move, the same pool. The rule counters start over, as
        # after a real move, so the same would-be action is reported at the pace a real one could be.
        return ev.decide(
            _reset_counters(new), Phase.ACT, f"dry-run: {reason}", action, pool, dry_run=True, **extra
        )
    moved = _reset_counters(
        replace(
            new, last_action_at=now, action_times=timing.recent(new.action_times, now) + (now,), pending=None
        )
    )
    left = replace(moved, pool=pool, pending=pending, left_pool=new.pool)
    return ev.decide(left, Phase.ACT, reason, action, pool, **extra)


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
