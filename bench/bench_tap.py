"""What the tap costs: added latency and throughput vs direct to the simulator, and its memory.

Four processes: two identically seeded upstreams, the tap (``specguard`` Monitor) in front of
the second, and this load generator. At each concurrency (1, 16, 128 streams) the same
streamed chat requests are sent directly and through the tap *at the same time*, so the
machine's contention hits both sides alike. Reported per concurrency: p50/p99 of TTFT and
end-to-end latency on each side; the added latency as p50/p99 of the per-request difference
(request (worker, i) is the same request on both sides); request throughput of each side; the
tap's CPU time per request; and the tap process's resident memory (start, end, peak).

    python3 bench/bench_tap.py [--seconds 4] [--rounds 2] [--json]

Targets (issue 4): p99 added latency <= 2 ms at 128 streams; tap RSS <= 150 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

import aiohttp

LEVELS = (1, 16, 128)


def _sim_main(queue: mp.Queue, time_scale: float) -> None:
    from specguard.monitor.sim import cluster

    async def main() -> None:
        async with cluster.SimCluster.from_config(
            None, seed=0, dialect="vllm", time_scale=time_scale, pools=["spec-k4"]
        ) as sim:
            queue.put((sim.urls["spec-k4"], sim.config.model_name))
            await asyncio.Event().wait()

    asyncio.run(main())


def _paced_main(queue: mp.Queue, chunks: int, interval: float) -> None:
    """An engine stand-in with exact pacing: ``chunks`` stream chunks, ``interval`` s apart."""
    from aiohttp import web

    head = b'data: {"id":"cmpl-1","object":"chat.completion.chunk","created":1,"model":"paced","choices":'
    usage = (
        head + b'[],"usage":{"prompt_tokens":8,"total_tokens":%d,"completion_tokens":%d},'
        b'"metrics":{"speculative_decoding":{"num_spec_steps":%d,"num_draft_tokens":%d,'
        b'"num_accepted_draft_tokens":%d,"acceptance_histogram":[0,0,0,%d,0],"num_spec_tokens":4}}}\n\n'
    ) % (8 + 3 * chunks, 3 * chunks, chunks, 4 * chunks, 2 * chunks, chunks)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(chunks):
            await asyncio.sleep(interval)
            await resp.write(head + b'[{"index":0,"delta":{"content":" a b c"},"finish_reason":null}]}\n\n')
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        queue.put((f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", "paced"))
        await asyncio.Event().wait()

    asyncio.run(main())


def _tap_main(queue: mp.Queue, upstream: str, scrape_seconds: float) -> None:
    from specguard.monitor import config
    from specguard.monitor.app import Monitor

    cfg = config.parse_text(
        f"""
pools:
  - {{name: spec-k4, url: "{upstream}", engine: vllm, num_speculative_tokens: 4}}
tap: {{holdout_share: 0, probe_share: 0}}
scrape: {{interval_seconds: {scrape_seconds}, timeout_seconds: 2}}
"""
    )

    async def main() -> None:
        monitor = Monitor(cfg)
        url = await monitor.start("127.0.0.1", 0)
        queue.put((url, os.getpid()))
        await asyncio.Event().wait()

    asyncio.run(main())


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process used so far (from /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB, from /proc."""
    values = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                values[key] = int(value.split()[0])
    return values["VmRSS"], values["VmHWM"]


async def one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float, int]:
    start = time.perf_counter()
    ttft = None
    async with session.post(
        url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "x-task-type": "code"},
    ) as resp:
        async for _chunk in resp.content.iter_any():
            if ttft is None:
                ttft = time.perf_counter() - start
        status = resp.status
    return ttft or 0.0, time.perf_counter() - start, status


async def run_side(url: str, model: str, concurrency: int, seconds: float, tag: str) -> dict:
    """Closed-loop streams for ``seconds``; worker w sends prompts "tag w i" (same on both sides)."""
    latencies: dict[tuple[int, int], tuple[float, float]] = {}
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(session: aiohttp.ClientSession, w: int) -> None:
        nonlocal errors
        i = 0
        while time.perf_counter() < deadline:
            i += 1
            body = json.dumps(
                {
                    "model": model,
                    "messages": [{"role": "user", "content": f"{tag} {w} {i}"}],
                    "max_tokens": 48,
                    "temperature": 0,
                    "stream": True,
                }
            ).encode()
            ttft, e2e, status = await one(session, url, body)
            if status != 200:
                errors += 1
            latencies[(w, i)] = (ttft, e2e)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session, w) for w in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"latencies": latencies, "errors": errors, "seconds": elapsed}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def summary(latencies: list[tuple[float, float]], errors: int, seconds: float) -> dict:
    ttft = [t for t, _ in latencies]
    e2e = [e for _, e in latencies]
    return {
        "requests": len(e2e),
        "errors": errors,
        "requests_per_second": len(e2e) / seconds,
        "ttft_p50_ms": 1e3 * pct(ttft, 0.5),
        "ttft_p99_ms": 1e3 * pct(ttft, 0.99),
        "e2e_p50_ms": 1e3 * pct(e2e, 0.5),
        "e2e_p99_ms": 1e3 * pct(e2e, 0.99),
        "e2e_mean_ms": 1e3 * statistics.fmean(e2e),
    }


