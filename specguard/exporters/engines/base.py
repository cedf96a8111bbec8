"""Shared machinery of the page adapters: read counters, gauges and histograms off a parsed page.

Absent means ``None``, never zero. Counters are summed over label sets (vLLM DP ``engine``,
several ``model_name``s) and every series behind a counter is recorded in ``series`` so that
``derive.window`` can difference them one by one, the way Prometheus ``rate()`` does.
Gauges are summed over label sets too, except across *replica* labels (``pid`` in multiprocess
mode, SGLang TP ranks that all report the same scheduler): there the largest value is taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from specguard.errors import InputError
from specguard.exporters import promtext
from specguard.exporters.snapshot import EngineSnapshot, HistogramTotals, SeriesKey

LabelFilter = Callable[[promtext.Labels], bool]


def label_is(name: str, value: str) -> LabelFilter:
    """A filter keeping the series whose label ``name`` equals ``value``."""
    return lambda labels: (name, value) in labels


def label_values(page: promtext.Page, names: Iterable[str], label: str) -> list[str]:
    """Distinct values of ``label`` on the given sample names, in page order."""
    seen: dict[str, None] = {}
    for name in names:
        for sample in page.samples(name):
            value = sample.label(label)
            if value is not None:
                seen.setdefault(value, None)
    return list(seen)


class Reader:
    """Reads one page (optionally only the series matching ``where``) and records counter series."""

    def __init__(
        self,
        page: promtext.Page,
        *,
        where: LabelFilter | None = None,
        replica_labels: tuple[str, ...] = ("pid",),
    ):
        self.page = page
        self.where = where
        self.replica_labels = frozenset(replica_labels)
        self.series: dict[str, dict[SeriesKey, float]] = {}

    def snapshot(self, engine: str, metrics_path: str, **fields: Any) -> EngineSnapshot:
        """The page as an ``EngineSnapshot``: ``fields`` plus the page's family names and the
        counter series read so far (so build it after every read)."""
        repeated = self.page.duplicates
        warnings = tuple(
            f"{self.page.source}:{d.line}: {d.name}: a repeated series (the last value is used)"
            for d in repeated[:MAX_WARNINGS]
        )
        if len(repeated) > MAX_WARNINGS:
            warnings += (f"{self.page.source}: {len(repeated) - MAX_WARNINGS} more repeated series",)
        return EngineSnapshot(
            engine=engine,
            families=tuple(self.page.family_names()),
            metrics_path=metrics_path,
            **fields,
            series=self.series,
            warnings=warnings,
        )

    def samples(self, name: str) -> list[promtext.Sample]:
        found = self.page.samples(name)
        if self.where is not None:
            found = [s for s in found if self.where(s.labels)]
        return [s for s in found if not math.isnan(s.value)]

    def present(self, *names: str) -> bool:
        return any(self.samples(name) for name in names)

    def counter(self, key: str, name: str, where: LabelFilter | None = None) -> float | None:
        """Sum of a counter over its label sets; records each series under ``key``."""
        found = [s for s in self.samples(name) if where is None or where(s.labels)]
        if not found:
            return None
        unique = {(s.name, s.labels): s.value for s in found}  # a repeated series: the last line wins
        bucket = self.series.setdefault(key, {})
        for series, value in unique.items():
            bucket[series] = bucket.get(series, 0.0) + value
        return total(unique.values())

    def counter_vector(self, key: str, name: str, label: str) -> tuple[float, ...] | None:
        """A counter split by an integer label (``position``): index i sums the series with label i."""
        found = self.samples(name)
        if not found:
            return None
        by_index: dict[int, list[promtext.Sample]] = {}
        for sample in found:
            raw = sample.label(label)
            try:
                index = int(raw) if raw is not None else -1
            except ValueError:
                index = -1
            if index < 0 or index > 4096:
                raise InputError(
                    f"{self.page.source}:{sample.line}: {name}: expected label {label} to be a "
                    f"position 0..4096, got {raw!r}"
                )
            by_index.setdefault(index, []).append(sample)
        vector = []
        for index in range(max(by_index) + 1):
            bucket = self.series.setdefault(f"{key}:{index}", {})
            for sample in by_index.get(index, []):
                bucket[(sample.name, sample.labels)] = sample.value
            vector.append(total(bucket.values()))
        return tuple(vector)

    def histogram(self, key: str, base: str, where: LabelFilter | None = None) -> HistogramTotals | None:
        """Sum and count of a histogram or summary family (``base_sum``/``base_count``)."""
        total = self.counter(f"{key}:sum", base + "_sum", where)
        count = self.counter(f"{key}:count", base + "_count", where)
        if total is None or count is None:
            self.series.pop(f"{key}:sum", None)
            self.series.pop(f"{key}:count", None)
            return None
        return HistogramTotals(total, count)

    def counter_totals(self, key: str, value_name: str, count_name: str) -> HistogramTotals | None:
        """Two plain counters read as (sum, count), e.g. llama.cpp seconds / tokens."""
        total = self.counter(f"{key}:sum", value_name)
        count = self.counter(f"{key}:count", count_name)
        if total is None or count is None:
            self.series.pop(f"{key}:sum", None)
            self.series.pop(f"{key}:count", None)
            return None
        return HistogramTotals(total, count)

    def gauge(self, name: str, how: str = "sum", where: LabelFilter | None = None) -> float | None:
        """A gauge over label sets: ``sum`` (max across replicas), ``mean`` or ``max``."""
        found = [s for s in self.samples(name) if where is None or where(s.labels)]
        if not found:
            return None
        if how == "max":
            return max(s.value for s in found)
        if how == "mean":
            return total(s.value for s in found) / len(found)
        groups: dict[promtext.Labels, float] = {}
        for sample in found:
            key = tuple(pair for pair in sample.labels if pair[0] not in self.replica_labels)
            groups[key] = max(groups.get(key, -math.inf), sample.value)
        return total(groups.values())


MAX_WARNINGS = 10


def total(values: Iterable[float]) -> float:
    """An exact sum (``math.fsum``) that is ``inf`` where the values overflow, not an OverflowError."""
    values = list(values)
    try:
        return math.fsum(values)
    except OverflowError:
        return math.copysign(math.inf, sum(values))
    except ValueError:  # inf and -inf together
        return math.nan


def positive(value: float | None) -> bool:
    return value is not None and value > 0
