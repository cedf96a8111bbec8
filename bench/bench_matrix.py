"""Robustness matrix: specguard in scenarios and simulator worlds it was not tuned on, per fleet shape.

Every scenario of ``bench/scenarios`` (step loads, a ramp, gradual drift, oscillation faster than
the guard's timers, a load swinging across the knee, tiny classes, a long stationary tail, a flash
crowd, two loads of one task type) in every simulator world of ``specguard/lab/worlds`` (plus the
shipped default), seeds 0-2, in virtual time through the simulator's engine core, with the shipped
default guard policy and a calibration profile swept on that world with its own mix and seed.

Per run: specguard against the oracle (``lab.hindsight``: the best of every hindsight plan, planned
per time slice on the simulator's truth, replayed), the best single pool, the best static plan per
class, the best in-engine K schedule and never-speculate, overall and per phase, every row on the
same engines of one fleet shape (``--fleet-shape``, ``lab.shapes``); TPOT p99 against the oracle's;
plan changes per class per hour against the policy's cap; and the oracle's plan replayed with
another acceptance draw (the run-to-run noise). The bound: no row beats the oracle by more than
the largest noise measured in the matrix. One table, then the mean, the worst run and the worst
phase of each figure and the targets.

    flock /tmp/specguard-bench.lock python3 bench/bench_matrix.py [--quick] [--jobs 2]
        [--scenarios a,b] [--worlds a,b] [--seeds 0,1,2] [--profiles fresh,none,stale]
        [--fleet-shape fixed|autoscaled|fluid] [--replicas 3xK4+1xnospec] [--fleet N]
        [--decider per-class|planner] [--scaling] [--no-spread] [--k-schedule] [--json]
    python3 bench/bench_matrix.py --render bench/results/matrix-fixed.json  # the docs' markdown
    python3 bench/bench_matrix.py --render bench/results/matrix-fixed.json --into docs/benchmarks.md
    cd bench/results && python3 ../bench_matrix.py --compare matrix-fixed-no-spread.json:matrix-fixed.json \
        [...] --into ../../docs/planner.md  # runs with guard.spread: false against the shipped ones
    cd bench/results && python3 ../bench_matrix.py --into ../../docs/planner.md \
        --decider-versus matrix-autoscaled.json:matrix-autoscaled-planner-all.json \
        matrix-fixed.json:matrix-fixed-planner.json  # the planner, the same runs
    cd bench/results && python3 ../bench_matrix.py --into ../../docs/planner.md --scaling-versus \
        matrix-autoscaled-planner.json:matrix-autoscaled-planner-scaling.json:matrix-autoscaled-planner-sustain0.json
    cd bench/results && python3 ../bench_matrix.py --into ../../docs/planner.md --block scaling-all \
        --scaling-versus matrix-autoscaled-planner-all.json:matrix-autoscaled-planner-scaling-all.json
    cd bench/results && python3 ../bench_matrix.py --into ../../docs/benchmarks.md \
        --schedule-versus matrix-fixed.json:matrix-fixed-scheduled.json  # pools with schedules

``--k-schedule``: each speculative pool runs the in-engine K schedule the run's calibration
profile gives a pool of its K in a routed fleet (``kschedule.recommend(keep=K)``: its K while that
pays for the sweep's mix, then cheaper), in the world and in the tap's config, so the guard prices
it at the K its schedule picks at each load. ``--quick``: two scenarios (shortened to 150 s)
in two worlds, seed 0 (what the test runs).
``--json`` prints every run and the summary; the release's run of each fleet shape is kept in
``bench/results/matrix-SHAPE.json`` and ``--render`` turns it into the markdown that
docs/benchmarks.md (and, for fixed pools, README.md) carry (a test checks they still do).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_controller  # noqa: E402

from specguard.lab import demo, scenario, shapes, summary, worlds  # noqa: E402
from specguard.rules import kschedule  # noqa: E402
from specguard.rules import policy as policy_mod  # noqa: E402

SCENARIOS = Path(__file__).with_name("scenarios")
QUICK = {"scenarios": "steps,tiny-classes", "worlds": "default,expensive-draft", "seeds": "0", "seconds": 150}
STALE_WORLD = {"k4-dominates": "expensive-draft"}  # the stale profile's world; default: k4-dominates
TARGETS = {
    "mean_vs_oracle": 0.95,
    "worst_run_vs_oracle": 0.90,
    "worst_phase_vs_never": 1.0,
    "vs_best_single_pool": 1.0,
    "vs_best_in_engine_schedule": 1.0,
    "tpot_p99_vs_oracle": 1.15,
}


def scenario_names() -> list[str]:
    return sorted(p.stem for p in SCENARIOS.glob("*.yaml"))


def load(name: str, seconds: float | None) -> scenario.Scenario:
    scen = scenario.load_scenario(str(SCENARIOS / f"{name}.yaml"))
    return scen.scaled(seconds) if seconds else scen


def calibration(spec: tuple[str, int, float, str, str | None]) -> tuple[tuple[str, int], object]:
    """The fresh profile of (world, seed): it depends on neither the scenario nor the other worlds."""
    world, seed, gpu_scale, shape, replicas = spec
    setup = bench_controller.setup_for(
        scenario.stationary_scenario(1, 60.0),
        seed,
        world=world,
        gpu_scale=gpu_scale,
        shape=shape,
        replicas=replicas,
    )
    return (world, seed), demo.calibrate(setup)


def run(spec: dict) -> dict:
    t0 = time.perf_counter()
    scen = load(spec["scenario"], spec["seconds"])
    setup = bench_controller.setup_for(
        scen,
        spec["seed"],
        world=spec["world"],
        gpu_scale=spec["gpu_scale"],
        fleet=spec.get("fleet"),
        shape=spec.get("shape", shapes.FIXED),
        replicas=spec.get("replicas"),
    )
    wanted = {
        "decider": spec.get("decider", setup.policy.decider),
        "spread": spec.get("spread", setup.policy.spread),
    }
    if spec.get("scaling"):  # the guard sizes the pools; the fleet's HPA scales on its numbers
        shape = setup.fleet_shape
        wanted["scaling"] = policy_mod.Scaling(
            target_in_flight=shape.target_in_flight,
            start_delay_seconds=shape.start_delay_s,
            max_replicas=shape.engines,
            sustain_seconds=spec.get("sustain"),
        )
    if any(getattr(setup.policy, key) != value for key, value in wanted.items()):
        setup = dataclasses.replace(setup, policy=dataclasses.replace(setup.policy, **wanted))
    launched = {}  # each speculative pool turns K down where the calibration says it stops paying
    for pool in [p for p in setup.exporter.pools if p.speculative] if spec.get("k_schedule") else ():
        advice = kschedule.recommend(spec["profile"], keep=pool.num_speculative_tokens)
        if advice is not None and advice.vllm is not None and len(advice.ranges) > 1:
            launched[pool.name] = advice.vllm
    if launched:
        setup = demo.with_k_schedules(setup, launched, configured=spec["k_schedule"] != "unconfigured")
    rows, realised = {}, {}
    variants = {"fresh": ("specguard", spec["profile"]), "none": ("specguard_no_profile", None)}
    variants["stale"] = ("specguard_stale_profile", spec["stale_profile"])
    for variant in spec["profiles"]:
        key, profile = variants[variant]
        result, guard = demo.run_specguard(setup, profile)
        rows[key] = demo.specguard_row(setup, result, guard, variant)
        realised[key] = guard.choices
    compared = demo.compare(setup, rows, noise_draws=(1,), realised=realised)
    policies, r = compared["policies"], compared["ratios"]
    sg, oracle = policies["specguard"], policies["oracle"]
    out = {
        "scenario": spec["scenario"],
        "world": spec["world"],
        "seed": spec["seed"],
        "fleet_shape": setup.fleet_shape.kind,
        "decider": setup.policy.decider,
        "spread": setup.policy.spread,
        "scaling": setup.policy.scaling is not None,
        "sustain_seconds": setup.policy.scaling.sustain if setup.policy.scaling is not None else None,
        "engines": setup.fleet,
        "vs_oracle": r["specguard_vs_oracle_throughput"],
        "worst_phase_vs_oracle": min(x for x in summary.phase_ratios(sg, oracle) if x is not None),
        "vs_best_single_pool": r["specguard_vs_best_single_pool_throughput"],
        "vs_best_in_engine_schedule": r["specguard_vs_best_in_engine_schedule_throughput"],
        "worst_phase_vs_best_in_engine_schedule": r[
            "specguard_vs_best_in_engine_schedule_worst_phase_throughput"
        ],
        "best_in_engine_schedule": policies["best_in_engine_schedule"]["label"].split(": ", 1)[-1],
        "vs_best_per_class_static": r["specguard_vs_best_per_class_static_throughput"],
        "vs_never": r["specguard_vs_never_speculate_throughput"],
        "worst_phase_vs_never": r["specguard_vs_never_worst_phase_throughput"],
        "worst_phase_vs_never_name": _worst_phase(sg, policies["never_speculate"]),
        "in_that_phase_vs_never": _in_worst_phase(sg, policies, oracle),
        "tpot_p99_vs_oracle": r["specguard_vs_oracle_tpot_p99"],
        "max_changes_per_class_hour": sg["max_changes_per_class_hour"],
        "cap_per_hour": setup.timed_policy().max_actions_per_hour,
        "actions": sg["actions"],
        "actions_in_stationary_phases": sg["actions_in_stationary_phases"],
        "oracle_plan_from": oracle["plan_from"],
        "oracle_routing_vs_oracle": oracle["routing_plan_tokens_per_second"]
        / oracle["throughput_tokens_per_second"],
        "noise": compared["noise"]["max_abs"],
        "ratios_to_oracle": compared["bound"]["ratios_to_oracle"],
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    if launched:
        out["k_schedule"] = {name: schedule.describe() for name, schedule in launched.items()}
        out["k_schedule_configured"] = spec["k_schedule"] != "unconfigured"
    for variant in spec["profiles"]:
        if variant != "fresh":
            out[f"{variant}_profile_vs_oracle"] = summary.ratio(policies[variants[variant][0]], oracle)
    return out


def _in_worst_phase(sg: dict, policies: dict, oracle: dict) -> dict[str, float | None]:
    """In specguard's worst phase against never-speculate, the best routing plan the per-slice
    hindsight search found (``routing_plan_phases``) and the best in-engine K schedule against
    never-speculate: whether routing over the shape's pools could have done no harm there."""
    never = policies["never_speculate"]
    index = _worst_index(sg, never)
    if index is None:
        return {}
    rows = {
        "routing": {"phases": oracle["routing_plan_phases"]},
        "schedule": policies["best_in_engine_schedule"],
    }
    return {name: summary.phase_ratios(row, never)[index] for name, row in rows.items()}


