"""``specguard sweep``: TPOT, acceptance and RC per pool x concurrency x class; CSV, plots, profile."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

from specguard.errors import ConfigError, ConfigIssue


def flag_error(message: str) -> ConfigError:
    """A bad command-line flag: ``--flag rest`` -> ``Error: --flag: rest``."""
    flag, _, rest = message.partition(" ")
    return ConfigError(ConfigIssue(flag.rstrip(":"), None, None, "", rest))


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="measure RC per pool (K) x concurrency x class; write CSV, plots and a calibration profile",
        description=(
            "Drive the request mix closed-loop at each concurrency level on each pool and record TPOT, "
            "throughput, accept length, strict accept rate, full-rollback ratio and RC against the no-spec "
            "pool. By default the built-in simulator in virtual time; --http drives the pools' URLs "
            "(from --config, e.g. real engines or `specguard simulate`); --launch starts one engine per "
            "K from a command template, sweeps it and stops it."
        ),
    )
    parser.add_argument("--config", default=None, help="specguard config: pools (name, url, K) and classes")
    parser.add_argument("--sim-config", default=None, help="simulator config for the virtual driver")
    parser.add_argument(
        "--http", action="store_true", help="sweep the pools' URLs over HTTP instead of virtual time"
    )
    launch = parser.add_argument_group("engine launch (--launch)")
    launch.add_argument(
        "--launch",
        metavar="TEMPLATE",
        default=None,
        help="command that starts a speculative engine; {k} and {port} are filled in per K",
    )
    launch.add_argument(
        "--launch-nospec",
        metavar="TEMPLATE",
        default=None,
        help="command that starts the engine without speculation (K = 0); {port} is filled in",
    )
    launch.add_argument(
        "--ks",
        default=None,
        help="K values (comma list, with 0): with --launch the engines to start in turn (default 0,2,4); "
        "on the simulator, one pool per K (its largest-K pool's engine at each K) instead of the "
        "configured pools",
    )
    launch.add_argument("--ready-path", default="/health", help="GET path that answers 200 when ready")
    launch.add_argument(
        "--ready-timeout", type=float, default=600.0, help="seconds to wait for an engine to be ready"
    )
    launch.add_argument(
        "--stop-timeout", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL"
    )
    launch.add_argument("--warmup", type=int, default=2, help="unmeasured requests after each engine start")
    parser.add_argument(
        "--geometry",
        default=None,
        help="workload geometries to sweep (comma list): "
        + ", ".join(sweep_geometry_names())
        + " or PROMPTxDECODE token counts (512x64)",
    )
    parser.add_argument(
        "--prompts",
        choices=("words", "task"),
        default=None,
        help="HTTP prompts: 'task' (extraction/code/chat/creative prompts a real model answers; "
        "the default with --launch) or 'words' (synthetic; the default with --http)",
    )
    parser.add_argument("--levels", default="1,2,4,8,16,32,64,128", help="concurrency levels (comma list)")
    parser.add_argument("--max-concurrency", type=int, default=None, help="shorthand: 1,2,4,... up to N")
    parser.add_argument(
        "--pools", default=None, help="only these pools (comma list; must include a K=0 pool)"
    )
    parser.add_argument(
        "--mix",
        default="code:0.0,extraction:0.0,chat:0.7,creative:1.0",
        help="task:temperature[:weight] entries (comma list)",
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="requests per cell (default max(64, 8 x concurrency))"
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="max_tokens per request (--http)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output-dir", "-o", default="sweep-out", help="directory for sweep.csv, plots, profile.yaml"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--spec-method",
        default="ngram",
        help="the speculative method the printed vLLM / TensorRT-LLM configs name (default ngram)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary")
    parser.set_defaults(func=run)


def sweep_geometry_names() -> list[str]:
    from specguard.lab.sweep import GEOMETRIES

    return list(GEOMETRIES)


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError as exc:
        raise flag_error(f"--levels {text!r}: expected integers separated by commas") from exc
    if not levels or levels[0] < 1:
        raise flag_error(f"--levels {text!r}: every level must be >= 1")
    return levels


def parse_mix(text: str):
    from specguard.lab.sweep import MixEntry

    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            weight = float(parts[2]) if len(parts) == 3 else 1.0
            out.append(MixEntry(parts[0], float(parts[1]), weight))
        except ValueError as exc:
            raise flag_error(f"--mix entry {item!r}: expected task:temperature[:weight]") from exc
    return out


class Progress:
    """A plain-text progress bar (one line per cell when not on a terminal)."""

    def __init__(self, stream, quiet: bool):
        self.stream = stream
        self.quiet = quiet
        self.tty = stream.isatty()
        self.t0 = time.monotonic()

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.quiet:
            return
        width = 30
        filled = int(width * done / total)
        bar = "#" * filled + "." * (width - filled)
        text = f"[{bar}] {done}/{total} {label:<20} {time.monotonic() - self.t0:6.1f}s"
        if self.tty:
            self.stream.write("\r" + text + ("\n" if done == total else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    from specguard.lab import replay, sweep

    started = time.monotonic()
    cfg = monitor_config_load(args.config)
    levels = sweep.levels_up_to(args.max_concurrency) if args.max_concurrency else parse_levels(args.levels)
    mix = parse_mix(args.mix)
    geometries = sweep.parse_geometries(args.geometry) if args.geometry else (sweep.MIX_GEOMETRY,)
    if args.requests is not None and args.requests < 2:
        raise flag_error(f"--requests ({args.requests}) must be >= 2")
    if args.launch and args.http:
        raise flag_error("--launch: give either --launch (start the engines) or --http (they run already)")
    if args.launch_nospec and not args.launch:
        raise flag_error("--launch-nospec: only with --launch")
    if args.launch and args.pools:
        raise flag_error("--pools: not with --launch (it launches the pools of --ks)")
    if args.ks and args.http:
        raise flag_error("--ks: with --launch or on the simulator (with --http the configured pools run)")
    if args.ks and args.pools:
        raise flag_error("--ks: not with --pools (--ks makes the pools)")
    per_cell = (lambda c: args.requests) if args.requests else (lambda c: max(64, 8 * c))
    progress = Progress(sys.stderr if args.json else sys.stdout, quiet=False)
    grid = {"geometries": geometries, "requests_per_level": per_cell, "progress": progress}
    engines: list[dict] = []
    if args.launch:
        samples, pools, stack, engines = _launched(args, levels, mix, grid)
    else:
        pools = _configured_pools(cfg, args.pools)
        driver, stack, pools = _driver(args, cfg, pools)
        samples = sweep.run_grid(pools, levels, mix, driver, **grid)
    buckets = replay.Buckets.from_classes(cfg.exporter.classes)
    frame = sweep.to_frame(samples, pools, buckets.temperature_bucket)
    summary = _write(args, frame, stack, geometries)
    summary.update(requests=len(samples), levels=list(levels), pools=[p.name for p in pools])
    summary["geometries"] = [g.name for g in geometries]
    if engines:
        summary["engines"] = engines
    summary["wall_seconds"] = round(time.monotonic() - started, 1)
    if args.json:
        json.dump(summary, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        plots = f" and {len(summary['plots'])} plots" if summary["plots"] else ""
        print(f"wrote {summary['csv']}, {summary['profile']}{plots}")
        print("best K per class and concurrency (lowest TPOT; K=0: speculation does not pay):")
        for line in summary["best_k"]:
            print(f"  {line}")
        print("where RC crosses 1.0:")
        for line in summary["crossovers"]:
            print(f"  {line}")
        print("one pool, no routing: the in-engine K schedule that costs this mix least per token:")
        for line in summary["schedule_lines"]:
            print(f"  {line}")
        print("routed pools: a pool of K that turns K down only where its own K stops paying for this mix:")
        for line in summary["routed_schedule_lines"]:
            print(f"  {line}")
        print(
            f"use it: point cost.calibration_profile in your config at {summary['profile']} "
            "(a relative path there is read from the config file's directory)"
        )
        print(f"done in {summary['wall_seconds']:.0f} s")
    return 0


def monitor_config_load(path: str | None):
    from specguard.monitor import config as monitor_config

    return monitor_config.load(path) if path else monitor_config.load_default()


def _configured_pools(cfg, only: str | None) -> list:
    from specguard.lab import sweep

    pools = [sweep.PoolSpec(p.name, p.num_speculative_tokens, p.url) for p in cfg.exporter.pools]
    if only:
        wanted = [x.strip() for x in only.split(",") if x.strip()]
        unknown = sorted(set(wanted) - {p.name for p in pools})
        if unknown:
            raise flag_error(f"--pools: unknown pools {unknown} (configured: {[p.name for p in pools]})")
        pools = [p for p in pools if p.name in wanted]
    return pools


def _driver(args: argparse.Namespace, cfg, pools):
    from specguard.lab import sweep, sweep_drivers

    if args.http:
        driver = sweep_drivers.http_driver(
            seed=args.seed, max_tokens=args.max_tokens, prompts=args.prompts or "words"
        )
        engines = sorted({p.engine for p in cfg.exporter.pools})
        stack = {"engine": ",".join(engines), "source": "specguard sweep --http"}
        stack.update(asyncio.run(sweep.http_stack(pools, engines[0] if len(engines) == 1 else "auto")))
        return driver, stack, pools
    from specguard.sim import config as sim_config

    sim = sim_config.load(args.sim_config)
    if args.ks:
        sim, pools = _pools_per_k(sim, _ks(args.ks))
    names = {p.name for p in sim.pools}
    missing = [p.name for p in pools if p.name not in names]
    if missing:
        raise ConfigError(
            f"pools {missing} are not simulator pools ({sorted(names)}); use --http for real engines"
        )
    driver = sweep_drivers.virtual_driver(sim, seed=args.seed)
    return driver, sweep.simulator_stack(sim, "specguard sweep (virtual time)"), pools


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise flag_error(f"--ks {text!r}: expected integers separated by commas") from exc
    if 0 not in ks or any(k < 0 or k > 16 for k in ks):
        raise flag_error(f"--ks {text!r}: needs K = 0 (the baseline) and every K in 0..16")
    return tuple(sorted(set(ks)))


def _pools_per_k(sim, ks: tuple[int, ...]):
    """The simulator with one pool per K: its largest-K pool's engine at each K (k0 without drafts)."""
    from specguard.lab import sweep

    reference = max(sim.pools, key=lambda p: p.num_speculative_tokens)
    made = tuple(
        dataclasses.replace(reference, name=f"k{k}", num_speculative_tokens=k, k_schedule=None, port=0)
        for k in ks
    )
    specs = [sweep.PoolSpec(p.name, p.num_speculative_tokens) for p in made]
    return dataclasses.replace(sim, pools=made), specs


