"""When a class may be evaluated and may act, on a wall clock that can jump: rule intervals, the
cooldown and cap per hour, stabilisation credit for a good streak, and timestamps a backward
clock step left in the future. Pure functions of the state and ``now``."""

from __future__ import annotations

from dataclasses import replace

from specguard.rules import policy as policy_mod
from specguard.rules.classstate import ClassState, RuleState

HOUR = 3600.0
"""The span of ``max_actions_per_hour``, seconds."""


def due(state: ClassState, rule: policy_mod.Rule, now: float) -> bool:
    """Whether ``rule`` is due for this class: its interval has passed since the last evaluation."""
    last = state.rule(rule.name).last_evaluated_at
    # a last evaluation in the future means the wall clock stepped back: due now, or the guard
    # would stay blind until the clock catches up (hours or days after an NTP step)
    if last is None or last > now:
        return True
    # 10% slack: a scheduler tick that fires a little early must not skip a whole interval
    return now - last >= rule.limits.interval_seconds * 0.9


def _clamp(t: float | None, now: float) -> float | None:
    return now if t is not None and t > now else t


def rebase(state: ClassState, now: float) -> ClassState:
    """Clamp timestamps left in the future by a backward clock step to ``now``.

    Conservative: a cooldown, the per-hour cap, the failure window and the stabilisation window
    then restart from now instead of lasting until the clock catches up (unbounded) or being
    skipped. ``last_evaluated_at`` is left alone: ``due`` treats a future one as due.
    """

    def future(t: float | None) -> bool:
        return t is not None and t > now

    stale = (
        future(state.last_action_at)
        or any(map(future, state.action_times))
        or (state.pending is not None and future(state.pending.at))
        or any(future(rs.good_since) or any(map(future, rs.failure_times)) for rs in state.rules.values())
    )
    if not stale:
        return state
    rules = {
        name: replace(
            rs,
            good_since=_clamp(rs.good_since, now),
            failure_times=tuple(min(t, now) for t in rs.failure_times),
        )
        for name, rs in state.rules.items()
    }
    pending = state.pending
    if pending is not None and pending.at > now:
        pending = replace(pending, at=now)
    return replace(
        state,
        rules=rules,
        last_action_at=_clamp(state.last_action_at, now),
        action_times=tuple(min(t, now) for t in state.action_times),
        pending=pending,
    )


def rate_gate(state: ClassState, now: float, policy: policy_mod.Policy) -> str | None:
    """Why an automatic action must wait (pause, cooldown, cap per hour), or None."""
    if state.paused:
        return "paused by operator"
    if state.last_action_at is not None and now - state.last_action_at < policy.cooldown_seconds:
        return (
            f"cooldown: {now - state.last_action_at:.0f} s since the last action < cooldown_seconds "
            f"({policy.cooldown_seconds:.0f})"
        )
    recent = [t for t in state.action_times if now - t < HOUR]
    if policy.max_actions_per_hour >= 0 and len(recent) >= policy.max_actions_per_hour:
        cap = policy.max_actions_per_hour
        return f"actions in the last hour ({len(recent)}) >= max_actions_per_hour ({cap})"
    return None


CREDIT_PER_EVALUATION = 2.0
"""At most this many interval_seconds of stabilisation credited per good evaluation."""


def good_for(rs: RuleState, limits: policy_mod.Limits, now: float) -> float:
    """Seconds of stabilisation credited to a streak of good evaluations.

    Wall-clock time since the streak began, but at most CREDIT_PER_EVALUATION x interval_seconds
    per gap between consecutive good evaluations: a forward clock jump (NTP step, VM resume) then
    cannot stand in for the window, while a scheduler that runs a little late still gets real
    elapsed time. So after a jump the window needs at least window / (2 x interval) + 1 good
    evaluations, i.e. half the window of real time at the very least.
    """
    if rs.good_since is None:
        return 0.0
    gaps = max(rs.consecutive_successes - 1, 0)
    return max(0.0, min(now - rs.good_since, gaps * CREDIT_PER_EVALUATION * limits.interval_seconds))


def recent(times: tuple[float, ...], now: float) -> tuple[float, ...]:
    """The action times inside the last hour (those ``max_actions_per_hour`` counts)."""
    return tuple(t for t in times if now - t < HOUR)
