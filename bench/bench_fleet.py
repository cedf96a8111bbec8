"""Fleet mode at 10, 100 and 300 replicas: what Prometheus and the decider cost, against earlier code.

One process serves N follower /metrics endpoints (fleet_targets.py: a real sidecar's page with
the shipped sidecar config after traffic through every class, counters growing and RC gauges
moving per replica). For each N a fresh Debian Prometheus scrapes them with the shipped rules
(deploy/prometheus/specguard-rules.yaml, unchanged), and one decider (`specguard run` with the
shipped deploy/kubernetes/base/guard.yaml: `guard.local: false`, its PromQL rule on the RC
recording rule) evaluates every class against it; Prometheus scrapes the decider too, as a job of
its own (the plan's cells are on its page). After a warm-up, over a measurement stretch it
samples:

- series: Prometheus' head series (scraped + recorded), and per target;
- rule-group evaluation time: ``prometheus_rule_group_last_duration_seconds`` per group;
- the decider's PromQL latency per evaluation: ``specguard_last_evaluation_duration_seconds``
  (one evaluation = one PromQL query per class and speculative pool, 4 in flight);
- memory: Prometheus' ``process_resident_memory_bytes`` and the decider's VmRSS; Prometheus' CPU.

``--baseline NAME=DIR`` measures another checkout the same way in the same run, size by size
right after this code (its follower page, its rules and its decider, imported from DIR), so the
two are compared on the same machine at the same time. The rendered result gives each code's
rows, this code's figures as a share of each baseline's, the linear growth per follower with the
figures it predicts at 1,000, and the evaluation interval each fleet size needs.

    flock /tmp/specguard-bench.lock python3 bench/bench_fleet.py [--sizes 10,100,300]
        [--scrape 15] [--warmup 300] [--measure 90] [--baseline NAME=DIR ...] [--json]
    python3 bench/bench_fleet.py --render bench/results/fleet.json
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
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fleet_targets  # noqa: E402  (the many-endpoint follower fleet)

ROOT = Path(__file__).resolve().parents[1]
RULES = Path("deploy") / "prometheus" / "specguard-rules.yaml"
DECIDER = Path("deploy") / "kubernetes" / "base" / "guard.yaml"
INTERVALS = (15, 30, 60, 120)  # the evaluation intervals the sizing table chooses from, s
HEADROOM = 0.5  # the worst evaluation may take at most this share of the interval
PREDICT_AT = 1000  # followers, extrapolated from the measured growth


@dataclass(frozen=True)
class Code:
    """One checkout under test: its follower page, rules and decider all come from ``root``."""

    name: str
    root: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.root)}

    @property
    def commit(self) -> str:
        done = subprocess.run(
            ["git", "-C", str(self.root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        return done.stdout.strip() or "unknown"

    def template_page(self, requests: int) -> str:
        """The follower page, made by this checkout's own specguard in a process of its own."""
        argv = [sys.executable, __file__, "--template", "--template-requests", str(requests)]
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: the template page failed:\n{done.stderr[-2000:]}")
        return done.stdout


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


