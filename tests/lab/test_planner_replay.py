"""``guard.decider: planner`` end to end in virtual time (fixed pools, the simulator's engine core,
the tap's router and statistics, the cost model, the planner and the guard's gates)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from specguard.lab import demo, scenario
from specguard.rules import planner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_controller  # noqa: E402
import bench_matrix  # noqa: E402


def test_the_planner_decides_the_fleet_and_its_moves_pass_the_gates():
    """Every move is the plan's, or the profile's warm start of a class the plan does not cover yet."""
    profile = demo.calibrate(bench_controller.setup_for(scenario.stationary_scenario(1, 60.0), 0))
    setup = bench_controller.setup_for(bench_matrix.load("tiny-classes", 150), 0)
    setup.policy = dataclasses.replace(setup.policy, decider="planner")
    result, guard = demo.run_specguard(setup, profile)
    assert isinstance(guard.last_plan, planner.Plan)
    moves = [d for d in result.decisions if d["action"] in ("off", "shorten", "lengthen", "restore")]
    planned = [d for d in moves if d["cause"] == "planner"]
    assert planned and all(
        d["reason"].startswith(("planner: move", "planner: the class's plan is")) for d in planned
    )
    # the rest: the profile's warm start of classes the plan does not cover yet (no request decoded)
    assert all(
        d["cause"] == "profile" and "no live evidence yet" in d["reason"] for d in moves if d not in planned
    )
    per_hour = setup.timed_policy().max_actions_per_hour
    by_class: dict[tuple, int] = {}
    for d in moves:
        key = (d["class"], d["load_bucket"])
        by_class[key] = by_class.get(key, 0) + 1
    assert max(by_class.values()) <= per_hour  # the cap holds for the planner's moves too
    last = guard.last_plan
    assert last.tokens >= last.tokens_now * (1 - 1e-9)  # never worse than now on its own model
