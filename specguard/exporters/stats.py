"""Per-class statistics of the requests through the tap: cumulative counters and a sliding window.

Key = (pool, task_type, temperature_bucket, load_bucket). Counters only grow (they are what
Prometheus gets); the window keeps the last ``window_seconds`` of ``RequestRecord``s for the
cost model (``records(since)``) and for windowed aggregates with TPOT quantiles. Memory is
bounded by ``max_records`` (the oldest records are dropped first).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from specguard.exporters.records import RequestRecord

Key = tuple[str, str, str, str]  # pool, task_type, temperature_bucket, load_bucket

# TPOT histogram buckets (seconds): 1 ms .. 2.5 s, dense where LLM decode lives.
TPOT_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.5,
)


@dataclass
class Totals:
    """Numerators and denominators for one key (cumulative or over a window)."""

    requests: int = 0
    spec_requests: int = 0  # requests that reported per-request spec stats
    output_tokens: int = 0
    verify_rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    full_rollback_rounds: int = 0
    full_rollback_requests: int = 0
    decode_seconds: float = 0.0
    decode_tokens: int = 0  # sum of output_tokens - 1 over requests with a decode time
    approximate_requests: int = 0  # requests whose numbers were inferred from stream chunks
    accepted_per_position: list[int] = field(default_factory=list)  # index i: rounds with > i accepted
    tpot_buckets: list[int] = field(default_factory=lambda: [0] * len(TPOT_BUCKETS))
    tpot_sum: float = 0.0
    tpot_count: int = 0

    def add(self, record: RequestRecord, threshold: float) -> None:
        self.requests += 1
        self.output_tokens += record.output_tokens
        tpot = record.tpot_seconds
        if tpot is not None and record.decode_seconds is not None:
            self.decode_seconds += record.decode_seconds
            self.decode_tokens += record.output_tokens - 1
            self.tpot_sum += tpot
            self.tpot_count += 1
            index = bisect.bisect_left(TPOT_BUCKETS, tpot)
            if index < len(TPOT_BUCKETS):
                self.tpot_buckets[index] += 1
        spec = record.spec
        if spec is None:
            return
        self.spec_requests += 1
        self.approximate_requests += int(spec.approximate)
        self.verify_rounds += spec.rounds or 0
        self.draft_tokens += spec.draft_tokens or 0
        self.accepted_tokens += spec.accepted_tokens or 0
        rollbacks = spec.full_rollback_rounds or 0
        self.full_rollback_rounds += rollbacks
        if spec.rounds and rollbacks / spec.rounds > threshold:
            self.full_rollback_requests += 1
        hist = spec.accepted_histogram
        if hist:
            positions = len(hist) - 1
            if len(self.accepted_per_position) < positions:
                self.accepted_per_position.extend([0] * (positions - len(self.accepted_per_position)))
            running = 0
            for i in range(positions, 0, -1):  # rounds with >= i accepted = sum(hist[i:])
                running += hist[i]
                self.accepted_per_position[i - 1] += running

    def merge(self, other: Totals) -> None:
        """Add ``other``'s numbers to these (totals of several keys exported as one)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, value in enumerate(theirs):
                    mine[i] += value
            else:
                setattr(self, f.name, mine + theirs)

    def copy(self) -> Totals:
        out = Totals(**{f.name: getattr(self, f.name) for f in fields(self)})
        out.accepted_per_position = list(self.accepted_per_position)
        out.tpot_buckets = list(self.tpot_buckets)
        return out


@dataclass(frozen=True)
class WindowAggregate:
    """Totals over the window for one key, plus TPOT quantiles (None without samples)."""

    totals: Totals
    tpot_p50: float | None
    tpot_p90: float | None
    tpot_p99: float | None


def key_of(record: RequestRecord) -> Key:
    return (record.pool, record.task_type, record.temperature_bucket, record.load_bucket)


