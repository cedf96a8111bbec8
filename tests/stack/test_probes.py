"""The sidecar's probes (deploy/kubernetes: startup/readiness/liveness on /livez) must never
fail because of specguard's dependencies: with every engine pool unreachable, no Prometheus and
no Kubernetes API, `specguard run` still answers /livez with 200, while /metrics reports the pools
down and /healthz says degraded (503, naming every pool and why) for people and external checks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from stackhelp import Stack, free_port, http_get, specguard_config, wait_until

pytestmark = pytest.mark.stack


def test_livez_stays_ok_and_healthz_says_degraded_when_every_dependency_is_down(tmp_path: Path):
    dead = {name: f"http://127.0.0.1:{free_port()}" for name in ("spec-k4", "spec-k2", "nospec")}
    config = specguard_config(dead, tmp_path)
    with Stack(tmp_path) as stack:
        url = stack.start_specguard(config)

        def pools_down():
            status, body = http_get(url + "/metrics")
            up = [
                s.value
                for f in text_string_to_metric_families(body.decode())
                for s in f.samples
                if s.name == "specguard_engine_up"
            ]
            return status == 200 and len(up) == 3 and set(up) == {0.0}

        wait_until("every pool scraped and down", pools_down, 20, stack.procs)
        deadline = time.monotonic() + 3  # a few more scrape rounds with everything failing
        while time.monotonic() < deadline:
            status, _ = http_get(url + "/livez")
            assert status == 200
            time.sleep(0.5)
        status, body = http_get(url + "/healthz")
        health = json.loads(body)
        assert status == 503 and health["status"] == "degraded", health
        assert all(name in health["reason"] for name in dead), health
        assert health["pools_serving"] == dict.fromkeys(dead, False)
