"""Receiver state after a restart: the guard reads the active alerts back from a real Alertmanager.

Debian's Alertmanager 0.25 with the shipped routing holds alerts posted to its API (as Prometheus
would); a guard that starts with ``alertmanager.url`` set takes the active ones routed to its
receiver as evidence at once, instead of waiting for the next notification (``repeat_interval``).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from stackhelp import Stack, free_port, http_get, wait_until

from specguard.monitor import config, guard_wiring
from specguard.monitor.app import Monitor

pytestmark = pytest.mark.stack


def post_alerts(url: str, alerts: list[dict]) -> None:
    request = urllib.request.Request(
        url + "/api/v2/alerts", data=json.dumps(alerts).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def alert(name: str, **labels: str) -> dict:
    now = datetime.now(UTC)
    return {
        "labels": {"alertname": name, **labels},
        "startsAt": (now - timedelta(minutes=20)).isoformat(),
        "endsAt": (now + timedelta(hours=1)).isoformat(),
    }


async def test_a_restarted_guard_reads_the_active_alerts_back(tmp_path: Path):
    with Stack(tmp_path) as stack:
        am_url = stack.start_alertmanager(f"http://127.0.0.1:{free_port()}/api/v1/alerts")
        post_alerts(
            am_url,
            [
                alert("SpecGuardRelativeCostAboveOne", task_type="creative", temperature_bucket="high"),
                alert("SpecGuardRelativeCostAboveOne", task_type="poetry"),  # no such class: skipped
                alert("SomethingElse", task_type="code"),  # routed to the default receiver only
            ],
        )

        def held() -> bool:
            status, body = http_get(am_url + "/api/v2/alerts?active=true")
            return status == 200 and len(json.loads(body)) == 3

        wait_until("alertmanager holds the alerts", held, 30, stack.procs)
        cfg = config.parse_text(
            f"""
pools:
  - {{name: spec-k4, url: "http://127.0.0.1:9", engine: vllm, num_speculative_tokens: 4}}
  - {{name: nospec, url: "http://127.0.0.1:9", engine: vllm, num_speculative_tokens: 0}}
guard: {{interval_seconds: 3600}}
server: {{insecure_loopback: true}}
actuators: {{plan_file: "{tmp_path / "plan.json"}"}}
alertmanager: {{url: "{am_url}", receiver: specguard}}
""",
            "readback.yaml",
        )
        guard, _ = guard_wiring.build(Monitor(cfg), cfg)
        started = time.monotonic()
        await guard.start()
        try:
            await asyncio.wait_for(guard.readback, 30)  # in the background: start() does not wait
            alerts = guard.status()["alerts"]
        finally:
            await guard.stop()
    assert time.monotonic() - started < 30
    assert [(a["alertname"], a["status"], a["labels"]["task_type"]) for a in alerts] == [
        ("SpecGuardRelativeCostAboveOne", "firing", "creative")
    ]
    assert guard.counters.webhook_alerts[("firing", "restored")] == 1
    stored = json.loads((tmp_path / "plan.json").read_text())
    assert [a["labels"]["task_type"] for a in stored["alerts"]] == ["creative"]  # kept with the plan
