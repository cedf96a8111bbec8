"""``specguard demo --json``: the fields, every row on the same engines (fixed pools by default), the
oracle as a checked upper bound, a calibration profile that cannot see the scenario, and specguard
beating always- and never-speculate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specguard import cli
from specguard.lab import demo, scenario

SHORT = """
name: short
description: low load, then saturation
phases:
  - name: low
    duration_seconds: 120
    loads:
      - {task_type: code, clients: 2, temperature: 0.0}
      - {task_type: chat, clients: 2, temperature: 0.7}
      - {task_type: creative, clients: 2, temperature: 1.0}
  - name: saturated
    duration_seconds: 120
    loads:
      - {task_type: code, clients: 64, temperature: 0.0}
      - {task_type: chat, clients: 64, temperature: 0.7}
      - {task_type: creative, clients: 64, temperature: 1.0}
"""

POLICY_KEYS = {
    "label",
    "throughput_tokens_per_second",
    "tpot_mean_ms",
    "tpot_p99_ms",
    "requests",
    "phases",
    "engines",
    "mean_engines_busy",
    "knows",
}
ROWS = set(demo.ROWS)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo") / "short.yaml"
    path.write_text(SHORT)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        args = [
            "--no-live",
            "--duration",
            "0",
            "--json",
            "--gpu-scale",
            "4",
            "--scenario",
            str(path),
            "--seed",
            "3",
        ]
        assert cli.main(["demo", *args]) == 0
    return json.loads(buf.getvalue())


TINY = """
name: tiny
phases:
  - name: only
    duration_seconds: 60
    loads:
      - {task_type: code, clients: 8, temperature: 0.0}
      - {task_type: creative, clients: 8, temperature: 1.0}
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo-live") / "tiny.yaml"
    path.write_text(TINY)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert (
            cli.main(["demo", "--duration", "12", "--json", "--gpu-scale", "4", "--scenario", str(path)]) == 0
        )
    return json.loads(buf.getvalue())["specguard_live"]


def test_json_has_every_policy_and_field(result):
    assert set(result["policies"]) == ROWS - {"best_per_phase"}  # fixed pools cannot change K per phase
    for name, policy in result["policies"].items():
        assert POLICY_KEYS <= set(policy), name
        assert [p["name"] for p in policy["phases"]] == ["low", "saturated"]
        assert policy["tpot_p99_ms"] >= policy["tpot_mean_ms"] > 0
    assert result["seed"] == 3
    assert "rules.guard.step" in result["specguard_mode"]
    assert set(result["ratios"]) >= {
        "specguard_vs_oracle_throughput",
        "specguard_vs_best_single_pool_throughput",
        "specguard_vs_best_in_engine_schedule_throughput",
        "specguard_vs_best_per_class_static_throughput",
        "specguard_vs_never_worst_phase_throughput",
        "specguard_vs_oracle_tpot_p99",
        "specguard_no_profile_vs_oracle_throughput",
        "specguard_stale_profile_vs_oracle_throughput",
    }
    assert result["policies"]["specguard"]["actions"] == len(result["policies"]["specguard"]["decisions"])
    assert set(result["targets"]) == {
        "vs_oracle",
        "worst_phase_vs_never",
        "vs_best_single_pool",
        "tpot_p99_vs_oracle",
        "changes_per_class_hour",
    }


def test_every_row_gets_the_same_engines_and_says_so(result):
    engines = result["capacity"]["engines"]
    shape = result["fleet_shape"]
    assert shape["kind"] == "fixed" and shape["replicas"] == {"spec-k4": 2, "spec-k2": 1, "nospec": 1}
    assert engines == 4 and "the same 4 engines" in result["capacity"]["statement"]
    for name, policy in result["policies"].items():
        assert policy["engines"] == engines, name
        assert 0 < policy["mean_engines_busy"] <= engines, name
    schedule = result["policies"]["best_in_engine_schedule"]
    assert schedule["label"].startswith("best in-engine schedule") and "K" in schedule["label"]


def test_no_row_beats_the_oracle_by_more_than_the_measured_noise(result):
    """The oracle is the best of every hindsight plan, replayed; specguard must not beat it."""
    noise, bound = result["noise"], result["bound"]
    assert noise["draws"] == 2 and 0 <= noise["max_abs"] < 0.02
    oracle = result["policies"]["oracle"]["throughput_tokens_per_second"]
    for name, policy in result["policies"].items():
        assert policy["throughput_tokens_per_second"] <= oracle * (1 + noise["max_abs"]), name
    for name in ("best_single_pool", "best_in_engine_schedule", "best_per_class_static", "never_speculate"):
        assert result["policies"][name]["throughput_tokens_per_second"] <= oracle  # by construction
    assert bound["holds"] and bound["tolerance"] == noise["max_abs"]


