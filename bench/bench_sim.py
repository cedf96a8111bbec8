"""How closely the HTTP simulator's realised step times follow its cost model, under load.

For each concurrency (default 1, 32, 200 streaming requests, closed loop, through the real HTTP
front end with the load generator in the same process, as the tests and the demo run it), the
spec-k4 pool logs every step's model duration (x time scale) and its realised wall duration
(time between consecutive step deliveries). Reported: total drift = |sum realised - sum model| /
sum model (target <= 5 %), the median and p95 of per-step |realised - model| / model, mean
lateness of a step's delivery, and tokens/s delivered to clients.

    python3 bench/bench_sim.py [--concurrency 1 32 200] [--duration 8] [--time-scale 1.0] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from specguard.lab import loadgen
from specguard.sim import cluster, virtual
from specguard.sim import config as simconfig


async def one(concurrency: int, duration: float, time_scale: float) -> dict:
    async with cluster.SimCluster.from_config(None, seed=0, time_scale=time_scale, pools=["spec-k4"]) as sim:
        runtime = sim.runtimes["spec-k4"]
        runtime.keep_step_log = 1_000_000
        mix = [loadgen.RequestClass("chat", temperature=0.7, max_tokens=64)]
        started = time.perf_counter()
        results = await loadgen.run_load(
            sim.urls["spec-k4"], mix, concurrency=concurrency, duration_s=duration, stream=True
        )
        wall = time.perf_counter() - started
        steps = [s for s in runtime.step_log if s["realised"] is not None]
    model = sum(s["model"] for s in steps)
    realised = sum(s["realised"] for s in steps)
    errors = sorted(abs(s["realised"] - s["model"]) / s["model"] for s in steps)
    batches = [s["batch"] for s in steps]
    return {
        "concurrency": concurrency,
        "steps": len(steps),
        "mean_batch": statistics.fmean(batches) if batches else 0,
        "mean_model_step_ms": 1000 * model / len(steps) if steps else None,
        "mean_realised_step_ms": 1000 * realised / len(steps) if steps else None,
        "total_drift": abs(realised - model) / model if model else None,
        "step_error_p50": errors[len(errors) // 2] if errors else None,
        "step_error_p95": errors[int(len(errors) * 0.95)] if errors else None,
        "mean_late_ms": 1000 * statistics.fmean(s["late"] for s in steps) if steps else None,
        "requests": len(results),
        "failed": sum(not r.ok for r in results),
        "tokens_per_second": sum(r.output_tokens for r in results) / wall,
    }


def virtual_speed(concurrency: int = 160, requests: int = 2000) -> dict:
    """Request-steps per second of the engine core in virtual time (what demo replays use)."""
    cfg = simconfig.load()
    started = time.perf_counter()
    run = virtual.simulate_closed(cfg, "spec-k4", [("chat", 0.7, 1.0)], concurrency, requests)
    elapsed = time.perf_counter() - started
    request_steps = sum(s.decode_requests + s.prefill_requests for s in run.steps)
    return {
        "virtual_request_steps_per_second": request_steps / elapsed,
        "virtual_model_seconds_per_wall_second": run.end / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 200])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of load per concurrency")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [asyncio.run(one(c, args.duration, args.time_scale)) for c in args.concurrency]
    speed = virtual_speed()
    if args.json:
        print(json.dumps({"rows": rows, **speed}, indent=2))
        return
    print(
        f"time scale {args.time_scale:g}, {args.duration:g} s of streaming load per row, pool spec-k4 (K=4)"
    )
    print(" conc  steps  batch  model ms  real ms  drift  step p50  step p95  late ms  tok/s  failed")
    for r in rows:
        cells = [
            f"{r['concurrency']:5d}", f"{r['steps']:6d}", f"{r['mean_batch']:6.1f}",
            f"{r['mean_model_step_ms']:9.2f}", f"{r['mean_realised_step_ms']:8.2f}",
            f"{100 * r['total_drift']:5.1f}%", f"{100 * r['step_error_p50']:8.1f}%",
            f"{100 * r['step_error_p95']:8.1f}%", f"{r['mean_late_ms']:8.2f}",
            f"{r['tokens_per_second']:6.0f}", f"{r['failed']:6d}",
        ]  # fmt: skip
        print(" ".join(cells))
    print(
        f"virtual time (no HTTP), 160 concurrent on spec-k4: "
        f"{speed['virtual_request_steps_per_second']:,.0f} request-steps/s, "
        f"{speed['virtual_model_seconds_per_wall_second']:.0f} model seconds per wall second"
    )


if __name__ == "__main__":
    main()
