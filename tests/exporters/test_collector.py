"""Collectors: the exposition of per-class counters, histogram and per-pool scrape state."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specguard.exporters.collector import SPEC_ONLY, EngineCollector, TapCollector
from specguard.exporters.config import PoolConfig
from specguard.exporters.poolwatch import PoolWatch, ScrapeLoop
from specguard.exporters.snapshot import EngineSnapshot
from specguard.exporters.stats import WindowedStats
from tests.exporters.recordkit import record

POOL = PoolConfig("spec-k2", "http://x", "vllm", 2)


def samples(registry):
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def labels(**kw):
    base = {"pool": "spec-k2", "task_type": "code", "temperature_bucket": "greedy", "load_bucket": "low"}
    base.update(kw)
    return tuple(sorted(base.items()))


def tpot(**kw):
    """The labels of the TPOT histogram: pool and load bucket."""
    return tuple((k, v) for k, v in labels(**kw) if k not in ("task_type", "temperature_bucket"))


def acceptance(**kw):
    """The labels of an acceptance counter: no load bucket."""
    return tuple((k, v) for k, v in labels(**kw) if k != "load_bucket")


def test_tap_collector_exports_every_numerator_and_denominator():
    stats = WindowedStats()
    stats.add(record(0, hist=(1, 1, 2), out=10, decode=0.9))
    stats.add(record(0, hist=None, reason="n_gt_1"))
    stats.count_error("spec-k2", "timeout")
    registry = CollectorRegistry()
    registry.register(TapCollector(stats, {"spec-k2": 3}))
    got = samples(registry)
    assert got[("specguard_requests_total", labels())] == 2
    assert ("specguard_requests_total", labels(task_type="chat")) not in got  # no traffic: no series
    assert got[("specguard_spec_requests_total", acceptance())] == 1
    assert got[("specguard_verify_rounds_total", acceptance())] == 4
    assert got[("specguard_draft_tokens_total", acceptance())] == 8
    assert got[("specguard_accepted_tokens_total", acceptance())] == 5
    assert got[("specguard_full_rollback_rounds_total", acceptance())] == 1
    assert got[("specguard_decode_tokens_total", labels())] == 18
    assert got[("specguard_accepted_per_position_total", acceptance(position="0"))] == 3
    assert got[("specguard_accepted_per_position_total", acceptance(position="1"))] == 2
    assert got[("specguard_time_per_output_token_seconds_bucket", tpot(le="0.1"))] == 2
    assert got[("specguard_time_per_output_token_seconds_bucket", tpot(le="0.075"))] == 0
    assert got[("specguard_time_per_output_token_seconds_count", tpot())] == 2
    assert got[("specguard_unattributed_requests_total", (("pool", "spec-k2"), ("reason", "n_gt_1")))] == 1
    assert got[("specguard_upstream_errors_total", (("kind", "timeout"), ("pool", "spec-k2")))] == 1
    assert got[("specguard_pool_in_flight_requests", (("pool", "spec-k2"),))] == 3


def test_acceptance_counters_sum_over_load_buckets_and_latency_keeps_them():
    stats = WindowedStats()
    stats.add(record(0, hist=(1, 1, 2), out=10, decode=0.9))
    stats.add(replace(record(0, hist=(0, 3), out=4, decode=0.3), load_bucket="high"))  # K=1 at high load
    registry = CollectorRegistry()
    registry.register(TapCollector(stats, {}))
    got = samples(registry)
    assert got[("specguard_verify_rounds_total", acceptance())] == 4 + 3
    assert got[("specguard_accepted_tokens_total", acceptance())] == 5 + 3
    assert got[("specguard_accepted_per_position_total", acceptance(position="0"))] == 3 + 3
    assert got[("specguard_accepted_per_position_total", acceptance(position="1"))] == 2
    assert not [
        key for name, key in got if name == "specguard_draft_tokens_total" and "load_bucket" in dict(key)
    ]
    assert got[("specguard_requests_total", labels())] == 1
    assert got[("specguard_requests_total", labels(load_bucket="high"))] == 1
    assert got[("specguard_decode_tokens_total", labels(load_bucket="high"))] == 3
    assert got[("specguard_time_per_output_token_seconds_count", tpot(load_bucket="high"))] == 1


def test_the_tpot_histogram_is_per_pool_and_load_and_sparse_counters_wait_for_a_count():
    stats = WindowedStats()
    stats.add(record(0, task="code", out=10, decode=0.9))
    stats.add(record(0, task="chat", out=10, decode=0.45))
    registry = CollectorRegistry()
    registry.register(TapCollector(stats, {}))
    got = samples(registry)
    assert got[("specguard_time_per_output_token_seconds_count", tpot())] == 2  # both classes
    assert got[("specguard_time_per_output_token_seconds_sum", tpot())] == 0.1 + 0.05
    assert got[("specguard_decode_seconds_total", labels(task_type="chat"))] == 0.45  # per class: counters
    assert not [name for name, _ in got if name == "specguard_approximate_requests_total"]  # never counted


def test_nospec_pool_exports_no_speculative_counters():
    stats = WindowedStats()
    stats.add(record(0, pool="nospec", hist=(1, 1, 2), out=10, decode=0.9))  # spec stats or not
    stats.add(record(0, hist=(1, 1, 2), out=10, decode=0.9))
    registry = CollectorRegistry()
    registry.register(TapCollector(stats, {}, nospec_pools=["nospec"]))
    got = samples(registry)
    nospec = labels(pool="nospec")
    for name in ("requests", "output_tokens", "decode_seconds", "decode_tokens"):
        assert got[(f"specguard_{name}_total", nospec)] > 0, name
    assert got[("specguard_time_per_output_token_seconds_count", tpot(pool="nospec"))] == 1
    names = {name for name, key in got if dict(key).get("pool") == "nospec"}
    for name in (*SPEC_ONLY, "accepted_per_position"):
        assert f"specguard_{name}_total" not in names, name
    spec_names = {name for name, key in got if dict(key).get("pool") == "spec-k2"}
    assert {"specguard_verify_rounds_total", "specguard_accepted_per_position_total"} <= spec_names


def test_collect_never_raises():
    class Broken(WindowedStats):
        def totals(self):
            raise RuntimeError("boom")

    registry = CollectorRegistry()
    registry.register(TapCollector(Broken(), {}))
    assert b"specguard_requests_total" not in generate_latest(registry)


def snap(drafts, accepted, series=None):
    return EngineSnapshot(engine="vllm", drafts=drafts, draft_tokens=drafts * 2, accepted_tokens=accepted)


def test_engine_counters_accumulate_reset_safely():
    watch = PoolWatch(POOL, clock=lambda: 5.0)
    registry = CollectorRegistry()
    registry.register(EngineCollector([watch]))
    pool = (("pool", "spec-k2"),)
    assert samples(registry)[("specguard_engine_up", pool)] == 0
    watch.observe(snap(100, 40), 0.01)  # baseline: nothing accumulated yet
    watch.observe(snap(130, 50), 0.02)
    watch.observe(snap(10, 4), 0.02)  # engine restarted: counts from zero again
    watch.observe(snap(15, 6), 0.03)
    got = samples(registry)
    assert got[("specguard_engine_verify_rounds_total", pool)] == 30 + 10 + 5
    assert got[("specguard_engine_accepted_tokens_total", pool)] == 10 + 4 + 2
    assert got[("specguard_engine_draft_tokens_total", pool)] == 90
    assert got[("specguard_engine_counter_resets_total", pool)] == 1
    assert got[("specguard_engine_up", pool)] == 1
    assert got[("specguard_scrape_duration_seconds", pool)] == 0.03
    assert ("specguard_engine_generation_tokens_total", pool) not in got  # the engine does not report it
    watch.fail("connection refused", 0.5)
    got = samples(registry)
    assert got[("specguard_engine_up", pool)] == 0
    assert got[("specguard_engine_last_scrape_error_timestamp_seconds", pool)] == 5.0


def test_describe_does_not_collect():
    class Exploding(WindowedStats):
        def totals(self):
            raise AssertionError("collect() called at registration")

    registry = CollectorRegistry(auto_describe=True)
    registry.register(TapCollector(Exploding(), {}))
    registry.register(EngineCollector([]))


def test_counter_family_appearing_after_the_first_scrape_counts_from_zero():
    watch = PoolWatch(POOL)
    watch.observe(EngineSnapshot(engine="sglang", drafts=None), 0.01)  # no traffic yet: no series
    watch.observe(EngineSnapshot(engine="sglang", drafts=7.0), 0.01)
    watch.observe(EngineSnapshot(engine="sglang", drafts=9.0), 0.01)
    assert watch.view()["accumulated"]["drafts"] == 9.0
    fresh = PoolWatch(POOL)  # the first page ever seen is only the baseline
    fresh.observe(EngineSnapshot(engine="sglang", drafts=7.0), 0.01)
    assert fresh.view()["accumulated"]["drafts"] == 0.0


async def test_scrape_loop_is_named_survives_failures_and_stops():
    watch = PoolWatch(POOL)
    pages = [OSError("refused"), snap(10, 4), ValueError("garbled"), snap(12, 5)]
    seen = []

    async def fetch(pool, timeout):
        page = pages.pop(0) if pages else snap(12, 5)
        if isinstance(page, Exception):
            raise page
        return page

    loop = ScrapeLoop(
        watch, fetch, interval=0.01, timeout=1.0, on_snapshot=lambda p, s: seen.append(s.drafts)
    )
    assert loop.name == "scrape:spec-k2"
    loop.start()
    for _ in range(200):
        if not pages and watch.scrapes >= 5:
            break
        await asyncio.sleep(0.01)
    await loop.stop()
    assert not any(t.get_name() == "scrape:spec-k2" for t in asyncio.all_tasks())
    assert seen[:2] == [10, 12] and watch.up
    assert watch.view()["accumulated"]["drafts"] == 2  # 10 is the baseline
    assert watch.last_error == "ValueError: garbled"