def _worst_phase(a: dict, b: dict) -> str:
    index = _worst_index(a, b)
    return "" if index is None else a["phases"][index]["name"]


def _worst_index(a: dict, b: dict) -> int | None:
    """The phase where ``a``'s throughput over ``b``'s is lowest (None: no phase has a ratio)."""
    pairs = [(x, i) for i, x in enumerate(summary.phase_ratios(a, b)) if x]
    return min(pairs)[1] if pairs else None


def aggregate(rows: list[dict]) -> dict:
    """Mean, worst run and worst phase of every figure; the bound with the matrix's noise; the targets."""
    tolerance = max(r["noise"] for r in rows)
    violations = [
        {"run": f"{r['scenario']}/{r['world']}/{r['seed']}", "row": name, "ratio": value}
        for r in rows
        for name, value in r["ratios_to_oracle"].items()
        if value is not None and value > 1 + tolerance
    ]

    def stats(key: str, worst=min) -> dict:
        values = [r[key] for r in rows if r.get(key) is not None]
        at = worst(rows, key=lambda r: r[key])
        return {
            "mean": statistics.mean(values),
            "worst": worst(values),
            "worst_run": f"{at['scenario']}/{at['world']}/seed {at['seed']}",
        }

    out = {
        "fleet_shape": rows[0].get("fleet_shape", "fluid") if rows else None,
        "runs": len(rows),
        "vs_oracle": stats("vs_oracle"),
        "worst_phase_vs_oracle": stats("worst_phase_vs_oracle"),
        "vs_best_single_pool": stats("vs_best_single_pool"),
        "vs_best_in_engine_schedule": stats("vs_best_in_engine_schedule"),
        "worst_phase_vs_best_in_engine_schedule": stats("worst_phase_vs_best_in_engine_schedule"),
        "vs_best_per_class_static": stats("vs_best_per_class_static"),
        "worst_phase_vs_never": stats("worst_phase_vs_never"),
        "tpot_p99_vs_oracle": stats("tpot_p99_vs_oracle", max),
        "max_changes_per_class_hour": stats("max_changes_per_class_hour", max),
        "noise": {"max_abs": tolerance, "method": "the oracle's plan, one other acceptance draw per run"},
        "bound": {"tolerance": tolerance, "holds": not violations, "violations": violations},
    }
    for key in ("none_profile_vs_oracle", "stale_profile_vs_oracle"):
        if any(key in r for r in rows):
            out[key] = stats(key)
    out["targets"] = {
        "mean_vs_oracle >= 0.95": out["vs_oracle"]["mean"] >= TARGETS["mean_vs_oracle"],
        "worst run vs oracle >= 0.90": out["vs_oracle"]["worst"] >= TARGETS["worst_run_vs_oracle"],
        "every phase >= never-speculate": out["worst_phase_vs_never"]["worst"] >= 1.0,
        "every run >= best single pool": out["vs_best_single_pool"]["worst"] >= 1.0,
        "every run >= best in-engine schedule": out["vs_best_in_engine_schedule"]["worst"] >= 1.0,
        "TPOT p99 <= 1.15 x oracle": out["tpot_p99_vs_oracle"]["worst"] <= TARGETS["tpot_p99_vs_oracle"],
        "changes per class per hour <= cap": all(
            r["max_changes_per_class_hour"] <= r["cap_per_hour"] for r in rows
        ),
        "runs below each goal": {
            "vs_oracle < 0.90": sum(r["vs_oracle"] < 0.90 for r in rows),
            "worst phase < never": sum(r["worst_phase_vs_never"] < 1.0 for r in rows),
            "< best single pool": sum(r["vs_best_single_pool"] < 1.0 for r in rows),
            "< best in-engine schedule": sum(r["vs_best_in_engine_schedule"] < 1.0 for r in rows),
            "TPOT p99 > 1.15 x oracle": sum(r["tpot_p99_vs_oracle"] > 1.15 for r in rows),
        },
    }
    return out


