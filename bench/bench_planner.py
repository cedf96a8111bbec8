"""Fleet planner decision time (``rules.planner``): run with ``python3 bench/bench_planner.py [--quick]``.

One evaluation of 60 classes x 3 load buckets x 4 pools (3 speculative, 1 no-spec; fixed replicas
2/1/1/1), on synthetic cells with intervals: the planner's ``plan`` against the per-class rule's
decision on the same cells (``planner.per_class``: each class to its cheapest pool when the benefit
clears at its interval's worst end), as a ratio measured in the same run. Three cases: per load
bucket with every class free to move (the worst case for the search), per load bucket with half
the cells without an interval, and the 180 (class, load) units as one problem. Also reported: the
problems the search proved optimal, and tokens/s on the planner's own model for the plan now, the
per-class plan and the planner's (the target is under 50 ms per evaluation; no test times it).

The release's run is kept in ``bench/results/planner.json`` (``--json``); ``--render FILE`` prints
the table docs/planner.md carries for it (a test checks it still does).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specguard.rules import planner as pl  # noqa: E402
from specguard.rules.bestpool import Estimate  # noqa: E402
from specguard.rules.stepfit import StepFit  # noqa: E402

STEP = StepFit(("batch", "verify_tokens"), 0.020, (0.0005, 0.0003), 1.0, 0.0, 10)
POOLS = (
    pl.Pool("spec-k4", 4, 2),
    pl.Pool("spec-k3", 3, 1),
    pl.Pool("spec-k2", 2, 1),
    pl.Pool("nospec", 0, 1),
)
LOADS = {"low": 2.0, "mid": 8.0, "high": 24.0}
TARGET_MS = 50


def instance(seed: int, classes: int = 60, movable: float = 1.0) -> pl.PlanInput:
    """Heavy-tailed demand, a random pool now, RC from an acceptance per class with noise."""
    rng = random.Random(seed)
    demand, current, cells = {}, {}, {}
    for c in range(classes):
        accept = rng.uniform(0.3, 0.9)
        for bucket, load in LOADS.items():
            key = (f"task{c:02d}", "greedy", bucket)
            demand[key] = pl.Demand(rng.paretovariate(1.2) * load / 6)
            current[key] = rng.choice([p.name for p in POOLS])
            cells[key] = {}
            for p in POOLS:
                if p.k == 0:
                    continue
                rc = 2 * (0.7 + 0.04 * p.k * load / 8) / (1 + accept * p.k * 0.6) * rng.uniform(0.9, 1.1)
                if rng.random() < movable:
                    w = rng.uniform(0.02, 0.3)
                    cells[key][p.name] = Estimate(
                        p.name, rc, "measured", 100, lower=rc / (1 + w), upper=rc * (1 + w)
                    )
                else:
                    cells[key][p.name] = Estimate(p.name, rc, "what-if", 100)
    return pl.PlanInput(POOLS, STEP, LOADS, demand, current, cells)


def together(inp: pl.PlanInput) -> pl.PlanInput:
    """The same cells as one problem, as the guard's replay plans the fleet now (``rules.planfeed``)."""
    at = {(k, p.name): inp.loads[k[2]] for k in inp.demand for p in inp.pools}
    return replace(inp, together="now", loads={**inp.loads, "now": max(inp.loads.values())}, measured_at=at)


def timed(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def case(name: str, movable: float, seeds: int, repeats: int, one: bool = False) -> dict:
    rows = []
    for seed in range(seeds):
        inp = instance(seed, movable=movable)
        inp = together(inp) if one else inp
        plan = pl.plan(inp)
        old = pl.per_class(inp)
        rows.append(
            {
                "plan_ms": timed(lambda inp=inp: pl.plan(inp), repeats) * 1000,
                "per_class_ms": timed(lambda inp=inp: pl.per_class(inp), repeats) * 1000,
                "nodes": plan.nodes,
                "proven_buckets": sum(plan.exact.values()),
                "moves": len(plan.moves),
                "tokens_now": plan.tokens_now,
                "tokens_per_class": pl.tokens_of(inp, old)[0],
                "tokens_plan": plan.tokens,
                "per_class_slo_breaks": len(pl.slo_breaks(inp, old)),
                "plan_slo_breaks": len(pl.slo_breaks(inp, plan.pools)),
            }
        )
    plan_ms = statistics.median(r["plan_ms"] for r in rows)
    per_ms = statistics.median(r["per_class_ms"] for r in rows)
    return {
        "case": name,
        "seeds": seeds,
        "plan_ms_median": round(plan_ms, 2),
        "plan_ms_max": round(max(r["plan_ms"] for r in rows), 2),
        "per_class_ms_median": round(per_ms, 3),
        "ratio_plan_over_per_class": round(plan_ms / per_ms, 1),
        "proven_problems": f"{sum(r['proven_buckets'] for r in rows)} of {(1 if one else 3) * seeds}",
        "tokens_per_class_over_now": round(
            statistics.mean(r["tokens_per_class"] / r["tokens_now"] for r in rows), 3
        ),
        "classes_above_slo_per_class": sum(r["per_class_slo_breaks"] for r in rows),
        "classes_above_slo_planner": sum(r["plan_slo_breaks"] for r in rows),
        "tokens_plan_over_now": round(statistics.mean(r["tokens_plan"] / r["tokens_now"] for r in rows), 3),
    }


def render(result: list[dict]) -> str:
    """The markdown table docs/planner.md carries for a ``--json`` result (a test checks it does)."""
    lines = [
        "| case | plan (median, max) | per-class rule | plan / per-class | proven optimal "
        "| tokens/s over the plan now: per-class, planner | classes above their SLO: per-class, planner |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result:
        lines.append(
            f"| {r['case']} | {r['plan_ms_median']:.1f} ms, {r['plan_ms_max']:.1f} ms "
            f"| {r['per_class_ms_median']:.2f} ms | {r['ratio_plan_over_per_class']}x "
            f"| {r['proven_problems']} "
            f"| {r['tokens_per_class_over_now']}, {r['tokens_plan_over_now']} "
            f"| {r['classes_above_slo_per_class']}, {r['classes_above_slo_planner']} |"
        )
    slowest = max(r["plan_ms_median"] for r in result)
    verdict = "within" if slowest < TARGET_MS else "above"
    lines.append(f"\nThe slowest case takes {slowest:.1f} ms (median): {verdict} the {TARGET_MS} ms target.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds, 3 repeats")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--render", metavar="FILE", help="print the docs' table for a --json result")
    args = parser.parse_args(argv)
    if args.render:
        print(render(json.loads(Path(args.render).read_text())), end="")
        return
    seeds, repeats = (3, 3) if args.quick else (10, 7)
    out = [
        case("per load bucket, every class free to move", 1.0, seeds, repeats),
        case("per load bucket, half the cells without an interval", 0.5, seeds, repeats),
        case("one problem of 180 (class, load) units, as the replay plans", 1.0, seeds, repeats, one=True),
    ]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for row in out:
        print(
            f"{row['case']}: plan {row['plan_ms_median']:.1f} ms median ({row['plan_ms_max']:.1f} max), "
            f"per-class {row['per_class_ms_median']:.2f} ms, ratio {row['ratio_plan_over_per_class']}x; "
            f"proven optimal in {row['proven_problems']} problems; tokens/s over the plan now: per-class "
            f"{row['tokens_per_class_over_now']}, planner {row['tokens_plan_over_now']}; classes above their "
            f"SLO: per-class {row['classes_above_slo_per_class']}, planner {row['classes_above_slo_planner']}"
        )


if __name__ == "__main__":
    main()
