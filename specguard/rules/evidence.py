"""What the guard sees about one class at one evaluation, and the Alertmanager alert book.

Evidence is plain data: per pool, the numbers a rule can read (from the local cost model or
from PromQL), whether they were measured or predicted, and any source error. Alerts from
Alertmanager are kept in an ``AlertBook`` keyed by fingerprint (idempotent under repeats and
HA duplicates) and handed to the state machine as evidence, never as a toggle.

With the policy option ``guard.rc_rises_with_load`` a (class, pool, load bucket) with too few
samples of its own inherits, as a labelled lower *bound*, a loss measured for the same class
and pool at the nearest lower load bucket (``inherit_losses_upward``; docs/guard.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specguard.rules.cost import ClassCost
    from specguard.rules.policy import Policy

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
    inherited_from: str | None = None
    """Load bucket whose measurement these numbers are a bound from (None: this bucket's own)."""
    note: str = ""
    """Why the numbers are what they are, for decisions and the audit log (e.g. an inheritance)."""
    method: str = ""
    """For a prediction: how the accept length was obtained (``histogram``, ``extrapolated``, ``iid``)."""
    made_from: str | None = None
    """For a prediction: the pool whose measurement it was made from."""

    def provenance(self, load_bucket: str, window_seconds: float) -> str:
        """Where this pool's numbers come from, for the reasons decisions give."""
        if self.inherited_from is not None:
            return f"bound inherited from load {self.inherited_from}, n={self.samples}"
        window = f"over the last {window_seconds:.0f} s"
        if self.predicted:
            made = f" on {self.made_from}" if self.made_from else ""
            return f"what-if from {self.samples} requests measured{made} at load {load_bucket} {window}"
        if self.samples == 0 and not self.baseline_source:  # numbers of a PromQL query, not a window
            return f"PromQL for {self.pool} at load {load_bucket}, now"
        baseline = f", baseline {self.baseline_source}" if self.baseline_source else ""
        return f"measured on {self.pool} at load {load_bucket} {window}, n={self.samples}{baseline}"


@dataclass(frozen=True)
class PriorRC:
    """The calibration profile's rc of one class on one pool, with its interval."""

    rc: float
    lower: float
    upper: float


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
    prior: Mapping[str, float] = field(default_factory=dict)
    """Pool -> rc from the calibration profile (``guard.prior: profile``): evidence of last resort,
    read only by the best-pool choice (``rules.bestpool``), never by a rule."""
    prior_bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """Pool -> the interval of its prior rc; a prior without one never moves a class."""


def evidence_from_costs(
    costs: Iterable[ClassCost], *, policy: Policy | None = None, load_order: Sequence[str] = ()
) -> dict[ClassKey, Evidence]:
    """Group the cost model's per (class, pool) results into Evidence per class.

    A measured pool wins over a what-if prediction for the same pool, unless it rests on fewer
    than the rules' ``min_samples`` requests and the prediction on at least that many; of several
    predictions for one pool (made from different measured pools) the one with more samples wins.
    With a ``policy`` whose ``rc_rises_with_load`` is on and the load buckets in ascending order
    (``load_order``), losses measured at a lower load bucket are inherited upwards
    (``inherit_losses_upward``); without them the evidence is each bucket's own.
    """
    needed = None
    if policy is not None:
        needed = min((r.limits.min_samples for r in policy.rules if r.query is None), default=None)
    grouped = _group(costs, needed)
    if policy is not None and policy.rc_rises_with_load and load_order:
        return inherit_losses_upward(grouped, load_order, policy)
    return grouped


def _group(costs: Iterable[ClassCost], needed: int | None = None) -> dict[ClassKey, Evidence]:
    """Per class and pool, one PoolEvidence: the measurement, else the what-if with most samples.

    A measurement on fewer than ``needed`` requests (the rules' ``min_samples``; without it, fewer
    than the cost model's) does not replace a what-if built on at least that many: a rule would
    reject the thin number anyway, and the well-supported prediction would be lost.
    """

    def thin(evidence: PoolEvidence, enough: bool) -> bool:
        return evidence.samples < needed if needed is not None else not enough

    def supported(samples: int) -> bool:
        return needed is None or samples >= needed

    pools: dict[ClassKey, dict[str, PoolEvidence]] = {}
    thin_measured: set[tuple[ClassKey, str]] = set()
    for cost in costs:
        key: ClassKey = (cost.task_type, cost.temperature_bucket, cost.load_bucket)
        per_class = pools.setdefault(key, {})
        measured = measured_evidence(cost)
        is_thin = thin(measured, cost.enough)
        existing = per_class.get(cost.pool)
        if existing is None or existing.samples < measured.samples and not existing.predicted:
            replace_it = True
        elif existing.predicted:
            replace_it = not (is_thin and supported(existing.samples) and existing.samples > measured.samples)
        else:
            replace_it = False
        if replace_it:
            per_class[cost.pool] = measured
            if is_thin:
                thin_measured.add((key, cost.pool))
            else:
                thin_measured.discard((key, cost.pool))
        for prediction in cost.predictions:
            if prediction.rc is None or prediction.pool == cost.pool:
                continue
            existing = per_class.get(prediction.pool)
            over_thin = (
                existing is not None
                and (key, prediction.pool) in thin_measured
                and cost.enough
                and supported(cost.n_spec)
                and cost.n_spec > existing.samples
            )
            if existing is None or (existing.predicted and existing.samples < cost.n_spec) or over_thin:
                thin_measured.discard((key, prediction.pool))
                per_class[prediction.pool] = PoolEvidence(
                    pool=prediction.pool,
                    values=_clean(
                        {
                            "rc": prediction.rc,
                            "accept_length": prediction.accept_length,
                            "ratio_spread": prediction.ratio_spread,
                            **_scaled(cost, prediction.rc),
                        }
                    ),
                    samples=cost.n_spec,
                    predicted=True,
                    baseline_source=cost.baseline_source,
                    method=prediction.acceptance_method or "",
                    note=f"what-if from {cost.pool} ({cost.n_spec} requests)" if over_thin else "",
                    made_from=cost.pool,
                )
    return {key: Evidence(pools=value) for key, value in pools.items()}


def _scaled(cost: ClassCost, rc: float) -> dict[str, float]:
    """A what-if's interval: the relative interval of the measurement it was made from (the same
    requests, the same baseline), carried over to the predicted rc; none when that has none."""
    if cost.rc is None or cost.lower is None or cost.upper is None or not cost.rc > 0:
        return {}
    return {"rc_lower": rc * cost.lower / cost.rc, "rc_upper": rc * cost.upper / cost.rc}


def with_prior(
    evidence: Mapping[ClassKey, Evidence], prior: Mapping[ClassKey, Mapping[str, PriorRC]]
) -> dict[ClassKey, Evidence]:
    """Attach the calibration profile's rc per pool (``rules.prior``) to every (class, load bucket)
    it covers, seen live or not.

    A (class, load bucket) with no live evidence gets an Evidence of its own, so the guard plans it
    before its first requests or before the load gets there (the warm start): a class that arrives
    in a flash crowd is already routed to its pool instead of the default one until the evaluation
    after its first requests finish. A class the traffic never sends is planned once, at the first
    evaluation, and then holds (no live evidence moves it).
    """
    out = dict(evidence)
    for key, rcs in prior.items():
        if rcs:
            out[key] = replace(
                out.get(key) or Evidence(),
                prior={pool: p.rc for pool, p in rcs.items()},
                prior_bounds={pool: (p.lower, p.upper) for pool, p in rcs.items()},
            )
    return out


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
        "spec_spread": cost.spec_spread,
    }
    return PoolEvidence(
        pool=cost.pool,
        values=_clean(values),
        samples=cost.n_spec,
        baseline_source=cost.baseline_source,
    )


