"""What the tap costs: added latency and throughput vs direct to an upstream, and its memory.

Four processes: two identically seeded upstreams, the tap (``specguard`` Monitor) in front of
the second, and this load generator. ``--pin on`` (the default on 2 or more CPUs) gives the tap
the last CPU to itself and the rest the others, as the sidecar deployment gives the tap a CPU of
its own; ``--pin off`` lets all four share every CPU. At each concurrency (1, 16, 128 streams)
direct and through-the-tap rounds alternate with the same prompts, so drift in the machine's load
hits both sides alike. Reported per concurrency and side: p50/p99 of TTFT, end-to-end latency and
(``--upstream paced``) chunk delivery latency (each stream chunk carries the upstream's send time,
so its delivery latency is exact); the added latency is the difference of the two sides'
quantiles; request throughput; the tap's CPU time per request; the tap process's resident memory.

``--proxy push`` or ``bare`` puts a floor relay (``floors.py``: relaying and nothing else) where
the tap stands, so the figures show how much of the tap's added latency any relay of that kind
adds on the same machine; ``--proxy none`` sends both sides direct (an A/A run): its "added"
figures are the measurement's own noise.

Upstreams: ``paced`` (default) is an engine stand-in that emits one chunk per stream every
``--interval`` seconds, all streams on one shared tick as an engine step does (``--pacing step``)
or each on its own timer (``--pacing independent``); ``sim`` is the simulator (pool spec-k4,
vLLM dialect).

    python3 bench/bench_tap.py [--upstream paced|sim] [--pacing step|independent] [--seconds 3]
        [--rounds 4] [--levels 1,16,128] [--pin on|off] [--proxy tap|push|bare|none] [--profile FILE]
        [--json]

Targets: p99 added latency <= 2 ms at 128 streams; tap RSS <= 150 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

LEVELS = (1, 16, 128)
T = TypeVar("T")


def _sim_main(queue: mp.Queue, time_scale: float, cpus: set[int] | None) -> None:
    _pin(cpus)
    from specguard.sim import cluster

    async def main() -> None:
        async with cluster.SimCluster.from_config(
            None, seed=0, dialect="vllm", time_scale=time_scale, pools=["spec-k4"]
        ) as sim:
            queue.put((sim.urls["spec-k4"], sim.config.model_name))
            await asyncio.Event().wait()

    _run(main())


def _paced_main(
    queue: mp.Queue, chunks: int, interval: float, cpus: set[int] | None, pacing: str, spread: bool = True
) -> None:
    """An engine stand-in with exact pacing: one stream chunk per ``interval`` seconds.

    A request gets ``chunks`` / 2 to 3 * ``chunks`` / 2 chunks (``chunks`` on average), chosen by a hash of
    its body so twin upstreams answer the same request alike; varied lengths keep the streams from
    finishing, and so restarting, in lockstep (``spread=False``: exactly ``chunks``). Each chunk's
    text carries its send time (``time.perf_counter``, one clock for every process on the machine).
    """
    _pin(cpus)
    from aiohttp import web

    head = b'data: {"id":"cmpl-1","object":"chat.completion.chunk","created":1,"model":"paced","choices":'
    usage = (
        head + b'[],"usage":{"prompt_tokens":8,"total_tokens":%d,"completion_tokens":%d},'
        b'"metrics":{"speculative_decoding":{"num_spec_steps":%d,"num_draft_tokens":%d,'
        b'"num_accepted_draft_tokens":%d,"acceptance_histogram":[0,0,0,%d,0],"num_spec_tokens":4}}}\n\n'
    )
    step = {"tick": asyncio.Event()}

    async def ticker() -> None:
        """An engine step: every stream gets its next chunk at the same moment."""
        while True:
            await asyncio.sleep(interval)
            done, step["tick"] = step["tick"], asyncio.Event()
            done.set()

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        count = chunks
        if spread:
            count = chunks // 2 + zlib.crc32(json.dumps(body["messages"]).encode()) % (chunks + 1)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(count):
            if pacing == "step":
                await step["tick"].wait()
            else:
                await asyncio.sleep(interval)
            stamp = b"%.6f" % time.perf_counter()
            await resp.write(
                head + b'[{"index":0,"delta":{"content":" t=' + stamp + b'"},"finish_reason":null}]}\n\n'
            )
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(usage % (8 + 3 * count, 3 * count, count, 4 * count, 2 * count, count))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def main() -> None:
        url = await serve_chat(handle)
        ticking = asyncio.create_task(ticker())  # noqa: F841 (runs for the process's life)
        queue.put((url, "paced"))
        await asyncio.Event().wait()

    _run(main())


async def serve_chat(handle: Callable[[Any], Awaitable[Any]]) -> str:
    """Serve ``handle`` as POST /v1/chat/completions on 127.0.0.1 (ephemeral port); its base URL."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """The harness (load generator, upstreams) runs on uvloop when installed, to keep its own
    overhead and jitter small; the tap runs on asyncio, as ``specguard run`` does."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _pin(cpus: set[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


