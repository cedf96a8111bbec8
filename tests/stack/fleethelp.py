"""A fleet on loopback for tests/stack/test_fleet.py and test_past_one_prometheus.py: simulator
replicas, one follower `specguard run` per replica (the shipped sidecar config), one decider
`specguard run` (the shipped decider config, `guard.local: false`), on top of stackhelp's
Prometheus and Alertmanager.

The plan reaches the followers either over HTTP (the decider's GET /api/v1/plan) or through a
ConfigMap of the loopback Kubernetes API stand-in (tests/monitor/kubekit.py), which also holds
the deciders' Lease."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import urllib.request
from pathlib import Path

import yaml
from stackhelp import (
    DEPLOY,
    TOKEN,
    Proc,
    Prometheus,
    Stack,
    control_url,
    free_port,
    http_get,
    scrape,
    wait_until,
)

from specguard.lab import loadgen

SIDECAR = DEPLOY / "kubernetes" / "base" / "specguard.yaml"
DECIDER = DEPLOY / "kubernetes" / "base" / "guard.yaml"
SEEDED_PLAN = DEPLOY / "kubernetes" / "base" / "plan-configmap.yaml"

# simulator replicas: engine name -> (specguard pool it serves, K)
REPLICAS = {"spec-k4-a": ("spec-k4", 4), "spec-k4-b": ("spec-k4", 4), "nospec-a": ("nospec", 0)}
# follower i sits next to replica i; like a Service, its pools reach one replica of each pool
FOLLOWERS = [
    {"spec-k4": "spec-k4-a", "nospec": "nospec-a"},
    {"spec-k4": "spec-k4-b", "nospec": "nospec-a"},
    {"spec-k4": "spec-k4-a", "nospec": "nospec-a"},  # next to nospec-a
]
POLL_SECONDS = 2.0  # followers' plan poll (guard.interval_seconds of a follower)
SCRAPE_SECONDS = 1.0  # Prometheus scrape and rule evaluation interval
BUCKET = {0.0: "greedy", 1.0: "high"}
NAMESPACE, CONFIGMAP, LEASE = "serving", "routing", "specguard-guard"
# the fleet's traffic: a class speculation hurts (creative at temperature 1), one it helps
MIX = [
    loadgen.RequestClass("creative", weight=2, temperature=1.0, max_tokens=64),
    loadgen.RequestClass("code", weight=1, temperature=0.0, max_tokens=64),
]
RC = "pool_class_load:specguard_relative_cost_per_token:ratio"
# the per-class counters the fleet-wide sums are checked on
COUNTERS = {
    "specguard_requests_total": "requests",
    "specguard_verify_rounds_total": "verify_rounds",
    "specguard_draft_tokens_total": "draft_tokens",
    "specguard_accepted_tokens_total": "accepted_tokens",
}


class Load:
    """Requests through every follower, round robin (as through a Service), until stopped."""

    def __init__(self, urls: list[str]):
        self.urls, self.results, self._stop = urls, [], threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seed = 0
        while not self._stop.is_set():
            seed += 1
            run = loadgen.run_load(self.urls, MIX, concurrency=6, duration_s=2, seed=seed, stream=True)
            self.results.extend(asyncio.run(run))

    def stop(self) -> list:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()
        return self.results


def seeded_configmap() -> dict[str, str]:
    """The plan ConfigMap's data as kustomize creates it (version 0, no entries)."""
    return dict(yaml.safe_load(SEEDED_PLAN.read_text())["data"])


def sim_args(workdir: Path, seed: int = 3) -> tuple[str, ...]:
    path = workdir / "sim.yaml"
    pools = [
        {
            "name": name,
            "num_speculative_tokens": k,
            "max_num_seqs": 256,
            "port": 0,
            "per_request_spec_metrics": True,
        }
        for name, (_, k) in REPLICAS.items()
    ]
    path.write_text(yaml.safe_dump({"pools": pools}))
    return ("--config", str(path), "--seed", str(seed))


