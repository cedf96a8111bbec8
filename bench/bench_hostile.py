"""Proxied latency under hostile input, as a ratio to a quiet run (docs/reliability.md#hostile-input).

Three processes on loopback: an engine (20 ms per answer; its /metrics page can be switched to one
with a 10 MB label value), ``specguard run`` (tap + guard, scraping every second and evaluating
every 2 s, so the hostile work happens many times during each run) and this load generator.
Runs alternate quiet / attack so drift in the machine's load hits both alike:

- ``alerts``: 2,000 distinct firing alerts about configured classes pushed to /api/v1/alerts
  (with the token) before the run; the guard evaluates over them every 2 s meanwhile; after the
  run they are resolved (TTL 0), so the quiet runs have none stored;
- ``label``: the engine's page carries a 10 MB label value; the tap scrapes it every second.

Each attack run's p99 (and p50) is divided by the mean of the quiet runs around it.

    python3 bench/bench_hostile.py [--rounds 3] [--requests 400] [--concurrency 8] [--json]
    python3 bench/bench_hostile.py --tree /path/to/other/checkout --attacks alerts   # another version
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-hostile-token"
DELAY = 0.02
LABEL_MB = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------ the engine (its own process)
def _engine_main(port: int) -> None:
    fixture = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu-ngram-k4.metrics.txt"
    normal = fixture.read_bytes()
    label = normal + b'vllm:num_requests_running{model_name="' + b"x" * (LABEL_MB << 20) + b'"} 1\n'
    state = {"page": normal}

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(DELAY)
        return web.json_response({"choices": [{"index": 0, "message": {"content": "ok"}}]})

    async def metrics(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        page = memoryview(state["page"])
        try:
            for start in range(0, len(page), 1 << 18):
                await response.write(page[start : start + (1 << 18)])
            await response.write_eof()
        except ConnectionError:
            pass
        return response

    async def switch(request: web.Request) -> web.Response:
        state["page"] = label if request.query.get("page") == "label" else normal
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/control", switch)
    app.router.add_route("*", "/{tail:.*}", answer)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# ------------------------------------------------------------------ load
async def load(url: str, requests: int, concurrency: int) -> list[float]:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    ).encode()
    timings: list[float] = []
    headers = {"Content-Type": "application/json", "x-task-type": "chat"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def worker(count: int) -> None:
            for _ in range(count):
                start = time.perf_counter()
                async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as response:
                    await response.read()
                    assert response.status == 200, response.status
                timings.append(time.perf_counter() - start)

        await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
    return timings


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def push_alerts(url: str, count: int, status: str = "firing") -> dict:
    alerts = [
        {
            "status": status,
            "labels": {
                "alertname": f"Bench{i}",
                "task_type": task,
                "temperature_bucket": "low",
                "load_bucket": "low",
            },
            "fingerprint": f"bench-{i:06d}",
            "startsAt": "2026-01-01T00:00:00Z",
        }
        for i, task in zip(range(count), ["code", "chat", "extraction", "creative"] * count, strict=False)
    ]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        for start in range(0, count, 500):
            payload = {"version": "4", "status": status, "alerts": alerts[start : start + 500]}
            async with session.post(url + "/api/v1/alerts", json=payload) as response:
                assert response.status == 200, await response.text()
        async with session.get(url + "/status") as response:
            status = await response.json()
    return {"stored": status.get("alerts_total", len(status.get("alerts", [])))}


async def control_of(tap_url: str) -> str:
    """The tree's control listener (/status, /api/v1/*): the tap's port + 1 by default; a tree
    without one serves them on the tap."""
    base, port = tap_url.rsplit(":", 1)
    control = f"{base}:{int(port) + 1}"
    try:
        async with aiohttp.ClientSession() as session, session.get(control + "/status") as response:
            await response.read()
    except aiohttp.ClientConnectionError:
        return tap_url
    return control


async def stored_after_expiry(url: str) -> int:
    """Alerts still stored once an evaluation has expired the resolved ones (polls /status)."""
    stored = -1
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        for _ in range(40):
            await asyncio.sleep(0.5)
            async with session.get(url + "/status") as response:
                status = await response.json()
            stored = status.get("alerts_total", len(status.get("alerts", [])))
            if stored == 0:
                break
    return stored


async def metric(url: str, name: str) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/metrics") as response:
            text = await response.text()
    return [line for line in text.splitlines() if line.startswith(name)]


def tap_rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def bench(args: argparse.Namespace, tap_url: str, engine_url: str, tap_pid: int) -> dict:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):  # wait for the tap
            try:
                async with session.get(tap_url + "/healthz") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)

        async def page(kind: str) -> None:
            async with session.post(engine_url + f"/control?page={kind}") as response:
                await response.read()

        await load(tap_url, 80, args.concurrency)  # warm-up
        runs: dict[str, list[dict]] = {"quiet": [], "alerts": [], "label": []}
        extra: dict = {}
        for _ in range(args.rounds):
            for kind in ("quiet", "alerts", "quiet", "label"):
                if kind != "quiet" and kind not in args.attacks:
                    continue
                if kind == "alerts":
                    extra.update(await push_alerts(await control_of(tap_url), 2000))
                await page("label" if kind == "label" else "normal")
                if kind == "label":
                    await asyncio.sleep(1.5)  # at least one scrape of the hostile page first
                timings = await load(tap_url, args.requests, args.concurrency)
                runs[kind].append({"p50": quantile(timings, 0.5), "p99": quantile(timings, 0.99)})
                if kind == "alerts":  # resolved with a TTL of 0: gone at the next evaluation
                    control = await control_of(tap_url)
                    await push_alerts(control, 2000, "resolved")
                    extra["stored_in_quiet_runs"] = await stored_after_expiry(control)
        if "label" in args.attacks:
            await page("label")
            await asyncio.sleep(1.5)
        extra["engine_up_during_label"] = await metric(tap_url, "specguard_engine_up")
        extra["rejected"] = await metric(tap_url, "specguard_scrape_rejected_total")
        extra["evaluations"] = await metric(tap_url, "specguard_evaluations_total")
    quiet_p99 = statistics.mean(r["p99"] for r in runs["quiet"])
    quiet_p50 = statistics.mean(r["p50"] for r in runs["quiet"])
    result = {
        "quiet_p50_ms": quiet_p50 * 1000,
        "quiet_p99_ms": quiet_p99 * 1000,
        "tap_peak_rss_mb": tap_rss(tap_pid),
        **extra,
    }
    for kind in args.attacks:
        p99 = statistics.mean(r["p99"] for r in runs[kind])
        p50 = statistics.mean(r["p50"] for r in runs[kind])
        result[f"{kind}_p99_ms"] = p99 * 1000
        result[f"{kind}_p99_ratio"] = p99 / quiet_p99
        result[f"{kind}_p50_ratio"] = p50 / quiet_p50
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose specguard runs")
    parser.add_argument(
        "--attacks",
        nargs="+",
        choices=("alerts", "label"),
        default=["alerts", "label"],
        help="which attacks to run (an old version may not survive a 10 MB label: 1.7 GB per scrape)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    engine_port, tap_port = free_port(), free_port()
    engine = mp.get_context("spawn").Process(target=_engine_main, args=(engine_port,), daemon=True)
    engine.start()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "token").write_text(TOKEN + "\n")
        cfg = Path(tmp) / "specguard.yaml"
        cfg.write_text(
            f'pools: [{{name: spec-k4, url: "http://127.0.0.1:{engine_port}", engine: vllm, '
            "num_speculative_tokens: 4}]\n"
            f'tap: {{listen: "127.0.0.1:{tap_port}"}}\n'
            "scrape: {interval_seconds: 1, timeout_seconds: 1}\n"
            "guard: {interval_seconds: 2, alerts: {resolved_ttl_seconds: 0}}\n"
            f'server: {{token_file: "{Path(tmp) / "token"}"}}\n'
            f'actuators: {{plan_file: "{Path(tmp) / "plan.json"}", '
            f'audit_log: "{Path(tmp) / "audit.jsonl"}"}}\n'
        )
        env = {**os.environ, "PYTHONPATH": str(args.tree)}
        tap = subprocess.Popen(
            [sys.executable, "-m", "specguard", "run", "--config", str(cfg), "--log-level", "warning"],
            env=env,
            cwd=args.tree,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            result = asyncio.run(
                bench(args, f"http://127.0.0.1:{tap_port}", f"http://127.0.0.1:{engine_port}", tap.pid)
            )
        finally:
            tap.terminate()
            _, log = tap.communicate(timeout=30)
            engine.terminate()
    result["tree"] = str(args.tree)
    result["tracebacks_in_log"] = log.count("Traceback")
    result["rejections_logged"] = len(re.findall(r"page rejected", log))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:28} {value:.3f}" if isinstance(value, float) else f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