def _tap_main(queue: mp.Queue, upstream: str, scrape_seconds: float, cpus: set[int] | None) -> None:
    _pin(cpus)
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

    asyncio.run(main())  # as `specguard run` runs it


def cpu_seconds(pid: int) -> float:
    """CPU seconds a process (all its threads) ran so far: the scheduler's exact count, not ticks."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as fh:
            total += int(fh.read().split()[0])
    return total / 1e9


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB, from /proc."""
    values = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                values[key] = int(value.split()[0])
    return values["VmRSS"], values["VmHWM"]


_STAMP = re.compile(rb"t=(\d+\.\d+)")


@dataclass
class Outcome:
    """One request as the client saw it."""

    ttft: float
    e2e: float
    status: int
    deliveries: list[float]  # per stamped chunk: receive time - the upstream's send time


async def one(session: aiohttp.ClientSession, url: str, body: bytes) -> Outcome:
    start = time.perf_counter()
    ttft = None
    deliveries: list[float] = []
    async with session.post(
        url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "x-task-type": "code"},
    ) as resp:
        async for chunk in resp.content.iter_any():
            now = time.perf_counter()
            if ttft is None:
                ttft = now - start
            deliveries.extend(now - float(m.group(1)) for m in _STAMP.finditer(chunk))
        status = resp.status
    return Outcome(ttft or 0.0, time.perf_counter() - start, status, deliveries)


async def run_side(
    url: str, model: str, concurrency: int, seconds: float, tag: str, stagger: float = 0.0
) -> dict:
    """Closed-loop streams for ``seconds``; worker w sends prompts "tag w i" (same on both sides).

    Worker w starts ``stagger * w / concurrency`` seconds late, so the streams do not start in lockstep.
    """
    outcomes: list[Outcome] = []
    deadline = time.perf_counter() + seconds

    async def worker(session: aiohttp.ClientSession, w: int) -> None:
        i = 0
        await asyncio.sleep(stagger * w / concurrency)
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
            outcomes.append(await one(session, url, body))

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session, w) for w in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"outcomes": outcomes, "seconds": elapsed}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def summary(outcomes: list[Outcome], seconds: float) -> dict:
    ttft = [o.ttft for o in outcomes]
    e2e = [o.e2e for o in outcomes]
    chunks = [d for o in outcomes for d in o.deliveries]
    return {
        "requests": len(e2e),
        "errors": sum(1 for o in outcomes if o.status != 200),
        "requests_per_second": len(e2e) / seconds,
        "ttft_p50_ms": 1e3 * pct(ttft, 0.5),
        "ttft_p99_ms": 1e3 * pct(ttft, 0.99),
        "e2e_p50_ms": 1e3 * pct(e2e, 0.5),
        "e2e_p99_ms": 1e3 * pct(e2e, 0.99),
        "chunks": len(chunks),
        "chunk_p50_ms": 1e3 * pct(chunks, 0.5),
        "chunk_p99_ms": 1e3 * pct(chunks, 0.99),
    }


