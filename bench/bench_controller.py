"""Controller quality: specguard against the oracle and the hindsight rows, on the same engines.

For several scenarios and seeds, in virtual time through the simulator's engine core (the same
replays ``specguard demo`` prints), with the shipped default guard policy and a calibration profile
swept with its own mix and seed (it cannot see the scenario):

- throughput of specguard as ratios to the oracle, the best single pool, the best in-engine K
  schedule, the best static plan per class, always- and never-speculate; the worst phase's ratio to
  never-speculate; TPOT p99 to the oracle's; every row on the same engines, a fleet shape
  (``lab.shapes``: fixed replicas per pool by default, autoscaled, or fluid);
- the bound: the oracle's plan replayed with other acceptance draws gives the run-to-run noise; no
  row may beat the oracle by more than it (the run fails the check otherwise);
- detection delay: simulated seconds from the temperature shift to the first plan change for the
  shifted class (``shift`` scenario; 0 when it was planned before the shift: the profile cannot see
  the scenario, but its own sweep mix covers every task type and temperature bucket, and every
  class it knows is planned at the first evaluation), and the same with no profile at all;
- plan changes in stationary phases and the most per class in any hour.

    python3 bench/bench_controller.py [--seeds 0,1,2] [--scenarios default,load-wave,shift,stationary]
        [--gpu-scale 2] [--fleet-shape fixed|autoscaled|fluid] [--replicas 3xK4+1xnospec] [--fleet N]
        [--timer-scale 0.3333] [--no-profile] [--set KEY=VALUE ...] [--json]

``--no-profile`` runs with no calibration profile at all (no warm start, no profile baseline): the
live baseline (and the model baseline, where the guard has one) is all it has.

``--set`` changes one top-level key of the shipped guard policy for an ablation, e.g.
``--set prior=none --set holdout=fixed --set best_pool=false``.

The release's runs are kept in ``bench/results/controller*.json`` (``--json``); ``--render FILE``
prints the markdown docs/benchmarks.md carries for one (a test checks it still does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

from specguard.lab import demo, scenario, shapes, summary, worlds
from specguard.monitor import config as monitor_config
from specguard.rules import policy as policy_mod


def detection_delay(decisions: list[dict], default_pool: str, shift_at: float) -> float | None:
    """Seconds from the shift to the first plan change for the shifted class (0: planned before it)."""
    shifted = [d for d in decisions if d["task_type"] == "code" and d["temperature_bucket"] == "medium"]
    if any(d["time"] < shift_at and d["to"] != default_pool for d in shifted):
        return 0.0
    moved = [d["time"] for d in decisions if d["time"] >= shift_at and d["task_type"] == "code"]
    return (min(moved) - shift_at) if moved else None


def policy_with(changes: list[str]) -> policy_mod.Policy:
    """The shipped default policy with ``KEY=VALUE`` changes (typed like the field's default)."""
    policy = policy_mod.load_default()
    fields = {}
    for change in changes:
        key, _, text = change.partition("=")
        current = getattr(policy, key)  # AttributeError names an unknown key
        if isinstance(current, bool):
            fields[key] = text.lower() in ("1", "true", "yes", "on")
        else:
            fields[key] = type(current)(text)
    return replace(policy, **fields)


def setup_for(
    scen: scenario.Scenario,
    seed: int,
    *,
    world: str = worlds.DEFAULT,
    gpu_scale: float = 2.0,
    fleet: int | None = None,
    timer_scale: float = 1 / 3,
    changes: list[str] = (),
    shape: str = shapes.FIXED,
    replicas: str | None = None,
) -> demo.DemoSetup:
    """The run's setup; ``shape``/``replicas``/``fleet``: the fleet shape (``lab.shapes``: ``fleet`` is
    the fluid fleet or the autoscaled budget)."""
    cfg = monitor_config.load_default()
    if gpu_scale != 1:
        scen = scen.with_clients_scaled(1 / gpu_scale)
    names = [p.name for p in cfg.exporter.pools]
    fleet_shape = shapes.build(shape, names, replicas=replicas, engines=fleet).scaled(gpu_scale)
    setup = demo.DemoSetup(
        sim=demo.smaller_gpu(worlds.load(world), gpu_scale),
        exporter=demo.for_shape(demo.smaller_buckets(cfg.exporter, gpu_scale), fleet_shape),
        policy=policy_with(list(changes)),
        scenario=scen,
        seed=seed,
        fleet=fleet_shape.size,
        timer_scale=timer_scale,
        gpu_scale=gpu_scale,
        shape=fleet_shape,
    )
    setup.settings = demo.cost_settings(setup.exporter)
    return setup


def one(name: str, seed: int, args: argparse.Namespace) -> dict:
    scen = scenario.BUILTIN[name]()
    if getattr(args, "scenario_seconds", None):
        scen = scen.scaled(args.scenario_seconds)
    setup = setup_for(
        scen,
        seed,
        gpu_scale=args.gpu_scale,
        fleet=args.fleet,
        timer_scale=args.timer_scale,
        changes=args.set,
        shape=getattr(args, "fleet_shape", shapes.FIXED),
        replicas=getattr(args, "replicas", None),
    )
    t0 = time.perf_counter()
    profile = None if args.no_profile else demo.calibrate(setup)
    result, guard = demo.run_specguard(setup, profile)
    variant = "none" if profile is None else "fresh"
    compared = demo.compare(
        setup,
        {"specguard": demo.specguard_row(setup, result, guard, variant)},
        realised={"specguard": guard.choices},
    )
    r, policies = compared["ratios"], compared["policies"]
    out = {
        "scenario": name,
        "seed": seed,
        "fleet_shape": setup.fleet_shape.kind,
        "engines": setup.fleet,
        "throughput_vs_oracle": r["specguard_vs_oracle_throughput"],
        "throughput_vs_best_single_pool": r["specguard_vs_best_single_pool_throughput"],
        "throughput_vs_best_in_engine_schedule": r["specguard_vs_best_in_engine_schedule_throughput"],
        "best_in_engine_schedule": policies["best_in_engine_schedule"]["label"].split(": ", 1)[-1],
        "throughput_vs_best_per_class_static": r["specguard_vs_best_per_class_static_throughput"],
        "throughput_vs_always": r["specguard_vs_always_speculate_throughput"],
        "throughput_vs_never": r["specguard_vs_never_speculate_throughput"],
        "worst_phase_vs_never": r["specguard_vs_never_worst_phase_throughput"],
        "worst_phase_vs_oracle": min(summary.phase_ratios(policies["specguard"], policies["oracle"])),
        "tpot_p99_vs_oracle": r["specguard_vs_oracle_tpot_p99"],
        "oracle_plan_from": policies["oracle"]["plan_from"],
        "noise": compared["noise"]["max_abs"],
        "bound_holds": compared["bound"]["holds"],
        "max_ratio_to_oracle": compared["bound"]["max_ratio_to_oracle"],
        "actions": len(result.decisions),
        "actions_in_stationary_phases": summary.stationary_actions(result.decisions, setup.scenario),
        "max_changes_per_class_hour": policies["specguard"]["max_changes_per_class_hour"],
        "profile": profile is not None,
        "baseline_sources": baseline_sources(guard),
        "wall_seconds": time.perf_counter() - t0,
    }
    if name == "shift":  # shift_scenario(): the shift happens at the start of its second phase
        shift_at = setup.scenario.boundaries()[1][0]
        out["detection_delay_seconds"] = detection_delay(result.decisions, setup.default_pool, shift_at)
        live_result, _ = demo.run_specguard(setup, None)
        out["detection_delay_live_only_seconds"] = detection_delay(
            live_result.decisions, setup.default_pool, shift_at
        )
    if name == "stationary":
        steady_start = setup.scenario.boundaries()[1][0]
        out["actions_after_settling"] = sum(1 for d in result.decisions if d["time"] >= steady_start)
    return out


def baseline_sources(guard) -> dict[str, int]:
    """Baseline sources of the RCs of the last evaluation, counted (e.g. live 12, profile 3)."""
    out: dict[str, int] = {}
    for cost in guard.last_costs:
        if cost.rc is not None:
            out[cost.baseline_source] = out.get(cost.baseline_source, 0) + 1
    return dict(sorted(out.items()))


def line(row: dict) -> str:
    extra = ""
    if "detection_delay_seconds" in row:
        d, live = row["detection_delay_seconds"], row["detection_delay_live_only_seconds"]
        extra += f" detect={'never' if d is None else f'{d:.0f}s'}"
        extra += f" (live only {'never' if live is None else f'{live:.0f}s'})"
    if "actions_after_settling" in row:
        extra += f" after-settle={row['actions_after_settling']}"
    return (
        f"{row['scenario']:<11} seed {row['seed']}: vs oracle {row['throughput_vs_oracle']:.3f} "
        f"vs best single pool {row['throughput_vs_best_single_pool']:.3f} "
        f"vs best per class {row['throughput_vs_best_per_class_static']:.3f} "
        f"vs best K schedule {row['throughput_vs_best_in_engine_schedule']:.3f} "
        f"vs always {row['throughput_vs_always']:.3f} vs never {row['throughput_vs_never']:.3f} "
        f"worst phase/never {row['worst_phase_vs_never']:.3f} "
        f"TPOT p99/oracle {row['tpot_p99_vs_oracle']:.3f} "
        f"bound {'ok' if row['bound_holds'] else 'VIOLATED'} (noise {row['noise']:.4f}) "
        f"actions {row['actions']} (stationary {row['actions_in_stationary_phases']}){extra} "
        f"baselines {row['baseline_sources']} [{row['wall_seconds']:.0f}s]"
    )


def _delay(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.0f} s"


def _figure(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def render(result: dict) -> str:
    """The markdown table of one ``--json`` run and the sentence that sums it up."""
    rows = result["rows"]
    head = (
        "| scenario | seed | / oracle | / best single pool | / best K schedule | / best per class | / always "
        "| / never | worst phase / never | TPOT p99 / oracle | actions (stationary) | bound (noise) "
        "| detection delay (no profile) |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        if "detection_delay_seconds" in r:
            live_only = _delay(r["detection_delay_live_only_seconds"])
            delay = f"{_delay(r['detection_delay_seconds'])} ({live_only})"
        elif "actions_after_settling" in r:
            delay = f"— ({r['actions_after_settling']} after settling)"
        else:
            delay = "—"
        bound = "holds" if r["bound_holds"] else "**violated**"
        lines.append(
            f"| {r['scenario']} | {r['seed']} | **{r['throughput_vs_oracle']:.3f}** "
            f"| {r['throughput_vs_best_single_pool']:.3f} "
            f"| {_figure(r.get('throughput_vs_best_in_engine_schedule'))} "
            f"| {r['throughput_vs_best_per_class_static']:.3f} "
            f"| {r['throughput_vs_always']:.3f} | {r['throughput_vs_never']:.3f} "
            f"| {r['worst_phase_vs_never']:.3f} | {r['tpot_p99_vs_oracle']:.2f} "
            f"| {r['actions']} ({r['actions_in_stationary_phases']}) | {bound} ({r['noise']:.2%}) | {delay} |"
        )
    lowest = min(rows, key=lambda r: r["throughput_vs_oracle"])
    single = [r["throughput_vs_best_single_pool"] for r in rows]
    bound = (
        "the bound holds in every run"
        if all(r["bound_holds"] for r in rows)
        else f"the bound is violated in {sum(not r['bound_holds'] for r in rows)} runs"
    )
    schedule = [
        r["throughput_vs_best_in_engine_schedule"]
        for r in rows
        if "throughput_vs_best_in_engine_schedule" in r
    ]
    against_schedule = (
        f", {statistics.mean(schedule):.3f} of the best in-engine K schedule (lowest {min(schedule):.3f})"
        if schedule
        else " (a run from before the in-engine schedule row)"
    )
    sentence = (
        f"Mean over the {len(rows)} runs ({result['summary'].get('fleet_shape', 'fluid')} fleet): "
        f"**{statistics.mean(r['throughput_vs_oracle'] for r in rows):.3f} "
        f"of the oracle** (lowest {lowest['throughput_vs_oracle']:.3f}, `{lowest['scenario']}` seed "
        f"{lowest['seed']}), {statistics.mean(single):.3f} of the best single pool (lowest "
        f"{min(single):.3f}){against_schedule}; every phase "
        f"at least {min(r['worst_phase_vs_never'] for r in rows):.2f}× never-speculate; TPOT p99 at most "
        f"{max(r['tpot_p99_vs_oracle'] for r in rows):.2f}× the oracle's; "
        f"{sum(r['actions_in_stationary_phases'] for r in rows)} plan changes in stationary phases; {bound} "
        f"(largest noise {max(r['noise'] for r in rows):.2%})."
    )
    return "\n".join(lines) + "\n\n" + sentence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--scenarios", default="default,load-wave,shift,stationary")
    parser.add_argument("--gpu-scale", type=float, default=2.0)
    parser.add_argument("--fleet-shape", choices=shapes.KINDS, default=shapes.FIXED)
    parser.add_argument("--replicas", default=None, help="fixed: POOL=N,... or a named fleet (lab.shapes)")
    parser.add_argument("--fleet", type=int, default=None, help="engines: fluid fleet or autoscaled budget")
    parser.add_argument("--timer-scale", type=float, default=1 / 3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="guard policy change")
    parser.add_argument("--no-profile", action="store_true", help="no calibration profile at all")
    parser.add_argument("--scenario-seconds", type=float, default=None, help="scale every scenario to this")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--render", metavar="FILE", help="print the docs' markdown for a --json result")
    args = parser.parse_args()
    if args.render:
        with open(args.render) as f:
            print(render(json.load(f)))
        return
    rows = []
    for name in args.scenarios.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            row = one(name, seed, args)
            rows.append(row)
            if not args.json:
                print(line(row), flush=True)
    summary_json = {
        "fleet_shape": args.fleet_shape,
        "engines": rows[0]["engines"],
        "mean_throughput_vs_oracle": statistics.mean(r["throughput_vs_oracle"] for r in rows),
        "min_throughput_vs_oracle": min(r["throughput_vs_oracle"] for r in rows),
        "mean_throughput_vs_best_single_pool": statistics.mean(
            r["throughput_vs_best_single_pool"] for r in rows
        ),
        "min_worst_phase_vs_never": min(r["worst_phase_vs_never"] for r in rows),
        "stationary_actions": sum(r["actions_in_stationary_phases"] for r in rows),
        "bound_holds_in_every_run": all(r["bound_holds"] for r in rows),
        "max_noise": max(r["noise"] for r in rows),
    }
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary_json}, indent=2))
    else:
        print(json.dumps(summary_json, indent=2))


if __name__ == "__main__":
    main()