def quantile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank quantile of an already sorted list."""
    if not sorted_values:
        return None
    rank = max(0, min(len(sorted_values) - 1, int(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


class WindowedStats:
    """Thread-safe store of request records: cumulative per-key totals and a bounded window."""

    def __init__(
        self,
        *,
        window_seconds: float = 900.0,
        max_records: int = 100_000,
        full_rollback_request_threshold: float = 0.5,
        clock: Callable[[], float] = time.time,
    ):
        self.window_seconds = window_seconds
        self.threshold = full_rollback_request_threshold
        self._clock = clock
        self._lock = threading.Lock()
        self._window: deque[RequestRecord] = deque(maxlen=max_records)
        # A key enters with its first record and stays for the process's life: a label set
        # dropped while idle would restart at 0 when its traffic returns, and rate() would miss
        # its increase up to the next scrape each time. Bounded: every label value comes from
        # the config's vocabulary.
        self._totals: dict[Key, Totals] = {}
        self._unattributed: dict[tuple[str, str], int] = {}
        self._unclassified: dict[str, int] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._resends: dict[tuple[str, str], int] = {}
        self.dropped = 0  # records evicted by the memory bound before their time

    def add(self, record: RequestRecord) -> None:
        """Count one finished request (called by the tap)."""
        with self._lock:
            totals = self._totals.get(key_of(record))
            if totals is None:
                totals = self._totals[key_of(record)] = Totals()
            totals.add(record, self.threshold)
            if record.unattributed_reason is not None:
                k = (record.pool, record.unattributed_reason)
                self._unattributed[k] = self._unattributed.get(k, 0) + 1
            if not record.classified:
                self._unclassified[record.pool] = self._unclassified.get(record.pool, 0) + 1
            if len(self._window) == self._window.maxlen:
                oldest = self._window[0]
                if oldest.started_at >= self._clock() - self.window_seconds:
                    self.dropped += 1
            self._window.append(record)
            self._prune()

    def count_unattributed(self, pool: str, reason: str) -> None:
        """A request the tap forwarded without recording it (e.g. POST to another path)."""
        with self._lock:
            self._unattributed[(pool, reason)] = self._unattributed.get((pool, reason), 0) + 1

    def count_error(self, pool: str, kind: str) -> None:
        """An upstream failure (connect, timeout, 5xx, broken stream)."""
        with self._lock:
            self._errors[(pool, kind)] = self._errors.get((pool, kind), 0) + 1

    def count_resend(self, pool: str, reason: str) -> None:
        """A request sent to ``pool`` once more because nothing of it reached the client (not an error)."""
        with self._lock:
            self._resends[(pool, reason)] = self._resends.get((pool, reason), 0) + 1

    def _prune(self) -> None:
        horizon = self._clock() - self.window_seconds
        window = self._window
        while window and window[0].started_at < horizon:
            window.popleft()

    def records(self, since: float | None = None) -> list[RequestRecord]:
        """Records in the window (started at or after ``since`` when given), oldest first."""
        with self._lock:
            self._prune()
            if since is None:
                return list(self._window)
            return [r for r in self._window if r.started_at >= since]

    def totals(self) -> dict[Key, Totals]:
        """Cumulative totals since start (copies; safe to read while requests keep coming)."""
        with self._lock:
            return {key: t.copy() for key, t in self._totals.items()}

    def unattributed(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._unattributed)

    def unclassified(self) -> dict[str, int]:
        with self._lock:
            return dict(self._unclassified)

    def upstream_errors(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._errors)

    def upstream_resends(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._resends)

    def window(self, since: float | None = None) -> dict[Key, WindowAggregate]:
        """Aggregates per key over the window, with TPOT p50/p90/p99."""
        per_key: dict[Key, Totals] = {}
        tpots: dict[Key, list[float]] = {}
        for record in self.records(since):
            key = key_of(record)
            totals = per_key.get(key)
            if totals is None:
                totals = per_key[key] = Totals()
                tpots[key] = []
            totals.add(record, self.threshold)
            tpot = record.tpot_seconds
            if tpot is not None:
                tpots[key].append(tpot)
        out: dict[Key, WindowAggregate] = {}
        for key, totals in per_key.items():
            values = sorted(tpots[key])
            out[key] = WindowAggregate(
                totals, quantile(values, 0.5), quantile(values, 0.9), quantile(values, 0.99)
            )
        return out
