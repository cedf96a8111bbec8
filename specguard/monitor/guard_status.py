"""The guard's status document, as ``GET /status`` and ``specguard status`` show it: each class's
pool, phase and last reason, pins, freezes and pending shorten-K moves; alerts; recent decisions;
each load bucket's baseline source and the (pool, load bucket) cells that have none; for a class
off speculation, its probe (pool, share, expected rc: ``rules.probes``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from specguard.rules import guard, holds, rcquality
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
    routing_status: Any
    baseline_report: Any
    holdout_report: Any
    schedule_report: Any
    cost_view: Any
    probes: Mapping[ClassKey, Any]
    elector: Any
    is_leader: bool
    clock: Any

    def plan_age(self, now: float) -> float | None: ...


def class_row(
    key: ClassKey,
    st: guard.ClassState,
    last: guard.Decision | None,
    pools: Mapping[str, int],
    down: frozenset[str] = frozenset(),
    costs: Sequence[Any] = (),
    probe: Any = None,
    policy: policy_mod.Policy | None = None,
    load_order: Sequence[str] = (),
    spread: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """One class: where it routes, why, what holds it there (the hold's kind, what it waits for and
    until when: ``rules.holds``), and its latest RC with the baseline source it used (on its pool,
    or on the speculative pool with the most samples when it is off)."""
    mine = [c for c in costs if (c.task_type, c.temperature_bucket, c.load_bucket) == key]
    rc = next((c for c in mine if c.pool == st.pool), None) or max(mine, key=lambda c: c.n_spec, default=None)
    return {
        "task_type": key[0],
        "temperature_bucket": key[1],
        "load_bucket": key[2],
        "pool": st.pool,
        "num_speculative_tokens": pools.get(st.pool, 0),
        "speculation_enabled": pools.get(st.pool, 0) > 0,
        "phase": last.phase.value if last else None,
        "reason": last.reason if last else None,
        "decided_at": last.at if last else None,
        **_wait(last, st, policy),
        "pin": st.pin,
        "paused": st.paused,
        "frozen": st.frozen,
        "consecutive_errors": st.consecutive_errors,
        "pending": None
        if st.pending is None
        else {"from": st.pending.from_pool, "predicted_rc": st.pending.predicted_rc},
        # the planned pool is marked down: the tap serves the class from another pool meanwhile
        "failover": st.pool in down,
        # report-only rules whose limits are breached (never acted on): rule -> why
        "reports": dict(last.reports) if last else {},
        "rc": None if rc is None else _rc(rc, costs, load_order),
        # off speculation: where its probes go and how many (rules.probes, by expected cost; with
        # the planner, rules.planprobes: by what they could teach the plan)
        "probe": None if probe is None else _probe(probe),
        # guard.spread: the pools a request of it may join, with its TPOT per second of each one's step
        "spread": None if not spread else dict(sorted(spread.items())),
    }


def _rc(rc: Any, costs: Sequence[Any], load_order: Sequence[str]) -> dict[str, Any]:
    """The class's RC with how much it says (``rules.rcquality``): a too-wide interval is "not
    enough evidence" (no point estimate), a model-baseline RC against measured neighbours is flagged."""
    evidence, why = rcquality.grade(rc, costs, load_order)
    return {
        "pool": rc.pool,
        "rc": rc.rc if evidence != rcquality.NOT_ENOUGH else None,
        "lower": rc.lower,
        "upper": rc.upper,
        "baseline_source": rc.baseline_source,
        "samples": rc.n_spec,
        "evidence": evidence,
        "evidence_note": why,
    }


def _wait(last: guard.Decision | None, st: guard.ClassState, policy: Any) -> dict[str, Any]:
    found = holds.wait(last, st, policy) if policy is not None else None
    if found is None:
        return {"hold": None}
    return {
        "hold": found.kind,
        "hold_words": found.words,
        "waiting_for": found.waiting_for,
        "until": found.until,
        "until_what": found.until_what,
    }


def _probe(probe: Any) -> dict[str, Any]:
    return {"pool": probe.pool, "share": probe.share, "expected_rc": probe.expected_rc, "basis": probe.basis}


STATUS_ALERTS = 100
"""Alerts /status lists at most (``alerts_total`` says how many are stored)."""


def document(g: StatusSource, decisions: int = 50) -> dict[str, Any]:
    """The status of guard ``g`` with its last ``decisions`` decisions (0: none)."""
    health = g.routing_status() if g.routing_status is not None else []
    down = frozenset(p["pool"] for p in health if not p["healthy"])
    costs = g.cost_view() if g.cost_view is not None else ()
    probes = getattr(g, "probes", {})
    spread = getattr(g, "spread", {})
    order = list(getattr(g, "load_buckets", ()))
    classes = [
        class_row(
            key,
            st,
            g.last_decisions.get(key),
            g.policy.pools,
            down,
            costs,
            probes.get(key),
            g.policy,
            order,
            spread.get(key),
        )
        for key, st in sorted(g.states.items())
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
        "pools": health,
        "classes": classes,
        "alerts": [
            {
                "fingerprint": a.fingerprint,
                "alertname": a.alertname,
                "status": a.status,
                "labels": dict(a.labels),
            }
            for a in g.alerts.snapshot()[-STATUS_ALERTS:]  # the most recently received
        ],
        "alerts_total": len(g.alerts),
        "decisions": list(g.decisions)[-decisions:] if decisions else [],
        "audit_write_errors": g.audit.write_errors,
        "audit_torn_lines": g.audit.torn_lines,
        "plan_file_recovered": g.store.recovered if g.store else None,
        "policy_reload_error": g.reload_error,
        "baselines": g.baseline_report() if g.baseline_report is not None else None,
        "holdout": g.holdout_report() if g.holdout_report is not None else None,
        "schedule": g.schedule_report() if g.schedule_report is not None else None,
        "spread_fit": getattr(g, "spread_fit", None),
        "planner": _plan(getattr(g, "last_plan", None), getattr(g, "desired_replicas", {}))
        if g.policy.decider == "planner"
        else None,
    }


def _plan(plan: Any, desired: Mapping[str, int]) -> dict[str, Any]:
    """``guard.decider: planner``: the latest plan's moves and what it is worth, or why there is
    none; and the desired replicas per pool (``guard.scaling``)."""
    sizes = dict(desired) or None
    if plan is None or isinstance(plan, str):
        return {"plan": None, "reason": plan or "not evaluated yet", "desired_replicas": sizes}
    return {
        "plan": {"/".join(key[:2]): pool for key, pool in sorted(plan.pools.items())},
        "moves": {"/".join(key[:2]): pool for key, pool in sorted(plan.moves.items())},
        "tokens_per_second": plan.tokens,
        "tokens_per_second_now": plan.tokens_now,
        "benefit_lower": plan.benefit_lower,
        "proven_optimal": all(plan.exact.values()) if plan.exact else False,
        "desired_replicas": sizes,
    }
