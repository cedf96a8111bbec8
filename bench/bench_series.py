"""Series on one tap's /metrics: right after start-up, and after traffic through every class.

A Monitor (the tap and exporter of `specguard run`, default classes: 5 task labels x 4
temperature buckets x 3 load buckets) over the simulator's three pools (spec-k4, spec-k2,
nospec), default tap shares (holdout and probes reach the other pools). Its page is counted
before any request, then after `--requests` requests of every task type at every temperature
bucket at 4 clients and as many again at 32 (the low and medium load buckets). Each
`--baseline NAME=DIR` runs the same measurement once more in a process importing specguard from
DIR (another checkout, e.g. an earlier release), for comparison in the same run.

    python3 bench/bench_series.py --json [--name NAME] [--baseline NAME=DIR ...] > bench/results/series.json
    python3 bench/bench_series.py --render bench/results/series.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path

TEMPERATURES = (0.0, 0.3, 0.7, 1.0)  # one per default temperature bucket
CLASS_LABELS = ("pool", "task_type", "temperature_bucket", "load_bucket")


def count(text: str) -> tuple[int, int]:
    """(samples, per-class label sets) of an exposition page."""
    from prometheus_client.parser import text_string_to_metric_families

    samples, sets = 0, set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples += 1
            if all(label in s.labels for label in CLASS_LABELS):
                sets.add(tuple(s.labels[label] for label in CLASS_LABELS))
    return samples, len(sets)


async def measure(requests: int) -> dict:
    from prometheus_client import generate_latest

    import specguard
    from specguard.lab import loadgen
    from specguard.monitor import config
    from specguard.monitor.app import Monitor
    from specguard.sim.cluster import SimCluster

    ks = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
    async with SimCluster.from_config(None, seed=0, dialect="vllm", time_scale=0.002) as sim:
        pools = "\n".join(
            f'  - {{name: {name}, url: "{url}", engine: vllm, num_speculative_tokens: {ks[name]}}}'
            for name, url in sim.urls.items()
        )
        text = f"pools:\n{pools}\ntap: {{default_pool: spec-k4, nospec_pool: nospec}}\n"
        cfg = config.parse_text(text + "scrape: {interval_seconds: 3600}\n", "bench.yaml")
        monitor = Monitor(cfg, rng=random.Random(0))
        classes = monitor.exporter_config.classes
        mix = [
            loadgen.RequestClass(task, temperature=t, max_tokens=32)
            for task in classes.task_labels
            for t in TEMPERATURES
        ]
        url = await monitor.start("127.0.0.1", 0)
        try:
            before = count(generate_latest(monitor.registry).decode())
            sent = []
            for clients in (4, 32):
                sent += await loadgen.run_load(
                    url, mix, clients, requests=requests, stream=True, seed=clients
                )
            after = count(generate_latest(monitor.registry).decode())
        finally:
            await monitor.stop()
    vocabulary = (
        len(ks) * len(classes.task_labels) * len(classes.temperature_buckets) * len(classes.load_buckets)
    )
    return {
        "commit": commit(Path(specguard.__file__).resolve().parents[1]),
        "requests": len(sent),
        "ok": sum(r.ok for r in sent),
        "vocabulary": vocabulary,
        "before": {"series": before[0], "label_sets": before[1]},
        "after": {"series": after[0], "label_sets": after[1]},
    }


def commit(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def baseline(directory: str, requests: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(directory).resolve())}
    argv = [sys.executable, __file__, "--measure", "--requests", str(requests)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


def render(result: dict) -> str:
    lines = [
        "| code | series before traffic (per-class label sets) | after traffic (per-class label sets) |",
        "|---|---|---|",
    ]
    for r in result["runs"]:
        b, a = r["before"], r["after"]
        lines.append(
            f"| {r['name']} | {b['series']:,} ({b['label_sets']}) | {a['series']:,} ({a['label_sets']}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per load level")
    parser.add_argument("--name", default="this code", help="the name of this checkout's row")
    parser.add_argument(
        "--baseline", action="append", default=[], metavar="NAME=DIR", help="a checkout to measure too"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--render", metavar="FILE", help="print the markdown table of a kept result")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return
    if args.measure:
        print(json.dumps(asyncio.run(measure(args.requests))))
        return
    runs = [{"name": args.name, **asyncio.run(measure(args.requests))}]
    for spec in args.baseline:
        name, _, directory = spec.rpartition("=")
        if not name or not directory:
            parser.error(f"--baseline {spec!r}: expected NAME=DIR")
        runs.append({"name": name, **baseline(directory, args.requests)})
    result = {"requests_per_level": args.requests, "runs": runs}
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else render(result))


if __name__ == "__main__":
    main()
