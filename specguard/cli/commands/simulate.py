"""``specguard simulate``: run the built-in engine simulator (one HTTP server per pool)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys

from specguard import signals
from specguard.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run simulated vLLM/SGLang engine pools (no GPU needed)",
        description=(
            "Start one simulated engine per pool (default: spec-k4, spec-k2, nospec) speaking vLLM's or "
            "SGLang's HTTP API and /metrics exactly, with ground truth at /sim/truth. Ctrl-C stops."
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="simulator YAML (default: the shipped default.yaml)")
    parser.add_argument(
        "--dialect", choices=("vllm", "sglang", "llamacpp"), help="HTTP dialect (default: from config)"
    )
    parser.add_argument("--seed", type=int, help="random seed (default: from config)")
    parser.add_argument("--host", help="listen address (default: 127.0.0.1)")
    parser.add_argument(
        "--port-base",
        type=int,
        metavar="PORT",
        help="give pools consecutive ports from PORT (default: config)",
    )
    parser.add_argument("--pools", metavar="NAMES", help="comma-separated subset of pools to start, in order")
    parser.add_argument(
        "--time-scale", type=float, metavar="X", help="wall seconds per model second (0.1 = 10x faster)"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective config as JSON and exit"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specguard.sim import cluster

    if args.port_base is not None and not 0 < args.port_base < 65536:
        raise ConfigError(f"--port-base ({args.port_base}) must be a port number")
    pools = [p.strip() for p in args.pools.split(",") if p.strip()] if args.pools else None
    sim = cluster.SimCluster.from_config(
        args.config,
        seed=args.seed,
        dialect=args.dialect,
        time_scale=args.time_scale,
        host=args.host,
        port_base=args.port_base,
        pools=pools,
    )
    if args.print_config:
        cfg = sim.config
        print(
            json.dumps(
                {
                    "dialect": cfg.dialect,
                    "seed": cfg.seed,
                    "time_scale": cfg.time_scale,
                    "host": cfg.host,
                    "pools": [vars(p) for p in cfg.pools],
                },
                indent=2,
            )
        )
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(sim))
    return 0


async def _serve(sim) -> None:
    stop = asyncio.Event()
    with signals.stop_on(stop):
        async with sim:
            cfg = sim.config
            scale = f"time scale {cfg.time_scale:g}"
            print(f"specguard simulator ({cfg.dialect} dialect, seed {cfg.seed}, {scale})")
            for pool in cfg.pools:
                k = pool.num_speculative_tokens
                print(f"  {pool.name:<10} K={k}  {sim.urls[pool.name]}")
            print(f"model: {cfg.model_name}   (the `model` field of requests)")
            print(f"ground truth: {next(iter(sim.urls.values()))}/sim/truth   (Ctrl-C stops)")
            sys.stdout.flush()
            watch = asyncio.create_task(watch_schedule(sim, stop))
            await stop.wait()
            await watch
    print("simulator stopped")


SCHEDULE_CHECK_SECONDS = 5.0


def lateness_warning(late: dict, time_scale: float) -> str:
    """What to tell a user whose simulator runs behind its time scale, and what keeps up."""
    worst = max(s["stretch"] for s in late.values())
    pools = ", ".join(f"{name} {s['stretch']:.2f}x" for name, s in sorted(late.items()))
    window = next(iter(late.values()))["window_seconds"]
    keeps_up = math.ceil(time_scale * worst * 1.5 * 10) / 10
    return (
        f"warning: the simulator runs behind its schedule ({pools} the time --time-scale {time_scale:g} "
        f"asks, over the last {window:g} s; a busy CPU?): the times it serves now are skewed, and so is "
        f"any RC measured on them; --time-scale {keeps_up:g} would keep up"
    )


async def watch_schedule(sim, stop: asyncio.Event, every: float = SCHEDULE_CHECK_SECONDS) -> None:
    """Say when the simulator falls behind its time scale, and when it keeps up again (stderr)."""
    was_late = False
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        late = sim.late()
        if late and not was_late:
            print(lateness_warning(late, sim.config.time_scale), file=sys.stderr, flush=True)
        elif was_late and not late:
            print(
                "the simulator keeps its schedule again: the times it serves are the model's", file=sys.stderr
            )
        was_late = bool(late)