def _launched(args: argparse.Namespace, levels, mix, grid: dict):
    from specguard.lab import sweep_drivers, sweep_launch

    try:
        ks = tuple(int(x) for x in (args.ks or "0,2,4").split(",") if x.strip())
    except ValueError as exc:
        raise flag_error(f"--ks {args.ks!r}: expected integers separated by commas") from exc
    if args.warmup < 0:
        raise flag_error(f"--warmup ({args.warmup}) must be >= 0")
    spec = sweep_launch.LaunchSpec(
        template=args.launch,
        nospec_template=args.launch_nospec,
        ks=ks,
        log_dir=Path(args.output_dir),
        ready_path=args.ready_path,
        ready_timeout_s=args.ready_timeout,
        stop_timeout_s=args.stop_timeout,
        warmup_requests=args.warmup,
    )
    spec.check()
    driver = sweep_drivers.http_driver(
        seed=args.seed, max_tokens=args.max_tokens, prompts=args.prompts or "task"
    )
    out = sys.stderr if args.json else sys.stdout

    def ready(k: int, url: str, seconds: float) -> None:
        out.write(f"engine K={k} ready at {url} after {seconds:.1f} s\n")
        out.flush()

    samples, pools, launched = sweep_launch.run_launched(spec, levels, mix, driver, on_ready=ready, **grid)
    stack = {"engine": "launched", "source": "specguard sweep --launch", "command": args.launch}
    return samples, pools, stack, [dataclasses.asdict(e) for e in launched]