def table(rows: list[dict]) -> str:
    head = (
        f"{'scenario':<13}{'world':<20}{'seed':>4}{'/oracle':>9}{'worst ph':>9}{'/single':>9}{'/sched':>8}"
        f"{'/class':>8}{'ph/never':>9}{'p99/or':>8}{'chg/h':>6}{'noise':>7}  oracle plan"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['scenario']:<13}{r['world']:<20}{r['seed']:>4}{r['vs_oracle']:>9.3f}"
            f"{r['worst_phase_vs_oracle']:>9.3f}{r['vs_best_single_pool']:>9.3f}"
            f"{r['vs_best_in_engine_schedule']:>8.3f}"
            f"{r['vs_best_per_class_static']:>8.3f}{r['worst_phase_vs_never']:>9.3f}"
            f"{r['tpot_p99_vs_oracle']:>8.2f}{r['max_changes_per_class_hour']:>6}{r['noise']:>7.4f}"
            f"  {r['oracle_plan_from']}"
        )
    return "\n".join(lines)


GOALS = (  # (summary key, label, target text, runs-below key)
    ("vs_oracle", "throughput / oracle", "≥ 0.95 mean, ≥ 0.90 worst", "vs_oracle < 0.90"),
    ("worst_phase_vs_oracle", "worst phase / oracle", "—", None),
    ("vs_best_single_pool", "throughput / best single pool", "≥ 1.00", "< best single pool"),
    (
        "vs_best_in_engine_schedule",
        "throughput / best in-engine K schedule",
        "≥ 1.00",
        "< best in-engine schedule",
    ),
    ("worst_phase_vs_best_in_engine_schedule", "worst phase / best in-engine K schedule", "—", None),
    ("vs_best_per_class_static", "throughput / best static plan per class", "—", None),
    ("worst_phase_vs_never", "worst phase / never-speculate", "≥ 1.00 in every phase", "worst phase < never"),
    ("tpot_p99_vs_oracle", "TPOT p99 / oracle's", "≤ 1.15", "TPOT p99 > 1.15 x oracle"),
    ("max_changes_per_class_hour", "plan changes per class per hour", "≤ the cap", None),
)
MET = {
    "vs_oracle": ("mean_vs_oracle >= 0.95", "worst run vs oracle >= 0.90"),
    "vs_best_single_pool": ("every run >= best single pool",),
    "vs_best_in_engine_schedule": ("every run >= best in-engine schedule",),
    "worst_phase_vs_never": ("every phase >= never-speculate",),
    "tpot_p99_vs_oracle": ("TPOT p99 <= 1.15 x oracle",),
    "max_changes_per_class_hour": ("changes per class per hour <= cap",),
}


