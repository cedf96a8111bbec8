"""docs/deploy.md's series-per-follower table is the kept ``bench/bench_series.py --json`` run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from test_bench_figures import flat

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_series  # noqa: E402

RESULT = json.loads((ROOT / "bench" / "results" / "series.json").read_text())


def test_the_deploy_doc_carries_the_kept_run():
    fix = "render it again: python3 bench/bench_series.py --render bench/results/series.json"
    assert flat(bench_series.render(RESULT)) in flat((ROOT / "docs" / "deploy.md").read_text()), fix


def test_the_kept_run_is_a_fresh_page_under_100_series_and_fewer_series_than_every_baseline():
    this, *baselines = RESULT["runs"]
    assert baselines, "the kept run compares with earlier code in the same run"
    assert this["ok"] == this["requests"] > 0
    assert this["before"]["series"] < 100 and this["before"]["label_sets"] == 0
    assert 0 < this["after"]["label_sets"] < this["vocabulary"]
    for before in baselines:
        assert before["requests"] == this["requests"], before["name"]
        assert this["after"]["series"] < before["after"]["series"], before["name"]
    # the oldest: every label set exported from start-up
    assert baselines[-1]["before"]["label_sets"] == baselines[-1]["vocabulary"]


def test_the_engine_page_compared_with_is_the_recorded_vllm_page():
    page = (ROOT / "tests" / "fixtures" / "vllm-0.32-cpu-ngram-k4.metrics.txt").read_text()
    samples = sum(len(f.samples) for f in text_string_to_metric_families(page))
    assert f"exports about {round(samples, -1)} series of its own" in flat(
        (ROOT / "docs" / "deploy.md").read_text()
    )
    this = RESULT["runs"][0]
    assert this["after"]["series"] <= 1.5 * samples  # the target: at most 1.5x the engine's own page
