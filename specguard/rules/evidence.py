"""What the guard sees about one class at one evaluation, and the Alertmanager alert book.

Evidence is plain data: per pool, the numbers a rule can read (from the local cost model or
from PromQL), whether they were measured or predicted, and any source error. Alerts from
Alertmanager are kept in an ``AlertBook`` keyed by fingerprint (idempotent under repeats and
HA duplicates) and handed to the state machine as evidence, never as a toggle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specguard.rules.cost import ClassCost

ClassKey = tuple[str, str, str]  # (task_type, temperature_bucket, load_bucket)


def key_text(key: ClassKey) -> str:
    return "/".join(key)


@dataclass(frozen=True)
class PoolEvidence:
    """Numbers for one class on one pool over the evidence window."""

    pool: str
    values: Mapping[str, float] = field(default_factory=dict)
    """Measure name (policy.MEASURES) or PromQL rule name -> value."""
    samples: int = 0
    """Spec-side requests behind the numbers (for a prediction: behind the pool it was made from)."""
    predicted: bool = False
    """True when the values are the cost model's what-if for this pool, not a measurement."""
    errors: Mapping[str, str] = field(default_factory=dict)
    """Rule name -> why its query failed this time (a source error, not "no data")."""
    baseline_source: str = ""


@dataclass(frozen=True)
class AlertEvidence:
    """One Alertmanager alert that applies to a class (pool None: whichever pool is assessed)."""

    fingerprint: str
    alertname: str
    firing: bool
    pool: str | None = None


@dataclass(frozen=True)
class Evidence:
    """Everything known about one class at one evaluation."""

    pools: Mapping[str, PoolEvidence] = field(default_factory=dict)
    alerts: tuple[AlertEvidence, ...] = ()
    error: str | None = None
    """The whole data source failed this time (every rule of the class is an error)."""


def evidence_from_costs(costs: Iterable[ClassCost]) -> dict[ClassKey, Evidence]:
    """Group the cost model's per (class, pool) results into Evidence per class.

    A measured pool always wins over a what-if prediction for the same pool; of several
    predictions for one pool (made from different measured pools) the one with more samples wins.
    """
    pools: dict[ClassKey, dict[str, PoolEvidence]] = {}
    for cost in costs:
        key: ClassKey = (cost.task_type, cost.temperature_bucket, cost.load_bucket)
        per_class = pools.setdefault(key, {})
        measured = measured_evidence(cost)
        existing = per_class.get(cost.pool)
        if existing is None or existing.predicted or existing.samples < measured.samples:
            per_class[cost.pool] = measured
        for prediction in cost.predictions:
            if prediction.rc is None or prediction.pool == cost.pool:
                continue
            existing = per_class.get(prediction.pool)
            if existing is None or (existing.predicted and existing.samples < cost.n_spec):
                per_class[prediction.pool] = PoolEvidence(
                    pool=prediction.pool,
                    values=_clean({"rc": prediction.rc, "accept_length": prediction.accept_length}),
                    samples=cost.n_spec,
                    predicted=True,
                    baseline_source=cost.baseline_source,
                )
    return {key: Evidence(pools=value) for key, value in pools.items()}


def measured_evidence(cost: ClassCost) -> PoolEvidence:
    """The numbers a rule can read, from one measured ClassCost."""
    values = {
        "rc": cost.rc,
        "rc_lower": cost.lower,
        "rc_upper": cost.upper,
        "strict_accept_rate": cost.strict_accept_rate,
        "accept_length": cost.accept_length,
        "full_rollback_ratio": cost.full_rollback_round_ratio,
        "full_rollback_request_ratio": cost.full_rollback_request_ratio,
        "samples": cost.n_spec,
        "baseline_samples": cost.n_base,
    }
    return PoolEvidence(
        pool=cost.pool,
        values=_clean(values),
        samples=cost.n_spec,
        baseline_source=cost.baseline_source,
    )


def _clean(values: Mapping[str, float | int | None]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}


@dataclass(frozen=True)
class AlertRecord:
    """The latest state of one alert, by fingerprint."""

    fingerprint: str
    alertname: str
    status: str  # firing | resolved
    labels: Mapping[str, str]
    starts_at: str
    received_at: float


class AlertBook:
    """Alerts by fingerprint. Repeats and HA duplicates change nothing; resolved alerts are kept a while.

    Not thread-safe; the daemon touches it from its event loop only.
    """

    def __init__(self) -> None:
        self._alerts: dict[str, AlertRecord] = {}

    def __len__(self) -> int:
        return len(self._alerts)

    def ingest(self, alert: AlertRecord) -> str:
        """Record one alert; returns the outcome: "new", "updated", "duplicate" or "stale".

        Alertmanager retries deliveries and HA replicas send the same alert, so notices arrive
        repeated and out of order. One episode of an alert is (fingerprint, startsAt): its
        "resolved" is final, and a "firing" for it that arrives later is stale; so is any notice
        for an older episode than the one recorded. Only a firing with a newer startsAt (a new
        episode) re-opens a resolved alert. A duplicate refreshes the time it was last received.
        """
        previous = self._alerts.get(alert.fingerprint)
        if previous is None:
            self._alerts[alert.fingerprint] = alert
            return "new"
        order = _compare_instants(alert.starts_at, previous.starts_at)
        if order < 0 or (order == 0 and previous.status == "resolved" and alert.status == "firing"):
            return "stale"
        self._alerts[alert.fingerprint] = alert
        if order == 0 and previous.status == alert.status:
            return "duplicate"
        return "updated"

    def expire(self, now: float, firing_ttl: float, resolved_ttl: float) -> None:
        for fingerprint, alert in list(self._alerts.items()):
            if alert.received_at > now:  # the clock stepped back: the TTL runs from now, not for ever
                alert = self._alerts[fingerprint] = replace(alert, received_at=now)
            ttl = firing_ttl if alert.status == "firing" else resolved_ttl
            if now - alert.received_at > ttl:
                del self._alerts[fingerprint]

    def records(self) -> list[AlertRecord]:
        return sorted(self._alerts.values(), key=lambda a: a.fingerprint)

    def for_class(self, key: ClassKey) -> tuple[AlertEvidence, ...]:
        """Alerts whose class labels match ``key`` (a missing label matches any value)."""
        out = []
        for alert in self.records():
            if matches(alert.labels, key):
                out.append(
                    AlertEvidence(
                        fingerprint=alert.fingerprint,
                        alertname=alert.alertname,
                        firing=alert.status == "firing",
                        pool=alert.labels.get("pool") or None,
                    )
                )
        return tuple(out)


def _instant(text: str) -> datetime | None:
    """An RFC 3339 time as Alertmanager writes it (nanoseconds, "Z"), or None if unreadable."""
    text = text.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    head, dot, rest = text.partition(".")
    if dot:  # Python reads at most 6 fractional digits
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _compare_instants(a: str, b: str) -> int:
    """-1, 0 or 1 as startsAt ``a`` is before, equal to or after ``b`` (text order if unreadable)."""
    if a == b:
        return 0
    first, second = _instant(a), _instant(b)
    if first is None or second is None:
        return -1 if a < b else 1
    return (first > second) - (first < second)


CLASS_LABELS = ("task_type", "temperature_bucket", "load_bucket")


def matches(labels: Mapping[str, str], key: ClassKey) -> bool:
    """True if the alert names a class (at least task_type) and every class label it has agrees."""
    if not labels.get("task_type"):
        return False
    return all(labels.get(name) in (None, "", value) for name, value in zip(CLASS_LABELS, key, strict=True))
