"""``specguard_baseline_available`` and the baseline report of ``/status`` (``monitor.cost_metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from specguard.monitor.cost_metrics import CostCollector
from specguard.rules import baseline


def base(source, available):
    return baseline.Baseline(source, 0.02 if source != "none" else None, 10, "detail", available=available)


def test_each_load_bucket_says_which_baseline_sources_could_serve_it():
    collector = CostCollector(["spec-k4", "spec-k2"])
    registry = CollectorRegistry()
    registry.register(collector)
    collector.update(
        (),
        {
            "low": base("live", ("live", "model")),
            "medium": base("model", ("model",)),
            "high": base("none", ("none",)),
        },
    )
    got = {
        (s.labels["load_bucket"], s.labels["source"]): s.value
        for family in registry.collect()
        if family.name == "specguard_baseline_available"
        for s in family.samples
    }
    assert got == {
        ("low", "live"): 1.0,
        ("low", "profile"): 0.0,
        ("low", "model"): 1.0,
        ("low", "none"): 0.0,
        ("medium", "live"): 0.0,
        ("medium", "profile"): 0.0,
        ("medium", "model"): 1.0,
        ("medium", "none"): 0.0,
        ("high", "live"): 0.0,
        ("high", "profile"): 0.0,
        ("high", "model"): 0.0,
        ("high", "none"): 1.0,
    }
    report = collector.baseline_report()
    assert [(r["load_bucket"], r["source"], r["available"]) for r in report["load_buckets"]] == [
        ("low", "live", ["live", "model"]),
        ("medium", "model", ["model"]),
        ("high", "none", []),
    ]
    assert [(m["pool"], m["load_bucket"]) for m in report["missing"]] == [
        ("spec-k4", "high"),
        ("spec-k2", "high"),
    ]
    assert "capacity_matched" in report["missing"][0]["how_to_get_one"]
