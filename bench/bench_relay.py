"""The tap's relay cost against its floors, in the same run.

Why the tap adds latency under load is CPU per stream chunk: when an engine step emits a chunk
for every running stream at once, the last of N chunks waits for the N - 1 before it. This
measures, for the tap (``specguard`` Monitor, as ``specguard run`` serves) and for two relays
that do nothing but relay (``floors.py``: the tap's push relay path alone, and a plain aiohttp
proxy), the CPU seconds per request and per stream chunk, against the same paced upstream:

- per request: requests of 1 chunk;
- per chunk: requests of ``--chunks`` chunks sent ``--interval`` apart (each chunk arrives on
  its own), minus the per-request part, divided by the extra chunks.

Proxies alternate over ``--rounds`` so drift in the machine's load hits all alike; the ratios
tap / floor are the figures to compare across machines.

    python3 bench/bench_relay.py [--rounds 3] [--chunks 200] [--interval 0.002] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_tap  # noqa: E402  (the same upstream, tap process and CPU accounting)
import floors  # noqa: E402


async def drive(url: str, requests: int, concurrency: int) -> None:
    body = json.dumps(
        {"model": "paced", "messages": [{"role": "user", "content": "x"}], "stream": True}
    ).encode()
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            for _ in range(requests):
                await bench_tap.one(session, url, body)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def cpu_per_request(proxy: str, chunks: int, interval: float, requests: int) -> float:
    """CPU seconds per request of ``proxy`` (a key of ``PROXIES``) for streams of ``chunks`` chunks."""
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    upstream = ctx.Process(
        target=bench_tap._paced_main, args=(queue, chunks, interval, None, "independent", False), daemon=True
    )
    procs = [upstream]
    try:
        upstream.start()
        url, _ = queue.get(timeout=60)
        if proxy == "tap":
            proc = ctx.Process(target=bench_tap._tap_main, args=(queue, url, 3600.0, None), daemon=True)
        else:
            proc = ctx.Process(target=floors.main, args=(proxy, queue, url), daemon=True)
        procs.append(proc)
        proc.start()
        proxy_url, pid = queue.get(timeout=60)
        asyncio.run(drive(proxy_url, 5, 4))  # warm-up: connections, caches
        before = bench_tap.cpu_seconds(pid)
        asyncio.run(drive(proxy_url, requests, 4))
        return (bench_tap.cpu_seconds(pid) - before) / (4 * requests)
    finally:
        for p in reversed(procs):
            p.terminate()
            p.join(10)


PROXIES = {"tap": "specguard tap", "push": "push relay only", "bare": "bare aiohttp proxy"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=200, help="chunks per long stream (on average)")
    parser.add_argument("--interval", type=float, default=0.002, help="seconds between a stream's chunks")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: dict[str, dict[str, list[float]]] = {p: {"request": [], "chunk": []} for p in PROXIES}
    for r in range(args.rounds):
        for proxy in list(PROXIES) if r % 2 == 0 else list(PROXIES)[::-1]:
            short = cpu_per_request(proxy, 1, 0.0, 250)
            long = cpu_per_request(proxy, args.chunks, args.interval, 8)
            rows[proxy]["request"].append(short)
            rows[proxy]["chunk"].append((long - short) / (args.chunks - 1))
    result: dict = {
        proxy: {
            "cpu_ms_per_request": 1e3 * statistics.median(v["request"]),
            "cpu_us_per_chunk": 1e6 * statistics.median(v["chunk"]),
        }
        for proxy, v in rows.items()
    }
    for floor in ("push", "bare"):
        for unit, key in (("request", "cpu_ms_per_request"), ("chunk", "cpu_us_per_chunk")):
            result[f"tap_over_{floor}_per_{unit}"] = result["tap"][key] / result[floor][key]
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for proxy, label in PROXIES.items():
        v = result[proxy]
        print(
            f"{label:<19} {v['cpu_ms_per_request']:.3f} ms CPU per request, "
            f"{v['cpu_us_per_chunk']:.1f} us per stream chunk (median of {args.rounds})"
        )
    for floor in ("push", "bare"):
        print(
            f"tap / {floor}: x{result[f'tap_over_{floor}_per_request']:.2f} per request, "
            f"x{result[f'tap_over_{floor}_per_chunk']:.2f} per chunk"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
