"""Small, specguard-independent helpers for the llama.cpp tier: provision, start, stop, read.

The oracle for every cross-check is computed here from raw data (prometheus_client's own parser,
raw JSON), never through specguard's adapters, so a bug there cannot hide itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests import engineproc

ROOT = Path(__file__).resolve().parents[2]
PROVISION = ROOT / "scripts" / "provision-llamacpp"
SERVE = ROOT / "scripts" / "serve-llamacpp"
K = 4  # --spec-draft-n-max of the speculating server
START_DEADLINE_S = 120.0  # 1-3 s alone; 7-9 s when several start at once on a busy 2-core box
STOP_GRACE_S = 10.0

SPEC_COUNTERS = {
    "drafts": "llamacpp:spec_decode_num_drafts",
    "draft_tokens": "llamacpp:spec_decode_num_draft_tokens",
    "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens",
}
PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos"
GENERATION = "llamacpp:tokens_predicted"


class ProvisionError(RuntimeError):
    pass


def provision() -> dict[str, Path]:
    """Run scripts/provision-llamacpp (a no-op when the cache is warm); return its ``--paths``."""
    proc = subprocess.run([str(PROVISION)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ProvisionError(
            f"scripts/provision-llamacpp failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    out = subprocess.run([str(PROVISION), "--paths"], capture_output=True, text=True, check=True)
    return {k: Path(v) for k, v in (line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(port: int | str, cpu: int, k: int | str, ngram: bool = False) -> list[str]:
    """scripts/serve-llamacpp: what docs/real-model.md tells users to run."""
    cmd = [str(SERVE), "--port", str(port), "--cpu", str(cpu), "--k", str(k)]
    return [*cmd, "--ngram"] if ngram else cmd


@dataclass
class Server:
    """One running llama-server (its own process group)."""

    name: str
    url: str
    k: int
    proc: subprocess.Popen
    log_path: Path
    start_seconds: float = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"


def start(name: str, logdir: Path, cpu: int, k: int, port: int | None = None, ngram: bool = False) -> Server:
    """Start scripts/serve-llamacpp on ``port`` (a free one by default); not yet waited for."""
    port = port or free_port()
    log_path = logdir / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            serve_command(port, cpu, k, ngram),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=logdir,
            start_new_session=True,
        )
    return Server(name, f"http://127.0.0.1:{port}", k, proc, log_path)


def wait_healthy(server: Server, deadline_s: float = START_DEADLINE_S) -> float:
    """Seconds from now until ``/health`` answers 200; RuntimeError (with the log) otherwise."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"llama-server '{server.name}' exited with code {server.proc.returncode} before it was "
                f"healthy; log {server.log_path}:\n{server.tail()}"
            )
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"llama-server '{server.name}' not healthy after {deadline_s:.0f} s:\n{server.tail()}")


def stop(server: Server) -> None:
    """SIGTERM, then SIGKILL to the process group."""
    engineproc.stop(server.proc, STOP_GRACE_S)


def kill(server: Server) -> None:
    if server.proc.poll() is None:
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)


def fetch(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def post(url: str, body: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def stream_events(url: str, body: dict, timeout: float = 120.0) -> list[dict]:
    """POST with ``stream: true``; the decoded JSON of every SSE ``data:`` event (not [DONE])."""
    req = urllib.request.Request(
        url, data=json.dumps({**body, "stream": True}).encode(), headers={"Content-Type": "application/json"}
    )
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                events.append(json.loads(line[5:].strip()))
    return events


def counters(text: str) -> dict[str, float]:
    """The spec counters, generation tokens and per-position series of a page, by prometheus_client."""
    out = {key: 0.0 for key in (*SPEC_COUNTERS, "generation_tokens")}
    names = {**{v: k for k, v in SPEC_COUNTERS.items()}, GENERATION: "generation_tokens"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name in names and sample.name.endswith("_total"):
                out[names[family.name]] += sample.value
            elif family.name == PER_POS:
                out[f"per_pos_{sample.labels['position']}"] = sample.value
    return out


def scrape(url: str) -> dict[str, float]:
    return counters(fetch(f"{url}/metrics"))


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


# ---- specguard in front of the two servers ------------------------------------------------------


def config_text(servers, *, holdout: float, listen: str = "127.0.0.1:0", extra: str = "") -> str:
    """A specguard config with the two servers as pools ``spec`` (K) and ``nospec``."""
    return f"""
pools:
  - {{name: spec, url: "{servers.spec.url}", engine: llamacpp, num_speculative_tokens: {K}}}
  - {{name: nospec, url: "{servers.nospec.url}", engine: llamacpp, num_speculative_tokens: 0}}
tap: {{listen: "{listen}", holdout_share: {holdout}, probe_share: 0, default_pool: spec, nospec_pool: nospec}}
scrape: {{interval_seconds: 3600, timeout_seconds: 5}}
{extra}"""


def class_sums(monitor, pool: str) -> dict[tuple[str, str], dict[str, int]]:
    """specguard's cumulative per-class totals of one pool: (task, temperature bucket) -> sums."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for (p, task, bucket, _load), t in monitor.stats.totals().items():
        if p != pool:
            continue
        sums = out.setdefault(
            (task, bucket), {"requests": 0, "output_tokens": 0, "draft_tokens": 0, "accepted_tokens": 0}
        )
        sums["requests"] += t.requests
        sums["output_tokens"] += t.output_tokens
        sums["draft_tokens"] += t.draft_tokens
        sums["accepted_tokens"] += t.accepted_tokens
    return out
