"""``bench/bench_matrix.py --quick``: the robustness matrix's subset runs, and its checks hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_scenario_and_world_of_the_matrix_loads():
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_matrix

    from specguard.lab import worlds

    names = bench_matrix.scenario_names()
    assert len(names) >= 8
    for name in names:
        assert bench_matrix.load(name, None).duration_s > 0
    assert len(worlds.names()) >= 4
    for world in worlds.names():
        worlds.load(world)


@pytest.mark.parametrize("shape", ["fixed", "autoscaled"])
def test_quick_matrix_runs_and_no_row_beats_the_oracle(shape):
    """On fixed and autoscaled pools every row, specguard and the in-engine schedule included, stays
    within the measured noise of the shape's oracle (fix the oracle, not this test)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "bench/bench_matrix.py", "--quick", "--json", "--fleet-shape", shape],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows, agg = result["rows"], result["summary"]
    assert {(r["scenario"], r["world"]) for r in rows} == {
        ("steps", "default"),
        ("steps", "expensive-draft"),
        ("tiny-classes", "default"),
        ("tiny-classes", "expensive-draft"),
    }
    assert result["fleet_shape"]["kind"] == shape and agg["fleet_shape"] == shape
    for r in rows:
        assert r["fleet_shape"] == shape and r["engines"] == (4 if shape == "fixed" else 8)
        assert 0.5 < r["vs_oracle"] <= 1 + agg["noise"]["max_abs"]
        assert "best_in_engine_schedule" in r["ratios_to_oracle"] and r["vs_best_in_engine_schedule"] > 0
    assert agg["bound"]["holds"], agg["bound"]["violations"]
    for key in ("vs_oracle", "vs_best_in_engine_schedule", "worst_phase_vs_never", "tpot_p99_vs_oracle"):
        assert {"mean", "worst", "worst_run"} <= set(agg[key])
    assert agg["runs"] == 4 and "runs below each goal" in agg["targets"]
    text = bench_matrix_render(result)
    assert shape in text["readme"] and "best in-engine K schedule" in text["readme"]


def bench_matrix_render(result: dict) -> dict:
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_matrix

    return bench_matrix.render(result)
