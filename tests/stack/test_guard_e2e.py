"""The RC half of the real-stack test: RC alert -> Alertmanager -> specguard -> routing change.

`specguard run` (tap + exporter + cost model + guard), `specguard simulate`, Debian's Prometheus
with the shipped rules (only `for` shortened, see stackhelp.stack_rules) and Debian's
Alertmanager with the shipped routing narrowed to SpecGuardRelativeCostAboveOne (so this alert
is the only possible trigger), delivering to specguard's receiver (bearer token) and to a
recorder. The guard's local rules are dry-run and its cheapest-pool choice is off, so only the
alert path can move a class.

Traffic: creative at temperature 1 (speculation costs more than it saves) next to code and
extraction at temperature 0 (it pays). Asserted: specguard exports RC and the recording rule
puts creative above 1.0 and code below; SpecGuardRelativeCostAboveOne fires for creative only;
Alertmanager delivers it; the guard moves creative off the speculative pool and leaves code on
it (specguard_plan_info / specguard_speculation_enabled in /metrics and in Prometheus). The
dashboard's queries are test_dashboard_data.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from stackhelp import (
    TOKEN,
    Receiver,
    Stack,
    control_url,
    drive_load,
    moved_off,
    specguard_config,
    wait_until,
)

pytestmark = pytest.mark.stack

CREATIVE = 'task_type="creative",temperature_bucket="high"'
RC_ALERT = "SpecGuardRelativeCostAboveOne"
CODE = 'task_type="code",temperature_bucket="greedy"'


def guard_config(pools: dict[str, str], workdir: Path) -> dict:
    config = specguard_config(pools, workdir)
    for rule in config["guard"]["rules"]:
        rule["dry_run"] = True  # the local rules only measure here: the alert is what moves the class
    config["guard"]["best_pool"] = False  # nor may the cheapest-pool choice move it
    return config


def test_alert_moves_the_losing_class_off_speculation(tmp_path: Path):
    results: list = []
    with Stack(tmp_path) as stack, Receiver() as receiver:
        # Slow enough that the modelled step times, not the relay's per-chunk overhead on a busy
        # machine, decide RC: that overhead weighs more on the no-spec pool (one token a chunk) and
        # once pulled creative's RC down to 0.85 at time scale 0.05.
        pools = stack.start_sim(time_scale=0.15)
        specguard = stack.start_specguard(guard_config(pools, tmp_path))
        am_url = stack.start_alertmanager(
            control_url(specguard) + "/api/v1/alerts", receiver.url, only=RC_ALERT
        )
        prom = stack.start_prometheus(specguard, am_url)
        load = drive_load(specguard, 28, results, seed=2)
        t0 = time.monotonic()
        timings = {}

        # RC is exported and the recording rule separates the classes
        rc = "pool_class_load:specguard_relative_cost_per_token:ratio"
        # (above 1.0 within the wait: in a full suite the first point, from a few requests on a
        # busy machine, once read 0.84; the alert below still has to fire for creative alone)
        creative_rc = wait_until(
            "RC recorded for creative on spec-k4 above 1.0",
            lambda: {k: v for k, v in prom.value(f'{rc}{{{CREATIVE},pool="spec-k4"}}').items() if v > 1.0},
            40,
            stack.procs,
        )
        assert max(creative_rc.values()) > 1.0, creative_rc
        code_rc = wait_until(
            "RC for code", lambda: prom.value(f'{rc}{{{CODE},pool="spec-k4"}}'), 30, stack.procs
        )
        assert min(code_rc.values()) < 1.0, code_rc

        # the RC alert fires for the losing class only
        firing = f'ALERTS{{alertname="{RC_ALERT}",alertstate="firing"}}'
        alerts = wait_until(f"{RC_ALERT} firing", lambda: prom.value(firing), 30, stack.procs)
        timings["alert firing"] = time.monotonic() - t0
        assert {dict(k)["task_type"] for k in alerts} == {"creative"}, alerts
        posted = wait_until("RC alert delivered", lambda: receiver.received, 20, stack.procs)
        timings["delivered"] = time.monotonic() - t0
        names = {a["labels"]["alertname"] for _, _, payload in posted for a in payload["alerts"]}
        assert names == {RC_ALERT}, names
        assert posted[0][1] == f"Bearer {TOKEN}"

        # Alertmanager delivers it to specguard, and the guard moves creative off speculation
        delivered, plan, samples = wait_until(
            "creative moved off speculation",
            lambda: moved_off(specguard, "creative", "high"),
            40,
            stack.procs,
        )
        timings["class moved"] = time.monotonic() - t0
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

        print("seconds after load start:", {k: round(v, 1) for k, v in timings.items()})
        load.join(timeout=90)
    assert results and sum(r.status == 200 for r in results) / len(results) > 0.95