INHERITED_MEASURE = "rc_lower"
"""The one number inherited: a lower bound stays a lower bound at a higher load."""
LOSS_BOUND = 1.0
"""RC above 1 means speculation slows the class down (docs/concepts.md)."""


def load_order(buckets: Iterable[Any]) -> tuple[str, ...]:
    """Load bucket names in ascending order of their ``max`` (None or inf = open top bucket)."""

    def top(bucket: Any) -> float:
        value = getattr(bucket, "max", None)
        return math.inf if value is None else float(value)

    return tuple(str(b.name) for b in sorted(buckets, key=top))


def inherit_losses_upward(
    evidence: Mapping[ClassKey, Evidence], order: Sequence[str], policy: Policy
) -> dict[ClassKey, Evidence]:
    """Give a (class, pool, load bucket) with too few samples the loss bound of a lower bucket.

    On one pool, a loss does not turn into a gain as load rises (docs/guard.md: at
    low load extra verify tokens ride along almost free, at high load they compete with real
    requests). So if the nearest lower load bucket with enough samples measured the class on a
    pool with ``rc_lower`` > 1, the class is at least as bad there at this bucket: its pool entry
    becomes that bound (only ``rc_lower``, labelled ``inherited_from`` with a ``note``), which the
    state machine counts as a failed evaluation under its usual limits, cooldown and caps. A good
    RC at a lower bucket says nothing about higher ones, so nothing else is ever inherited: no
    point estimate, no upper bound, no restore evidence. "Enough samples" is the largest
    ``min_samples`` of the local rules on RC (each reads ``rc_lower`` where a move off speculation
    is concerned, whichever RC measure it names: ``rules.assess``); a bound that any of them would
    not call bad, or would call good when restoring, is not inherited: it never counts as a success.
    """
    rc_measures = ("rc", INHERITED_MEASURE, "rc_upper")
    readers = [
        r
        for r in policy.rules
        if r.query is None and (r.measure in rc_measures or r.restore_measure in rc_measures)
    ]
    if not readers:
        return dict(evidence)
    needed = max(r.limits.min_samples for r in readers)
    acting = [r for r in readers if r.measure in rc_measures and r.direction == "above"]
    restoring = [
        r for r in readers if (r.restore_measure or r.measure) in rc_measures and r.direction == "below"
    ]

    def harmful(bound: float | None) -> bool:
        """A loss every reader sees as bad (acting) and none as good (restoring)."""
        if bound is None or not bound > LOSS_BOUND:
            return False
        return all(r.is_bad(bound) for r in acting) and not any(r.is_good(bound) for r in restoring)

    rank = {name: i for i, name in enumerate(order)}
    out = dict(evidence)
    classes: dict[tuple[str, str], list[ClassKey]] = {}
    for key in evidence:
        if key[2] in rank:
            classes.setdefault((key[0], key[1]), []).append(key)
    for keys in classes.values():
        keys.sort(key=lambda k: rank[k[2]])
        source: dict[str, tuple[str, PoolEvidence]] = {}  # pool -> nearest lower bucket with enough
        for key in keys:
            pools = dict(out[key].pools)
            own = {name: e for name, e in pools.items() if not e.predicted and e.samples >= needed}
            for name, (bucket, found) in source.items():
                if name in own:
                    continue
                bound = found.values.get(INHERITED_MEASURE)
                if bound is None or not harmful(bound):
                    continue
                note = (
                    f"inherited from load_bucket={bucket} ({INHERITED_MEASURE} {bound:.2f} > {LOSS_BOUND}, "
                    f"{found.samples} samples): a loss does not turn into a gain as load rises"
                )
                pools[name] = PoolEvidence(
                    pool=name,
                    values={INHERITED_MEASURE: bound},
                    samples=found.samples,
                    baseline_source=found.baseline_source,
                    inherited_from=bucket,
                    note=note,
                )
            for name, found in own.items():
                source[name] = (key[2], found)
            if pools != out[key].pools:
                out[key] = replace(out[key], pools=pools)
    return out


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


