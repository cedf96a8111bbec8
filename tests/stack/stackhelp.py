"""A real local stack on loopback for the end-to-end tests: the engine simulator, `specguard run`,
Debian's Prometheus and Alertmanager. Every process is started with its own log file and is
stopped (SIGTERM, then SIGKILL) when the `Stack` context exits, also on failure."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from specguard.lab import loadgen

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "specguard-rules.yaml"
ALERTMANAGER_YML = DEPLOY / "compose" / "alertmanager.yml"
DASHBOARD = DEPLOY / "grafana" / "specguard-overview.json"
TOKEN = "stack-test-webhook-token"
# a class that speculation hurts (creative at temperature 1: almost every round rolls back) next to
# classes it helps (code and extraction at temperature 0)
MIX = [
    loadgen.RequestClass("creative", weight=2, temperature=1.0, max_tokens=96),
    loadgen.RequestClass("code", weight=1, temperature=0.0, max_tokens=96),
    loadgen.RequestClass("extraction", weight=1, temperature=0.0, max_tokens=64),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError(f"none of {names} found: scripts/test installs Debian's prometheus packages")


class Proc:
    """One child process in its own process group, logging to a file."""

    def __init__(self, name: str, argv: list[str], workdir: Path):
        self.name = name
        self.log = workdir / f"{name}.log"
        self._log = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE if name == "sim" else self._log,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        if self.popen.stdout:
            self.popen.stdout.close()
        self._log.close()

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def http_get(url: str, timeout: float = 5.0, headers: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_post(url: str, payload: dict, headers: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(payload).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(url: str) -> list:
    """Every sample on ``url``/metrics."""
    status, body = http_get(url + "/metrics")
    assert status == 200
    return [s for f in text_string_to_metric_families(body.decode()) for s in f.samples]


def moved_off(specguard: str, task_type: str, temperature_bucket: str):
    """(delivered firing alerts, plan, samples) once the class is on ``nospec`` at every load, else None."""
    samples = scrape(specguard)
    delivered = sum(
        s.value
        for s in samples
        if s.name == "specguard_webhook_alerts_total" and s.labels["status"] == "firing"
    )
    plan = {
        (s.labels["task_type"], s.labels["temperature_bucket"], s.labels["load_bucket"]): s.labels["pool"]
        for s in samples
        if s.name == "specguard_plan_info" and s.value == 1
    }
    pools = [pool for key, pool in plan.items() if key[:2] == (task_type, temperature_bucket)]
    off = pools and all(pool == "nospec" for pool in pools)
    return (delivered, plan, samples) if delivered > 0 and off else None


def drive_load(url: str, seconds: float, results: list, seed: int = 1) -> threading.Thread:
    """MIX through ``url`` at concurrency 6 for ``seconds`` in a thread; results land in ``results``."""

    def run():
        results.extend(
            asyncio.run(loadgen.run_load(url, MIX, concurrency=6, duration_s=seconds, seed=seed, stream=True))
        )

    thread = threading.Thread(target=run, name="loadgen", daemon=True)
    thread.start()
    return thread


def wait_until(what: str, check, timeout: float, procs: list[Proc] = (), interval: float = 0.5):
    """Poll `check()` until it returns a truthy value; fail with the logs after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        for p in procs:
            if p.popen.poll() is not None:
                raise AssertionError(
                    f"{p.name} exited ({p.popen.returncode}) while waiting for {what}:\n{p.tail()}"
                )
        try:
            value = check()
            if value:
                return value
        except (OSError, ValueError, KeyError) as exc:
            last_error = exc
        time.sleep(interval)
    logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})\n{logs}")


def stack_rules(text: str) -> str:
    """The shipped rules with only the `for`/`keep_firing_for` durations shortened.

    The shipped alerts wait 5-10 minutes before firing, which no bounded test can sit out; the
    exact `for` boundaries of the shipped file are pinned by `promtool test rules`
    (tests/deploy). Expressions, windows, labels and annotations are untouched, so this stack
    exercises the shipped queries on real data end to end.
    """
    text = re.sub(r"(?m)^(\s+)for: \d+m$", r"\1for: 2s", text)
    return re.sub(r"(?m)^(\s+)keep_firing_for: \d+m$", r"\1keep_firing_for: 30s", text)


