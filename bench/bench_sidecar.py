"""Sidecar cost: CPU and memory of ``specguard run`` (tap + exporter + guard) with 50 classes.

Starts the simulator in this process and ``python3 -m specguard run`` as a child process in front
of it (scrape interval 15 s, the default guard policy), then measures the child only (utime +
stime from /proc, VmRSS) over an idle stretch (scrapes and guard evaluations only) and a loaded
stretch (closed-loop streaming traffic spread over 50 classes = 25 task types x 2 temperature
buckets, through the tap). Also reports the size of its /metrics page.

    python3 bench/bench_sidecar.py [--idle 60] [--load 120] [--concurrency 16] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from specguard.lab import loadgen
from specguard.sim.cluster import SimCluster

TASKS = [f"task{i:02d}" for i in range(25)]
TEMPS = (0.0, 0.7)  # greedy and medium buckets -> 50 classes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_text(urls: dict[str, str], port: int, interval: float) -> str:
    return f"""
pools:
  - {{name: spec-k4, url: "{urls["spec-k4"]}", engine: vllm, num_speculative_tokens: 4}}
  - {{name: spec-k2, url: "{urls["spec-k2"]}", engine: vllm, num_speculative_tokens: 2}}
  - {{name: nospec, url: "{urls["nospec"]}", engine: vllm, num_speculative_tokens: 0}}
classes:
  task_types: [{", ".join(TASKS)}]
tap: {{listen: "127.0.0.1:{port}", default_pool: spec-k4, nospec_pool: nospec}}
scrape: {{interval_seconds: {interval}}}
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def wait_ready(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url + "/healthz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("specguard run did not become ready")


async def measure(pid: int, seconds: float, work=None) -> dict:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    peak = rss_mb(pid)
    task = asyncio.create_task(work) if work is not None else None
    while time.monotonic() - t0 < seconds:
        await asyncio.sleep(1.0)
        peak = max(peak, rss_mb(pid))
    results = await task if task is not None else []
    elapsed = time.monotonic() - t0
    return {
        "seconds": elapsed,
        "cpu_percent_of_one_core": 100 * (cpu_seconds(pid) - c0) / elapsed,
        "rss_mb_peak": peak,
        "rss_mb_end": rss_mb(pid),
        "requests": len(results),
        "requests_per_second": len(results) / elapsed,
        "failed": sum(1 for r in results if not r.ok),
    }


async def main_async(args) -> dict:
    async with SimCluster.from_config(None, seed=0) as sim:
        port = free_port()
        with tempfile.TemporaryDirectory() as tmp:
            cfg = Path(tmp) / "config.yaml"
            cfg.write_text(config_text(sim.urls, port, args.interval))
            child = subprocess.Popen(
                [sys.executable, "-m", "specguard", "run", "--config", str(cfg), "--log-level", "error"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                url = f"http://127.0.0.1:{port}"
                await wait_ready(url)
                idle = await measure(child.pid, args.idle)
                mix = [
                    loadgen.RequestClass(t, 1.0, temperature=temp, max_tokens=64)
                    for t in TASKS
                    for temp in TEMPS
                ]
                work = loadgen.run_load(url, mix, args.concurrency, duration_s=args.load, stream=True, seed=1)
                loaded = await measure(child.pid, args.load + 2, work)
                async with aiohttp.ClientSession() as session:
                    async with session.get(url + "/metrics") as r:
                        page = await r.text()
                series = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
            finally:
                child.terminate()
                child.wait(timeout=10)
    return {
        "classes": len(TASKS) * len(TEMPS),
        "scrape_interval_seconds": args.interval,
        "idle": idle,
        "loaded": loaded,
        "metrics_page_bytes": len(page),
        "metrics_series": series,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--load", type=float, default=120.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name in ("idle", "loaded"):
        r = result[name]
        print(
            f"{name:<7} {r['seconds']:5.0f}s: CPU {r['cpu_percent_of_one_core']:5.1f}% of one core, "
            f"RSS peak {r['rss_mb_peak']:.0f} MB, {r['requests_per_second']:.1f} req/s through the tap "
            f"({r['failed']} failed)"
        )
    print(f"/metrics: {result['metrics_page_bytes'] // 1024} KiB, {result['metrics_series']} series")


if __name__ == "__main__":
    main()
