"""Soak of the tap: high concurrency for minutes against the simulator, every response checked.

Three processes: two identically seeded simulators ("direct" and "behind"), ``specguard run``
(tap + scrape + exporter + guard in dry-run) in front of "behind", and this load generator.
Each of ``--concurrency`` workers loops until the deadline (then stops by itself): it draws a
request (task type, temperature, chat or completions, streamed or not, with or without usage,
a prompt unique to the run), sends it directly and through the tap at the same time, and
compares the two answers byte for byte after normalising only ``id`` and ``created``. Lost =
the direct answer was 200 and the tap's was not (or the connection broke); altered = both 200
but the bytes differ. Every ``--sample`` seconds the tap process's RSS is read from /proc.

Reported: requests, lost, altered, throughput, per-minute p50/p99 of the added latency (tap e2e
minus direct e2e of the same request), RSS after warm-up vs at the end. The same prompt gives
the same draws on both simulators (keys are prompt + occurrence), so the answers must match.

    python3 bench/soak_tap.py --minutes 3 [--concurrency 64] [--json]

Exit status 1 when a response was lost or altered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
CLASSES = [  # (task type, temperature, chat?)
    ("code", 0.0, True),
    ("extraction", 0.0, False),
    ("chat", 0.7, True),
    ("creative", 1.0, True),
    ("creative", 1.0, False),
]


def _serve_sims(time_scale: float, seed: int) -> None:
    """Child process: both simulators; prints their URLs as one JSON line; ends when stdin closes."""
    from specguard.sim import cluster

    async def main() -> None:
        async with (
            cluster.SimCluster.from_config(None, seed=seed, dialect="vllm", time_scale=time_scale) as direct,
            cluster.SimCluster.from_config(None, seed=seed, dialect="vllm", time_scale=time_scale) as behind,
        ):
            print(json.dumps([direct.urls, behind.urls, direct.config.model_name]), flush=True)
            await asyncio.to_thread(sys.stdin.read)  # the parent closes stdin (or dies): stop

    asyncio.run(main())


def start_sims(time_scale: float, seed: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve-sims",
            "--seed",
            str(seed),
            "--time-scale",
            str(time_scale),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def normalise(data: bytes) -> bytes:
    data = re.sub(rb'"id": ?"[^"]+"', b'"id":"X"', data)
    return re.sub(rb'"created": ?\d+', b'"created":0', data)


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Tally:
    requests: int = 0
    lost: int = 0
    altered: int = 0
    direct_failed: int = 0  # the simulator itself failed (not the tap's doing)
    examples: list[str] = field(default_factory=list)
    added: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, added s)


def config_text(urls: dict[str, str], tmp: Path, window: float = 30.0) -> str:
    k = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
    pools = "\n".join(
        f'  - {{name: {n}, url: "{u}", engine: vllm, num_speculative_tokens: {k[n]}}}'
        for n, u in urls.items()
    )
    return f"""pools:
{pools}
tap: {{listen: "127.0.0.1:0", window_seconds: {window:g}, holdout_share: 0, probe_share: 0,
      default_pool: spec-k4, nospec_pool: nospec}}
