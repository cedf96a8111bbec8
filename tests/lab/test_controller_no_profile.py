"""``bench/bench_controller.py`` without any calibration profile, one scenario on the fluid fleet of
4 engines it was set on: the guard, on live and model baselines alone, is not worse than never
speculating in any phase. On the default fixed pools it is not so (one phase at 0.95x:
docs/benchmarks.md, the no-profile table, says where and why)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_controller.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_controller", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_controller", module)
    spec.loader.exec_module(module)
    return module


def test_without_a_profile_no_phase_is_worse_than_never_speculating():
    bench = load_bench()
    args = argparse.Namespace(
        gpu_scale=2.0,
        fleet=4,
        timer_scale=1 / 3,
        set=[],
        no_profile=True,
        fleet_shape="fluid",
        replicas=None,
    )
    row = bench.one("default", 0, args)
    assert row["profile"] is False
    assert row["worst_phase_vs_never"] >= 1.0, row
    assert row["throughput_vs_never"] > 1.0 and row["actions_in_stationary_phases"] == 0
    assert set(row["baseline_sources"]) <= {"live", "model"}  # nothing from a profile
