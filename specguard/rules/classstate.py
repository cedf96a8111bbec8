"""The guard's value types: one class's state (per-rule counters, a pending shorten-K move,
operator pin and pause) and the Decision each evaluation or override yields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specguard.rules.assess import Phase
from specguard.rules.evidence import ClassKey


@dataclass(frozen=True)
class RuleState:
    """Counters of one rule for one class (Argo semantics: errors never count as failures)."""

    consecutive_failures: int = 0
    failure_times: tuple[float, ...] = ()
    consecutive_successes: int = 0
    good_since: float | None = None
    last_evaluated_at: float | None = None


@dataclass(frozen=True)
class Pending:
    """A shorten-K move made on a prediction, waiting to be confirmed by measurement."""

    from_pool: str
    to_pool: str
    predicted_rc: float
    at: float


@dataclass(frozen=True)
class ClassState:
    key: ClassKey
    pool: str
    rules: Mapping[str, RuleState] = field(default_factory=dict)
    consecutive_errors: int = 0
    frozen: bool = False
    last_action_at: float | None = None
    action_times: tuple[float, ...] = ()
    pending: Pending | None = None
    confirm_successes: int = 0
    candidate: str | None = None
    pin: str | None = None
    paused: bool = False
    memory: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Pool -> (last rc measured there with enough samples, when, its lower and upper bound): evidence
    for pools the class left."""
    favoured: str | None = None
    """The cheaper pool the last evaluations favoured (``rules.bestpool``), and in how many in a row."""
    consecutive_favoured: int = 0
    left_pool: str | None = None
    """The pool the class left at its last plan change: a best-pool move back to it is a reversal."""
    reversal_times: tuple[float, ...] = ()
    """When best-pool moves reversed the move before (kept memory_seconds): each doubles the next's wait."""

    def rule(self, name: str) -> RuleState:
        return self.rules.get(name, RuleState())


HOLD_DATA = "data"
"""Too little data: a rule has no number to judge yet (samples, a baseline, a measurement)."""
HOLD_BAD = "bad"
"""Bad, within limits: the number is past the threshold, not yet for long enough to act."""
HOLD_RATE = "rate"
"""A move is due but waits for the cooldown or the hourly cap."""
HOLD_RECOVERING = "recovering"
"""Good again; restoring waits for a streak of good evaluations and the stabilisation window."""
HOLD_CONFIRMING = "confirming"
"""Moved on a prediction; waiting for measurements on the new pool to confirm it."""
HOLD_REVERSAL = "reversal"
"""A move back to the pool it left waits longer (no flapping)."""
HOLD_STUCK = "stuck"
"""Bad past the limits, but no lower pool to move to."""
HOLD_OPERATOR = "operator"
"""Pinned or paused by an operator."""
HOLD_NOT_DUE = "not_due"
"""No rule is due at this evaluation."""
HOLD_KINDS = (
    HOLD_DATA,
    HOLD_BAD,
    HOLD_RATE,
    HOLD_RECOVERING,
    HOLD_CONFIRMING,
    HOLD_REVERSAL,
    HOLD_STUCK,
    HOLD_OPERATOR,
    HOLD_NOT_DUE,
)


@dataclass(frozen=True)
class Decision:
    """What one evaluation (or operator override) decided, why, and the numbers behind it."""

    key: ClassKey
    at: float
    phase: Phase
    action: str
    from_pool: str
    to_pool: str
    reason: str
    numbers: Mapping[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    cause: str = ""
    """Bounded code for metrics: the rule that breached, "recovered", "source_errors", "operator"..."""
    reports: Mapping[str, str] = field(default_factory=dict)
    """Report-only (``dry_run``) rules whose failure limits are breached: rule name -> why."""
    hold: str = ""
    """With phase hold: its kind (one of ``HOLD_KINDS``); empty otherwise."""

    @property
    def changes_plan(self) -> bool:
        return self.from_pool != self.to_pool and not self.dry_run

    def to_json(self) -> dict[str, Any]:
        task_type, temperature_bucket, load_bucket = self.key
        return {
            "time": self.at,
            "task_type": task_type,
            "temperature_bucket": temperature_bucket,
            "load_bucket": load_bucket,
            "class": f"{task_type}/{temperature_bucket}",
            "phase": self.phase.value,
            "action": self.action,
            "cause": self.cause,
            "from": self.from_pool,
            "to": self.to_pool,
            "reason": self.reason,
            "dry_run": self.dry_run,
            "numbers": dict(self.numbers),
            **({"reports": dict(self.reports)} if self.reports else {}),
            **({"hold": self.hold} if self.hold else {}),
        }
