"""``specguard_baseline_available`` and the baseline report of ``/status`` (``monitor.cost_metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from specguard.monitor.cost_metrics import CostCollector
from specguard.rules import baseline, rcquality
from specguard.rules.cost import ClassCost


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


def cost(load, rc, lower, upper, source="live"):
    return ClassCost(
        "creative",
        "high",
        load,
        "spec-k4",
        4,
        "ok",
        rc,
        lower,
        upper,
        0.95,
        "delta",
        40,
        50,
        None,
        None,
        source,
        "",
    )


def test_a_too_wide_interval_is_not_enough_evidence_and_a_contradicting_model_rc_is_flagged():
    assert rcquality.enough(0.21, 0.0, 141.14) == rcquality.NOT_ENOUGH  # a zero lower bound
    assert rcquality.enough(1.0, 0.45, 1.9) == rcquality.NOT_ENOUGH  # more than a factor 4, around 1.0
    assert rcquality.enough(1.37, 1.13, 1.66) == rcquality.ENOUGH
    assert rcquality.enough(0.42, 0.18, 0.98) == rcquality.ENOUGH  # wide, but it pays either way
    assert rcquality.enough(1.0, None, None) == rcquality.NOT_ENOUGH  # no interval at all
    assert rcquality.shown(0.21, 0.0, 141.14) == "not enough evidence [0.00, 141.14]"
    collector = CostCollector(["spec-k4"], ["low", "medium", "high"])
    registry = CollectorRegistry()
    registry.register(collector)
    collector.update(
        [
            cost("low", 1.37, 1.13, 1.66),
            cost("medium", 0.21, 0.0, 141.14, "model"),
            cost("high", 0.479, 0.40, 0.57, "model"),
        ]
    )
    got = {
        (family.name, s.labels["load_bucket"], s.labels.get("evidence")): s.value
        for family in registry.collect()
        for s in family.samples
        if "relative_cost_per_token" in family.name or family.name.endswith("evidence_info")
    }
    ratio = "specguard_relative_cost_per_token_ratio"
    assert (ratio, "medium", None) not in got  # too wide: no number ...
    assert got[("specguard_relative_cost_per_token_upper_ratio", "medium", None)] == 141.14  # ... its bounds
    assert got[("specguard_relative_cost_evidence_info", "medium", "not_enough_evidence")] == 1
    assert got[(ratio, "high", None)] == 0.479  # flagged, still a number
    assert got[("specguard_relative_cost_evidence_info", "high", "contradicted")] == 1
    assert got[("specguard_relative_cost_evidence_info", "low", "enough")] == 1
    state, why = rcquality.grade(
        cost("high", 0.479, 0.40, 0.57, "model"), [cost("low", 1.37, 1.13, 1.66)], ["low", "medium", "high"]
    )
    assert state == rcquality.CONTRADICTED and "at the lower load low it measured a loss (1.37" in why
    # a gain measured below a model loss is no contradiction: RC may rise with load
    state, _ = rcquality.grade(
        cost("high", 1.4, 1.2, 1.6, "model"), [cost("low", 0.5, 0.4, 0.6)], ["low", "medium", "high"]
    )
    assert state == rcquality.ENOUGH