def plan_source(source: str, decider_url: str, kube_url: str | None, workdir: Path | None = None) -> dict:
    if source == "http":
        token = (workdir or Path(".")) / "decider-token"  # the decider's token has the follower role
        token.write_text(TOKEN + "\n")
        return {
            "plan_http": {"urls": [control_url(decider_url)], "timeout_seconds": 1, "token_file": str(token)}
        }
    return {
        "configmap": {"namespace": NAMESPACE, "name": CONFIGMAP, "api_server": kube_url, "timeout_seconds": 5}
    }


def follower_config(
    index: int, engines: dict[str, str], source: str, workdir: Path, decider: str, kube
) -> dict:
    """The shipped sidecar config, pointed at this fleet; its plan from `source`."""
    config = yaml.safe_load(SIDECAR.read_text())
    key = workdir / "engine-api-key"  # the Secret the manifests mount (the simulator takes any key)
    key.write_text("fleet-engine-key\n")
    for pool in config["pools"]:
        pool["url"] = engines[FOLLOWERS[index][pool["name"]]]
        if "api_key_file" in pool:
            pool["api_key_file"] = str(key)
    config["scrape"] = {"interval_seconds": 1, "timeout_seconds": 1}
    config["tap"].update(holdout_share=0.2)  # a live baseline within seconds
    config["cost"] = {"min_samples": 20, "baseline_min_samples": 20}
    config["guard"]["interval_seconds"] = POLL_SECONDS
    acts = {k: v for k, v in config["actuators"].items() if k != "configmap"}
    acts.update(
        plan_source(source, decider, kube, workdir), plan_file=str(workdir / f"follower-{index}-plan.json")
    )
    config["actuators"] = acts
    token = workdir / "follower-token"  # its control listener's credential: /status (plan_of) reads it
    token.write_text(TOKEN + "\n")
    config["server"] = {"token_file": str(token)}
    return config


def decider_config(engines: dict[str, str], source: str, workdir: Path, prometheus: str, kube) -> dict:
    """The shipped decider config, pointed at this fleet's Prometheus; it acts on the first bad
    evaluation of its PromQL rule (20 samples across the fleet) and never restores in a test."""
    config = yaml.safe_load(DECIDER.read_text())
    for pool in config["pools"]:
        pool["url"] = engines["spec-k4-a" if pool["name"] == "spec-k4" else "nospec-a"]
    config["scrape"] = {"interval_seconds": 1, "timeout_seconds": 1}
    guard = config["guard"]
    guard.update(interval_seconds=1, cooldown_seconds=0, stabilization_window_seconds=3600)
    guard["prometheus"] = {"url": prometheus, "timeout_seconds": 2}
    (rule,) = guard["rules"]
    rule["query"] = rule["query"].replace(">= 30", ">= 20")
    rule.update(consecutive_failure_limit=0)
    token = workdir / "decider-token"
    token.write_text(TOKEN + "\n")
    config["server"] = {"token_file": str(token)}  # every role; its control listener: control_url
    acts = config["actuators"]
    acts.update(plan_file=str(workdir / "decider-plan.json"), audit_log=str(workdir / "audit.jsonl"))
    if source == "http":
        del acts["configmap"], acts["leader_election"]  # mode auto: the lock on plan_file
    else:
        acts["configmap"].update(namespace=NAMESPACE, name=CONFIGMAP, api_server=kube, timeout_seconds=5)
        acts["leader_election"].update(
            identity="specguard-guard-0",  # a pod name: a restarted container renews at once
            lease_duration_seconds=3,
            renew_deadline_seconds=2,
            retry_period_seconds=1,
        )
    return config


def start_run(stack: Stack, name: str, config: dict, port: int, *, wait: bool = True) -> tuple[Proc, str]:
    """`specguard run` named `name` on 127.0.0.1:`port`, once its /livez answers (unless not `wait`)."""
    path = stack.workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    url = f"http://127.0.0.1:{port}"
    control = control_url(url).removeprefix("http://")
    argv = [sys.executable, "-m", "specguard", "run", "--config", str(path), "--listen", f"127.0.0.1:{port}"]
    argv += ["--control-listen", control]
    proc = stack.spawn(name, argv)
    if wait:
        wait_healthy(proc, url)
    return proc, url


