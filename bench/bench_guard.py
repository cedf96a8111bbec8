"""Guard benchmarks (figures for the README): run with ``python3 bench/bench_guard.py [--quick]``.

1. Stability: the shipped default policy over 30 simulated minutes of stationary traffic
   (simulator engine core in virtual time, the tap's router and statistics, the cost model,
   the guard): how long until the losing class is moved off, and how many actions happen
   after that (target: none).
2. Cost of deciding: one ``guard.step`` per class against one ``cost.evaluate`` per class on
   the same records, as a ratio measured in the same run (the state machine must be noise
   next to the statistics it reads).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specguard.lab import replay, replay_policies  # noqa: E402
from specguard.lab import scenario as sc  # noqa: E402
from specguard.monitor import config  # noqa: E402
from specguard.rules import cost as cost_mod  # noqa: E402
from specguard.rules import evidence as evidence_mod  # noqa: E402
from specguard.rules import guard  # noqa: E402
from specguard.rules import policy as policy_mod  # noqa: E402
from specguard.rules.cost_config import CostSettings  # noqa: E402
from specguard.sim import config as sim_config  # noqa: E402


def stability(clients: int, minutes: float) -> dict:
    cfg = config.load_default()
    ex = cfg.exporter
    settings = (cfg.sections.get("cost") or CostSettings()).with_traffic(
        ex.classes.load_buckets, ex.tap.full_rollback_request_threshold
    )
    policy = replay_policies.SpecguardPolicy(ex, policy_mod.load_default(), settings, seed=0)
    scenario = sc.stationary_scenario(clients, minutes * 60)
    started = time.perf_counter()
    result = replay.Replay(
        sim_config.load(), scenario, policy, replay.Buckets.from_classes(ex.classes), seed=0
    ).run()
    wall = time.perf_counter() - started
    decisions = result.decisions
    settle = 300.0
    return {
        "scenario": scenario.name,
        "simulated_minutes": minutes,
        "requests": len(result.finished),
        "evaluations": policy.evaluations,
        "actions": [
            (round(d["time"]), d["class"], d["load_bucket"], d["action"], d["to"]) for d in decisions
        ],
        "actions_after_settling": sum(1 for d in decisions if d["time"] > settle),
        "wall_seconds": round(wall, 1),
        "policy": policy,
    }


def decide_cost(policy) -> dict:
    now = policy.clock.now
    records = policy.stats.records(since=now - policy.policy.window_seconds)
    started = time.perf_counter()
    rounds = 5
    for _ in range(rounds):
        costs = cost_mod.evaluate(records, policy.pools, policy.profile, now, policy.settings)
    cost_seconds = (time.perf_counter() - started) / rounds
    evidence = evidence_mod.evidence_from_costs(costs)
    states = {k: guard.initial_state(k, policy.policy) for k in evidence}
    started = time.perf_counter()
    steps = 0
    for i in range(200):
        for key, ev in evidence.items():
            states[key], _ = guard.step(states[key], ev, now + 30 * (i + 1), policy.policy)
            steps += 1
    step_seconds = (time.perf_counter() - started) / steps
    per_class_cost = cost_seconds / max(1, len(evidence))
    return {
        "records": len(records),
        "classes": len(evidence),
        "step_microseconds": round(step_seconds * 1e6, 1),
        "cost_evaluate_per_class_microseconds": round(per_class_cost * 1e6, 1),
        "step_to_cost_ratio": round(step_seconds / per_class_cost, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10 simulated minutes instead of 30")
    parser.add_argument(
        "--clients", type=int, default=2, help="closed-loop clients per task type (default 2)"
    )
    args = parser.parse_args()
    result = stability(args.clients, 10.0 if args.quick else 30.0)
    policy = result.pop("policy")
    result["decide"] = decide_cost(policy)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