def alertmanager_config(webhook_urls: list[str], token_file: Path, only: str | None = None) -> dict:
    """The shipped compose routing with short group timers, its webhook pointed at this stack's
    receivers (specguard's, plus optionally a recorder that keeps the raw payloads); `only`
    narrows the specguard route to one alert name (to isolate one trigger)."""
    am = yaml.safe_load(ALERTMANAGER_YML.read_text())
    am["route"].update(group_wait="1s", group_interval="2s", repeat_interval="1m")
    if only is not None:
        (route,) = [r for r in am["route"]["routes"] if r["receiver"] == "specguard"]
        route["matchers"] = [f'alertname="{only}"']
    for receiver in am["receivers"]:
        hooks = receiver.get("webhook_configs", [])
        if hooks:
            (template,) = hooks
            template["http_config"]["authorization"]["credentials_file"] = str(token_file)
            receiver["webhook_configs"] = [{**template, "url": url} for url in webhook_urls]
    return am


class Receiver:
    """A webhook endpoint on loopback that records what Alertmanager posts."""

    def __init__(self):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append((self.path, self.headers.get("Authorization"), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhook-receiver", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def api(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        status, body = http_get(f"{self.url}/api/v1/{path}?{query}", timeout=10)
        payload = json.loads(body)
        if payload.get("status") != "success":
            raise AssertionError(f"{path} {params}: {status} {payload}")
        return payload["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, seconds: float = 300, step: float = 5) -> list[dict]:
        """As Grafana runs panel and annotation queries: over a time range, one step per point."""
        end = time.time()
        return self.api("query_range", query=expr, start=end - seconds, end=end, step=step)["result"]

    def value(self, expr: str) -> dict[tuple, float]:
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in self.query(expr)}


class Stack(ExitStack):
    """Start with `Stack(tmp_path).start(...)`; leaving the `with` stops every process."""

    def __init__(self, workdir: Path):
        super().__init__()
        self.workdir = workdir
        self.procs: list[Proc] = []

    def spawn(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.workdir)
        self.procs.append(proc)
        self.callback(proc.stop)
        return proc

    def start_sim(self, time_scale: float = 0.05, args: tuple[str, ...] = ()) -> dict[str, str]:
        """`specguard simulate` (the default pools on ephemeral loopback ports); returns their URLs."""
        argv = [sys.executable, "-m", "specguard", "simulate", "--time-scale", str(time_scale), *args]
        proc = self.spawn("sim", argv)
        urls = {}
        for raw in proc.popen.stdout:  # "  spec-k4    K=4  http://127.0.0.1:PORT" ... "ground truth: ..."
            line = raw.decode()
            match = re.match(r"^\s+(\S+)\s+K=\d+\s+(http://\S+)\s*$", line)
            if match:
                urls[match.group(1)] = match.group(2)
            if line.startswith("ground truth:"):
                return urls
        raise AssertionError(f"`specguard simulate` did not start:\n{proc.tail()}")

    def start_specguard(self, config: dict) -> str:
        port = free_port()
        path = self.workdir / "specguard.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [
            sys.executable,
            "-m",
            "specguard",
            "run",
            "--config",
            str(path),
            "--listen",
            f"127.0.0.1:{port}",
            "--control-listen",
            control_url(f"http://127.0.0.1:{port}").removeprefix("http://"),
        ]
        proc = self.spawn("specguard", argv)
        url = f"http://127.0.0.1:{port}"
        wait_until("specguard /livez", lambda: http_get(url + "/livez")[0] == 200, 30, [proc])
        return url

    def start_alertmanager(self, *webhook_urls: str, only: str | None = None) -> str:
        token_file = self.workdir / "webhook-token"
        token_file.write_text(TOKEN + "\n")
        path = self.workdir / "alertmanager.yml"
        path.write_text(
            yaml.safe_dump(alertmanager_config(list(webhook_urls), token_file, only), sort_keys=False)
        )
        port = free_port()
        argv = [
            binary("prometheus-alertmanager", "alertmanager"),
            f"--config.file={path}",
            f"--storage.path={self.workdir / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip port: loopback only, single instance
        ]
        proc = self.spawn("alertmanager", argv)
        url = f"http://127.0.0.1:{port}"
        wait_until("alertmanager ready", lambda: http_get(url + "/-/ready")[0] == 200, 30, [proc])
        return url

    def start_prometheus(
        self,
        specguard_url: str | None = None,
        alertmanager_url: str | None = None,
        jobs: dict[str, list[str]] | None = None,
        *,
        name: str = "prometheus",
        rules: bool = True,
        agent: bool = False,
        receiver: bool = False,
        scrape_configs: tuple[dict, ...] = (),
        remote_write: tuple[dict, ...] = (),
    ) -> Prometheus:
        """Prometheus scraping `specguard_url` as job "specguard" (or every URL of `jobs`, by job).

        More than one per stack by `name` (its config, rules copy and storage are named after it).
        `rules`: load the shipped rules (stack_rules); `agent`: agent mode (scrape and remote-write
        only: no rules, no query API); `receiver`: accept remote writes on /api/v1/write;
        `scrape_configs` are added as they are (federation), `remote_write` is its remote_write."""
        jobs = jobs if jobs is not None else {"specguard": [specguard_url]}
        config: dict = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}}
        if not agent:
            config["global"]["evaluation_interval"] = "1s"
        if rules:
            path = self.workdir / ("specguard-rules.yaml" if name == "prometheus" else f"{name}-rules.yaml")
            path.write_text(stack_rules(RULES.read_text()))
            config["rule_files"] = [str(path)]
        if alertmanager_url:
            config["alerting"] = {
                "alertmanagers": [{"static_configs": [{"targets": [alertmanager_url.split("//")[1]]}]}]
            }
        config["scrape_configs"] = [
            {"job_name": job, "static_configs": [{"targets": [url.split("//")[1] for url in urls]}]}
            for job, urls in jobs.items()
        ] + list(scrape_configs)
        if remote_write:
            config["remote_write"] = list(remote_write)
        path = self.workdir / f"{name}.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        storage = self.workdir / ("prom-data" if name == "prometheus" else f"{name}-data")
        argv = [
            binary("prometheus"),
            f"--config.file={path}",
            f"--storage.{'agent' if agent else 'tsdb'}.path={storage}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ]
        if agent:
            argv.append("--enable-feature=agent")
        if receiver:
            argv.append("--web.enable-remote-write-receiver")
        proc = self.spawn(name, argv)
        url = f"http://127.0.0.1:{port}"
        wait_until(f"{name} ready", lambda: http_get(url + "/-/ready")[0] == 200, 30, [proc])
        return Prometheus(url)


CONTROLS: dict[str, str] = {}


def control_url(url: str) -> str:
    """The control listener of the specguard whose tap is ``url``: a free port of its own, the same
    across a restart (``--control-listen``)."""
    if url not in CONTROLS:
        CONTROLS[url] = f"http://127.0.0.1:{free_port()}"
    return CONTROLS[url]


def specguard_config(pools: dict[str, str], workdir: Path) -> dict:
    """The compose stack's specguard config, pointed at this stack's simulator pools, with the
    guard evaluating every second and its receiver's token in a file."""
    config = yaml.safe_load((DEPLOY / "compose" / "specguard.yaml").read_text())
    for pool in config["pools"]:
        pool["url"] = pools[pool["name"]]
    config["scrape"] = {"interval_seconds": 1, "timeout_seconds": 1}
    token_file = workdir / "specguard-token"
    token_file.write_text(TOKEN + "\n")
    # one token with every role; the control listener on a port of its own (control_url)
    config["server"] = {"token_file": str(token_file)}
    config["guard"].update(interval_seconds=1, window_seconds=60, min_samples=10, cooldown_seconds=0)
    config["alertmanager"].pop("url", None)  # the compose stack's Alertmanager: this one starts later
    config["alertmanager"].pop("receiver", None)
    config["actuators"].update(plan_file=str(workdir / "plan.json"), audit_log=str(workdir / "audit.jsonl"))
    return config


def substitute(expr: str, rate_interval: str = "1m", interval: str = "15s") -> str:
    """A dashboard expression as Grafana sends it with every variable on 'All'."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__interval", interval)
    return re.sub(r"\$[a-z_]+", ".+", expr)


NAME_RE = re.compile(r"\b([a-zA-Z_][a-zA-Z0-9_]*(?::[a-zA-Z0-9_]+)+|specguard_[a-zA-Z0-9_]+|ALERTS)\b")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (specguard_*, recording rules, ALERTS)."""
    return set(NAME_RE.findall(expr))


def dashboard_variables() -> list[tuple[str, str, str]]:
    """(name, label, series selector) of every `label_values(selector, label)` query variable."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.*), (\w+)\)", var["query"]["query"])
            assert match, var["query"]
            out.append((var["name"], match.group(2), substitute(match.group(1))))
    return out


def exposed_names(metrics_text: str) -> set[str]:
    names = set()
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names
