"""Helpers for the tap tests against real engines: config, sums over classes, ``specguard run``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllmkit import NUM_SPECULATIVE_TOKENS

from specguard.lab import loadgen
from specguard.monitor.app import Monitor

K = NUM_SPECULATIVE_TOKENS
SPEC_FIELDS = ("drafts", "draft_tokens", "accepted_tokens")
MIX = [
    loadgen.RequestClass("code", temperature=0.0, max_tokens=48, prompt_tokens=40, chat=False),
    loadgen.RequestClass("extraction", temperature=0.3, max_tokens=32, prompt_tokens=60),
    loadgen.RequestClass("chat", temperature=0.7, max_tokens=40, prompt_tokens=30),
    loadgen.RequestClass("creative", temperature=1.0, max_tokens=48, prompt_tokens=20, chat=False),
]


def config_text(engines, *, holdout: float, listen: str = "127.0.0.1:0", scrape_s: float = 3600) -> str:
    return f"""
pools:
  - {{name: spec, url: "{engines.spec.url}", engine: vllm, num_speculative_tokens: {K}}}
  - {{name: nospec, url: "{engines.nospec.url}", engine: vllm, num_speculative_tokens: 0}}
tap: {{listen: "{listen}", holdout_share: {holdout}, probe_share: 0, default_pool: spec, nospec_pool: nospec}}
scrape: {{interval_seconds: {scrape_s}, timeout_seconds: {min(5.0, scrape_s)}}}
"""


def pool_sums(monitor: Monitor, pool: str) -> dict[str, float]:
    totals = [t for key, t in monitor.stats.totals().items() if key[0] == pool]
    per_pos = [0] * K
    for t in totals:
        for i, value in enumerate(t.accepted_per_position):
            per_pos[i] += value
    out = {
        "requests": sum(t.requests for t in totals),
        "spec_requests": sum(t.spec_requests for t in totals),
        "generation_tokens": sum(t.output_tokens for t in totals),
        "drafts": sum(t.verify_rounds for t in totals),
        "draft_tokens": sum(t.draft_tokens for t in totals),
        "accepted_tokens": sum(t.accepted_tokens for t in totals),
    }
    out.update({f"per_pos_{i}": v for i, v in enumerate(per_pos)})
    return out


def pools(engines) -> list[tuple[str, object]]:
    return [("spec", engines.spec), ("nospec", engines.nospec)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return None


def exported(text: str) -> dict[str, list[tuple[dict, float]]]:
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def total(metrics: dict, name: str, **labels: str) -> float:
    return sum(v for lab, v in metrics.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def wait_until(predicate, deadline_s: float, what: str, proc: subprocess.Popen, log: Path):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(
                f"specguard run exited ({proc.returncode}) while waiting for {what}:\n{log.read_text()}"
            )
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"specguard run: no {what} within {deadline_s:.0f} s:\n{log.read_text()[-3000:]}")


class SpecguardRun:
    """``specguard run --config FILE`` as a user starts it, on a free port; always stopped."""

    def __init__(self, engines, tmp_path: Path, extra_yaml: str, holdout: float):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        path = tmp_path / "specguard.yaml"
        listen = f"127.0.0.1:{self.port}"
        path.write_text(config_text(engines, holdout=holdout, listen=listen, scrape_s=0.5) + extra_yaml)
        self.log = tmp_path / "run.log"
        control = free_port()
        self.control = f"http://127.0.0.1:{control}"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                # the control listener on a free port of its own (the tap's port + 1 may be taken)
                [
                    sys.executable,
                    "-m",
                    "specguard",
                    "run",
                    "--config",
                    str(path),
                    "--control-listen",
                    f"127.0.0.1:{control}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def wait_until(self, predicate, deadline_s: float, what: str):
        return wait_until(predicate, deadline_s, what, self.proc, self.log)

    def wait_healthy(self) -> None:
        def both_up():
            body = get(f"{self.base}/healthz")
            return body and all(json.loads(body)["pools_up"].values())

        self.wait_until(both_up, 60, "healthy pools")

    def metrics(self) -> dict:
        return exported(get(f"{self.base}/metrics") or "")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode
