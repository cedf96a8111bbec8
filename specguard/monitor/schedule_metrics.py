"""One pool, no routing: what a pool's in-engine K schedule runs per load bucket, and the classes
that lose where it speculates (``rules.onepool``), for ``/metrics``, ``/status`` and the alert.

``specguard_schedule_speculative_tokens{pool, load_bucket, bound}`` is the lowest and highest K the
schedule runs at the bucket's loads per replica (``bound="max"`` 0: it does not speculate there);
``specguard_schedule_class_loses{task_type, temperature_bucket, load_bucket, pool}`` is 1 where the
class's RC interval lies above 1.0 at a load the schedule speculates, else 0 (for every cell of a
scheduled pool with an RC interval). ``SpecGuardScheduledClassLoses`` fires on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specguard import schedules
from specguard.rules import onepool

log = logging.getLogger("specguard.schedule_metrics")

SPEC_TOKENS = "specguard_schedule_speculative_tokens"
LOSES = "specguard_schedule_class_loses"
LABELS = ("task_type", "temperature_bucket", "load_bucket", "pool")
_HELP = {
    SPEC_TOKENS: "K the pool's in-engine schedule runs at the load bucket's loads per replica "
    "(bound=min/max; max 0: no speculation there).",
    LOSES: "1 when the class's RC interval is above 1.0 at a load bucket where the pool's in-engine "
    "schedule speculates (a batch-size schedule cannot spare one class), else 0.",
}


class ScheduleCollector(Collector):
    """Reads the latest costs (``costs()``) and the scheduled pools; never computes at scrape time
    more than a lookup per bucket, never raises."""

    def __init__(
        self,
        scheduled: Mapping[str, schedules.Schedule],
        buckets: Sequence[tuple[str, float, float]],
        costs: Callable[[], Sequence[Any]],
    ) -> None:
        self._scheduled = dict(scheduled)
        self._buckets = tuple(buckets)  # (name, low, high) in requests in flight per replica
        self._ranges = {
            (pool, name): onepool.k_range(s, low, high)
            for pool, s in self._scheduled.items()
            for name, low, high in self._buckets
        }
        self._costs = costs

    def _band(self, name: str) -> tuple[float, float] | None:
        return next(((low, high) for n, low, high in self._buckets if n == name), None)

    def losses(self) -> list[onepool.Loss]:
        return onepool.losses(self._costs(), self._scheduled, self._band)

    def report(self) -> dict[str, Any]:
        """For ``/status``: each scheduled pool's K per load bucket and the classes that lose."""
        return {
            "pools": {
                pool: {
                    "schedule": s.describe(),
                    "config": s.to_json(),
                    "k_by_load_bucket": {
                        name: list(self._ranges[(pool, name)]) for name, _, _ in self._buckets
                    },
                }
                for pool, s in self._scheduled.items()
            },
            "losing": [loss.to_json() for loss in self.losses()],
            "lines": [loss.line() for loss in self.losses()],
        }

    def describe(self) -> list[Metric]:
        return list(_families().values())

    def collect(self) -> Iterable[Metric]:
        families = _families()
        try:
            for (pool, bucket), (low, high) in sorted(self._ranges.items()):
                families[SPEC_TOKENS].add_metric([pool, bucket, "min"], low)
                families[SPEC_TOKENS].add_metric([pool, bucket, "max"], high)
            losing = {(x.task_type, x.temperature_bucket, x.load_bucket, x.pool) for x in self.losses()}
            for c in self._costs():
                if c.pool in self._scheduled and c.lower is not None:
                    key = (c.task_type, c.temperature_bucket, c.load_bucket, c.pool)
                    families[LOSES].add_metric(list(key), 1.0 if key in losing else 0.0)
        except Exception:  # never break a scrape
            log.exception("schedule metrics: could not render the latest evaluation")
            families = _families()
        return list(families.values())


def _families() -> dict[str, GaugeMetricFamily]:
    return {
        SPEC_TOKENS: GaugeMetricFamily(
            SPEC_TOKENS, _HELP[SPEC_TOKENS], labels=("pool", "load_bucket", "bound")
        ),
        LOSES: GaugeMetricFamily(LOSES, _HELP[LOSES], labels=LABELS),
    }
