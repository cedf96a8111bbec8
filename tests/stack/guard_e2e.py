"""The guard half of the real-stack test: alert -> Alertmanager -> specguard -> routing change.

`specguard run` with the guard wired in (guard_wiring.configure in run.CONFIGURERS), the
simulator pools, Debian's Prometheus with the shipped rules (only `for` shortened, see
stackhelp.stack_rules) and Debian's Alertmanager with the shipped routing, delivering to
specguard's own receiver (POST /api/v1/alerts, bearer token). The guard's local RC rule is
dry-run here, so the only thing that can move a class is the alert path.

Traffic: creative at temperature 1 (speculation costs more than it saves) next to code and
extraction at temperature 0 (it pays). Asserted: specguard exports RC and the recording rule
puts creative above 1.0 and code below; SpecGuardRelativeCostAboveOne fires for creative only;
Alertmanager delivers it to specguard (specguard_webhook_alerts_total); the guard moves
creative off the speculative pool (specguard_plan_info / specguard_speculation_enabled in
/metrics and in Prometheus) and leaves code on it; every dashboard expression returns data.

Not collected by default until the guard is wired into `specguard run`: run it explicitly with
`python3 -m pytest tests/stack/guard_e2e.py`, and rename it to test_guard_e2e.py to switch it on.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from stackhelp import (
    Stack,
    dashboard_exprs,
    http_get,
    metric_names,
    specguard_config,
    substitute,
    wait_until,
)

from specguard.monitor import loadgen

pytestmark = pytest.mark.stack

MIX = [
    loadgen.RequestClass("creative", weight=2, temperature=1.0, max_tokens=96),
    loadgen.RequestClass("code", weight=1, temperature=0.0, max_tokens=96),
    loadgen.RequestClass("extraction", weight=1, temperature=0.0, max_tokens=64),
]
CREATIVE = 'task_type="creative",temperature_bucket="high"'
CODE = 'task_type="code",temperature_bucket="greedy"'


def guard_config(pools: dict[str, str], workdir: Path) -> dict:
    config = specguard_config(pools, workdir)
    for rule in config["guard"]["rules"]:
        rule["dry_run"] = True  # the local rules only measure here: the alert is what moves the class
    return config


def drive_load(url: str, seconds: float, results: list) -> threading.Thread:
    def run():
        results.extend(
            asyncio.run(loadgen.run_load(url, MIX, concurrency=6, duration_s=seconds, seed=2, stream=True))
        )

    thread = threading.Thread(target=run, name="loadgen", daemon=True)
    thread.start()
    return thread


def test_alert_moves_the_losing_class_off_speculation(tmp_path: Path):
    results: list = []
    with Stack(tmp_path) as stack:
        pools = stack.start_sim(time_scale=0.05)
        specguard = stack.start_specguard(guard_config(pools, tmp_path))
        am_url = stack.start_alertmanager(specguard + "/api/v1/alerts")
        prom = stack.start_prometheus(specguard, am_url)
        load = drive_load(specguard, 45, results)

        # RC is exported and the recording rule separates the classes
        rc = "pool_class_load:specguard_relative_cost_per_token:ratio"
        creative_rc = wait_until(
            "RC recorded for creative on spec-k4",
            lambda: prom.value(f'{rc}{{{CREATIVE},pool="spec-k4"}}'),
            40,
            stack.procs,
        )
        assert max(creative_rc.values()) > 1.0, creative_rc
        code_rc = wait_until(
            "RC for code", lambda: prom.value(f'{rc}{{{CODE},pool="spec-k4"}}'), 30, stack.procs
        )
        assert min(code_rc.values()) < 1.0, code_rc

        # the RC alert fires for the losing class only
        firing = 'ALERTS{alertname="SpecGuardRelativeCostAboveOne",alertstate="firing"}'
        alerts = wait_until(
            "SpecGuardRelativeCostAboveOne firing", lambda: prom.value(firing), 30, stack.procs
        )
        assert {dict(k)["task_type"] for k in alerts} == {"creative"}, alerts

        # Alertmanager delivers it to specguard, and the guard moves creative off speculation
        def moved():
            status, body = http_get(specguard + "/metrics")
            samples = [s for f in text_string_to_metric_families(body.decode()) for s in f.samples]
            delivered = sum(
                s.value
                for s in samples
                if s.name == "specguard_webhook_alerts_total" and s.labels["status"] == "firing"
            )
            plan = {
                (s.labels["task_type"], s.labels["temperature_bucket"], s.labels["load_bucket"]): s.labels[
                    "pool"
                ]
                for s in samples
                if s.name == "specguard_plan_info" and s.value == 1
            }
            creative = {k: v for k, v in plan.items() if k[:2] == ("creative", "high")}
            off = creative and all(pool == "nospec" for pool in creative.values())
            return (delivered, plan, samples) if delivered > 0 and off else None

        delivered, plan, samples = wait_until("creative moved off speculation", moved, 40, stack.procs)
        assert all(
            pool != "nospec" for (task, temp, _), pool in plan.items() if (task, temp) == ("code", "greedy")
        )
        enabled = {
            (s.labels["task_type"], s.labels["temperature_bucket"]): s.value
            for s in samples
            if s.name == "specguard_speculation_enabled"
        }
        assert enabled[("creative", "high")] == 0 and enabled[("code", "greedy")] == 1
        actions = [
            s for s in samples if s.name == "specguard_actions_total" and s.labels["task_type"] == "creative"
        ]
        assert actions and sum(s.value for s in actions) >= 1

        # the decision reaches Prometheus too (what the dashboard and the alerts read)
        wait_until(
            "decision scraped",
            lambda: prom.value(f"class_load:specguard_speculation_enabled:max{{{CREATIVE}}} == 0"),
            15,
            stack.procs,
        )

        # every dashboard expression parses and returns data on this stack
        empty = [
            (where, sorted(metric_names(expr)))
            for where, expr in dashboard_exprs()
            if not prom.query_range(substitute(expr, interval="5s"))
        ]
        assert not empty, empty
        load.join(timeout=90)
    assert results and sum(r.status == 200 for r in results) / len(results) > 0.95
