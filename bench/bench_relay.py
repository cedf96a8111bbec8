"""The tap's relay cost against the floor: a bare aiohttp streaming proxy, in the same run.

Why the tap adds latency under load is CPU per stream chunk: when an engine step emits a chunk
for every running stream at once, the last of N chunks waits for the N - 1 before it. This
measures, for the tap (``specguard`` Monitor, as ``specguard run`` serves) and for a minimal
aiohttp proxy (read the body, forward it, relay the stream chunk by chunk, nothing else), the
CPU seconds per request and per stream chunk, against the same paced upstream:

- per request: requests of 1 chunk;
- per chunk: requests of ``--chunks`` chunks sent ``--interval`` apart (each chunk arrives on
  its own), minus the per-request part, divided by the extra chunks.

Proxies alternate over ``--rounds`` so drift in the machine's load hits both alike; the ratio
tap / bare proxy is the figure to compare across machines.

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


def _bare_main(queue: mp.Queue, upstream: str) -> None:
    """The floor: an aiohttp proxy that relays the stream and does nothing else."""
    from aiohttp import web

    async def main() -> None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

        async def handle(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            async with session.post(
                upstream + request.path, data=raw, headers={"Content-Type": "application/json"}
            ) as resp:
                out = web.StreamResponse(
                    status=resp.status, headers={"Content-Type": resp.headers["Content-Type"]}
                )
                await out.prepare(request)
                async for data in resp.content.iter_any():
                    await out.write(data)
                await out.write_eof()
                return out

        queue.put((await bench_tap.serve_chat(handle), os.getpid()))
        await asyncio.Event().wait()

    asyncio.run(main())


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
    """CPU seconds per request of ``proxy`` ("tap" or "bare") for streams of ``chunks`` chunks."""
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
            proc = ctx.Process(target=_bare_main, args=(queue, url), daemon=True)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=200, help="chunks per long stream (on average)")
    parser.add_argument("--interval", type=float, default=0.002, help="seconds between a stream's chunks")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: dict[str, dict[str, list[float]]] = {p: {"request": [], "chunk": []} for p in ("tap", "bare")}
    for r in range(args.rounds):
        for proxy in ("tap", "bare") if r % 2 == 0 else ("bare", "tap"):
            short = cpu_per_request(proxy, 1, 0.0, 250)
            long = cpu_per_request(proxy, args.chunks, args.interval, 8)
            rows[proxy]["request"].append(short)
            rows[proxy]["chunk"].append((long - short) / (args.chunks - 1))
    result = {
        proxy: {
            "cpu_ms_per_request": 1e3 * statistics.median(v["request"]),
            "cpu_us_per_chunk": 1e6 * statistics.median(v["chunk"]),
        }
        for proxy, v in rows.items()
    }
    result["ratio_per_request"] = result["tap"]["cpu_ms_per_request"] / result["bare"]["cpu_ms_per_request"]
    result["ratio_per_chunk"] = result["tap"]["cpu_us_per_chunk"] / result["bare"]["cpu_us_per_chunk"]
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for proxy, label in (("tap", "specguard tap"), ("bare", "bare aiohttp proxy")):
        v = result[proxy]
        print(
            f"{label:<19} {v['cpu_ms_per_request']:.3f} ms CPU per request, "
            f"{v['cpu_us_per_chunk']:.1f} us per stream chunk (median of {args.rounds})"
        )
    ratios = f"x{result['ratio_per_request']:.2f} per request, x{result['ratio_per_chunk']:.2f} per chunk"
    print(f"tap / bare: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