async def measure(
    direct: str,
    tap: str,
    model: str,
    seconds: float,
    rounds: int,
    tap_pid: int,
    levels: tuple[int, ...] = LEVELS,
    stagger: float = 0.0,
) -> list[dict]:
    """Direct and through-the-tap rounds alternate (direct first on even rounds, tap first on odd).

    One side runs at a time, so the harness loads the machine half as much as running both at
    once, and drift in the machine's load hits both sides alike over the rounds. The added
    latency is the difference of the two sides' quantiles (the same prompts on twin upstreams).
    """
    out = []
    for level in levels:
        for url in (direct, tap):
            await run_side(url, model, level, 0.5, tag=f"warm{level}", stagger=stagger)
        sides: dict[str, dict] = {name: {"outcomes": [], "seconds": 0.0} for name in ("direct", "tap")}
        per_round: list[dict[str, float]] = []
        cpu = 0.0
        for r in range(rounds):
            order = (("direct", direct), ("tap", tap)) if r % 2 == 0 else (("tap", tap), ("direct", direct))
            got: dict[str, dict] = {}
            for name, url in order:
                before = cpu_seconds(tap_pid)
                got[name] = await run_side(url, model, level, seconds, tag=f"c{level}r{r}", stagger=stagger)
                if name == "tap":
                    cpu += cpu_seconds(tap_pid) - before
                sides[name]["outcomes"] += got[name]["outcomes"]
                sides[name]["seconds"] += got[name]["seconds"]
            d, t = (summary(got[n]["outcomes"], got[n]["seconds"]) for n in ("direct", "tap"))
            per_round.append({k: t[k] - d[k] for k in ("e2e_p99_ms", "chunk_p99_ms")})
        row: dict = {
            "concurrency": level,
            "tap_cpu_ms_per_request": 1e3 * cpu / max(1, len(sides["tap"]["outcomes"])),
        }
        for name, side in sides.items():
            row[name] = summary(side["outcomes"], side["seconds"])
        d, t = row["direct"], row["tap"]
        added = {k: t[k] - d[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")}
        added |= {k: t[k] - d[k] for k in ("chunk_p50_ms", "chunk_p99_ms")}
        added["per_round"] = per_round
        added["throughput_ratio"] = t["requests_per_second"] / d["requests_per_second"]
        row["added"] = added
        out.append(row)
    return out


def report(result: dict, args: argparse.Namespace) -> None:
    if args.upstream == "sim":
        what = "the simulator (pool spec-k4, vLLM dialect, max_tokens 48)"
    else:
        what = f"a paced stand-in (8-24 chunks, one per {args.interval * 1e3:g} ms, pacing {args.pacing})"
    pinned = "the tap on its own CPU" if result["pinned"] else "no pinning"
    proxy = {
        "tap": "tap",
        "none": "A/A run ('tap' = direct to the twin upstream; CPU and RSS are the upstream's)",
    }.get(args.proxy, f"'tap' = the {args.proxy} floor relay (bench/floors.py)")
    print(f"{proxy} vs direct to {what}; streamed chat, twin upstreams, {result['cpus']} CPUs, {pinned}")
    print("streams  side    req/s   TTFT p50/p99 ms    e2e p50/p99 ms   chunk delivery p50/p99 ms")
    for row in result["levels"]:
        for name in ("direct", "tap"):
            s = row[name]
            print(
                f"{row['concurrency']:>7}  {name:<6} {s['requests_per_second']:7.1f}  "
                f"{s['ttft_p50_ms']:7.2f}/{s['ttft_p99_ms']:7.2f}  "
                f"{s['e2e_p50_ms']:7.2f}/{s['e2e_p99_ms']:7.2f}  "
                f"{s['chunk_p50_ms']:7.2f}/{s['chunk_p99_ms']:7.2f}"
                + (f"  errors {s['errors']}" if s["errors"] else "")
            )
        a = row["added"]
        rounds = ", ".join(f"{r['chunk_p99_ms']:+.2f}" for r in a["per_round"])
        e2e_rounds = ", ".join(f"{r['e2e_p99_ms']:+.2f}" for r in a["per_round"])
        print(
            f"{'':>7}  added (tap - direct): chunk p50 {a['chunk_p50_ms']:+.2f} ms, "
            f"p99 {a['chunk_p99_ms']:+.2f} ms "
            f"(per round {rounds}); e2e p50 {a['e2e_p50_ms']:+.2f}, p99 {a['e2e_p99_ms']:+.2f} ms "
            f"(per round {e2e_rounds}); "
            f"TTFT p50 {a['ttft_p50_ms']:+.2f}, p99 {a['ttft_p99_ms']:+.2f} ms; "
            f"throughput x{a['throughput_ratio']:.3f}; tap CPU {row['tap_cpu_ms_per_request']:.2f} ms/request"
        )
    print(
        f"tap RSS: start {result['tap_rss_mib_start']:.1f} MiB, end {result['tap_rss_mib_end']:.1f} MiB, "
        f"peak {result['tap_rss_mib_peak']:.1f} MiB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per side per round")
    parser.add_argument("--rounds", type=int, default=4, help="alternating direct/tap rounds per level")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="simulator wall seconds per model second"
    )
    parser.add_argument("--upstream", choices=("paced", "sim"), default="paced")
    parser.add_argument(
        "--interval", type=float, default=0.02, help="paced: seconds between a stream's chunks"
    )
    parser.add_argument("--pacing", choices=("step", "independent"), default="step")
    parser.add_argument(
        "--levels", default=",".join(map(str, LEVELS)), help="concurrent streams (comma-separated)"
    )
    parser.add_argument(
        "--pin", choices=("on", "off"), default="on", help="on: the tap gets the last CPU to itself"
    )
    parser.add_argument(
        "--proxy",
        choices=("tap", "push", "bare", "none"),
        default="tap",
        help="what sits in front of the second upstream: the tap, a floor relay (bench/floors.py), "
        "or nothing (none: an A/A run, direct against direct, for the measurement's own noise)",
    )
    parser.add_argument(
        "--profile", metavar="FILE", help="sample the tap with py-spy into FILE (collapsed stacks)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    levels = tuple(int(x) for x in args.levels.split(","))
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    cpus = sorted(os.sched_getaffinity(0))
    tap_cpus = rest_cpus = None
    if args.pin == "on" and len(cpus) >= 2:
        tap_cpus, rest_cpus = {cpus[-1]}, set(cpus[:-1])
        _pin(rest_cpus)
    if args.upstream == "sim":
        target, target_args = _sim_main, (queue, args.time_scale, rest_cpus)
    else:
        target, target_args = _paced_main, (queue, 16, args.interval, rest_cpus, args.pacing)
    procs = [ctx.Process(target=target, args=target_args, daemon=True) for _ in range(2)]
    spy = None
    try:
        procs[0].start()
        direct_url, model = queue.get(timeout=60)
        procs[1].start()
        behind_url, _ = queue.get(timeout=60)
        scrape = 5.0 if args.upstream == "sim" else 3600.0  # the stand-in has no /metrics
        if args.proxy == "none":
            tap_url, tap_pid = behind_url, procs[1].pid  # (CPU and memory figures: the upstream's)
        else:
            if args.proxy == "tap":
                proxy_main, proxy_args = _tap_main, (queue, behind_url, scrape, tap_cpus)
            else:
                import floors

                proxy_main, proxy_args = floors.main, (args.proxy, queue, behind_url, tap_cpus)
            procs.append(ctx.Process(target=proxy_main, args=proxy_args, daemon=True))
            procs[-1].start()
            tap_url, tap_pid = queue.get(timeout=60)
        rss_start = rss_kib(tap_pid)
        if args.profile:
            command = ["py-spy", "record", "--nonblocking", "-f", "raw", "-r", "100", "-p", str(tap_pid)]
            spy = subprocess.Popen([*command, "-o", args.profile])
        stagger = 16 * args.interval if args.upstream == "paced" else 0.5
        rows = _run(measure(direct_url, tap_url, model, args.seconds, args.rounds, tap_pid, levels, stagger))
        rss_end, rss_peak = rss_kib(tap_pid)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
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
        "pinned": tap_cpus is not None,
        "upstream": args.upstream,
        "proxy": args.proxy,
        "pacing": args.pacing if args.upstream == "paced" else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