def prometheus_config(code: Code, targets: list[str], decider: str, scrape: float, workdir: Path) -> Path:
    """The followers as job ``specguard`` and the decider as its own job (its plan, its state)."""
    config = {
        "global": {"scrape_interval": f"{scrape:g}s", "evaluation_interval": f"{scrape:g}s"},
        "rule_files": [str(code.root / RULES)],
        "scrape_configs": [
            {"job_name": "specguard", "static_configs": [{"targets": targets}]},
            {"job_name": "specguard-guard", "static_configs": [{"targets": [decider]}]},
        ],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def decider_config(code: Code, prom: str, workdir: Path, interval: float) -> Path:
    config = yaml.safe_load((code.root / DECIDER).read_text())
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


async def one_size(code: Code, page: str, size: int, args: argparse.Namespace) -> dict:
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
                    f"--config.file={prometheus_config(code, addresses, decider[7:], args.scrape, workdir)}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        cfg = decider_config(code, prom, workdir, args.scrape)
        argv = [sys.executable, "-m", "specguard", "run", "--config", str(cfg), "--listen", decider[7:]]
        argv += ["--log-level", "error"]
        # cwd: not a checkout, so `-m specguard` imports the one on code.env's PYTHONPATH
        procs.append(subprocess.Popen(argv, env=code.env, cwd=workdir, stderr=subprocess.DEVNULL))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await wait_ready(session, prom + "/-/ready", procs[0])
            await wait_ready(session, decider + "/livez", procs[1])  # no engines: /healthz is 503
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
            "code": code.name,
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


async def main_async(args: argparse.Namespace, codes: list[Code]) -> dict:
    pages = {code.name: code.template_page(args.template_requests) for code in codes}
    sizes = [int(s) for s in args.sizes.split(",")]
    # size by size, each code right after the other: the same machine state for both
    rows = [await one_size(code, pages[code.name], size, args) for size in sizes for code in codes]
    return {
        "scrape_interval_seconds": args.scrape,
        "warmup_seconds": args.warmup,
        "measure_seconds": args.measure,
        "codes": [{"name": code.name, "commit": code.commit} for code in codes],
        "rows": rows,
    }


def rules_seconds(row: dict) -> dict[str, float]:
    """The `specguard.rules` group's evaluation time, s: mean and max."""
    groups = row["rule_group_seconds"]
    return next((v for k, v in groups.items() if k.endswith("specguard.rules")), {"mean": 0.0, "max": 0.0})


def alerts_seconds(row: dict) -> dict[str, float]:
    groups = row["rule_group_seconds"]
    return next((v for k, v in groups.items() if k.endswith("specguard.alerts")), {"mean": 0.0, "max": 0.0})


MEASURES = {  # name in the tables: how to read it from a row
    "series": lambda r: float(r["head_series"]),
    "Prometheus RSS, MB": lambda r: r["prometheus_rss_mb"],
    "`specguard.rules` mean, s": lambda r: rules_seconds(r)["mean"],
    "`specguard.rules` max, s": lambda r: rules_seconds(r)["max"],
    "Prometheus CPU, % of one core": lambda r: r["prometheus_cpu_percent_of_one_core"],
}


def line_fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope per follower) through ``points``."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    if len(set(xs)) < 2:
        return ys[0], 0.0
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def growth(result: dict, code: str) -> dict[str, tuple[float, float]]:
    rows = [r for r in result["rows"] if r["code"] == code]
    return {name: line_fit([(r["targets"], read(r)) for r in rows]) for name, read in MEASURES.items()}


def interval_for(worst_seconds: float) -> int | None:
    """The shortest interval whose budget (HEADROOM of it) holds the worst evaluation."""
    return next((i for i in INTERVALS if worst_seconds <= HEADROOM * i), None)