def _write(args: argparse.Namespace, frame, stack: dict, geometries) -> dict:
    """sweep.csv, best_k.csv, rc_crossings.csv, profile.yaml and plots (per geometry when several)."""
    from specguard.lab import sweep, sweep_plots, sweep_tables
    from specguard.rules import kschedule
    from specguard.rules import profile as profile_mod

    out = Path(args.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise flag_error(f"--output-dir {out}: cannot create: {exc.strerror}") from exc
    csv_path = out / "sweep.csv"
    frame.to_csv(csv_path, index=False)
    best = sweep_tables.best_k(frame)
    best.to_csv(out / "best_k.csv", index=False)
    crossings = sweep_tables.rc_crossings(frame)
    crossings.to_csv(out / "rc_crossings.csv", index=False)
    profile_path = out / "profile.yaml"
    first = geometries[0].name
    profile = sweep.to_profile(frame, stack=stack, geometry=first)
    advice = kschedule.recommend(profile)
    if advice is not None:
        profile = dataclasses.replace(profile, schedule=advice.to_dict(args.spec_method))
    profile_mod.write_profile(profile, profile_path)
    plots = []
    if not args.no_plots:
        for geometry in geometries:
            where = out if len(geometries) == 1 else out / geometry.name
            where.mkdir(parents=True, exist_ok=True)
            plots += sweep_plots.write_plots(frame[frame["geometry"] == geometry.name], where)
    return {
        "csv": str(csv_path),
        "best_k_csv": str(out / "best_k.csv"),
        "rc_crossings_csv": str(out / "rc_crossings.csv"),
        "profile": str(profile_path),
        "profile_geometry": first,
        "plots": [str(p) for p in plots],
        "cells": int(len(frame)),
        "best_k": sweep_tables.best_k_lines(best),
        "crossovers": sweep_tables.crossing_lines(crossings),
        "schedule": profile.schedule,
        "schedule_lines": advice.lines(args.spec_method)
        if advice is not None
        else ["needs a no-speculation pool and a speculative one in the sweep"],
        **_routed(profile, args.spec_method),
    }


def _routed(profile, method: str) -> dict:
    """Per swept K: the schedule a pool launched at that K in a routed fleet runs (``recommend(keep=K)``)."""
    from specguard.rules import kschedule

    configs, lines = {}, []
    for k in sorted({p.num_speculative_tokens for p in profile.pools if p.num_speculative_tokens > 0}):
        advice = kschedule.recommend(profile, keep=k)
        if advice is None:
            continue
        steady = [r.k for r in advice.ranges] == [k]
        config = None if steady else advice.vllm_config(method)
        configs[str(k)] = config
        said = f"--speculative-config '{config}'" if config else "speculation pays at no load swept"
        lines.append(f"K={k}: " + ("keeps K at every load swept" if steady else said))
    return {"routed_schedules": configs, "routed_schedule_lines": lines}
