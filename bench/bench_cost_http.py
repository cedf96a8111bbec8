"""End to end over HTTP: load through the tap into the simulator, RC from the tap's records vs the truth.

Unlike bench_cost.py (virtual time), decode times here are wall-clock times the tap measured
on real streams, with the simulator pacing its steps at ``--time-scale`` wall seconds per model
second, so event-loop jitter on a busy machine is part of the figure. Each pool gets the whole
mix in turn (the routing plan sends every class to it) at ``--concurrency`` closed-loop clients.

    python3 bench/bench_cost_http.py [--time-scale 0.25] [--concurrency 4] [--requests 240]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

from specguard.lab import loadgen
from specguard.monitor import config
from specguard.monitor.app import Monitor
from specguard.rules import cost
from specguard.rules.cost_config import CostSettings
from specguard.sim import cluster
from specguard.sim import truth as sim_truth

K = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
MIX = [
    loadgen.RequestClass("code", temperature=0.0),
    loadgen.RequestClass("chat", temperature=0.7),
    loadgen.RequestClass("creative", temperature=1.0),
]
TEMPERATURE = {"greedy": 0.0, "medium": 0.7, "high": 1.0}


async def measure(args) -> dict:
    async with cluster.SimCluster.from_config(
        None, seed=0, dialect=args.dialect, time_scale=args.time_scale
    ) as sim:
        pools = "\n".join(
            f'  - {{name: {name}, url: "{url}", engine: {args.dialect}, num_speculative_tokens: {K[name]}}}'
            for name, url in sim.urls.items()
        )
        tap = "tap: {holdout_share: 0, probe_share: 0}\nscrape: {interval_seconds: 3600}\n"
        cfg = config.parse_text(f"pools:\n{pools}\n{tap}")
        monitor = Monitor(cfg, rng=random.Random(1))
        url = await monitor.start("127.0.0.1", 0)
        classes = cfg.exporter.classes
        started = time.perf_counter()
        try:
            for index, pool in enumerate(K):
                monitor.router.set_plan(
                    {
                        (c.task_type, temp.name, load.name): pool
                        for c in MIX
                        for temp in classes.temperature_buckets
                        for load in classes.load_buckets
                    }
                )
                results = await loadgen.run_load(
                    url, MIX, args.concurrency, requests=args.requests, stream=True, seed=index
                )
                assert {r.status for r in results} == {200}, {r.status for r in results}
            records = monitor.stats.records()
        finally:
            await monitor.stop()
        elapsed = time.perf_counter() - started
    settings = CostSettings(min_samples=20, baseline_min_samples=20).with_traffic(
        classes.load_buckets, cfg.exporter.tap.full_rollback_request_threshold
    )
    results = cost.evaluate(records, cfg.exporter.pools, None, time.time(), settings)
    rows, errors, covered = [], [], []
    for r in results:
        if r.rc is None:
            continue
        truth = sim_truth.relative_cost(
            sim.config,
            r.task_type,
            TEMPERATURE[r.temperature_bucket],
            r.num_speculative_tokens,
            args.concurrency,
        )
        errors.append(abs(r.rc / truth - 1))
        covered.append(r.lower <= truth <= r.upper)
        rows.append(
            {
                "class": f"{r.task_type}/{r.temperature_bucket}",
                "pool": r.pool,
                "load_bucket": r.load_bucket,
                "n_spec": r.n_spec,
                "n_base": r.n_base,
                "rc": round(r.rc, 4),
                "interval": [round(r.lower, 4), round(r.upper, 4)],
                "truth": round(truth, 4),
            }
        )
    return {
        "wall_seconds": round(elapsed, 1),
        "records": len(records),
        "mean_abs_error_vs_truth": statistics.fmean(errors) if errors else None,
        "max_abs_error_vs_truth": max(errors) if errors else None,
        "coverage_95": statistics.fmean(covered) if covered else None,
        "cells": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=240, help="requests per pool")
    parser.add_argument("--dialect", default="vllm", choices=("vllm", "sglang"))
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args)), indent=2))


if __name__ == "__main__":
    main()