ALERT_LABELS = ("alertname", "task_type", "temperature_bucket", "load_bucket", "pool")
"""The only labels an alert is kept with: its name, the class it names and the pool."""
MAX_LABEL_VALUE = 128
"""A longer value names no configured class or pool (label values are short names)."""


class AlertBook:
    """Alerts by fingerprint. Repeats and HA duplicates change nothing; resolved alerts are kept a while.

    Bounded: at most ``max_alerts`` in all and ``max_per_class`` per class slot (the class labels,
    the pool and the alert name); past either, the oldest received goes first (resolved ones
    before firing ones), so a sender with the token can not grow the store or the evaluation.
    Not thread-safe; the daemon touches it from its event loop only (``snapshot`` hands the
    evaluation a copy).
    """

    def __init__(self, *, max_alerts: int = 10_000, max_per_class: int = 16) -> None:
        self.max_alerts = max_alerts
        self.max_per_class = max_per_class
        self._alerts: dict[str, AlertRecord] = {}  # oldest received first
        self._slots: dict[tuple[str, ...], dict[str, None]] = {}  # slot -> fingerprints, oldest first
        self._resolved: dict[str, None] = {}  # resolved fingerprints, oldest received first
        self._fresh: dict[str, AlertRecord] = {}  # in the book, new or changed since ``take_fresh``
        self.evicted = 0

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
        alert = _trimmed(alert)
        previous = self._alerts.get(alert.fingerprint)
        if previous is None:
            self._make_room(_slot(alert))
            self._put(alert)
            self._fresh[alert.fingerprint] = alert
            return "new"
        order = _compare_instants(alert.starts_at, previous.starts_at)
        if order < 0 or (order == 0 and previous.status == "resolved" and alert.status == "firing"):
            return "stale"
        self._drop(alert.fingerprint)
        self._put(alert)
        if order == 0 and previous.status == alert.status:
            return "duplicate"
        self._fresh[alert.fingerprint] = alert
        return "updated"

    def _put(self, alert: AlertRecord) -> None:
        self._alerts[alert.fingerprint] = alert
        self._slots.setdefault(_slot(alert), {})[alert.fingerprint] = None
        if alert.status == "resolved":
            self._resolved[alert.fingerprint] = None

    def _drop(self, fingerprint: str) -> None:
        alert = self._alerts.pop(fingerprint)
        self._resolved.pop(fingerprint, None)
        self._fresh.pop(fingerprint, None)  # (so it never holds more than the book)
        slot = _slot(alert)
        members = self._slots.get(slot, {})
        members.pop(fingerprint, None)
        if not members:
            self._slots.pop(slot, None)

    def _make_room(self, slot: tuple[str, ...]) -> None:
        """Drop the oldest received alert of a full slot, then of a full book; resolved ones first."""
        members = self._slots.get(slot, {})
        if len(members) >= self.max_per_class:
            oldest = list(members)  # (at most max_per_class)
            self._evict(next((f for f in oldest if f in self._resolved), oldest[0]))
        if len(self._alerts) >= self.max_alerts:
            self._evict(next(iter(self._resolved or self._alerts)))

    def _evict(self, fingerprint: str) -> None:
        self._drop(fingerprint)
        self.evicted += 1

    def expire(self, now: float, firing_ttl: float, resolved_ttl: float) -> None:
        for fingerprint, alert in list(self._alerts.items()):
            if alert.received_at > now:  # the clock stepped back: the TTL runs from now, not for ever
                alert = self._alerts[fingerprint] = replace(alert, received_at=now)
            ttl = firing_ttl if alert.status == "firing" else resolved_ttl
            if now - alert.received_at > ttl:
                self._drop(fingerprint)

    def records(self) -> list[AlertRecord]:
        return sorted(self._alerts.values(), key=lambda a: a.fingerprint)

    def checkpoint(self) -> Callable[[], None]:
        """What puts the book back as it is now (a change whose write failed is undone with it)."""
        alerts, resolved, evicted = dict(self._alerts), dict(self._resolved), self.evicted
        slots = {slot: dict(members) for slot, members in self._slots.items()}

        def restore() -> None:
            self._alerts, self._resolved, self._slots, self.evicted = alerts, resolved, slots, evicted

        return restore

    def take_fresh(self) -> list[AlertRecord]:
        """The alerts new or changed since the last call, oldest first (what a journal appends)."""
        fresh, self._fresh = self._fresh, {}
        return [a for a in fresh.values() if self._alerts.get(a.fingerprint) is a]

    def snapshot(self) -> list[AlertRecord]:
        """The alerts now, for an evaluation running off the event loop."""
        return list(self._alerts.values())

    def for_class(self, key: ClassKey) -> tuple[AlertEvidence, ...]:
        """Alerts whose class labels match ``key`` (a missing label matches any value)."""
        return alerts_by_class(self._alerts.values(), [key]).get(key, ())