async def measure(direct: str, tap: str, model: str, seconds: float, rounds: int, tap_pid: int) -> list[dict]:
    """Both sides run at the same time with the same prompts against twin upstreams.

    The machine's contention then hits both sides alike, and request (worker, i) on one side
    is the same request as (worker, i) on the other, so the per-request difference of their
    latencies is the tap's added latency for that request.
    """
    out = []
    for level in LEVELS:
        await asyncio.gather(
            run_side(direct, model, level, 0.5, tag=f"warm{level}"),
            run_side(tap, model, level, 0.5, tag=f"warm{level}"),
        )
        sides: dict[str, dict] = {
            name: {"latencies": [], "errors": 0, "seconds": 0.0} for name in ("direct", "tap")
        }
        pairs: list[tuple[float, float]] = []
        cpu = 0.0
        for r in range(rounds):
            before = cpu_seconds(tap_pid)
            got_direct, got_tap = await asyncio.gather(
                run_side(direct, model, level, seconds, tag=f"c{level}r{r}"),
                run_side(tap, model, level, seconds, tag=f"c{level}r{r}"),
            )
            cpu += cpu_seconds(tap_pid) - before
            for name, got in (("direct", got_direct), ("tap", got_tap)):
                side = sides[name]
                side["latencies"] += list(got["latencies"].values())
                side["errors"] += got["errors"]
                side["seconds"] += got["seconds"]
            for key, (ttft, e2e) in got_tap["latencies"].items():
                if key in got_direct["latencies"]:
                    d_ttft, d_e2e = got_direct["latencies"][key]
                    pairs.append((ttft - d_ttft, e2e - d_e2e))
        row: dict = {
            "concurrency": level,
            "tap_cpu_ms_per_request": 1e3 * cpu / max(1, len(sides["tap"]["latencies"])),
        }
        for name, side in sides.items():
            row[name] = summary(side["latencies"], side["errors"], side["seconds"])
        row["added"] = {
            "pairs": len(pairs),
            "ttft_p50_ms": 1e3 * pct([p[0] for p in pairs], 0.5),
            "ttft_p99_ms": 1e3 * pct([p[0] for p in pairs], 0.99),
            "e2e_p50_ms": 1e3 * pct([p[1] for p in pairs], 0.5),
            "e2e_p99_ms": 1e3 * pct([p[1] for p in pairs], 0.99),
            "throughput_ratio": row["tap"]["requests_per_second"] / row["direct"]["requests_per_second"],
        }
        out.append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per side per round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating direct/tap rounds per level")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="simulator wall seconds per model second"
    )
    parser.add_argument(
        "--upstream",
        choices=("sim", "paced"),
        default="sim",
        help="sim: the simulator; paced: a stand-in streaming 16 chunks exactly --interval apart",
    )
    parser.add_argument("--interval", type=float, default=0.02, help="paced upstream: seconds between chunks")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    if args.upstream == "sim":
        target, target_args = _sim_main, (queue, args.time_scale)
    else:
        target, target_args = _paced_main, (queue, 16, args.interval)
    procs = [ctx.Process(target=target, args=target_args, daemon=True) for _ in range(2)]
    try:
        procs[0].start()
        direct_url, model = queue.get(timeout=60)
        procs[1].start()
        behind_url, _ = queue.get(timeout=60)
        procs.append(
            ctx.Process(
                target=_tap_main,
                args=(queue, behind_url, 5.0 if args.upstream == "sim" else 3600.0),
                daemon=True,
            )
        )
        procs[2].start()
        tap_url, tap_pid = queue.get(timeout=60)
        rss_start = rss_kib(tap_pid)
        rows = asyncio.run(measure(direct_url, tap_url, model, args.seconds, args.rounds, tap_pid))
        rss_end, rss_peak = rss_kib(tap_pid)
    finally:
        for proc in reversed(procs):
            if proc.pid is not None:
                proc.terminate()
                proc.join(10)
    result = {
        "levels": rows,
        "tap_rss_mib_start": rss_start[0] / 1024,
        "tap_rss_mib_end": rss_end / 1024,
        "tap_rss_mib_peak": rss_peak / 1024,
        "cpus": os.cpu_count(),
        "upstream": args.upstream,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if args.upstream == "sim":
        what = "the simulator (pool spec-k4, vLLM dialect, max_tokens 48)"
    else:
        what = f"a paced stand-in (16 chunks, {args.interval * 1e3:g} ms apart)"
    print(f"tap vs direct to {what}; streamed chat, twin upstreams, {os.cpu_count()} CPUs")
    header = "streams  side    req/s   TTFT p50/p99 ms   e2e p50/p99 ms"
    print(header)
    for row in rows:
        for name in ("direct", "tap"):
            s = row[name]
            print(
                f"{row['concurrency']:>7}  {name:<6} {s['requests_per_second']:7.1f}  "
                f"{s['ttft_p50_ms']:7.2f}/{s['ttft_p99_ms']:7.2f}  "
                f"{s['e2e_p50_ms']:7.2f}/{s['e2e_p99_ms']:7.2f}"
                + (f"  errors {s['errors']}" if s["errors"] else "")
            )
        a = row["added"]
        print(
            f"{'':>7}  added per request ({a['pairs']} pairs): "
            f"e2e p50 {a['e2e_p50_ms']:+.2f} ms, p99 {a['e2e_p99_ms']:+.2f} ms; "
            f"TTFT p50 {a['ttft_p50_ms']:+.2f} ms, p99 {a['ttft_p99_ms']:+.2f} ms; "
            f"throughput x{a['throughput_ratio']:.3f}; tap CPU {row['tap_cpu_ms_per_request']:.2f} ms/request"
        )
    print(
        f"tap RSS: start {result['tap_rss_mib_start']:.1f} MiB, end {result['tap_rss_mib_end']:.1f} MiB, "
        f"peak {result['tap_rss_mib_peak']:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