def render(result: dict) -> dict[str, str]:
    """The markdown the docs carry for one matrix run: ``scenarios`` (throughput / oracle, mean over
    the seeds per scenario and world), ``goals`` (each figure against its target), ``readme`` and
    ``wall`` (how long it took: the time depends on the machine) and ``bound`` (whether any row beat
    the oracle by more than the noise, and where)."""
    rows, summary = result["rows"], result["summary"]
    names = sorted({r["scenario"] for r in rows})
    world_names = list(dict.fromkeys(r["world"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})

    def cell(runs: list[dict]) -> str:
        return f"{statistics.mean(r['vs_oracle'] for r in runs):.3f}"

    head = ["scenario", *world_names, "mean", "worst run", "worst phase"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in [*names, None]:
        mine = [r for r in rows if name is None or r["scenario"] == name]
        cells = [cell([r for r in mine if r["world"] == w]) for w in world_names]
        tail = [
            cell(mine),
            f"{min(r['vs_oracle'] for r in mine):.3f}",
            f"{min(r['worst_phase_vs_oracle'] for r in mine):.3f}",
        ]
        label = name or "**all**"
        if name is None:
            tail = [f"**{x}**" for x in tail]
        lines.append("| " + " | ".join([label, *cells, *tail]) + " |")
    scenarios_md = "\n".join(lines)

    below = summary["targets"]["runs below each goal"]
    goal_lines = ["| figure | mean | worst | where | target | met |", "|---|---|---|---|---|---|"]
    for key, label, target, below_key in GOALS:
        figure = summary[key]
        met = "—"
        if key in MET:
            ok = all(summary["targets"][t] for t in MET[key])
            met = "**yes**" if ok else "**no**"
            if not ok and below_key:
                met += f" ({below[below_key]} runs)"
        digits = 2 if key == "tpot_p99_vs_oracle" else (1 if key == "max_changes_per_class_hour" else 3)
        goal_lines.append(
            f"| {label} | {figure['mean']:.{digits}f} | {figure['worst']:.{digits}f} | "
            f"{figure['worst_run']} | {target} | {met} |"
        )
    v = summary["vs_oracle"]
    never, sched = summary["worst_phase_vs_never"], summary["vs_best_in_engine_schedule"]
    p99 = summary["tpot_p99_vs_oracle"]
    shape = result.get("fleet_shape", {}).get("label", "a fluid fleet of 4 engines (an idealisation)")
    readme = (
        f"In the robustness matrix on {shape} ({summary['runs']} runs: {len(names)} scenarios × "
        f"{len(world_names)} simulator worlds × seeds {seeds[0]}–{seeds[-1]}) specguard reaches "
        f"{v['mean']:.3f} of the oracle on average ({of_routing(rows):.3f} of the best routing plan "
        f"the hindsight search finds on these pools); the worst run is {v['worst']:.3f} "
        f"({v['worst_run']}), the worst phase {never['worst']:.2f}× never-speculate "
        f"({never['worst_run']}), {sched['mean']:.3f}× the best in-engine K schedule on average "
        f"({sched['worst']:.3f} at worst) and TPOT p99 up to {p99['worst']:.2f}× the oracle's."
    )
    per_run = statistics.mean(r["wall_seconds"] for r in rows)
    wall = (
        f"{summary['runs']} runs in {result['wall_seconds'] / 60:.1f} min wall with "
        f"{result.get('jobs', 2)} processes ({per_run:.1f} s per run)"
    )
    sched_lines = [
        "| scenario | " + " | ".join(world_names) + " | worst run |",
        "|" + "---|" * (len(world_names) + 2),
    ]
    for name in names:
        mine = [r for r in rows if r["scenario"] == name]
        cells = [
            f"{statistics.mean(r['vs_best_in_engine_schedule'] for r in mine if r['world'] == w):.3f}"
            for w in world_names
        ]
        sched_lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {min(r['vs_best_in_engine_schedule'] for r in mine):.3f} |"
        )
    held = summary["bound"]
    if held["holds"]:
        bound = (
            f"**The bound holds in all {summary['runs']} runs**: no row beats the oracle by more than "
            f"the largest run-to-run noise measured in the matrix ({held['tolerance']:.2%})."
        )
    else:
        where = "; ".join(f"{v['row']} in {v['run']} ({v['ratio']:.3f})" for v in held["violations"])
        bound = (
            f"**The bound does not hold in {len({v['run'] for v in held['violations']})} of "
            f"{summary['runs']} runs** (noise {held['tolerance']:.2%}): {where}."
        )
    return {
        "scenarios": scenarios_md,
        "goals": "\n".join(goal_lines),
        "schedule": "\n".join(sched_lines),
        "readme": readme,
        "wall": wall,
        "bound": bound,
        "ceiling": ceiling(rows),
        "below_never": below_never(rows),
    }


def below_never(rows: list[dict]) -> str:
    """The runs with a phase below never-speculate: in that phase, specguard, the best routing plan
    the per-slice hindsight search found and the best in-engine K schedule, each over
    never-speculate (runs kept before this figure was recorded are left out)."""
    below = [r for r in rows if r["worst_phase_vs_never"] < 1.0]
    runs = [r for r in below if r.get("in_that_phase_vs_never")]
    if not below:
        return "No run of this set has a phase below never-speculate."
    if not runs:
        return f"{len(below)} runs have a phase below never-speculate; they did not record the plans there."
    lines = [
        "| run | phase | specguard | best per-slice routing plan | best in-engine K schedule |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: r["worst_phase_vs_never"]):
        there = r["in_that_phase_vs_never"]
        lines.append(
            f"| {r['scenario']}/{r['world']}/seed {r['seed']} | {r['worst_phase_vs_never_name']} | "
            f"{r['worst_phase_vs_never']:.3f} | {there['routing']:.3f} | {there['schedule']:.3f} |"
        )
    routing = sum(r["in_that_phase_vs_never"]["routing"] < 1.0 for r in runs)
    schedule = sum(r["in_that_phase_vs_never"]["schedule"] < 1.0 for r in runs)
    lines.append("")
    lines.append(
        f"Throughput over never-speculate's in the phase where specguard's is lowest. In {routing} of "
        f"these {len(runs)} runs the best routing plan the per-slice hindsight search found on the "
        f"shape's pools is below never-speculate in that phase too, and the best in-engine K schedule in "
        f"{schedule}."
    )
    return "\n".join(lines)


SCHEDULE = "best_in_engine_schedule"
ROUTING_PLANS = ("oracle", "oracle_sticky", "spread", "split_static", "best_per_class_static")
"""The oracle's candidates that route over the shape's pools (with ``_replicas``: replanned on the
replicas the plan had; ``*_routing``: a specguard row's own routing replayed); every other
candidate is one pool of all the engines, at the in-engine K schedule or at one pool's K."""


def best_routing(row: dict) -> float:
    """The best routing plan the hindsight search knows, over the oracle: per time slice, a static
    spread or a static pool per class, on the shape's pools."""
    return max(row["oracle_routing_vs_oracle"], row["ratios_to_oracle"]["best_per_class_static"])


def _routes(name: str) -> bool:
    return name.removesuffix("_replicas") in ROUTING_PLANS or name.endswith("_routing")


def of_routing(rows: list[dict]) -> float:
    """specguard's mean share of the best routing plan the hindsight search knows."""
    return statistics.mean(r["vs_oracle"] / best_routing(r) for r in rows)


def ceiling(rows: list[dict]) -> str:
    """How much of the oracle routing over the shape's pools can reach, and how much of that
    specguard reaches: where the oracle is one pool of all the engines at a K (or a K schedule) no
    pool of the shape runs, no routing over them matches it."""
    one_pool = [r for r in rows if not _routes(r["oracle_plan_from"])]
    schedule = sum(r["oracle_plan_from"] == SCHEDULE for r in one_pool)
    routing = [(best_routing(r), r) for r in rows]
    mine = [(r["vs_oracle"] / value, r) for value, r in routing]

    def where(pairs: list[tuple[float, dict]]) -> str:
        value, r = min(pairs, key=lambda pair: pair[0])
        return f"{value:.3f} at worst, {r['scenario']}/{r['world']}/seed {r['seed']}"

    fixed_k = rows[0].get("fleet_shape") == shapes.FIXED  # a pool's engines never change K
    one_k = len(one_pool) - schedule
    pools_note = (
        f", and in {one_k} more one pool of all the engines at one K, which on fixed pools routing "
        "cannot be either"
        if fixed_k
        else f" (in {one_k} more it is one pool of all the engines at one K)"
    )
    return (
        f"In {schedule} of {len(rows)} runs the oracle is the in-engine K schedule on one pool of all "
        f"the engines, which no routing over pools of fixed K can be{pools_note}. The best routing "
        f"plan the hindsight search finds on the shape's pools (per time slice, or static per class) "
        f"reaches {statistics.mean(v for v, _ in routing):.3f} of the oracle on average "
        f"({where(routing)}); specguard reaches {of_routing(rows):.3f} of that "
        f"plan on average ({where(mine)})."
    )


def compare(pairs: list[tuple[dict, dict]]) -> str:
    """A table of the same matrix run twice per fleet shape (``(shipped, other)`` results): mean and
    worst throughput over the oracle, runs with a phase below never-speculate, throughput over the
    best in-engine K schedule and the worst TPOT p99 over the oracle's."""
    lines = [
        "| fleet shape | runs | mean / oracle | worst run / oracle | runs with a phase below never-speculate "
        "| mean / best in-engine schedule | worst TPOT p99 / oracle's |",
        "|---|---|---|---|---|---|---|",
    ]
    for base, other in pairs:
        a, b = base["summary"], other["summary"]
        if (a["fleet_shape"], a["runs"]) != (b["fleet_shape"], b["runs"]):
            raise ValueError(
                f"not the same matrix: {a['fleet_shape']}/{a['runs']} vs {b['fleet_shape']}/{b['runs']}"
            )
        below = (a["targets"]["runs below each goal"], b["targets"]["runs below each goal"])
        never = "worst phase < never"

        def pair(x: float, y: float, digits: int = 3) -> str:
            return f"{x:.{digits}f} → **{y:.{digits}f}**"

        lines.append(
            f"| {a['fleet_shape']} | {a['runs']} | {pair(a['vs_oracle']['mean'], b['vs_oracle']['mean'])} | "
            f"{pair(a['vs_oracle']['worst'], b['vs_oracle']['worst'])} | "
            f"{below[0][never]} → **{below[1][never]}** | "
            f"{pair(a['vs_best_in_engine_schedule']['mean'], b['vs_best_in_engine_schedule']['mean'])} | "
            f"{pair(a['tpot_p99_vs_oracle']['worst'], b['tpot_p99_vs_oracle']['worst'], 2)} |"
        )
    return "\n".join(lines)


def scaling_table(inflight: dict, *sized: dict) -> str:
    """A table of the planner's runs on autoscaled pools with the HPA on requests in flight
    (``inflight``) and on the guard's desired replicas (``sized``: ``--scaling`` runs, each with its
    ``sustain_seconds``): throughput over never-speculate (the same engines without speculation: a
    unit common to every variant, where each variant's oracle also replays that variant's own run),
    over its oracle (mean and worst run), runs below 0.90 of it, with a phase below never-speculate,
    and with TPOT p99 above 1.15x the oracle's; then, per variant, each scenario's runs over the same
    runs on the in-flight HPA (where sizing on the guard's numbers gains and where it loses)."""
    keys = sorted((r["scenario"], r["world"], r["seed"]) for r in inflight["rows"])
    base = {(r["scenario"], r["world"], r["seed"]): r["vs_never"] for r in inflight["rows"]}
    per_scenario = []
    lines = [
        "| the HPA scales on | runs | mean / never-speculate | mean / oracle | worst run / oracle "
        "| runs below 0.90 of the oracle | runs with a phase below never-speculate "
        "| runs with TPOT p99 above 1.15x the oracle's |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in (inflight, *sized):
        if sorted((r["scenario"], r["world"], r["seed"]) for r in result["rows"]) != keys:
            raise ValueError("not the same runs: every --scaling result must cover the in-flight runs")
        sustain = {r.get("sustain_seconds") for r in result["rows"]}
        if not all(r.get("scaling") for r in result["rows"]):
            label = "requests in flight (target per replica)"
        elif sustain == {0}:
            label = "the guard's desired replicas, asked at once (`sustain_seconds: 0`)"
        else:
            label = "the guard's desired replicas, demand that lasted a start delay (the default)"
        agg, below = result["summary"], result["summary"]["targets"]["runs below each goal"]
        never = statistics.fmean(r["vs_never"] for r in result["rows"])
        lines.append(
            f"| {label} | {agg['runs']} | {never:.3f} | {agg['vs_oracle']['mean']:.3f} | "
            f"{agg['vs_oracle']['worst']:.3f} | "
            f"{below['vs_oracle < 0.90']} | {below['worst phase < never']} | "
            f"{below['TPOT p99 > 1.15 x oracle']} |"
        )
        if result is not inflight:
            ratios: dict[str, list[float]] = {}
            for r in result["rows"]:
                ratios.setdefault(r["scenario"], []).append(
                    r["vs_never"] / base[(r["scenario"], r["world"], r["seed"])]
                )
            each = ", ".join(
                f"{name} {statistics.fmean(v):.3f} ({min(v):.3f}-{max(v):.3f})"
                for name, v in sorted(ratios.items())
            )
            per_scenario.append(
                f"{label[0].upper()}{label[1:]}: throughput over the same runs' on the in-flight HPA, "
                f"per scenario (mean, lowest-highest run): {each}."
            )
    return "\n".join(lines) + "".join(f"\n\n{line}" for line in per_scenario)


def launched_with_schedule(base: dict, *scheduled: dict) -> str:
    """A table of the same runs on fixed-K pools (``base``, rows kept in the shape's full matrix) and
    with each speculative pool launched with the in-engine schedule the calibration gives it
    (``scheduled``: ``--k-schedule`` runs, the guard's config naming the schedules or not):
    specguard's throughput over the best of the fleets' oracles (each fleet's oracle bounds its own
    runs; never-speculate, the same engines without speculation, is the common unit), its worst
    phase against never-speculate, against the best in-engine schedule and its TPOT p99 against its
    own oracle's; then how many runs each schedule run moved by more than 1%."""
    runs = {(r["scenario"], r["world"], r["seed"]): r for r in base["rows"]}
    keys = [(r["scenario"], r["world"], r["seed"]) for r in scheduled[0]["rows"]]
    columns = [[runs[k] for k in keys]]
    for result in scheduled:
        own = {(r["scenario"], r["world"], r["seed"]): r for r in result["rows"]}
        if sorted(own) != sorted(keys):
            raise ValueError("not the same runs: every --k-schedule result must cover the same runs")
        columns.append([own[k] for k in keys])

    def oracle(row: dict) -> float:  # the oracle's throughput over never-speculate's
        return 1.0 / row["ratios_to_oracle"]["never_speculate"]

    best = [max(oracle(column[i]) for column in columns) for i in range(len(keys))]
    lines = [
        "| pools | runs | mean / the best oracle | worst run | runs with a phase below never-speculate "
        "| mean / best in-engine schedule | worst TPOT p99 / own oracle's |",
        "|---|---|---|---|---|---|---|",
    ]
    moved = []
    for i, column in enumerate(columns):
        configured = column[0].get("k_schedule_configured", True) if i else None
        label = {
            None: "fixed K",
            True: "each with its schedule",
            False: "each with its schedule, not in the config",
        }
        values = [row["vs_never"] / b for row, b in zip(column, best, strict=True)]
        lines.append(
            f"| {label[configured]} | {len(column)} | {statistics.mean(values):.3f} | {min(values):.3f} | "
            f"{sum(r['worst_phase_vs_never'] < 1 for r in column)} | "
            f"{statistics.mean(r['vs_best_in_engine_schedule'] for r in column):.3f} | "
            f"{max(r['tpot_p99_vs_oracle'] for r in column):.2f} |"
        )
        if configured is not None:
            pairs = list(zip(columns[0], column, strict=True))
            better = sum(y["vs_never"] > x["vs_never"] * 1.01 for x, y in pairs)
            worse = sum(y["vs_never"] < x["vs_never"] / 1.01 for x, y in pairs)
            moved.append(
                f"{label[configured]}: {better} runs more than 1% better than on fixed K, {worse} worse"
            )
    return "\n".join(lines) + "\n\n" + "; ".join(moved) + "."


def fill(doc: str, name: str, pieces: dict[str, str]) -> str:
    """``doc`` with each ``<!-- matrix:NAME:PIECE -->`` ... ``<!-- /matrix -->`` block holding its
    piece of ``--render`` (the blocks that are there; a piece without a block is left out)."""
    for piece, text in pieces.items():
        block = re.compile(rf"(<!-- matrix:{re.escape(name)}:{piece} -->\n).*?(<!-- /matrix -->)", re.S)
        doc = block.sub(lambda m, t=text: f"{m.group(1)}\n{t}\n\n{m.group(2)}", doc)
    return doc


def _table(text: str, into: str | None, name: str, piece: str) -> int:
    """Print a comparison table, or write it into ``into``'s ``matrix:NAME:PIECE`` block."""
    if into:
        doc = Path(into)
        doc.write_text(fill(doc.read_text(), name, {piece: text}))
    else:
        print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the test's subset")
    parser.add_argument("--scenarios", default=",".join(scenario_names()))
    parser.add_argument("--worlds", default=",".join(worlds.names()))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--profiles", default="fresh", help="specguard with: fresh, none, stale (comma list)")
    parser.add_argument("--gpu-scale", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--fleet-shape", choices=shapes.KINDS, default=shapes.FIXED)
    parser.add_argument("--replicas", default=None, help="fixed: POOL=N,... or a named fleet (lab.shapes)")
    parser.add_argument("--fleet", type=int, default=None, help="engines: fluid fleet or autoscaled budget")
    parser.add_argument("--decider", choices=("per-class", "planner"), default="per-class")
    parser.add_argument(
        "--no-spread", action="store_true", help="guard.spread: false (each class whole on its plan's pool)"
    )
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="autoscaled, with --decider planner: guard.scaling on, and the fleet's HPA scales each pool on "
        "the guard's desired replicas (as deploy/kubernetes/autoscaling) instead of requests in flight",
    )
    parser.add_argument(
        "--sustain",
        type=float,
        default=None,
        help="with --scaling: guard.scaling.sustain_seconds (default: the shape's start delay)",
    )
    parser.add_argument(
        "--k-schedule",
        nargs="?",
        const="configured",
        choices=("configured", "unconfigured"),
        help="each speculative pool runs the in-engine K schedule the calibration gives a pool of its K "
        "(unconfigured: the guard's config does not name the schedules)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--render", metavar="FILE", help="print the docs' markdown for a --json result")
    parser.add_argument("--into", metavar="DOC", help="with --render: write it into DOC's matrix blocks")
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="SHIPPED:OTHER",
        help="print the table comparing pairs of --json results (with --into DOC: its spread:compare block)",
    )
    parser.add_argument(
        "--decider-versus",
        nargs="+",
        metavar="SHIPPED:PLANNER",
        help="print the table comparing the shipped runs with the same runs under --decider planner "
        "(with --into DOC: its decider:versus block)",
    )
    parser.add_argument(
        "--scaling-versus",
        metavar="INFLIGHT:SCALING[:SCALING...]",
        help="print the table of the planner's autoscaled runs on the in-flight HPA against --scaling runs "
        "(with --into DOC: its scaling:versus block)",
    )
    parser.add_argument(
        "--block",
        metavar="NAME",
        help="with --into and a comparison table: write it into the doc's matrix:NAME:... block instead of "
        "the table's own (spread, decider, scaling, schedule)",
    )
    parser.add_argument(
        "--schedule-versus",
        metavar="FIXED:SCHEDULED[:UNCONFIGURED]",
        help="print the table of a --k-schedule result against the same runs on fixed-K pools "
        "(with --into DOC: its schedule:versus block)",
    )
    args = parser.parse_args(argv)
    if args.schedule_versus:
        base, *launched = (json.loads(Path(f).read_text()) for f in args.schedule_versus.split(":"))
        return _table(launched_with_schedule(base, *launched), args.into, args.block or "schedule", "versus")
    for given, block in ((args.compare, ("spread", "compare")), (args.decider_versus, ("decider", "versus"))):
        if given:
            pairs = [tuple(json.loads(Path(f).read_text()) for f in pair.split(":")) for pair in given]
            return _table(compare(pairs), args.into, args.block or block[0], block[1])
    if args.scaling_versus:
        inflight, *sized = (json.loads(Path(f).read_text()) for f in args.scaling_versus.split(":"))
        return _table(scaling_table(inflight, *sized), args.into, args.block or "scaling", "versus")
    if args.render and args.into:
        doc = Path(args.into)
        pieces = render(json.loads(Path(args.render).read_text()))
        doc.write_text(fill(doc.read_text(), Path(args.render).stem, pieces))
        return 0
    if args.render:
        for text in render(json.loads(Path(args.render).read_text())).values():
            print(text, end="\n\n")
        return 0
    if args.scaling and (args.decider != "planner" or args.fleet_shape != shapes.AUTOSCALED):
        parser.error("--scaling needs --decider planner and --fleet-shape autoscaled")
    if args.sustain is not None and not args.scaling:
        parser.error("--sustain needs --scaling")
    seconds = None
    if args.quick:
        args.scenarios, args.worlds, args.seeds = QUICK["scenarios"], QUICK["worlds"], QUICK["seeds"]
        seconds = QUICK["seconds"]
    names, world_names = args.scenarios.split(","), args.worlds.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    profiles = args.profiles.split(",")
    for name in names:  # a bad scenario file fails here, before any work
        load(name, seconds)
    for world in world_names:
        worlds.load(world)
    shape = bench_controller.setup_for(
        load(names[0], seconds),
        seeds[0],
        gpu_scale=args.gpu_scale,
        fleet=args.fleet,
        shape=args.fleet_shape,
        replicas=args.replicas,
    ).fleet_shape  # a bad shape fails here too
    t0 = time.perf_counter()
    stale_worlds = {STALE_WORLD.get(w, "k4-dominates") for w in world_names} if "stale" in profiles else set()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        specs = [
            (w, s, args.gpu_scale, args.fleet_shape, args.replicas)
            for w in sorted(set(world_names) | stale_worlds)
            for s in seeds
        ]
        fresh = dict(pool.map(calibration, specs))
        jobs = [
            {
                "scenario": name,
                "world": world,
                "seed": seed,
                "seconds": seconds,
                "gpu_scale": args.gpu_scale,
                "fleet": args.fleet,
                "shape": args.fleet_shape,
                "replicas": args.replicas,
                "profiles": profiles,
                "decider": args.decider,
                "spread": not args.no_spread,
                "scaling": args.scaling,
                "sustain": args.sustain,
                "k_schedule": args.k_schedule,
                "profile": fresh[(world, seed)],
                "stale_profile": fresh.get((STALE_WORLD.get(world, "k4-dominates"), seed)),
            }
            for name in names
            for world in world_names
            for seed in seeds
        ]
        rows = list(pool.map(run, jobs))
    wall = round(time.perf_counter() - t0, 1)
    result = {
        "fleet_shape": shape.to_json(),
        "rows": rows,
        "summary": aggregate(rows),
        "wall_seconds": wall,
        "jobs": args.jobs,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"fleet shape: {shape.label()}")
        print(table(rows))
        print(json.dumps(result["summary"], indent=2))
        print(f"{len(rows)} runs in {result['wall_seconds']:.0f} s with {args.jobs} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
