"""Proxied latency under hostile input, as a ratio to a quiet run (docs/reliability.md#hostile-input).

Three processes on loopback: an engine (20 ms per answer; its /metrics page can be switched to one
with a 10 MB label value), ``specguard run`` (tap + guard, scraping every second and evaluating
every 2 s, so the hostile work happens many times during each run) and this load generator.
Runs alternate quiet / attack so drift in the machine's load hits both alike:

- ``alerts``: 2,000 distinct firing alerts about configured classes pushed to /api/v1/alerts
  (with the token) before the run; the guard evaluates over them every 2 s meanwhile; after the
  run they are resolved (TTL 0), so the quiet runs have none stored;
- ``label``: the engine's page carries a 10 MB label value; the tap scrapes it every second;
- ``json``: JSON amplification: 12 clients in a process of their own keep posting a 3.9 MB body of
  1.3 million ``{}`` to /v1/chat/completions, each uploading at about 2.6 MB/s (256 KiB every
  100 ms, staggered so the bodies end one after another) and starting the next body at once, so
  12 such bodies are in flight throughout the run (8 end every second; run it with enough
  ``--requests`` that a run lasts several seconds);
- ``engine5xx``: the planned pool (spec-k4) answers every request with a 500; the tap ejects it
  (``tap.eject_consecutive_5xx``) and the no-spec pool serves its traffic; the requests that got
  the 500s before the ejection are counted (``engine5xx_failed``), the p99 is over the rest.

Each attack run's p99 (and p50) is divided by the mean of the quiet runs around it; the tap's peak
resident memory (``VmHWM``) covers the whole run, the amplification runs included.

    python3 bench/bench_hostile.py [--rounds 3] [--requests 400] [--concurrency 8] [--json]
    python3 bench/bench_hostile.py --tree /path/to/other/checkout --attacks alerts   # another version
    python3 bench/bench_hostile.py --render bench/results/hostile.json   # the docs' table
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
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-hostile-token"
DELAY = 0.02
LABEL_MB = 10
ATTACKS = ("alerts", "label", "json", "engine5xx")
AMPLIFIERS = 12  # JSON amplification bodies in flight at once
AMPLIFIER_OBJECTS = 1_300_000
TARGET_RATIO = 1.5
EJECT = ", eject_seconds: 1, eject_max_seconds: 1"  # re-admitted before each quiet run (not with --tree)
TARGET_RSS_MB = 512


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------ the engine (its own process)
def _engine_main(port: int, nospec_port: int) -> None:
    fixture = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu-ngram-k4.metrics.txt"
    normal = fixture.read_bytes()
    label = normal + b'vllm:num_requests_running{model_name="' + b"x" * (LABEL_MB << 20) + b'"} 1\n'
    state = {"page": normal, "fail": False}

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(DELAY)
        if state["fail"] and request.url.port == port:  # (the no-spec pool always answers)
            return web.json_response({"error": {"message": "internal error"}}, status=500)
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
        state["fail"] = request.query.get("fail") == "1"
        return web.Response(text="ok")

    async def serve() -> None:
        app = web.Application(client_max_size=8 << 20)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/control", switch)
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for where in (port, nospec_port):
            await web.TCPSite(runner, "127.0.0.1", where).start()
        await asyncio.Event().wait()

    asyncio.run(serve())


# ------------------------------------------------------------------ JSON amplification (its own process)
def _amplifier_main(url: str, stop: Any, sent: Any, refused: Any) -> None:
    body = (
        b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "pad": ['
        + b"{}," * (AMPLIFIER_OBJECTS - 1)
        + b"{}]}"
    )

    async def paced():  # 256 KiB every 100 ms: ~2.6 MB/s per client, 1.5 s per body
        view = memoryview(body)
        for start in range(0, len(view), 1 << 18):
            yield bytes(view[start : start + (1 << 18)])
            await asyncio.sleep(0.1)

    async def worker(session: aiohttp.ClientSession, index: int) -> None:
        await asyncio.sleep(index * 1.5 / AMPLIFIERS)  # staggered: the bodies end one after another
        while not stop.is_set():
            try:
                async with session.post(url + "/v1/chat/completions", data=paced()) as response:
                    await response.read()
                    with sent.get_lock():
                        sent.value += 1
                    if response.status == 413:
                        with refused.get_lock():
                            refused.value += 1
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)

    async def run() -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(worker(session, i) for i in range(AMPLIFIERS)))

    asyncio.run(run())


# ------------------------------------------------------------------ load
async def load(url: str, requests: int, concurrency: int, failed: list[int] | None = None) -> list[float]:
    """Seconds per successful request; with ``failed``, non-200 answers are counted there."""
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
                    if response.status != 200 and failed is not None:
                        failed.append(response.status)
                        continue
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


async def _wait_up(url: str) -> None:
    """Until the specguard at ``url`` answers /healthz 200 (60 s at most)."""
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(url + "/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"specguard run at {url} did not come up (see its log)")


async def bench(args: argparse.Namespace, tap_url: str, engine_url: str, tap_pid: int) -> dict:
    await _wait_up(tap_url)
    async with aiohttp.ClientSession() as session:

        async def page(kind: str, fail: bool = False) -> None:
            async with session.post(engine_url + f"/control?page={kind}&fail={int(fail)}") as response:
                await response.read()

        await load(tap_url, 80, args.concurrency)  # warm-up
        runs: dict[str, list[dict]] = {"quiet": [], **{kind: [] for kind in ATTACKS}}
        extra: dict = {"engine5xx_failed": 0, "json_bodies_sent": 0}
        order = ["quiet", "alerts", "quiet", "label", "quiet", "json", "quiet", "engine5xx"]
        for _ in range(args.rounds):
            for kind in order:
                if kind != "quiet" and kind not in args.attacks:
                    continue
                if kind == "alerts":
                    extra.update(await push_alerts(await control_of(tap_url), 2000))
                await page("label" if kind == "label" else "normal", fail=kind == "engine5xx")
                if kind == "label":
                    await asyncio.sleep(1.5)  # at least one scrape of the hostile page first
                amplifier = None
                if kind == "json":
                    spawn = mp.get_context("spawn")
                    stop, sent, refused = spawn.Event(), spawn.Value("i", 0), spawn.Value("i", 0)
                    amplifier = spawn.Process(
                        target=_amplifier_main, args=(tap_url, stop, sent, refused), daemon=True
                    )
                    amplifier.start()
                    while sent.value < AMPLIFIERS:  # every attacker's body went through once: in flight
                        await asyncio.sleep(0.1)
                failed: list[int] = []
                timings = await load(tap_url, args.requests, args.concurrency, failed)
                if amplifier is not None:
                    stop.set()
                    amplifier.join(30)
                    extra["json_bodies_sent"] += sent.value
                    extra["json_bodies_413"] = extra.get("json_bodies_413", 0) + refused.value
                if kind == "engine5xx":
                    extra["engine5xx_failed"] += len(failed)
                    await page("normal")
                    await asyncio.sleep(1.2)  # past tap.eject_seconds: re-admitted for the quiet run
                elif failed:
                    raise RuntimeError(f"{kind}: {len(failed)} requests failed: {sorted(set(failed))}")
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
        extra["ejections"] = await metric(tap_url, "specguard_pool_ejections_total")
        extra["failovers"] = await metric(tap_url, "specguard_failover_requests_total")
    quiet_p99 = statistics.mean(r["p99"] for r in runs["quiet"])
    quiet_p50 = statistics.mean(r["p50"] for r in runs["quiet"])
    result = {
        "quiet_p50_ms": quiet_p50 * 1000,
        "quiet_p99_ms": quiet_p99 * 1000,
        "tap_peak_rss_mb": tap_rss(tap_pid),
        **extra,
    }
    result["attacks"] = list(args.attacks)
    for kind in args.attacks:
        p99 = statistics.mean(r["p99"] for r in runs[kind])
        p50 = statistics.mean(r["p50"] for r in runs[kind])
        result[f"{kind}_p99_ms"] = p99 * 1000
        result[f"{kind}_p99_ratio"] = p99 / quiet_p99
        result[f"{kind}_p50_ratio"] = p50 / quiet_p50
    return result


LABELS = {
    "alerts": "2,000 distinct firing alerts stored, evaluated every 2 s",
    "label": "the engine's page carries a 10 MB label value, scraped every second",
    "json": f"{AMPLIFIERS} bodies of 1.3 million `{{}}` (3.9 MB, each sent at 2.6 MB/s) in flight throughout",
    "engine5xx": "the planned pool answers every request with a 500",
}


def render(result: dict) -> str:
    """The docs' table of one ``--json`` result (docs/reliability.md carries it as is)."""
    rows = [
        "| attack | p99 | ratio to quiet: p99 (p50) | target |",
        "|---|---|---|---|",
        f"| quiet | {result['quiet_p99_ms']:.1f} ms | — | — |",
    ]
    for kind in result.get("attacks", []):
        ratio = result[f"{kind}_p99_ratio"]
        met = "met" if ratio <= TARGET_RATIO else "**missed**"
        rows.append(
            f"| {LABELS[kind]} | {result[f'{kind}_p99_ms']:.1f} ms | **{ratio:.2f}×** "
            f"({result[f'{kind}_p50_ratio']:.2f}×) | ≤ {TARGET_RATIO}×: {met} |"
        )
    rss = result["tap_peak_rss_mb"]
    met = "met" if rss <= TARGET_RSS_MB else "**missed**"
    rows.append(
        f"| the tap's peak resident memory, whole run | {rss:.0f} MB | — | ≤ {TARGET_RSS_MB} MB: {met} |"
    )
    notes = []
    if "engine5xx" in result.get("attacks", []):
        notes.append(
            f"{result['engine5xx_failed']} requests of the engine5xx runs got the engine's 500 before "
            f"the pool was ejected ({_sum(result.get('ejections', []))} ejections in all)"
        )
    if "json" in result.get("attacks", []):
        sent, refused = result["json_bodies_sent"], result.get("json_bodies_413", 0)
        notes.append(f"{sent} amplification bodies were answered during the json runs, {refused} of them 413")
    return "\n".join(rows) + ("\n\n" + "; ".join(notes) + "." if notes else "")