def start_followers(
    stack: Stack, engines: dict[str, str], source: str, workdir: Path, decider_url: str, kube_url: str | None
) -> list[str]:
    """One follower `specguard run` per replica, started together; their URLs once all answer."""
    started = [
        start_run(
            stack,
            f"follower-{i}",
            follower_config(i, engines, source, workdir, decider_url, kube_url),
            free_port(),
            wait=False,
        )
        for i in range(len(FOLLOWERS))
    ]
    for proc, url in started:
        wait_healthy(proc, url)
    return [url for _, url in started]


def wait_healthy(proc: Proc, url: str) -> None:
    wait_until(f"{proc.name} /livez", lambda: http_get(url + "/livez")[0] == 200, 30, [proc])


def truth(engine_url: str) -> dict:
    status, body = http_get(engine_url + "/sim/truth")
    assert status == 200
    return json.loads(body)


def truth_counts(engine_url: str, fields: tuple[str, ...]) -> dict[tuple[str, str, str], dict[str, int]]:
    """What the simulator replicas really did: (specguard pool, task_type, temperature bucket) -> counts."""
    out: dict[tuple[str, str, str], dict[str, int]] = {}
    for engine, data in truth(engine_url)["pools"].items():
        pool = REPLICAS[engine][0]
        for key, counts in data["classes"].items():
            task, temperature = key.split("@")
            row = out.setdefault((pool, task, BUCKET[float(temperature)]), dict.fromkeys(fields, 0))
            for field in fields:
                row[field] += counts[field]
    return out


def counter_sums(samples, names: dict[str, str]) -> dict[tuple[str, str, str], dict[str, int]]:
    """specguard counters from /metrics samples: (pool, task_type, temperature_bucket) -> field -> sum."""
    out: dict[tuple[str, str, str], dict[str, int]] = {}
    for s in samples:
        field = names.get(s.name)
        if field is None or not s.value:
            continue
        key = (s.labels["pool"], s.labels["task_type"], s.labels["temperature_bucket"])
        row = out.setdefault(key, dict.fromkeys(names.values(), 0))
        row[field] += int(s.value)
    return out


def plan_of(url: str) -> tuple[int, dict[tuple[str, str, str], str]]:
    """(plan version, plan) a specguard process holds: its /status (the plan's cells are on /metrics
    only where the plan is decided), with the version it exports on /metrics, which must agree."""
    for _ in range(5):  # a plan adopted between the two reads: read both again
        status, body = http_get(control_url(url) + "/status", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, (url, status, body[:200])
        doc = json.loads(body)
        exported = next(int(s.value) for s in scrape(url) if s.name == "specguard_plan_version")
        if exported == doc["plan_version"]:
            break
    assert exported == doc["plan_version"], (url, exported, doc["plan_version"])
    cells = {(c["task_type"], c["temperature_bucket"], c["load_bucket"]): c["pool"] for c in doc["classes"]}
    return doc["plan_version"], {key: pool for key, pool in cells.items() if pool}


def sample(url: str, name: str, **labels: str) -> float | None:
    for s in scrape(url):
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def audit(path: Path) -> list[dict]:
    """The decisions in an audit log (its webhook lines say who sent what, and are left out)."""
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if "event" not in r]


def post_json(url: str, body: dict) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def follower_counters(urls: list[str]) -> dict[tuple[str, str, str], dict[str, int]]:
    """COUNTERS summed over the followers' own /metrics: (pool, task_type, temperature_bucket) -> field."""
    total: dict = {}
    for url in urls:
        for key, row in counter_sums(scrape(url), COUNTERS).items():
            into = total.setdefault(key, dict.fromkeys(row, 0))
            for field, value in row.items():
                into[field] += value
    return total


def fleet_counters(prom: Prometheus, job: str = "fleet") -> dict[tuple[str, str, str], dict[str, int]]:
    """COUNTERS summed over the fleet's series in `prom`, keyed as follower_counters."""
    got: dict = {}
    for metric, field in COUNTERS.items():
        by = "pool, task_type, temperature_bucket"
        for labels, value in prom.value(f'sum by ({by}) ({metric}{{job="{job}"}}) > 0').items():
            key = tuple(dict(labels)[k] for k in ("pool", "task_type", "temperature_bucket"))
            got.setdefault(key, dict.fromkeys(COUNTERS.values(), 0))[field] = int(value)
    return got
