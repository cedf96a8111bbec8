"""Fleet mode at 10, 50 and 100 replicas: what Prometheus and the decider cost.

One process serves N follower /metrics endpoints (fleet_targets.py: a real sidecar's page with
the default label cardinality, counters growing and RC gauges moving per replica). For each N a
fresh Debian Prometheus scrapes them with the shipped rules (deploy/prometheus/specguard-rules.yaml,
unchanged), and one decider (`specguard run` with the shipped deploy/kubernetes/base/guard.yaml:
`guard.local: false`, its PromQL rule on the RC recording rule) evaluates every class against it.
After a warm-up, over a measurement stretch it samples:

- series: Prometheus' head series (scraped + recorded), and per target;
- rule-group evaluation time: ``prometheus_rule_group_last_duration_seconds`` per group;
- the decider's PromQL latency per evaluation: ``specguard_last_evaluation_duration_seconds``
  (one evaluation = one PromQL query per class and speculative pool, 4 in flight);
- memory: Prometheus' ``process_resident_memory_bytes`` and the decider's VmRSS; Prometheus' CPU.

    flock /tmp/specguard-bench.lock python3 bench/bench_fleet.py [--sizes 10,50,100]
        [--scrape 15] [--warmup 300] [--measure 90] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fleet_targets  # noqa: E402  (the many-endpoint follower fleet)

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "specguard-rules.yaml"
DECIDER = ROOT / "deploy" / "kubernetes" / "base" / "guard.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def get_json(session: aiohttp.ClientSession, url: str, **params) -> dict:
    async with session.get(url, params=params) as response:
        return await response.json()


async def scalar(session: aiohttp.ClientSession, prom: str, expr: str) -> dict[str, float]:
    """An instant query: {label values joined: value}."""
    data = await get_json(session, f"{prom}/api/v1/query", query=expr)
    out = {}
    for row in data["data"]["result"]:
        key = ",".join(v for k, v in sorted(row["metric"].items()) if k != "__name__")
        out[key] = float(row["value"][1])
    return out


async def exported(session: aiohttp.ClientSession, url: str, name: str) -> dict[str, float]:
    """Samples of one family on ``url``/metrics: {label values joined: value}."""
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[",".join(v for _, v in sorted(s.labels.items()))] = s.value
    return out


async def page_value(session: aiohttp.ClientSession, url: str, name: str) -> float | None:
    values = await exported(session, url, name)
    return sum(values.values()) if values else None


async def wait_ready(session: aiohttp.ClientSession, url: str, proc: subprocess.Popen) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} never became ready")


def prometheus_config(targets: list[str], scrape: float, workdir: Path) -> Path:
    config = {
        "global": {"scrape_interval": f"{scrape:g}s", "evaluation_interval": f"{scrape:g}s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "specguard", "static_configs": [{"targets": targets}]}],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def decider_config(prom: str, workdir: Path, interval: float) -> Path:
    config = yaml.safe_load(DECIDER.read_text())
    config["scrape"] = {"interval_seconds": 3600, "timeout_seconds": 5}  # no engines here
    config["guard"]["interval_seconds"] = interval
    config["guard"]["prometheus"]["url"] = prom
    (workdir / "token").write_text("bench-token\n")
    config["server"] = {"token_file": str(workdir / "token")}  # control listener: the tap's port + 1
    acts = config["actuators"]
    for key in ("configmap", "leader_election"):
        acts.pop(key, None)
    acts.update(plan_file=str(workdir / "plan.json"), audit_log=str(workdir / "audit.jsonl"))
    path = workdir / "guard.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def one_size(page: str, size: int, args: argparse.Namespace) -> dict:
    targets = fleet_targets.Targets(page, size, seed=size)
    addresses = await targets.start()
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-fleet-{size}-"))
    prom_port, decider_port = free_port(), free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    decider = f"http://127.0.0.1:{decider_port}"
    procs: list[subprocess.Popen] = []
    try:
        binary = shutil.which("prometheus")
        procs.append(
            subprocess.Popen(
                [
                    binary,
                    f"--config.file={prometheus_config(addresses, args.scrape, workdir)}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        cfg = decider_config(prom, workdir, args.scrape)
        argv = [sys.executable, "-m", "specguard", "run", "--config", str(cfg), "--listen", decider[7:]]
        procs.append(subprocess.Popen([*argv, "--log-level", "error"], stderr=subprocess.DEVNULL))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await wait_ready(session, prom + "/-/ready", procs[0])
            await wait_ready(session, decider + "/healthz", procs[1])
            await asyncio.sleep(args.warmup)
            groups: dict[str, list[float]] = {}
            evaluations: list[float] = []
            cpu0, t0 = await page_value(session, prom, "process_cpu_seconds_total"), time.monotonic()
            while time.monotonic() - t0 < args.measure:
                durations = await exported(session, prom, "prometheus_rule_group_last_duration_seconds")
                for key, value in durations.items():
                    groups.setdefault(key.rsplit(";", 1)[-1], []).append(value)
                seconds = await page_value(session, decider, "specguard_last_evaluation_duration_seconds")
                if seconds is not None:
                    evaluations.append(seconds)
                await asyncio.sleep(args.scrape / 2)
            cpu1, t1 = await page_value(session, prom, "process_cpu_seconds_total"), time.monotonic()
            head = await page_value(session, prom, "prometheus_tsdb_head_series")
            recorded = await scalar(session, prom, 'count({__name__=~".+:.+"})')
            prom_rss = await page_value(session, prom, "process_resident_memory_bytes")
            up = await scalar(session, prom, 'sum(up{job="specguard"})')
            queries = await page_value(session, decider, "specguard_evaluations_total")
        return {
            "targets": size,
            "targets_up": int(next(iter(up.values()), 0)),
            "series_per_target": targets.series,
            "head_series": int(head or 0),
            "recorded_series": int(next(iter(recorded.values()), 0)),
            "rule_group_seconds": {
                name: {"mean": statistics.fmean(v), "max": max(v)} for name, v in sorted(groups.items())
            },
            "decider_evaluation_seconds": {
                "mean": statistics.fmean(evaluations) if evaluations else None,
                "max": max(evaluations) if evaluations else None,
                "samples": len(evaluations),
            },
            "decider_evaluations": queries,
            "prometheus_rss_mb": (prom_rss or 0) / 2**20,
            "prometheus_cpu_percent_of_one_core": 100 * ((cpu1 or 0) - (cpu0 or 0)) / (t1 - t0),
            "decider_rss_mb": rss_mb(procs[1].pid),
            "load_average_1m": os.getloadavg()[0],  # other work on the machine inflates wall times
        }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        await targets.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def main_async(args: argparse.Namespace) -> dict:
    page = await fleet_targets.template_page(requests=args.template_requests)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = [await one_size(page, size, args) for size in sizes]
    return {
        "scrape_interval_seconds": args.scrape,
        "warmup_seconds": args.warmup,
        "measure_seconds": args.measure,
        "rows": rows,
    }


def print_table(result: dict) -> None:
    print(
        f"scrape and rule interval {result['scrape_interval_seconds']:g} s, "
        f"measured {result['measure_seconds']:g} s after {result['warmup_seconds']:g} s"
    )
    print(
        "| targets | series (per target) | recorded | specguard.rules eval ms (max) | alerts eval ms (max) "
        "| decider eval ms (max) | Prometheus RSS MB | Prometheus CPU % | decider RSS MB | load avg |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        g = r["rule_group_seconds"]
        rules = next((v for k, v in g.items() if k.endswith("specguard.rules")), {"mean": 0, "max": 0})
        alerts = next((v for k, v in g.items() if k.endswith("specguard.alerts")), {"mean": 0, "max": 0})
        d = r["decider_evaluation_seconds"]
        print(
            f"| {r['targets']} ({r['targets_up']} up) | {r['head_series']} ({r['series_per_target']}) "
            f"| {r['recorded_series']} | {1000 * rules['mean']:.1f} ({1000 * rules['max']:.1f}) "
            f"| {1000 * alerts['mean']:.1f} ({1000 * alerts['max']:.1f}) "
            f"| {1000 * (d['mean'] or 0):.0f} ({1000 * (d['max'] or 0):.0f}) "
            f"| {r['prometheus_rss_mb']:.0f} | {r['prometheus_cpu_percent_of_one_core']:.1f} "
            f"| {r['decider_rss_mb']:.0f} | {r['load_average_1m']:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,50,100", help="follower targets per run")
    parser.add_argument("--scrape", type=float, default=15.0, help="scrape and rule evaluation interval, s")
    parser.add_argument("--warmup", type=float, default=300.0, help="seconds before measuring (rate5m full)")
    parser.add_argument("--measure", type=float, default=90.0)
    parser.add_argument("--template-requests", type=int, default=1200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