def _sum(lines: list[str]) -> int:
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in lines))


# ------------------------------------------------------------------ state and limits (--suite state)
BOOK = 10_000
"""Alerts stored before the alert-book attack: ``alertmanager.max_alerts``, the default cap."""
CLASSES_AT_CAP = 41
"""Task types of the many-classes attack: with ``other``, 4 temperature and 3 load buckets and two
pools, 42 x 4 x 3 x 2 = 1,008 combinations, the most the default ``classes.max_combinations`` admits."""


def _tap_config(tmp: Path, engine_port: int, tap_port: int, extra: str = "", server: str = "") -> Path:
    cfg = tmp / f"specguard-{tap_port}.yaml"
    cfg.write_text(
        f'pools: [{{name: spec-k4, url: "http://127.0.0.1:{engine_port}", engine: vllm, '
        "num_speculative_tokens: 4},\n"
        f'        {{name: nospec, url: "http://127.0.0.1:{engine_port}", engine: vllm, '
        "num_speculative_tokens: 0}]\n"
        f'tap: {{listen: "127.0.0.1:{tap_port}", default_pool: spec-k4}}\n'
        "scrape: {interval_seconds: 1, timeout_seconds: 1}\n"
        "guard: {interval_seconds: 2}\n"
        f'server: {{token_file: "{tmp / "token"}"{server}}}\n'
        f'actuators: {{plan_file: "{tmp / f"plan-{tap_port}.json"}", '
        f'audit_log: "{tmp / f"audit-{tap_port}.jsonl"}"}}\n' + extra
    )
    return cfg


