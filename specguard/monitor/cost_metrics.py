"""Prometheus collector for the cost model: RC per class, load bucket and pool, from the latest evaluation.

``collect()`` renders whatever ``update()`` stored last (the daemon calls it after each
evaluation); it never computes, waits or raises. An unknown RC (no samples or no baseline) is
left out of the ratio families rather than exported as a made-up number, and so is the point
estimate of an RC whose interval is too wide to be one (``rules.rcquality``: "not enough
evidence"; its bounds are still exported); ``specguard_relative_cost_evidence_info`` says which,
and flags a model-baseline RC that contradicts a measured one at a neighbouring load; its sample counts and
``baseline_info{source="none"}`` are still exported so dashboards can show why. Per load bucket,
``specguard_baseline_available{load_bucket, source}`` says which baseline sources could serve it
(1) and which not (0); ``source="none"`` is 1 where none can. ``baseline_report()`` is the same for
``/status``, with the (pool, load bucket) cells that have no baseline and how to get one.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specguard.rules import baseline as baseline_mod
from specguard.rules import rcquality
from specguard.rules.cost import ClassCost

log = logging.getLogger("specguard.cost_metrics")

LABELS = ("task_type", "temperature_bucket", "load_bucket", "pool")

RATIO = "specguard_relative_cost_per_token_ratio"
LOWER = "specguard_relative_cost_per_token_lower_ratio"
UPPER = "specguard_relative_cost_per_token_upper_ratio"
SAMPLES = "specguard_relative_cost_samples"
BASELINE = "specguard_relative_cost_baseline_info"
PREDICTED = "specguard_predicted_relative_cost_per_token_ratio"
AVAILABLE = "specguard_baseline_available"
EVIDENCE = "specguard_relative_cost_evidence_info"

_HELP = {
    RATIO: "Relative cost per token: TPOT with speculation on this pool / TPOT without, same load bucket "
    "(< 1: speculation pays). Absent when unknown.",
    LOWER: "Lower bound of the RC confidence interval (cost.confidence, per-request samples).",
    UPPER: "Upper bound of the RC confidence interval (cost.confidence, per-request samples).",
    SAMPLES: "Requests behind the RC: side=spec (class on this pool), side=baseline (no-spec or profile).",
    BASELINE: "Where the RC's baseline TPOT came from: live no-spec traffic, a (fresh) calibration profile, "
    "the step-cost model, or none.",
    AVAILABLE: "1 for each baseline source that could give the load bucket's no-spec TPOT now (live, "
    "profile, "
    "model), 0 otherwise; source=none is 1 when none can.",
    PREDICTED: "What-if RC of the class on pool (another K), from its acceptance measured on source_pool.",
    EVIDENCE: "Always 1; evidence = enough (the RC is a number), not_enough_evidence (its interval holds "
    f"1.0 and spans more than a factor of {rcquality.MAX_SPREAD:g}: no point estimate is exported, the "
    "bounds are), contradicted (a model-baseline RC on the other side of 1.0 from a measured one at the "
    "nearest load below or above) or unknown.",
}


class CostCollector(Collector):
    """Exports the cost metric families of the last ``update()``; register it on any registry."""

    def __init__(self, spec_pools: Iterable[str] = (), load_order: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._order = tuple(load_order)
        self._costs: tuple[ClassCost, ...] = ()
        self._baselines: dict[str, baseline_mod.Baseline] = {}
        self._spec_pools = tuple(spec_pools)

    def update(
        self, costs: Iterable[ClassCost], baselines: Mapping[str, baseline_mod.Baseline] | None = None
    ) -> None:
        snapshot = tuple(costs)
        with self._lock:
            self._costs = snapshot
            if baselines is not None:
                self._baselines = dict(baselines)

    def baselines(self) -> dict[str, baseline_mod.Baseline]:
        with self._lock:
            return dict(self._baselines)

    def baseline_report(self) -> dict[str, object]:
        """Per load bucket: the baseline in use, every source available, and the cells without one."""
        baselines = self.baselines()
        rows = [
            {
                "load_bucket": bucket,
                "source": base.source,
                "available": [s for s in base.available if s != baseline_mod.SOURCE_NONE],
                "tpot_seconds": base.tpot_seconds,
                "samples": base.samples,
                "detail": base.detail,
            }
            for bucket, base in baselines.items()
        ]
        missing = [
            {"pool": pool, "load_bucket": bucket, "how_to_get_one": baseline_mod.HOW_TO_GET_ONE}
            for bucket, base in baselines.items()
            if base.source == baseline_mod.SOURCE_NONE
            for pool in self._spec_pools
        ]
        return {"load_buckets": rows, "missing": missing}

    @property
    def costs(self) -> tuple[ClassCost, ...]:
        with self._lock:
            return self._costs

    def describe(self) -> list[Metric]:
        return list(_families().values())

    def collect(self) -> Iterable[Metric]:
        families = _families()
        try:
            costs = self.costs
            for cost in costs:
                _add(families, cost, rcquality.grade(cost, costs, self._order)[0])
            for bucket, base in sorted(self.baselines().items()):
                for source in baseline_mod.SOURCES:
                    families[AVAILABLE].add_metric([bucket, source], 1.0 if source in base.available else 0.0)
        except Exception:  # never break a scrape; the previous families are still valid
            log.exception("cost metrics: could not render the latest evaluation")
            families = _families()
        return list(families.values())


def _families() -> dict[str, GaugeMetricFamily]:
    return {
        RATIO: GaugeMetricFamily(RATIO, _HELP[RATIO], labels=LABELS),
        LOWER: GaugeMetricFamily(LOWER, _HELP[LOWER], labels=LABELS),
        UPPER: GaugeMetricFamily(UPPER, _HELP[UPPER], labels=LABELS),
        SAMPLES: GaugeMetricFamily(SAMPLES, _HELP[SAMPLES], labels=(*LABELS, "side")),
        BASELINE: GaugeMetricFamily(BASELINE, _HELP[BASELINE], labels=(*LABELS, "source")),
        PREDICTED: GaugeMetricFamily(PREDICTED, _HELP[PREDICTED], labels=(*LABELS, "source_pool")),
        AVAILABLE: GaugeMetricFamily(AVAILABLE, _HELP[AVAILABLE], labels=("load_bucket", "source")),
        EVIDENCE: GaugeMetricFamily(EVIDENCE, _HELP[EVIDENCE], labels=(*LABELS, "evidence")),
    }


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _add(families: dict[str, GaugeMetricFamily], cost: ClassCost, evidence: str) -> None:
    labels = [cost.task_type, cost.temperature_bucket, cost.load_bucket, cost.pool]
    point = cost.rc if evidence != rcquality.NOT_ENOUGH else None  # too wide to be a number
    for name, value in ((RATIO, point), (LOWER, cost.lower), (UPPER, cost.upper)):
        if _finite(value):
            families[name].add_metric(labels, value)
    families[EVIDENCE].add_metric([*labels, evidence], 1)
    families[SAMPLES].add_metric([*labels, "spec"], cost.n_spec)
    families[SAMPLES].add_metric([*labels, "baseline"], cost.n_base)
    families[BASELINE].add_metric([*labels, cost.baseline_source], 1)
    for prediction in cost.predictions:
        if _finite(prediction.rc):
            target = [cost.task_type, cost.temperature_bucket, cost.load_bucket, prediction.pool, cost.pool]
            families[PREDICTED].add_metric(target, prediction.rc)


def render_costs(costs: Sequence[ClassCost]) -> list[dict[str, object]]:
    """Plain JSON-ready rows (for /status and ``--json`` outputs)."""
    rows = []
    for c in costs:
        rows.append(
            {
                "task_type": c.task_type,
                "temperature_bucket": c.temperature_bucket,
                "load_bucket": c.load_bucket,
                "pool": c.pool,
                "num_speculative_tokens": c.num_speculative_tokens,
                "status": c.status,
                "verdict": c.verdict,
                "rc": c.rc,
                "lower": c.lower,
                "upper": c.upper,
                "confidence": c.confidence,
                "n_spec": c.n_spec,
                "n_base": c.n_base,
                "baseline_source": c.baseline_source,
                "baseline_detail": c.baseline_detail,
                "accept_length": c.accept_length,
                "strict_accept_rate": c.strict_accept_rate,
                "full_rollback_round_ratio": c.full_rollback_round_ratio,
                "full_rollback_request_ratio": c.full_rollback_request_ratio,
                "predictions": [
                    {"pool": p.pool, "k": p.num_speculative_tokens, "rc": p.rc, "detail": p.detail}
                    for p in c.predictions
                ],
            }
        )
    return rows
