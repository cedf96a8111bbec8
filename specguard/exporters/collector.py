"""Prometheus collectors for the tap's per-class counters and each pool's scrape state.

``collect()`` renders what the tap and the scrape loops already stored: it never waits on an
engine and never raises (a failing part is logged and skipped). Every label value comes from
the config or from a fixed vocabulary in code, so cardinality is bounded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from specguard.exporters.health import PoolHealth
from specguard.exporters.poolwatch import PoolWatch
from specguard.exporters.stats import TPOT_BUCKETS, Key, Totals, WindowedStats

log = logging.getLogger("specguard.collector")

CLASS_LABELS = ["pool", "task_type", "temperature_bucket", "load_bucket"]
# Acceptance is a property of the draft and the traffic, not of the batch it ran in: its counters
# (SPEC_ONLY, per position) carry no load_bucket, one series where the latency counters have one
# per load bucket with traffic. TPOT depends on load and keeps the bucket.
ACCEPTANCE_LABELS = CLASS_LABELS[:3]
# The TPOT histogram is read per pool and load bucket (quantiles against the no-spec pool at the
# same load); per class, TPOT is decode_seconds / decode_tokens. 21 series per label set.
TPOT_LABELS = ["pool", "load_bucket"]

# (metric name without _total, Totals attribute, help)
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("specguard_requests", "requests", "Requests through the tap that finished (any status)."),
    (
        "specguard_spec_requests",
        "spec_requests",
        "Requests that reported per-request speculative-decoding stats.",
    ),
    ("specguard_output_tokens", "output_tokens", "Output (completion) tokens of finished requests."),
    ("specguard_verify_rounds", "verify_rounds", "Speculative verify rounds of requests with spec stats."),
    ("specguard_draft_tokens", "draft_tokens", "Draft tokens proposed (requests with spec stats)."),
    (
        "specguard_accepted_tokens",
        "accepted_tokens",
        "Draft tokens accepted, bonus token excluded (requests with spec stats).",
    ),
    (
        "specguard_full_rollback_rounds",
        "full_rollback_rounds",
        "Verify rounds that accepted zero drafts.",
    ),
    (
        "specguard_full_rollback_requests",
        "full_rollback_requests",
        "Requests whose share of full-rollback rounds exceeded tap.full_rollback_request_threshold.",
    ),
    (
        "specguard_decode_seconds",
        "decode_seconds",
        "Seconds from first to last output token (streamed requests); TPOT = this / decode_tokens.",
    ),
    (
        "specguard_decode_tokens",
        "decode_tokens",
        "Output tokens after the first, over the requests counted in decode_seconds.",
    ),
    (
        "specguard_approximate_requests",
        "approximate_requests",
        "Requests whose spec numbers were inferred from stream chunks, not reported by the engine.",
    ),
)


# Counters with a value only where drafts are verified: not exported for a no-spec pool
# (num_speculative_tokens 0), whose page keeps requests, output tokens and TPOT (the baseline).
SPEC_ONLY: frozenset[str] = frozenset(
    {
        "spec_requests",
        "verify_rounds",
        "draft_tokens",
        "accepted_tokens",
        "full_rollback_rounds",
        "full_rollback_requests",
        "approximate_requests",
    }
)


# Counters exported from their first increment, not with their label set: zero for every engine
# that reports per-request numbers (only TensorRT-LLM's and TGI's streams are counted by chunk).
SPARSE: frozenset[str] = frozenset({"approximate_requests"})


def _safe(name: str, produce: Callable[[], Iterable[Metric]]) -> Iterator[Metric]:
    try:
        yield from list(produce())
    except Exception:  # collect() must never raise into the registry
        log.exception("collector %s failed; its families are skipped this scrape", name)


class TapCollector(Collector):
    """Per-class counters, the TPOT histogram and the tap's own error/attribution counters.

    A label set is exported from its first request on (``WindowedStats`` keeps it for the
    process's life); ``nospec_pools`` get no speculative counters (``SPEC_ONLY``, per position),
    and those carry ``ACCEPTANCE_LABELS`` (summed over load buckets).
    """

    def __init__(self, stats: WindowedStats, in_flight: Mapping[str, int], nospec_pools: Iterable[str] = ()):
        self._stats = stats
        self._in_flight = in_flight
        self._nospec = frozenset(nospec_pools)

    def describe(self) -> Iterator[Metric]:
        for name, attr, doc in COUNTERS:
            yield CounterMetricFamily(name, doc, labels=_labels(attr))
        yield from self._other_families()

    def collect(self) -> Iterator[Metric]:
        yield from _safe("tap", self._collect)

    def _other_families(self) -> list[Metric]:
        return [
            HistogramMetricFamily(
                "specguard_time_per_output_token_seconds",
                "Per-request time per output token after the first (streamed requests).",
                labels=TPOT_LABELS,
            ),
            CounterMetricFamily(
                "specguard_accepted_per_position",
                "Verify rounds whose first position+1 drafts were all accepted (p_i numerator).",
                labels=[*ACCEPTANCE_LABELS, "position"],
            ),
            CounterMetricFamily(
                "specguard_unattributed_requests",
                "Requests forwarded without per-request spec stats, by reason (the cross-check gap).",
                labels=["pool", "reason"],
            ),
            CounterMetricFamily(
                "specguard_unclassified_requests",
                "Tapped requests whose body was not a JSON object (forwarded untouched).",
                labels=["pool"],
            ),
            CounterMetricFamily(
                "specguard_upstream_errors",
                "Upstream failures by kind: connect, timeout, broken (mid-response), status_5xx.",
                labels=["pool", "kind"],
            ),
            CounterMetricFamily(
                "specguard_upstream_resends",
                "Requests sent to a pool once more because nothing of them reached the client, by reason.",
                labels=["pool", "reason"],
            ),
            GaugeMetricFamily(
                "specguard_pool_in_flight_requests",
                "Requests currently in flight through the tap to each pool.",
                labels=["pool"],
            ),
        ]

    def _collect(self) -> list[Metric]:
        totals = self._stats.totals()
        # acceptance per (pool, task_type, temperature_bucket), summed over load buckets
        speculative = _grouped({k: t for k, t in totals.items() if k[0] not in self._nospec}, lambda k: k[:3])
        out: list[Metric] = []
        for name, attr, doc in COUNTERS:
            family = CounterMetricFamily(name, doc, labels=_labels(attr))
            for key, t in sorted((speculative if attr in SPEC_ONLY else totals).items()):
                value = getattr(t, attr)
                if value or attr not in SPARSE:
                    family.add_metric(list(key), float(value))
            out.append(family)
        hist, positions, unattributed, unclassified, errors, resends, in_flight = self._other_families()
        for key, t in sorted(_grouped(totals, lambda k: (k[0], k[3])).items()):  # (pool, load_bucket)
            if t.tpot_count:  # 21 series per label set: only where there are observations
                hist.add_metric(list(key), _buckets(t), t.tpot_sum)
        for key, t in sorted(speculative.items()):
            for position, value in enumerate(t.accepted_per_position):
                positions.add_metric([*key, str(position)], float(value))
        for (pool, reason), value in sorted(self._stats.unattributed().items()):
            unattributed.add_metric([pool, reason], float(value))
        for pool, value in sorted(self._stats.unclassified().items()):
            unclassified.add_metric([pool], float(value))
        for (pool, kind), value in sorted(self._stats.upstream_errors().items()):
            errors.add_metric([pool, kind], float(value))
        for (pool, reason), value in sorted(self._stats.upstream_resends().items()):
            resends.add_metric([pool, reason], float(value))
        for pool, value in sorted(dict(self._in_flight).items()):
            in_flight.add_metric([pool], float(value))
        return [*out, hist, positions, unattributed, unclassified, errors, resends, in_flight]


def _labels(attr: str) -> list[str]:
    return ACCEPTANCE_LABELS if attr in SPEC_ONLY else CLASS_LABELS


def _grouped(
    totals: Mapping[Key, Totals], group: Callable[[Key], tuple[str, ...]]
) -> dict[tuple[str, ...], Totals]:
    """Totals summed into the label set each family is exported with."""
    out: dict[tuple[str, ...], Totals] = {}
    for key, t in totals.items():
        out.setdefault(group(key), Totals()).merge(t)
    return out


def _buckets(t: Totals) -> list[tuple[str, float]]:
    running = 0
    out: list[tuple[str, float]] = []
    for bound, count in zip(TPOT_BUCKETS, t.tpot_buckets, strict=True):
        running += count
        out.append((repr(bound), float(running)))
    out.append(("+Inf", float(t.tpot_count)))
    return out


ENGINE_COUNTERS = (
    ("specguard_engine_verify_rounds", "drafts", "Engine-reported verify rounds with drafts, since start."),
    ("specguard_engine_draft_tokens", "draft_tokens", "Engine-reported draft tokens, since start."),
    ("specguard_engine_accepted_tokens", "accepted_tokens", "Engine-reported accepted drafts, since start."),
    (
        "specguard_engine_generation_tokens",
        "generation_tokens",
        "Engine-reported output tokens, since start.",
    ),
)


class EngineCollector(Collector):
    """Per pool: engine_up, scrape duration, counter resets and the engine counter increases."""

    def __init__(self, watches: Iterable[PoolWatch]):
        self._watches = list(watches)

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        yield from _safe("engine", self._collect)

    def _families(self) -> list[Metric]:
        pool = ["pool"]
        return [
            GaugeMetricFamily(
                "specguard_engine_up", "1 when the last scrape of the pool succeeded.", labels=pool
            ),
            GaugeMetricFamily(
                "specguard_scrape_duration_seconds", "Duration of the last scrape of the pool.", labels=pool
            ),
            GaugeMetricFamily(
                "specguard_engine_last_scrape_error_timestamp_seconds",
                "When the last failed scrape of the pool happened.",
                labels=pool,
            ),
            CounterMetricFamily(
                "specguard_engine_counter_resets",
                "Scrapes in which an engine counter went backwards (engine restart).",
                labels=pool,
            ),
            *(
                CounterMetricFamily(
                    name,
                    doc + " Increases between scrapes, reset-safe (cached from the last scrape).",
                    labels=pool,
                )
                for name, _, doc in ENGINE_COUNTERS
            ),
            CounterMetricFamily(
                "specguard_scrape_rejected",
                "Engine pages refused, by reason: page_too_large, line_too_long, too_many_samples, "
                "not_utf8, malformed (specguard_engine_up is 0 meanwhile).",
                labels=["pool", "reason"],
            ),
            CounterMetricFamily(
                "specguard_scrape_non_finite_samples",
                "NaN or infinite samples dropped from the pool's pages, one by one (the rest is used).",
                labels=pool,
            ),
        ]

    def _collect(self) -> list[Metric]:
        up, duration, error_at, resets, *counters, rejected, non_finite = self._families()
        for watch in self._watches:
            view = watch.view()
            name = [watch.pool.name]
            up.add_metric(name, 1.0 if view["up"] else 0.0)
            if view["duration"] is not None:
                duration.add_metric(name, float(view["duration"]))  # type: ignore[arg-type]
            if view["last_error_at"] is not None:
                error_at.add_metric(name, float(view["last_error_at"]))  # type: ignore[arg-type]
            resets.add_metric(name, float(view["resets"]))  # type: ignore[arg-type]
            accumulated: dict[str, float] = view["accumulated"]  # type: ignore[assignment]
            has: dict[str, bool] = view["has"]  # type: ignore[assignment]
            for family, (_, attr, _) in zip(counters, ENGINE_COUNTERS, strict=True):
                if has[attr]:
                    family.add_metric(name, accumulated[attr])
            for reason, count in sorted(view["rejected"].items()):  # type: ignore[attr-defined]
                rejected.add_metric([watch.pool.name, reason], float(count))
            non_finite.add_metric(name, float(view["non_finite"]))  # type: ignore[arg-type]
        return [up, duration, error_at, resets, *counters, rejected, non_finite]


class HealthCollector(Collector):
    """Per pool: serving or marked down (``exporters.health``), and the requests failed over."""

    def __init__(self, health: PoolHealth):
        self._health = health

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        yield from _safe("health", self._collect)

    @staticmethod
    def _families() -> list[Metric]:
        return [
            GaugeMetricFamily(
                "specguard_pool_healthy",
                "1 while the pool serves, 0 while it is marked down (a connect failed) or ejected "
                "(5xx answers or resets in a row); it then gets no traffic while another pool serves.",
                labels=["pool"],
            ),
            CounterMetricFamily(
                "specguard_failover_requests",
                "Requests the plan sent to pool that were served by to_pool because pool was down.",
                labels=["pool", "to_pool"],
            ),
            CounterMetricFamily(
                "specguard_pool_ejections",
                "Times the pool was ejected: tap.eject_consecutive_5xx answers 5xx or resets in a row.",
                labels=["pool"],
            ),
        ]

    def _collect(self) -> list[Metric]:
        healthy, failovers, ejections = self._families()
        for name, state in self._health.view().items():
            healthy.add_metric([name], 1.0 if state.healthy else 0.0)
        for (pool, to_pool), value in sorted(self._health.failovers.items()):
            failovers.add_metric([pool, to_pool], float(value))
        for name in self._health.view():
            ejections.add_metric([name], float(self._health.ejections.get(name, 0)))
        return [healthy, failovers, ejections]
