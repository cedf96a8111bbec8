"""``specguard sweep``: TPOT, acceptance and RC per pool x concurrency x class; CSV, plots, profile."""

from __future__ import annotations

import argparse
import asyncio
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
            "(from --config, e.g. real engines or `specguard simulate`)."
        ),
    )
    parser.add_argument("--config", default=None, help="specguard config: pools (name, url, K) and classes")
    parser.add_argument("--sim-config", default=None, help="simulator config for the virtual driver")
    parser.add_argument(
        "--http", action="store_true", help="sweep the pools' URLs over HTTP instead of virtual time"
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
    parser.add_argument("--json", action="store_true", help="print a JSON summary")
    parser.set_defaults(func=run)


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
    from specguard.lab import replay, sweep, sweep_plots
    from specguard.monitor import config as monitor_config
    from specguard.rules import profile as profile_mod

    cfg = monitor_config.load(args.config) if args.config else monitor_config.load_default()
    levels = sweep.levels_up_to(args.max_concurrency) if args.max_concurrency else parse_levels(args.levels)
    mix = parse_mix(args.mix)
    pools = [sweep.PoolSpec(p.name, p.num_speculative_tokens, p.url) for p in cfg.exporter.pools]
    if args.pools:
        wanted = [x.strip() for x in args.pools.split(",") if x.strip()]
        unknown = sorted(set(wanted) - {p.name for p in pools})
        if unknown:
            raise flag_error(f"--pools: unknown pools {unknown} (configured: {[p.name for p in pools]})")
        pools = [p for p in pools if p.name in wanted]
    if args.requests is not None and args.requests < 2:
        raise flag_error(f"--requests ({args.requests}) must be >= 2")
    if args.http:
        driver = sweep.http_driver(seed=args.seed, max_tokens=args.max_tokens)
        engines = sorted({p.engine for p in cfg.exporter.pools})
        stack = {"engine": ",".join(engines), "source": "specguard sweep --http"}
        stack.update(asyncio.run(sweep.http_stack(pools, engines[0] if len(engines) == 1 else "auto")))
    else:
        from specguard.sim import config as sim_config

        sim = sim_config.load(args.sim_config)
        names = {p.name for p in sim.pools}
        missing = [p.name for p in pools if p.name not in names]
        if missing:
            raise ConfigError(
                f"pools {missing} are not simulator pools ({sorted(names)}); use --http for real engines"
            )
        driver = sweep.virtual_driver(sim, seed=args.seed)
        stack = sweep.simulator_stack(sim, "specguard sweep (virtual time)")
    per_cell = (lambda c: args.requests) if args.requests else (lambda c: max(64, 8 * c))
    progress = Progress(sys.stderr if args.json else sys.stdout, quiet=False)
    samples = sweep.run_grid(pools, levels, mix, driver, requests_per_level=per_cell, progress=progress)
    buckets = replay.Buckets.from_classes(cfg.exporter.classes)
    frame = sweep.to_frame(samples, pools, buckets.temperature_bucket)
    out = Path(args.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise flag_error(f"--output-dir {out}: cannot create: {exc.strerror}") from exc
    csv_path = out / "sweep.csv"
    frame.to_csv(csv_path, index=False)
    profile_path = out / "profile.yaml"
    profile_mod.write_profile(sweep.to_profile(frame, stack=stack), profile_path)
    plots = [] if args.no_plots else sweep_plots.write_plots(frame, out)
    summary = {
        "csv": str(csv_path),
        "profile": str(profile_path),
        "plots": [str(p) for p in plots],
        "cells": int(len(frame)),
        "requests": len(samples),
        "levels": list(levels),
        "pools": [p.name for p in pools],
        "crossovers": sweep_plots.crossovers(frame),
    }
    if args.json:
        json.dump(summary, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(f"wrote {csv_path}, {profile_path}" + (f" and {len(plots)} plots" if plots else ""))
        for line in summary["crossovers"]:
            print(f"  {line}")
        print(f"use it: set cost.calibration_profile: {profile_path} in your config")
    return 0
