"""The guard's status document, as ``GET /status`` and ``specguard status`` show it: each class's
pool, phase and last reason, pins, freezes and pending shorten-K moves; alerts; recent decisions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from specguard.rules import guard
from specguard.rules import policy as policy_mod
from specguard.rules.evidence import AlertBook, ClassKey


class StatusSource(Protocol):
    """What the status document reads from the daemon's ``Guard`` (a protocol, so this module
    does not import the daemon that imports it)."""

    policy: policy_mod.Policy
    states: dict[ClassKey, guard.ClassState]
    last_decisions: dict[ClassKey, guard.Decision]
    decisions: Any
    alerts: AlertBook
    audit: Any
    store: Any
    follow: Any
    running: bool
    version: int
    last_evaluation: float | None
    reload_error: str | None
    elector: Any
    is_leader: bool
    clock: Any

    def plan_age(self, now: float) -> float | None: ...


def class_row(
    key: ClassKey, st: guard.ClassState, last: guard.Decision | None, pools: Mapping[str, int]
) -> dict[str, Any]:
    """One class: where it routes, why, and what holds it there."""
    return {
        "task_type": key[0],
        "temperature_bucket": key[1],
        "load_bucket": key[2],
        "pool": st.pool,
        "num_speculative_tokens": pools.get(st.pool, 0),
        "speculation_enabled": pools.get(st.pool, 0) > 0,
        "phase": last.phase.value if last else None,
        "reason": last.reason if last else None,
        "pin": st.pin,
        "paused": st.paused,
        "frozen": st.frozen,
        "consecutive_errors": st.consecutive_errors,
        "pending": None
        if st.pending is None
        else {"from": st.pending.from_pool, "predicted_rc": st.pending.predicted_rc},
    }


def document(g: StatusSource, decisions: int = 50) -> dict[str, Any]:
    """The status of guard ``g`` with its last ``decisions`` decisions (0: none)."""
    classes = [
        class_row(key, st, g.last_decisions.get(key), g.policy.pools) for key, st in sorted(g.states.items())
    ]
    return {
        "mode": "follow" if g.follow is not None else "guard",
        "running": g.running,
        "leader": None
        if g.follow is not None
        else {"is_leader": g.is_leader, "holder": g.elector.holder, "election": g.elector.name},
        "plan_age_seconds": g.plan_age(g.clock()),
        "dry_run": g.policy.dry_run,
        "policy_version": g.policy.version,
        "plan_version": g.version,
        "last_evaluation": g.last_evaluation,
        "interval_seconds": g.policy.interval_seconds,
        "frozen": any(s.frozen for s in g.states.values()),
        "classes": classes,
        "alerts": [
            {
                "fingerprint": a.fingerprint,
                "alertname": a.alertname,
                "status": a.status,
                "labels": dict(a.labels),
            }
            for a in g.alerts.records()
        ],
        "decisions": list(g.decisions)[-decisions:] if decisions else [],
        "audit_write_errors": g.audit.write_errors,
        "audit_torn_lines": g.audit.torn_lines,
        "plan_file_recovered": g.store.recovered if g.store else None,
        "policy_reload_error": g.reload_error,
    }
