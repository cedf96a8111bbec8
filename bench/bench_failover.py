"""Failover from a dead pool: what the clients see when a pool is SIGKILLed during load.

The tap (``specguard`` Monitor, in this process) fronts two simulated pools: spec-k4 (in this
process) and nospec, which runs as its own ``specguard simulate`` process so that it can be killed
with SIGKILL. creative/high is planned onto nospec (as in the run that found the defect) and a
holdout share of every other class goes there too. Each run: load for ``--before`` seconds, SIGKILL
of nospec, ``--down`` seconds dead, restart on the same port, ``--after`` seconds more. Reported per
run: requests sent, requests failed (not a whole 2xx answer), of those the ones sent after the pool
was marked down, the time from the kill to the pool marked down (time to failover), and from the
restarted pool answering ``/health`` to it marked up (time back); and the same with ``tap.failover:
false`` (no failover: the behaviour this replaced) for comparison.

    python3 bench/bench_failover.py [--runs 3] [--concurrency 8] [--before 3] [--down 5]
        [--after 3] [--time-scale 0.05] [--json]

Run it under ``flock /tmp/specguard-bench.lock``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics

from specguard.lab import failover, loadgen
from specguard.monitor import config
from specguard.monitor.app import Monitor
from specguard.sim import cluster

MIX = [
    loadgen.RequestClass("creative", temperature=1.0, max_tokens=32),
    loadgen.RequestClass("code", temperature=0.0, max_tokens=32),
    loadgen.RequestClass("chat", temperature=0.7, max_tokens=32),
]
PLANNED = {("creative", "high", load): "nospec" for load in ("low", "medium", "high")}


def monitor_config(spec_url: str, nospec_url: str, enabled: bool) -> config.SpecguardConfig:
    return config.parse_text(
        f"""
pools:
  - {{name: spec-k4, url: "{spec_url}", engine: vllm, num_speculative_tokens: 4}}
  - {{name: nospec, url: "{nospec_url}", engine: vllm, num_speculative_tokens: 0}}
tap: {{holdout_share: 0.05, probe_share: 0.05, default_pool: spec-k4, nospec_pool: nospec,
      failover: {str(enabled).lower()}}}
scrape: {{interval_seconds: 15, timeout_seconds: 2}}
""",
        "bench-failover.yaml",
    )


async def one_run(args: argparse.Namespace, seed: int, enabled: bool) -> failover.Outcome:
    victim = failover.SimVictim("nospec", time_scale=args.time_scale, seed=seed)
    await victim.start()
    try:
        async with cluster.SimCluster.from_config(
            None, seed=seed, time_scale=args.time_scale, pools=["spec-k4"]
        ) as sim:
            cfg = monitor_config(sim.urls["spec-k4"], victim.url, enabled)
            monitor = Monitor(cfg, rng=random.Random(seed))
            monitor.router.set_plan(PLANNED)
            url = await monitor.start("127.0.0.1", 0)
            try:
                return await failover.kill_during_load(
                    monitor,
                    url,
                    victim,
                    MIX,
                    concurrency=args.concurrency,
                    before_s=args.before,
                    down_s=args.down,
                    after_s=args.after,
                    seed=seed,
                    back_timeout_s=30 if enabled else 0,
                )
            finally:
                await monitor.stop()
    finally:
        await victim.stop()


def summary(outcomes: list[failover.Outcome]) -> dict:
    def figures(values: list[float | None]) -> dict:
        known = [v for v in values if v is not None]
        if not known:
            return {"median": None, "max": None}
        return {"median": round(statistics.median(known), 3), "max": round(max(known), 3)}

    return {
        "runs": len(outcomes),
        "requests": sum(o.requests for o in outcomes),
        "failed": [o.failed for o in outcomes],
        "failed_after_failover": [o.failed_after_failover for o in outcomes],
        "failover_requests": [o.failover_requests for o in outcomes],
        "time_to_failover_s": figures([o.time_to_failover_s for o in outcomes]),
        "time_back_s": figures([o.time_back_s for o in outcomes]),
    }


async def main(args: argparse.Namespace) -> dict:
    out: dict = {"config": vars(args)}
    for label, enabled in (("failover", True), ("no_failover", False)):
        outcomes = [await one_run(args, seed, enabled) for seed in range(args.runs)]
        out[label] = {"summary": summary(outcomes), "runs": [o.to_json() for o in outcomes]}
    return out


def render(result: dict) -> str:
    lines = [
        "| tap | runs | requests | failed per run | failed after marked down "
        "| time to failover (median / max) | time back (median / max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in ("failover", "no_failover"):
        s = result[label]["summary"]
        ttf, back = s["time_to_failover_s"], s["time_back_s"]
        lines.append(
            f"| {label} | {s['runs']} | {s['requests']} | {s['failed']} | {s['failed_after_failover']} "
            f"| {ttf['median']} / {ttf['max']} s | {back['median']} / {back['max']} s |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--before", type=float, default=3.0)
    parser.add_argument("--down", type=float, default=5.0)
    parser.add_argument("--after", type=float, default=3.0)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args()
    outcome = asyncio.run(main(arguments))
    print(json.dumps(outcome, indent=1) if arguments.json else render(outcome))