async def _webhook_flood(url: str, stop: asyncio.Event, clients: int = 8) -> dict:
    """``clients`` senders posting one new firing alert each, back to back, into a full book."""
    counts = {"sent": 0, "ok": 0, "refused": 0}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:

        async def sender(n: int) -> None:
            i = 0
            while not stop.is_set():
                alert = {
                    "status": "firing",
                    "labels": {
                        "alertname": f"Flood{n}-{i}",
                        "task_type": "chat",
                        "temperature_bucket": "low",
                    },
                    "fingerprint": f"flood-{n}-{i:08d}",
                    "startsAt": "2026-01-01T00:00:00Z",
                }
                async with session.post(
                    url + "/api/v1/alerts", json={"version": "4", "alerts": [alert]}
                ) as r:
                    await r.read()
                    counts["sent"] += 1
                    counts["ok" if r.status == 200 else "refused"] += 1
                i += 1

        await asyncio.gather(*(sender(n) for n in range(clients)))
    return counts


async def _scrape_metrics(url: str, stop: asyncio.Event, every: float) -> dict:
    """Prometheus at ``every`` seconds: the page's size and render time as the scraper sees them."""
    seen = {"scrapes": 0, "bytes": 0, "seconds_max": 0.0, "status": []}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        while not stop.is_set():
            started = time.perf_counter()
            async with session.get(url + "/metrics") as response:
                body = await response.read()
                seen["status"] = sorted({*seen["status"], response.status})
            seen["scrapes"] += 1
            seen["bytes"] = len(body)
            seen["seconds_max"] = max(seen["seconds_max"], time.perf_counter() - started)
            await asyncio.sleep(every)
    return seen