def test_the_calibration_profile_cannot_see_the_scenario(result):
    calibration = result["calibration"]
    assert calibration["sees_the_scenario"] is False and calibration["seed"] == 3 + 1000
    # the sweep's mix: every task type of the world at every temperature bucket, not the scenario's
    tasks = {task for task, _ in calibration["mix"]}
    assert tasks == {"code", "extraction", "chat", "creative"}  # extraction is not in the scenario
    assert len(calibration["mix"]) == 4 * 4


def test_live_run_went_through_the_tap_and_the_guard(live):
    assert live["requests"] > 30 and live["failed_requests"] == 0
    assert live["tap_requests"] >= live["requests"]  # every request went through the tap
    assert live["tpot_mean_ms"] > 0 and live["time_scale"] > 0
    assert live["final_plan"]  # the guard evaluated classes and holds a plan for them
    # the guard evaluates at start, just before the traffic: its warm start is at t=0, never before
    warm = [d["time"] for d in live["decisions"] if d["cause"] == "profile"]
    # (at 0 s, or a few milliseconds after on a busy machine: never a whole evaluation interval late)
    assert warm and 0.0 <= min(warm) < 1.0, live["decisions"]
    assert all(d["time"] >= 0 for d in live["decisions"]), live["decisions"]


def test_specguard_beats_always_and_never_speculate(result):
    p = result["policies"]
    sg = p["specguard"]["throughput_tokens_per_second"]
    assert sg > p["always_speculate"]["throughput_tokens_per_second"]
    assert sg > p["never_speculate"]["throughput_tokens_per_second"]
    assert p["specguard"]["tpot_mean_ms"] < p["always_speculate"]["tpot_mean_ms"]
    assert p["specguard"]["tpot_mean_ms"] < p["never_speculate"]["tpot_mean_ms"]
    # the guard really acted: creative (RC > 1 at every load) left speculation
    assert any(d["task_type"] == "creative" and d["to"] == "nospec" for d in p["specguard"]["decisions"])
    assert (
        p["oracle"]["throughput_tokens_per_second"] >= p["best_single_pool"]["throughput_tokens_per_second"]
    )


def test_the_holdout_is_a_few_percent_not_the_no_spec_engines_share(result):
    # matched_on_demand: a live baseline at every load for a few percent of the requests; capacity
    # matching all the time held out a quarter of a 4-engine fleet (docs/demo.md)
    for row, bound in (("specguard", 0.05), ("specguard_stale_profile", 0.05), ("specguard_no_profile", 0.2)):
        held = result["policies"][row]["routes"]["holdout"]
        # without a profile nothing is planned on the no-spec pool until live evidence moves it, so in
        # this 4-minute run the first fill of every load bucket is most of it (13% measured)
        assert 0 < held["requests"] < bound and held["client_time"] < bound + 0.01, (row, held)


def test_bad_flags_and_files_are_clear_errors(tmp_path, capsys):
    assert cli.main(["demo", "--duration", "-1"]) == 2
    assert "--duration" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("phases:\n  - {name: x, duration_seconds: 0, loads: []}\n")
    assert cli.main(["demo", "--scenario", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:2" in err and "duration_seconds" in err
    assert cli.main(["demo", "--scenario", "nope"]) == 2
    capsys.readouterr()
    assert cli.main(["demo", "--fleet-shape", "fluid", "--fleet", "2"]) == 2
    err = capsys.readouterr().err
    assert "--fleet" in err and "every pool needs an engine" in err
    assert cli.main(["demo", "--replicas", "spec-k8=3"]) == 2
    assert "--replicas" in capsys.readouterr().err
    assert cli.main(["demo", "--fleet", "6"]) == 2  # a fixed fleet's engines are its replicas
    assert "--replicas" in capsys.readouterr().err
    assert cli.main(["demo", "--stale-world", "nowhere"]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_builtin_scenarios_are_consistent():
    for name, build in scenario.BUILTIN.items():
        scen = build()
        assert scen.duration_s > 0, name
        assert scen.phase_at(0) == 0 and scen.phase_at(scen.duration_s + 1) == len(scen.phases) - 1
    assert scenario.stationary_scenario().stationary_phases() == [1]
    assert scenario.default_scenario().scaled(60).duration_s == pytest.approx(60)


def test_same_seed_same_numbers_whatever_the_hash_seed(tmp_path):
    import os
    import subprocess
    import sys

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    outputs = []
    for hash_seed in ("1", "2"):
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": root}
        args = ["demo", "--no-live", "--duration", "0", "--json", "--gpu-scale", "4", "--scenario", str(path)]
        done = subprocess.run(
            [sys.executable, "-m", "specguard", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=root,
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        result.pop("wall_seconds")
        outputs.append(result)
    assert outputs[0] == outputs[1]