def alerts_by_class(
    alerts: Iterable[AlertRecord], keys: Iterable[ClassKey]
) -> dict[ClassKey, tuple[AlertEvidence, ...]]:
    """Each key's matching alerts (``matches``), by fingerprint; one pass over the alerts."""
    by_task: dict[str, list[ClassKey]] = {}
    for key in keys:
        by_task.setdefault(key[0], []).append(key)
    found: dict[ClassKey, list[AlertRecord]] = {}
    for alert in alerts:
        for key in by_task.get(alert.labels.get("task_type", ""), ()):
            if matches(alert.labels, key):
                found.setdefault(key, []).append(alert)
    return {
        key: tuple(
            AlertEvidence(
                fingerprint=a.fingerprint,
                alertname=a.alertname,
                firing=a.status == "firing",
                pool=a.labels.get("pool") or None,
            )
            for a in sorted(records, key=lambda a: a.fingerprint)
        )
        for key, records in found.items()
    }


def _slot(alert: AlertRecord) -> tuple[str, ...]:
    return tuple(alert.labels.get(name, "") for name in ALERT_LABELS)


def _trimmed(alert: AlertRecord) -> AlertRecord:
    labels = {k: v[:MAX_LABEL_VALUE] for k, v in alert.labels.items() if k in ALERT_LABELS}
    if labels == alert.labels:
        return alert
    return replace(alert, labels=labels)


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


def alert_time(text: str) -> datetime | None:
    """An alert's ``startsAt`` as a time (RFC 3339 as Alertmanager writes it), None if unreadable."""
    return _instant(text)


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