def render(result: dict) -> str:
    codes = [c["name"] for c in result["codes"]]
    out = [
        f"Scrape and rule interval {result['scrape_interval_seconds']:g} s, measured "
        f"{result['measure_seconds']:g} s after {result['warmup_seconds']:g} s of warm-up; "
        + "; ".join(f"{c['name']}: {c['commit']}" for c in result["codes"])
        + ".",
        "",
        "| code | followers | series in Prometheus (per follower) | recorded series "
        "| `specguard.rules` evaluation, s: mean (max) | `specguard.alerts`, s: mean (max) "
        "| decider evaluation, s: mean (max) | Prometheus RSS, MB | Prometheus CPU, % of one core "
        "| decider RSS, MB | load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        rules, alerts, d = rules_seconds(r), alerts_seconds(r), r["decider_evaluation_seconds"]
        up = "" if r["targets_up"] == r["targets"] else f", {r['targets_up']} up"
        out.append(
            f"| {r['code']} | {r['targets']}{up} | {r['head_series']:,} ({r['series_per_target']:,}) "
            f"| {r['recorded_series']:,} | {rules['mean']:.2f} ({rules['max']:.2f}) "
            f"| {alerts['mean']:.2f} ({alerts['max']:.2f}) "
            f"| {d['mean'] or 0:.2f} ({d['max'] or 0:.2f}) "
            f"| {r['prometheus_rss_mb']:,.0f} | {r['prometheus_cpu_percent_of_one_core']:.1f} "
            f"| {r['decider_rss_mb']:.0f} | {r['load_average_1m']:.1f} |"
        )
    this, baselines = codes[0], codes[1:]
    by = {(r["code"], r["targets"]): r for r in result["rows"]}
    sizes = sorted({r["targets"] for r in result["rows"]})
    for base in baselines:
        out += [
            "",
            f"{this} as a share of {base}, size by size:",
            "",
            "| followers | series | Prometheus RSS | `specguard.rules` mean evaluation |",
            "|---|---|---|---|",
        ]
        for n in sizes:
            a, b = by.get((this, n)), by.get((base, n))
            if a and b:
                shares = [MEASURES[m](a) / MEASURES[m](b) for m in list(MEASURES)[:3]]
                out.append(f"| {n} | " + " | ".join(f"{100 * x:.0f}%" for x in shares) + " |")
    out += [
        "",
        f"Growth per follower (least squares over the measured sizes) and what it predicts at "
        f"{PREDICT_AT:,}; the interval is the shortest of {', '.join(map(str, INTERVALS))} s whose "
        f"{HEADROOM:.0%} holds the worst `specguard.rules` evaluation (measured, or predicted at "
        f"{PREDICT_AT:,}):",
        "",
        "| code | series per follower | RSS per follower, MB | `specguard.rules` mean, ms per follower "
        f"| at {PREDICT_AT:,}: series | RSS, GB | `specguard.rules` mean (max), s "
        "| Prometheus CPU, % of one core "
        "| interval, s: " + ", ".join(map(str, sizes + [PREDICT_AT])) + " followers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for code in codes:
        fit = growth(result, code)

        def at(name: str, fit: dict = fit) -> float:
            intercept, slope = fit[name]
            return intercept + slope * PREDICT_AT

        worst = [rules_seconds(by[(code, n)])["max"] for n in sizes if (code, n) in by] + [
            at("`specguard.rules` max, s")
        ]
        intervals = ", ".join(str(interval_for(w) or f">{INTERVALS[-1]}") for w in worst)
        out.append(
            f"| {code} | {fit['series'][1]:,.0f} | {fit['Prometheus RSS, MB'][1]:.2f} "
            f"| {1000 * fit['`specguard.rules` mean, s'][1]:.1f} "
            f"| {at('series'):,.0f} | {at('Prometheus RSS, MB') / 1024:.1f} "
            f"| {at('`specguard.rules` mean, s'):.1f} ({at('`specguard.rules` max, s'):.1f}) "
            f"| {at('Prometheus CPU, % of one core'):.0f} | {intervals} |"
        )
    return "\n".join(out)


def checkouts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Code]:
    codes = [Code(args.name, ROOT)]
    for spec in args.baseline:
        name, _, directory = spec.rpartition("=")
        if not name or not directory or not (Path(directory) / RULES).is_file():
            parser.error(f"--baseline {spec!r}: expected NAME=DIR, DIR a specguard checkout")
        codes.append(Code(name, Path(directory).resolve()))
    return codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,300", help="follower targets per run")
    parser.add_argument("--scrape", type=float, default=15.0, help="scrape and rule evaluation interval, s")
    parser.add_argument("--warmup", type=float, default=300.0, help="seconds before measuring (rate5m full)")
    parser.add_argument("--measure", type=float, default=90.0)
    parser.add_argument("--template-requests", type=int, default=1200)
    parser.add_argument("--name", default="this code", help="the name of this checkout's rows")
    parser.add_argument(
        "--baseline", action="append", default=[], metavar="NAME=DIR", help="a checkout to measure too"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--render", metavar="FILE", help="print the markdown tables of a kept result")
    parser.add_argument("--template", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return
    if args.template:  # in a baseline's process: its own specguard makes its own page
        print(asyncio.run(fleet_targets.template_page(requests=args.template_requests)), end="")
        return
    result = asyncio.run(main_async(args, checkouts(parser, args)))
    print(json.dumps(result, indent=2) if args.json else render(result))


if __name__ == "__main__":
    main()