async def _attack_runs(args: argparse.Namespace, url: str, attack, rounds: int) -> tuple[dict, dict]:
    """Alternating quiet / attack runs on one tap: (p99 and p50 of each kind, the attack's report)."""
    await load(url, 80, args.concurrency)  # warm-up
    runs: dict[str, list[dict]] = {"quiet": [], "attack": []}
    report: dict = {}
    for _ in range(rounds):
        for kind in ("quiet", "attack"):
            stop = asyncio.Event()
            task = asyncio.create_task(attack(url, stop)) if kind == "attack" else None
            timings = await load(url, args.requests, args.concurrency)
            stop.set()
            if task is not None:
                report = await task
            runs[kind].append({"p50": quantile(timings, 0.5), "p99": quantile(timings, 0.99)})
    summary = {
        kind: {q: statistics.mean(r[q] for r in rs) for q in ("p50", "p99")} for kind, rs in runs.items()
    }
    return summary, report


async def alert_book_attack(args: argparse.Namespace, url: str) -> dict:
    """Webhooks against a full alert book (10,000 stored) while normal traffic runs."""
    control = await control_of(url)  # the alerts endpoint's listener
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        for start in range(0, BOOK, 1000):
            alerts = [
                {
                    "status": "firing",
                    "labels": {"alertname": f"Book{i}", "task_type": "chat", "temperature_bucket": "low"},
                    "fingerprint": f"book-{i:06d}",
                    "startsAt": "2026-01-01T00:00:00Z",
                }
                for i in range(start, start + 1000)
            ]
            async with session.post(control + "/api/v1/alerts", json={"version": "4", "alerts": alerts}) as r:
                assert r.status == 200, await r.text()
    flood = lambda _tap, stop: _webhook_flood(control, stop)  # noqa: E731
    summary, flood = await _attack_runs(args, url, flood, args.rounds)
    return {"stored": BOOK, "webhooks": flood, **_ratios(summary)}


async def many_classes_attack(args: argparse.Namespace, url: str) -> dict:
    """/metrics of a config at the class cap, scraped every 2 s while normal traffic runs."""
    # one request per task type and temperature bucket: those classes have series (a label set is
    # exported from its first request on)
    async with aiohttp.ClientSession() as session:
        for i in range(CLASSES_AT_CAP):
            for temperature in (0.0, 0.3, 0.7, 1.0):
                headers = {"x-task-type": f"t{i}"}
                body = {"model": "m", "temperature": temperature}
                async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                    await r.read()
    summary, scrapes = await _attack_runs(
        args, url, lambda u, stop: _scrape_metrics(u, stop, 2.0), args.rounds
    )
    return {"task_types": CLASSES_AT_CAP, "metrics": scrapes, **_ratios(summary)}


def _ratios(summary: dict) -> dict:
    quiet, attack = summary["quiet"], summary["attack"]
    return {
        "quiet_p99_ms": quiet["p99"] * 1000,
        "attack_p99_ms": attack["p99"] * 1000,
        "p99_ratio": attack["p99"] / quiet["p99"],
        "p50_ratio": attack["p50"] / quiet["p50"],
    }


