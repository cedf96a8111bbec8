"""The tap's /metrics holds series only where there is traffic, and none that cannot have a value.

A label set of the per-class families appears with its first request and stays; a fresh tap's
page is small whatever the size of the class vocabulary (pools x task labels x temperature
buckets x load buckets). The no-spec pool exports what the baseline needs (requests, output
tokens, decode seconds and tokens, the TPOT histogram), no speculative counter.
"""

from __future__ import annotations

import random

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specguard.exporters.collector import CLASS_LABELS, COUNTERS
from specguard.lab import loadgen
from specguard.monitor import config
from specguard.monitor.app import Monitor
from specguard.sim import cluster

K = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
CODE = [loadgen.RequestClass("code", temperature=0.0)]
CHAT = [loadgen.RequestClass("chat", temperature=0.7)]
CLASS_FAMILIES = {name for name, _, _ in COUNTERS} | {
    "specguard_time_per_output_token_seconds",
    "specguard_accepted_per_position",
}
SPEC_FAMILIES = {
    "specguard_spec_requests",
    "specguard_verify_rounds",
    "specguard_draft_tokens",
    "specguard_accepted_tokens",
    "specguard_full_rollback_rounds",
    "specguard_full_rollback_requests",
    "specguard_approximate_requests",
    "specguard_accepted_per_position",
}
ALL = "*"  # a label the family does not carry
TPOT = "specguard_time_per_output_token_seconds"
SPARSE = {"specguard_approximate_requests"}  # from its first increment: never, on vLLM
BASELINE_FAMILIES = {
    "specguard_requests",
    "specguard_output_tokens",
    "specguard_decode_seconds",
    "specguard_decode_tokens",
    "specguard_time_per_output_token_seconds",
}


def monitor_for(sim: cluster.SimCluster) -> Monitor:
    pools = "\n".join(
        f'  - {{name: {name}, url: "{url}", engine: vllm, num_speculative_tokens: {K[name]}}}'
        for name, url in sim.urls.items()
    )
    text = (
        f"pools:\n{pools}\n"
        "tap: {default_pool: spec-k4, nospec_pool: nospec, holdout_share: 0, probe_share: 0}\n"
        "scrape: {interval_seconds: 3600}\n"
    )
    return Monitor(config.parse_text(text, "series.yaml"), rng=random.Random(1))


def page(monitor: Monitor) -> list:
    """Every sample of the monitor's /metrics (what Prometheus would store as series)."""
    text = generate_latest(monitor.registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def class_sets(samples: list) -> dict[tuple[str, ...], set[str]]:
    """Per-class label set -> the families it appears in; a label a family does not carry is ALL
    (acceptance: no load bucket; the TPOT histogram: pool and load bucket only)."""
    out: dict[tuple[str, ...], set[str]] = {}
    for s in samples:
        family = s.name.removesuffix("_total")
        for suffix in ("_bucket", "_sum", "_count"):
            if family.endswith(suffix) and family.removesuffix(suffix) in CLASS_FAMILIES:
                family = family.removesuffix(suffix)
        if family in CLASS_FAMILIES:
            out.setdefault(tuple(s.labels.get(label, ALL) for label in CLASS_LABELS), set()).add(family)
    return out


async def test_a_label_set_appears_with_its_first_request_and_not_before():
    async with cluster.SimCluster.from_config(None, seed=0, dialect="vllm", time_scale=0.005) as sim:
        monitor = monitor_for(sim)
        classes = monitor.exporter_config.classes
        vocabulary = len(sim.urls) * len(classes.task_labels)
        vocabulary *= len(classes.temperature_buckets) * len(classes.load_buckets)
        assert vocabulary >= 100  # the product the page used to pre-create, times 11 counters
        url = await monitor.start("127.0.0.1", 0)
        try:
            fresh = page(monitor)
            assert len(fresh) < 100, len(fresh)
            assert class_sets(fresh) == {}
            results = await loadgen.run_load(url, CODE, 1, requests=6, stream=True, seed=1)
            assert {r.status for r in results} == {200}
            after = page(monitor)
        finally:
            await monitor.stop()
    sets = class_sets(after)
    # exactly the class that had traffic: volume and latency at its load bucket, acceptance over
    # all loads, the TPOT histogram per pool and load
    assert sets == {
        ("spec-k4", "code", "greedy", "low"): CLASS_FAMILIES - SPEC_FAMILIES - {TPOT},
        ("spec-k4", "code", "greedy", ALL): SPEC_FAMILIES - SPARSE,
        ("spec-k4", ALL, ALL, "low"): {TPOT},
    }
    requests = [s.value for s in after if s.name == "specguard_requests_total"]
    assert requests == [6.0]
    assert len(after) < 100 + 40  # one label set: 11 counters, 21 histogram series, K positions


async def test_the_nospec_pool_exports_the_baseline_and_no_speculative_counter():
    async with cluster.SimCluster.from_config(None, seed=0, dialect="vllm", time_scale=0.005) as sim:
        monitor = monitor_for(sim)
        monitor.router.set_plan({("chat", "medium", load): "nospec" for load in ("low", "medium", "high")})
        url = await monitor.start("127.0.0.1", 0)
        try:
            results = await loadgen.run_load(url, CODE + CHAT, 1, requests=12, stream=True, seed=2)
            assert {r.status for r in results} == {200}
            samples = page(monitor)
        finally:
            await monitor.stop()
    sets = class_sets(samples)
    nospec = ("nospec", "chat", "medium", "low")
    assert not sets[nospec] & SPEC_FAMILIES, sets[nospec] & SPEC_FAMILIES
    # no verify rounds, drafts, rollbacks, positions: the baseline's counters and its TPOT histogram
    assert sets[nospec] == BASELINE_FAMILIES - {TPOT}
    assert sets[("nospec", ALL, ALL, "low")] == {TPOT}
    assert set(sets) == {
        ("spec-k4", "code", "greedy", "low"),
        ("spec-k4", "code", "greedy", ALL),
        ("spec-k4", ALL, ALL, "low"),
        nospec,
        ("nospec", ALL, ALL, "low"),
    }
    decode = [
        s.value for s in samples if s.name == "specguard_decode_tokens_total" and s.labels["pool"] == "nospec"
    ]
    assert decode and decode[0] > 0  # the baseline's TPOT denominator is there
