"""Cost model: accuracy and interval coverage on the simulator, and evaluation time.

Accuracy: ``--reps`` independent runs of the simulator's engine (virtual time, closed loop at
``--concurrency``) per pool with a mixed class load; each run's RC per (class, pool) is compared
with the simulator's true RC (``truth.relative_cost``, the table ``/sim/truth`` serves); the figures
are the mean and max |relative error| and the share of 95% intervals (delta and bootstrap) that
cover the truth.

Speed: ``rules.cost.evaluate`` over a window of records, as a ratio to the irreducible part
measured in the same run (a pandas groupby of the ratio-of-sums TPOT per cell).

    python3 bench/bench_cost.py [--reps 40] [--requests 150] [--concurrency 4] [--records 20000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import numpy as np
import pandas as pd

from specguard.exporters.records import RequestRecord
from specguard.rules import cost
from specguard.rules.cost_config import CostSettings
from specguard.sim import config as sim_config
from specguard.sim import truth as sim_truth
from specguard.sim.virtual import VirtualCluster

POOLS = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
MIX = (("code", 0.0, "greedy"), ("chat", 0.7, "medium"), ("creative", 1.0, "high"))
SETTINGS = CostSettings(min_samples=20, baseline_min_samples=20).with_traffic([("low", 4), ("high", None)])


def closed_loop(config, pool, concurrency, requests, seed) -> list[RequestRecord]:
    """Exactly ``requests`` results that ran at full concurrency (the drain tail is dropped)."""
    rng = np.random.default_rng(seed)
    finished = []

    def send(_result=None) -> None:
        task, temperature, _ = MIX[int(rng.integers(len(MIX)))]
        cluster.submit(pool, task, temperature)

    cluster = VirtualCluster(config, pools=[pool], seed=seed, keep_steps=False, on_finish=send)
    for _ in range(concurrency):
        send()
    while len(finished) < requests:
        finished.extend(cluster.run_until(cluster._events[0][0]))
    buckets = {t: name for _, t, name in MIX}
    return [
        RequestRecord(
            pool=pool,
            task_type=r.task_type,
            temperature_bucket=buckets[r.temperature],
            load_bucket="low" if concurrency <= 4 else "high",
            route="plan",
            started_at=r.arrival,
            status=200,
            streamed=True,
            output_tokens=r.output_tokens,
            decode_seconds=r.decode_seconds,
            spec=r.spec_stats(),
        )
        for r in finished[:requests]
    ]


def accuracy(args) -> dict:
    config = sim_config.load(None)
    length = sim_config.LengthDist(400, 0.3, 200, 1000)
    config = config.with_overrides(
        tasks={n: dataclasses.replace(t, output_tokens=length) for n, t in config.tasks.items()}
    )
    methods = {
        "jackknife": SETTINGS,
        "delta": dataclasses.replace(SETTINGS, interval_method="delta"),
        "bootstrap": dataclasses.replace(SETTINGS, interval_method="bootstrap", bootstrap_resamples=500),
    }
    errors: list[float] = []
    covered: dict[str, list[bool]] = {name: [] for name in methods}
    for rep in range(args.reps):
        records = []
        for i, pool in enumerate(POOLS):
            records += closed_loop(config, pool, args.concurrency, args.requests, seed=1000 * rep + i)
        results = {name: cost.evaluate(records, POOLS, None, 0.0, s) for name, s in methods.items()}
        for index, result in enumerate(results["jackknife"]):
            if result.rc is None:
                continue
            temperature = next(t for task, t, name in MIX if name == result.temperature_bucket)
            k = result.num_speculative_tokens
            truth = sim_truth.relative_cost(config, result.task_type, temperature, k, args.concurrency)
            errors.append(abs(result.rc / truth - 1))
            for name in methods:
                other = results[name][index]
                covered[name].append(other.lower <= truth <= other.upper)
    return {
        "cells": len(errors),
        "requests_per_cell": args.requests / len(MIX),
        "mean_abs_error_vs_truth": statistics.fmean(errors),
        "max_abs_error_vs_truth": max(errors),
        **{f"coverage_95_{name}": statistics.fmean(c) for name, c in covered.items()},
    }


def speed(args) -> dict:
    config = sim_config.load(None)
    seed_records = []
    for i, pool in enumerate(POOLS):
        seed_records += closed_loop(config, pool, 4, 300, seed=i)
    rng = np.random.default_rng(0)
    records = []
    buckets = ("low", "high")
    while len(records) < args.records:
        r = seed_records[int(rng.integers(len(seed_records)))]
        records.append(dataclasses.replace(r, load_bucket=buckets[int(rng.integers(2))]))

    def baseline() -> int:
        frame = pd.DataFrame(
            {
                "pool": [r.pool for r in records],
                "task": [r.task_type for r in records],
                "temp": [r.temperature_bucket for r in records],
                "load": [r.load_bucket for r in records],
                "seconds": [r.decode_seconds for r in records],
                "tokens": [r.output_tokens - 1 for r in records],
            }
        )
        sums = frame.groupby(["pool", "task", "temp", "load"])[["seconds", "tokens"]].sum()
        return len(sums["seconds"] / sums["tokens"])

    cases = {
        "pandas groupby TPOT (baseline)": baseline,
        "cost.evaluate jackknife": lambda: len(cost.evaluate(records, POOLS, None, 0.0, SETTINGS)),
        "cost.evaluate bootstrap (1000 resamples)": lambda: len(
            cost.evaluate(
                records, POOLS, None, 0.0, dataclasses.replace(SETTINGS, interval_method="bootstrap")
            )
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeat):
        for name, func in cases.items():
            started = time.perf_counter()
            func()
            times[name].append(time.perf_counter() - started)
    base = statistics.median(times["pandas groupby TPOT (baseline)"])
    return {
        "records": len(records),
        "median_seconds": {name: statistics.median(t) for name, t in times.items()},
        "ratio_to_baseline": {name: statistics.median(t) / base for name, t in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--requests", type=int, default=150, help="requests per pool per rep")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps({"accuracy": accuracy(args), "speed": speed(args)}, indent=2))


if __name__ == "__main__":
    main()