def state_suite(args: argparse.Namespace, engine_port: int) -> dict:
    """The alert-book and many-classes attacks, each on its own ``specguard run``."""
    result: dict = {"load_average_at_start": round(os.getloadavg()[0], 1)}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "token").write_text(TOKEN + "\n")
        types = ", ".join(f"t{i}" for i in range(CLASSES_AT_CAP))
        # the alert book's writes are what is measured: every webhook is let in (the rate limit,
        # 1 a second with a burst of 30 by default, would refuse nearly all of the flood)
        unlimited = ", alerts_per_second: 10000, alerts_burst: 10000"
        suites = {
            "alert_book": ("", unlimited, alert_book_attack),
            "many_classes": (f"classes: {{task_types: [{types}]}}\n", "", many_classes_attack),
        }
        for name, (extra, server, attack) in suites.items():
            port = free_port()
            cfg = _tap_config(tmp, engine_port, port, extra, server)
            env = {**os.environ, "PYTHONPATH": str(args.tree)}
            command = [
                sys.executable,
                "-m",
                "specguard",
                "run",
                "--config",
                str(cfg),
                "--log-level",
                "warning",
            ]
            tap = subprocess.Popen(command, env=env, cwd=args.tree, stderr=subprocess.PIPE, text=True)
            try:

                async def run(url: str = f"http://127.0.0.1:{port}", attack=attack) -> dict:
                    await _wait_up(url)
                    return await attack(args, url)

                result[name] = asyncio.run(run())
                result[name]["tap_peak_rss_mb"] = tap_rss(tap.pid)
            finally:
                tap.terminate()
                _, log = tap.communicate(timeout=60)
            result[name]["tracebacks_in_log"] = log.count("Traceback")
    result["load_average_at_end"] = round(os.getloadavg()[0], 1)
    return result


def render_state(result: dict) -> str:
    """The docs' table of the state-and-limits attacks (docs/reliability.md carries it as is)."""
    book, classes = result["alert_book"], result["many_classes"]
    hooks, page = book["webhooks"], classes["metrics"]
    rows = [
        "| attack | quiet p99 | under attack: p99, ratio to quiet (p99 / p50) |",
        "|---|---|---|",
        f"| webhooks into a full alert book ({book['stored']:,} stored; {hooks['sent']:,} webhooks, "
        f"{hooks['ok']:,} answered 200) | {book['quiet_p99_ms']:.1f} ms | {book['attack_p99_ms']:.1f} ms, "
        f"**{book['p99_ratio']:.2f}×** / {book['p50_ratio']:.2f}× |",
        f"| /metrics at the class cap ({classes['task_types']} task types; "
        f"a {page['bytes'] / 1e6:.1f} MB page, "
        f"scraped every 2 s, {page['seconds_max']:.2f} s at most) | {classes['quiet_p99_ms']:.1f} ms | "
        f"{classes['attack_p99_ms']:.1f} ms, **{classes['p99_ratio']:.2f}×** / {classes['p50_ratio']:.2f}× |",
    ]
    met = all(part["p99_ratio"] <= 1.5 for part in (book, classes))
    start, end = result["load_average_at_start"], result["load_average_at_end"]
    load = f"load average {start:.1f} at the start, {end:.1f} at the end"
    verdict = "**met**" if met else "**not met** in this run"
    return "\n".join(rows) + f"\n\nTarget: p99 ≤ 1.5× quiet: {verdict} (2 cores, {load}).\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose specguard runs")
    parser.add_argument(
        "--attacks",
        nargs="+",
        choices=ATTACKS,
        default=list(ATTACKS),
        help="which attacks to run (an old version may not survive a 10 MB label: 1.7 GB per scrape)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--suite",
        choices=("hostile", "state"),
        default="hostile",
        help="state: the alert-book and many-classes attacks (bench/results/hostile-state.json)",
    )
    parser.add_argument("--render", type=Path, help="print the docs' markdown for a kept --json result")
    args = parser.parse_args()
    if args.render is not None:
        kept = json.loads(args.render.read_text())
        print(render_state(kept) if "alert_book" in kept else render(kept) + "\n", end="")
        return 0
    engine_port, nospec_port, tap_port = free_port(), free_port(), free_port()
    engine = mp.get_context("spawn").Process(
        target=_engine_main, args=(engine_port, nospec_port), daemon=True
    )
    engine.start()
    if args.suite == "state":
        try:
            result = state_suite(args, engine_port)
        finally:
            engine.terminate()
        print(json.dumps(result, indent=2) if args.json else render_state(result))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "token").write_text(TOKEN + "\n")
        cfg = Path(tmp) / "specguard.yaml"
        cfg.write_text(
            f'pools: [{{name: spec-k4, url: "http://127.0.0.1:{engine_port}", engine: vllm, '
            "num_speculative_tokens: 4},\n"
            f'  {{name: nospec, url: "http://127.0.0.1:{nospec_port}", engine: vllm}}]\n'
            f'tap: {{listen: "127.0.0.1:{tap_port}", default_pool: spec-k4, holdout_share: 0, '
            f"probe_share: 0{EJECT if args.tree == ROOT else ''}}}\n"
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