scrape: {{interval_seconds: 5, timeout_seconds: 2}}
guard: {{interval_seconds: 10, dry_run: true}}
server: {{insecure_loopback: true}}
actuators: {{plan_file: "{tmp / "plan.json"}", audit_log: "{tmp / "audit.jsonl"}"}}
"""


def start_tap(cfg_path: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specguard",
            "run",
            "--config",
            str(cfg_path),
            "--listen",
            f"127.0.0.1:{port}",
            # its own free port: the default (port + 1) may be another process's by now
            "--control-listen",
            f"127.0.0.1:{free_port()}",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"specguard run exited {proc.returncode}: {proc.stderr.read()}")
            try:
                async with session.get(url + "/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("specguard run did not become ready in 30 s")


async def one(session: aiohttp.ClientSession, url: str, path: str, body: dict, task: str):
    t0 = time.perf_counter()
    try:
        async with session.post(url + path, json=body, headers={"x-task-type": task}) as response:
            data = await response.read()
            return response.status, data, time.perf_counter() - t0
    except (aiohttp.ClientError, TimeoutError) as exc:
        return 0, type(exc).__name__.encode(), time.perf_counter() - t0


async def worker(
    index: int,
    deadline: float,
    start: float,
    direct: str,
    tap: str,
    model: str,
    tally: Tally,
    session: aiohttp.ClientSession,
    seed: int,
) -> None:
    rng = random.Random(f"{seed}/{index}")
    n = 0
    while time.monotonic() < deadline:
        n += 1
        task, temperature, chat = rng.choice(CLASSES)
        stream = rng.random() < 0.6
        body: dict = {"model": model, "max_tokens": rng.choice((8, 16, 32, 64)), "temperature": temperature}
        prompt = f"[soak {seed} worker {index} request {n}] {task} " + " ".join(
            rng.choice(("alpha", "bravo", "charlie", "delta", "echo")) for _ in range(rng.randint(4, 40))
        )
        if chat:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            path = "/v1/completions"
            body["prompt"] = prompt
        if stream:
            body["stream"] = True
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
        (ds, dd, dt), (ts, td, tt) = await asyncio.gather(
            one(session, direct, path, body, task), one(session, tap, path, body, task)
        )
        tally.requests += 1
        if ds != 200:
            tally.direct_failed += 1
            continue
        if ts != 200:
            tally.lost += 1
            if len(tally.examples) < 5:
                tally.examples.append(f"lost: tap {ts} {td[:200]!r}")
            continue
        if normalise(dd) != normalise(td):
            tally.altered += 1
            if len(tally.examples) < 5:
                tally.examples.append(f"altered: direct {dd[:300]!r} tap {td[:300]!r}")
            continue
        tally.added.append((time.monotonic() - start, tt - dt))


async def soak(
    seconds: float,
    concurrency: int,
    *,
    seed: int = 0,
    time_scale: float = 0.02,
    sample_every: float = 2.0,
    warmup: float | None = None,
) -> dict:
    """Run the soak; returns the figures (see the module docstring). Every process is stopped."""
    sims = start_sims(time_scale, seed)
    proc = None
    tmp = Path(tempfile.mkdtemp(prefix="specguard-soak-"))
    try:
        line = await asyncio.wait_for(asyncio.to_thread(sims.stdout.readline), 60)
        if not line:
            raise RuntimeError(f"the simulators did not start (exit {sims.wait(10)})")
        direct_urls, behind_urls, model = json.loads(line)
        cfg = tmp / "specguard.yaml"
        # a short statistics window, so the tap's memory reaches its steady state during warm-up
        window = max(2.0, min(30.0, seconds / 6))
        cfg.write_text(config_text(behind_urls, tmp, window))
        port = free_port()
        proc = start_tap(cfg, port)
        tap = f"http://127.0.0.1:{port}"
        await wait_ready(tap, proc)
        tally = Tally()
        rss: list[tuple[float, float]] = []
        start = time.monotonic()
        deadline = start + seconds
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def sampler() -> None:
                while time.monotonic() < deadline:
                    value = rss_mb(proc.pid)
                    if value is not None:
                        rss.append((time.monotonic() - start, value))
                    await asyncio.sleep(sample_every)

            jobs = [
                worker(i, deadline, start, direct_urls["spec-k4"], tap, model, tally, session, seed)
                for i in range(concurrency)
            ]
            await asyncio.wait_for(asyncio.gather(sampler(), *jobs), seconds + 180)
            async with session.get(tap + "/metrics") as response:
                metrics = await response.text()
        elapsed = time.monotonic() - start
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()
        sims.stdin.close()  # the simulators stop when their stdin closes
        try:
            sims.wait(20)
        except subprocess.TimeoutExpired:
            sims.kill()
            sims.wait(5)
        sims.stdout.close()
        shutil.rmtree(tmp, ignore_errors=True)
    warm = warmup if warmup is not None else min(45.0, seconds / 4)
    after = [v for t, v in rss if t >= warm]
    quarter = max(1, len(after) // 4)
    minutes = []
    span = 60.0 if seconds >= 120 else max(5.0, seconds / 4)
    edge = 0.0
    while edge < seconds:
        added = [a for t, a in tally.added if edge <= t < edge + span]
        if added:
            minutes.append(
                {
                    "from_s": edge,
                    "requests": len(added),
                    "added_p50_ms": round(percentile(added, 0.5) * 1000, 2),
                    "added_p99_ms": round(percentile(added, 0.99) * 1000, 2),
                }
            )
        edge += span
    tap_requests = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("specguard_requests_total{")
    )
    return {
        "seconds": round(elapsed, 1),
        "concurrency": concurrency,
        "requests": tally.requests,
        "requests_per_second": round(tally.requests / elapsed, 1),
        "lost": tally.lost,
        "altered": tally.altered,
        "direct_failed": tally.direct_failed,
        "examples": tally.examples,
        "tap_counted_requests": tap_requests,
        "window_seconds": window,
        "windows": minutes,
        "rss_mb": {
            "samples": len(rss),
            "start": round(rss[0][1], 1) if rss else None,
            "after_warmup": round(statistics.median(v for v in after[:quarter]), 1) if after else None,
            "end": round(statistics.median(v for v in after[-quarter:]), 1) if after else None,
            "max": round(max(v for _, v in rss), 1) if rss else None,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=3.0, help="soak duration (default 3)")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent request loops (default 64)")
    parser.add_argument("--time-scale", type=float, default=0.02, help="simulator speed (default 0.02)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--serve-sims", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_sims:
        _serve_sims(args.time_scale, args.seed)
        return 0
    if args.minutes <= 0 or args.concurrency < 1:
        parser.error("--minutes must be > 0 and --concurrency >= 1")
    result = asyncio.run(
        soak(args.minutes * 60, args.concurrency, seed=args.seed, time_scale=args.time_scale)
    )
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        r = result
        print(
            f"soak: {r['concurrency']} streams x {r['seconds'] / 60:.1f} min: {r['requests']} requests "
            f"({r['requests_per_second']}/s), lost {r['lost']}, altered {r['altered']}, "
            f"direct failures {r['direct_failed']}"
        )
        m = r["rss_mb"]
        print(
            f"tap RSS MB: start {m['start']}, after warm-up {m['after_warmup']}, end {m['end']}, "
            f"max {m['max']} ({m['samples']} samples)"
        )
        for w in r["windows"]:
            print(
                f"  from {w['from_s']:>5.0f} s: {w['requests']:>6} requests, added latency "
                f"p50 {w['added_p50_ms']} ms, p99 {w['added_p99_ms']} ms"
            )
        for example in r["examples"]:
            print("  " + example)
    return 0 if result["lost"] == 0 and result["altered"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
