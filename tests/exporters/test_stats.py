"""Windowed statistics: cumulative totals, window pruning, memory bound, quantiles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specguard.exporters.stats import WindowedStats, quantile
from tests.exporters.recordkit import record
from tests.propkit import examples


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def test_totals_sum_numerators_and_denominators():
    stats = WindowedStats(clock=Clock(), full_rollback_request_threshold=0.5)
    stats.add(record(1000, hist=(1, 1, 2)))  # 4 rounds, 1 rollback -> 0.25: not a rollback request
    stats.add(record(1000, hist=(2, 0, 0)))  # all rollbacks
    stats.add(record(1000, hist=None, reason="stop_string"))
    t = stats.totals()[("spec-k2", "code", "greedy", "low")]
    assert (t.requests, t.spec_requests) == (3, 2)
    assert t.verify_rounds == 6
    assert t.draft_tokens == 12
    assert t.accepted_tokens == 1 + 4
    assert t.full_rollback_rounds == 3
    assert t.full_rollback_requests == 1
    assert t.accepted_per_position == [3, 2]  # rounds with >=1 accepted, >=2 accepted
    assert t.output_tokens == 30
    assert t.decode_tokens == 27 and t.decode_seconds == pytest.approx(2.7)
    assert t.tpot_count == 3 and t.tpot_buckets[-1] == 0
    assert stats.unattributed() == {("spec-k2", "stop_string"): 1}


def test_threshold_is_exclusive_like_the_simulator_truth():
    stats = WindowedStats(clock=Clock(), full_rollback_request_threshold=0.5)
    stats.add(record(1000, hist=(1, 1)))  # exactly half: not "mostly"
    stats.add(record(1000, hist=(2, 1)))
    assert stats.totals()[("spec-k2", "code", "greedy", "low")].full_rollback_requests == 1


def test_window_prunes_old_records_but_counters_keep_counting():
    clock = Clock(1000.0)
    stats = WindowedStats(window_seconds=60, clock=clock)
    stats.add(record(1000))
    clock.now = 1030
    stats.add(record(1030))
    assert len(stats.records()) == 2
    assert [r.started_at for r in stats.records(since=1010)] == [1030]
    clock.now = 1070
    assert [r.started_at for r in stats.records()] == [1030]
    assert stats.totals()[("spec-k2", "code", "greedy", "low")].requests == 2


def test_memory_bound_drops_oldest_first():
    stats = WindowedStats(window_seconds=1e9, max_records=100, clock=Clock())
    for i in range(250):
        stats.add(record(1000 + i * 1e-3))
    kept = stats.records()
    assert len(kept) == 100 and kept[0].started_at == pytest.approx(1000 + 150e-3)
    assert stats.dropped == 150


def test_window_aggregates_with_tpot_quantiles():
    stats = WindowedStats(clock=Clock())
    for i in range(1, 101):
        stats.add(record(1000, out=11, decode=i / 100))  # tpot = i/1000
    stats.add(record(1000, task="chat"))
    agg = stats.window()
    code = agg[("spec-k2", "code", "greedy", "low")]
    assert code.totals.requests == 100
    assert code.tpot_p50 == pytest.approx(0.050)
    assert code.tpot_p99 == pytest.approx(0.099)
    assert agg[("spec-k2", "chat", "greedy", "low")].totals.requests == 1


def test_quantile_empty():
    assert quantile([], 0.5) is None


@settings(max_examples=examples(40), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["code", "chat"]),
            st.one_of(st.none(), st.lists(st.integers(0, 20), min_size=3, max_size=3)),
            st.integers(1, 500),
        ),
        max_size=30,
    )
)
def test_counters_are_sums_over_records_whatever_the_mix(rows):
    stats = WindowedStats(clock=Clock(), max_records=10)
    for task, hist, out in rows:
        stats.add(record(1000, task=task, hist=tuple(hist) if hist else None, out=out, reason=None))
    totals = stats.totals()
    for task in ("code", "chat"):
        mine = [(h, o) for t, h, o in rows if t == task]
        got = totals.get(("spec-k2", task, "greedy", "low"))
        if not mine:
            assert got is None
            continue
        with_spec = [h for h, _ in mine if h]
        assert got.requests == len(mine) and got.spec_requests == len(with_spec)
        assert got.verify_rounds == sum(sum(h) for h in with_spec)
        assert got.accepted_tokens == sum(h[1] + 2 * h[2] for h in with_spec)
        assert got.full_rollback_rounds == sum(h[0] for h in with_spec)
        assert got.output_tokens == sum(o for _, o in mine)
        expected_positions = [sum(h[1] + h[2] for h in with_spec), sum(h[2] for h in with_spec)]
        assert got.accepted_per_position == (expected_positions if with_spec else [])
    assert len(stats.records()) == min(10, len(rows))  # the window is bounded, the counters are not
