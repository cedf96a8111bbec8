"""docs/deploy.md's fleet tables are the kept ``bench/bench_fleet.py --json`` run, and what its
prose says of that run holds: at 100 followers this code's series, Prometheus memory and
`specguard.rules` evaluation time are at most 40% of the release it is compared with in the same
run, memory about a quarter at 300, a whole follower page within 1.5 times the engine's own, and
the decider stays flat with the fleet size."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_bench_figures import flat

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_fleet  # noqa: E402

RESULT = json.loads((ROOT / "bench" / "results" / "fleet.json").read_text())
THIS, BASE = (c["name"] for c in RESULT["codes"][:2])
ROWS = {(r["code"], r["targets"]): r for r in RESULT["rows"]}


def test_the_deploy_doc_carries_the_kept_run():
    fix = "render it again: python3 bench/bench_fleet.py --render bench/results/fleet.json"
    assert flat(bench_fleet.render(RESULT)) in flat((ROOT / "docs" / "deploy.md").read_text()), fix


def test_the_kept_run_measures_both_codes_at_10_100_and_300_with_every_follower_up():
    assert {n for _, n in ROWS} >= {10, 100, 300}
    for (code, n), row in ROWS.items():
        assert row["targets_up"] == n, (code, n)
        assert row["decider_evaluation_seconds"]["samples"] > 0, (code, n)


def share(measure: str, n: int) -> float:
    read = bench_fleet.MEASURES[measure]
    return read(ROWS[THIS, n]) / read(ROWS[BASE, n])


@pytest.mark.parametrize(
    "measure",
    ["series", "Prometheus RSS, MB", "`specguard.rules` mean, s", "Prometheus CPU, % of one core"],
)
def test_at_100_followers_this_code_costs_at_most_40_percent_of_the_release(measure):
    assert share(measure, 100) <= 0.4


def test_memory_under_a_third_at_100_about_a_quarter_at_300_and_per_follower():
    # the docs say so in words; a run that lands elsewhere must change them
    assert share("Prometheus RSS, MB", 100) < 1 / 3
    assert 0.2 <= share("Prometheus RSS, MB", 300) <= 0.3
    per_follower = [bench_fleet.growth(RESULT, code)["Prometheus RSS, MB"][1] for code in (THIS, BASE)]
    assert 0.2 <= per_follower[0] / per_follower[1] <= 0.3, per_follower


def test_under_a_quarter_of_the_series_at_every_size_and_3_to_4_5_kb_per_series():
    for n in (10, 100, 300):
        assert 0.2 <= share("series", n) < 0.25, n
    for code in (THIS, BASE):
        fit = bench_fleet.growth(RESULT, code)
        kb = 1024 * fit["Prometheus RSS, MB"][1] / fit["series"][1]
        assert 3.0 <= kb <= 4.5, (code, kb)


def test_the_releases_recorded_series_are_under_2_percent_of_its_series_at_100():
    # its followers' plan and its decider's carry two jobs: the docs name the count and the share
    recorded = ROWS[BASE, 100]["recorded_series"]
    assert recorded / ROWS[BASE, 100]["head_series"] < 0.02
    assert f"The release records {recorded:,} series here" in flat((ROOT / "docs" / "deploy.md").read_text())


def test_past_100_followers_rules_take_a_quarter_or_less_and_cpu_a_fifth_to_a_third():
    for n in (100, 300):
        assert 0.15 <= share("`specguard.rules` mean, s", n) <= 0.25, n
        assert 0.2 <= share("Prometheus CPU, % of one core", n) <= 1 / 3, n
    for code in (THIS, BASE):  # "under 0.2 s in both codes" at 10
        assert rules_mean(code, 10) < 0.2, code


def rules_mean(code: str, n: int) -> float:
    return bench_fleet.rules_seconds(ROWS[code, n])["mean"]


def test_the_release_would_want_about_two_cores_at_1000_followers():
    intercept, slope = bench_fleet.growth(RESULT, BASE)["Prometheus CPU, % of one core"]
    assert 180 <= intercept + slope * bench_fleet.PREDICT_AT <= 220


def test_a_whole_follower_page_is_within_one_and_a_half_times_the_engines_own():
    page = (ROOT / "tests" / "fixtures" / "vllm-0.32-cpu-ngram-k4.metrics.txt").read_text()
    engine = sum(len(f.samples) for f in text_string_to_metric_families(page))
    per_follower = {ROWS[THIS, n]["series_per_target"] for n in (10, 100, 300)}
    (series,) = per_follower
    assert series <= 1.5 * engine, (series, engine)
    assert f"holds {series:,} series after traffic through every class" in flat(
        (ROOT / "docs" / "deploy.md").read_text()
    )


def test_the_decider_stays_flat_while_the_fleet_grows_thirty_fold():
    for code in (THIS, BASE):
        rss = [ROWS[code, n]["decider_rss_mb"] for n in (10, 100, 300)]
        assert max(rss) <= 1.25 * min(rss), (code, rss)
    # its queries read the recorded series, one per class and pool: they grow with neither
    recorded = {ROWS[THIS, n]["recorded_series"] for n in (10, 100, 300)}
    assert max(recorded) <= 1.1 * min(recorded), recorded


def test_growth_and_intervals_follow_from_the_rows():
    intercept, slope = bench_fleet.line_fit([(10, 1.0), (100, 10.0), (300, 30.0)])
    assert abs(slope - 0.1) < 1e-9 and abs(intercept) < 1e-9
    assert bench_fleet.interval_for(7.0) == 15 and bench_fleet.interval_for(7.6) == 30
    assert bench_fleet.interval_for(1e6) is None
    for code in (THIS, BASE):
        series_slope = bench_fleet.growth(RESULT, code)["series"][1]
        per_follower = ROWS[code, 100]["series_per_target"]
        assert 0.9 * per_follower <= series_slope <= 1.1 * per_follower, (code, series_slope)
