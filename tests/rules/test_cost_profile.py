from __future__ import annotations

import json
import math

import pytest
from cost_synth import PROFILE_YAML as GOOD

from specguard import configfile
from specguard.errors import ConfigError
from specguard.rules import profile
from specguard.rules.cost_config import (
    CostSettings,
    LoadBucket,
    parse_cost_section,
    resolve_profile_path,
)


def test_a_profile_round_trips_through_its_writer(tmp_path):
    loaded = profile.parse_profile_text(GOOD, "p.yaml")
    assert [p.name for p in loaded.pools] == ["nospec", "spec-k4"]
    assert [lv.concurrency for lv in loaded.pools[0].levels] == [1, 8]  # sorted
    assert loaded.stack == {"engine": "vllm", "engine_version": "0.32.0"}
    code = loaded.pools[1].levels[0].classes[0]
    assert code.accepted_per_position == (0.95, 0.9, 0.8, 0.55)
    target = tmp_path / "out.yaml"
    profile.write_profile(loaded, target)
    again = profile.load_profile(target)
    assert again.pools == loaded.pools and again.created == loaded.created and again.stack == loaded.stack
    assert list(tmp_path.iterdir()) == [target]  # no temp file left behind
    # JSON is YAML: a JSON profile loads too
    as_json = tmp_path / "p.json"
    as_json.write_text(json.dumps(profile.profile_to_dict(loaded)))
    assert profile.load_profile(as_json).pools == loaded.pools


def test_every_profile_error_is_reported_with_its_position():
    bad = GOOD.replace("version: 1", "version: 2").replace("tpot_seconds: 0.022", "tpot_seconds: -1")
    bad = bad.replace("concurrency: 1, tpot", "concurrency: 8, tpot").replace(
        "[0.95, 0.9, 0.8, 0.55]", "[0.5, 0.9]"
    )
    bad = bad.replace("  - name: spec-k4\n", "  - name: spec-k4\n    colour: red\n")
    with pytest.raises(ConfigError) as info:
        profile.parse_profile_text(bad, "p.yaml")
    assert str(info.value).splitlines() == [
        "p.yaml:2:1: version: (2) is not supported; this specguard reads version 1",
        "p.yaml:9:26: pools[0].levels[0].tpot_seconds: (-1.0) must be >= 0.0",
        "p.yaml:10:10: pools[0].levels[1].concurrency: duplicate concurrency 8",
        "p.yaml:22:27: pools[1].levels[0].classes[0].accepted_per_position: must not increase with position",
        "p.yaml:12:5: pools[1].colour: unknown key (known: levels, name, num_speculative_tokens)",
    ]


def test_missing_file_and_wrong_format_are_clear():
    with pytest.raises(ConfigError, match="cannot read"):
        profile.load_profile("/nonexistent/profile.yaml")
    with pytest.raises(ConfigError, match="format: must be 'specguard-calibration-profile'"):
        profile.parse_profile_text("format: other\nversion: 1\npools: []\n")
    with pytest.raises(ConfigError, match="pools: must list at least one pool"):
        profile.parse_profile_text("format: specguard-calibration-profile\nversion: 1\npools: []\n")


def test_lookup_averages_inside_a_bucket_and_interpolates_between_levels():
    pool = profile.parse_profile_text(GOOD).pools[0]
    inside = profile.lookup(pool, 0, 4, "tpot_seconds", "p")
    assert inside.value == 0.018 and inside.samples == 300 and inside.stderr == 0.0002
    both = profile.lookup(pool, 0, 16, "tpot_seconds", "p")
    assert both.value == pytest.approx((300 * 0.018 + 100 * 0.022) / 400)
    between = profile.lookup(pool, 1, 7, "tpot_seconds", "p")  # representative concurrency 4.5
    fraction = math.log(4.5) / math.log(8)
    assert between.value == pytest.approx(0.018 + fraction * 0.004)
    assert "interpolated at concurrency 4.5 from 1 and 8" in between.detail
    assert profile.lookup(pool, 16, math.inf, "tpot_seconds", "p") is None  # never extrapolated
    assert profile.lookup(pool, 0, 16, "step_seconds", "p").value == 0.018  # only levels that have it
    assert profile.representative_concurrency(4, 16) == 10.5
    assert profile.representative_concurrency(16, math.inf) == 17


def test_cost_section_defaults_and_errors(tmp_path):
    doc = configfile.parse_text("cost: {}\n")
    assert parse_cost_section(doc.root().section("cost")) == CostSettings()
    doc = configfile.parse_text(
        "cost:\n  min_samples: 1\n  confidence: 1.5\n  interval_method: magic\n  calibraton_profile: x\n",
        "c.yaml",
    )
    parse_cost_section(doc.root().section("cost"))
    with pytest.raises(ConfigError) as info:
        doc.raise_if_issues()
    assert [str(i) for i in info.value.issues] == [
        "c.yaml:2:3: cost.min_samples: (1) must be >= 2",
        "c.yaml:3:3: cost.confidence: (1.5) must be <= 0.999",
        "c.yaml:4:3: cost.interval_method: ('magic') must be one of 'jackknife', 'delta', 'bootstrap'",
        "c.yaml:5:3: cost.calibraton_profile: unknown key (known: baseline_min_samples, "
        "baseline_scope, bootstrap_resamples, calibration_profile, confidence, interval_method, "
        "min_samples, model_baseline, seed, window_seconds)",
    ]
    doc = configfile.parse_text("cost:\n  calibration_profile: sweep.yaml\n  interval_method: bootstrap\n")
    settings = parse_cost_section(doc.root().section("cost"))
    assert settings.interval_method == "bootstrap"
    assert resolve_profile_path(settings, tmp_path / "main.yaml") == tmp_path / "sweep.yaml"
    assert resolve_profile_path(CostSettings(), None) is None


def test_traffic_settings_accept_the_tap_bucket_objects():
    class Bucket:
        def __init__(self, name, max):
            self.name, self.max = name, max

    settings = CostSettings().with_traffic([Bucket("high", math.inf), Bucket("low", 4)], 0.6)
    assert settings.load_buckets == (LoadBucket("high", math.inf), LoadBucket("low", 4.0))
    assert settings.bucket_range("high") == (4.0, math.inf)
    assert settings.full_rollback_request_threshold == 0.6
