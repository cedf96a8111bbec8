"""End to end on a real stack, loopback only, bounded: the engine simulator's pools,
`specguard run` (tap + exporter + guard), Debian's Prometheus scraping it with the shipped rules,
and Debian's Alertmanager with the shipped routing delivering to specguard's own receiver
(POST /api/v1/alerts, bearer token) and to a recorder that keeps the raw payloads.

Traffic mixes a class that speculation hurts (creative at temperature 1: almost every round
rolls back, it costs more than it saves) with classes it helps (code and extraction at
temperature 0). The guard's local rules are dry-run here, so only the alert path can move a
class. Asserted: the exporter exposes the contract's metric families; Prometheus evaluates every
shipped rule without error; the recording rules produce the per-class series and separate the
losing class from the winning ones; SpecGuardFullRollbackRatioHigh fires for the losing class
only; Alertmanager delivers it (v4 payload, bearer token) and specguard accepts it; the guard
moves the losing class off speculation and keeps the others on it; the decision shows in
/metrics and in Prometheus. The dashboard's queries are checked by test_dashboard_data.py.

The RC-alert variant (SpecGuardRelativeCostAboveOne as the trigger) is test_guard_e2e.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from stackhelp import (
    TOKEN,
    Receiver,
    Stack,
    control_url,
    drive_load,
    http_get,
    http_post,
    moved_off,
    specguard_config,
    wait_until,
)

pytestmark = pytest.mark.stack

# tap/exporter metric families of the team contract, `_total` stripped as the parser does
EXPORTER_FAMILIES = {
    "specguard_requests",
    "specguard_spec_requests",
    "specguard_output_tokens",
    "specguard_verify_rounds",
    "specguard_draft_tokens",
    "specguard_accepted_tokens",
    "specguard_full_rollback_rounds",
    "specguard_full_rollback_requests",
    "specguard_decode_seconds",
    "specguard_decode_tokens",
    "specguard_time_per_output_token_seconds",
    "specguard_accepted_per_position",
    "specguard_unattributed_requests",
    "specguard_unclassified_requests",
    "specguard_upstream_errors",
    "specguard_pool_in_flight_requests",
    "specguard_engine_up",
    "specguard_scrape_duration_seconds",
    "specguard_engine_counter_resets",
    "specguard_engine_verify_rounds",
    "specguard_engine_draft_tokens",
    "specguard_engine_accepted_tokens",
    "specguard_engine_generation_tokens",
}
# guard families: exported once `specguard run` wires the guard in
GUARD_FAMILIES = {
    "specguard_speculation_enabled", "specguard_num_speculative_tokens", "specguard_plan_info",
    "specguard_actions", "specguard_evaluations", "specguard_last_evaluation_timestamp_seconds",
    "specguard_guard_frozen", "specguard_consecutive_errors", "specguard_webhook_alerts",
    "specguard_audit_write_errors", "specguard_config_info",
}  # fmt: skip
CREATIVE = 'task_type="creative",temperature_bucket="high",pool="spec-k4"'
CODE = 'task_type="code",temperature_bucket="greedy",pool="spec-k4"'


def test_stack_end_to_end(tmp_path: Path):
    results: list = []
    with Stack(tmp_path) as stack, Receiver() as receiver:
        pools = stack.start_sim(time_scale=0.05)
        config = specguard_config(pools, tmp_path)
        for rule in config["guard"]["rules"]:
            rule["dry_run"] = True  # only an alert may move a class in this test
        config["guard"]["best_pool"] = False  # nor may the cheapest-pool choice (the alert would then
        # rightly stay silent: it reads the pool the class is planned on)
        specguard = stack.start_specguard(config)
        am_url = stack.start_alertmanager(control_url(specguard) + "/api/v1/alerts", receiver.url)
        prom = stack.start_prometheus(specguard, am_url)
        load = drive_load(specguard, 25, results)
        t0 = time.monotonic()
        timings = {}

        # the exporter exposes the contract's families
        status, body = http_get(specguard + "/metrics")
        assert status == 200
        families = {f.name for f in text_string_to_metric_families(body.decode())}
        assert EXPORTER_FAMILIES | GUARD_FAMILIES <= families, sorted(
            (EXPORTER_FAMILIES | GUARD_FAMILIES) - families
        )

        # Prometheus scrapes specguard and every shipped rule evaluates cleanly
        wait_until(
            "specguard scraped",
            lambda: (
                prom.value('up{job="specguard"}')
                and list(prom.value('up{job="specguard"}').values()) == [1.0]
            ),
            20,
            stack.procs,
        )
        groups = wait_until(
            "rules evaluated",
            lambda: [
                g
                for g in prom.api("rules")["groups"]
                if all(r.get("lastEvaluation", "0001")[:4] != "0001" for r in g["rules"])
            ],
            20,
            stack.procs,
        )
        assert {g["name"] for g in groups} == {"specguard.rules", "specguard.alerts"}
        for group in groups:
            for rule in group["rules"]:
                assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))

        # recording rules separate the losing class from the winning one
        def both(expr: str):
            got = prom.value(f"{expr}{{{CREATIVE}}}"), prom.value(f"{expr}{{{CODE}}}")
            return got if all(got) else None

        alpha = wait_until(
            "accept-rate series for creative and code",
            lambda: both("pool_class:specguard_accepted_tokens_per_draft_tokens:ratio_rate5m"),
            30,
            stack.procs,
        )
        creative_alpha, code_alpha = (max(v.values()) for v in alpha)
        assert creative_alpha < 0.15 < 0.5 < code_alpha, (creative_alpha, code_alpha)
        creative_len, code_len = (
            max(v.values()) for v in both("pool_class:specguard_accept_length:ratio_rate5m")
        )
        assert 1.0 <= creative_len < 1.5 and code_len > 2.5, (creative_len, code_len)
        rollback = both("pool_class:specguard_full_rollback_rounds_per_verify_rounds:ratio_rate5m")
        creative_fr, code_fr = (max(v.values()) for v in rollback)
        assert creative_fr > 0.8 and code_fr < 0.4, (creative_fr, code_fr)
        tpot = prom.value('pool_load:specguard_decode_seconds_per_decode_tokens:ratio_rate5m{pool="spec-k4"}')
        assert tpot and all(v > 0 for v in tpot.values())
        positions = prom.value(
            "pool_class:specguard_accepted_per_position_per_verify_rounds:ratio_rate5m"
            '{task_type="code",temperature_bucket="greedy",pool="spec-k4"}'
        )
        by_pos = {dict(k)["position"]: v for k, v in positions.items()}
        assert by_pos["0"] >= by_pos["1"] >= by_pos["3"] > 0, by_pos

        # the full-rollback alert fires for the losing class and Alertmanager delivers it
        firing = 'ALERTS{alertname="SpecGuardFullRollbackRatioHigh",alertstate="firing"}'
        alerts = wait_until(
            "SpecGuardFullRollbackRatioHigh firing", lambda: prom.value(firing), 30, stack.procs
        )
        timings["alert firing"] = time.monotonic() - t0
        classes = {dict(k)["task_type"] for k in alerts}
        assert "creative" in classes and "code" not in classes, classes

        def delivered():
            return [
                (auth, a)
                for _, auth, payload in receiver.received
                for a in payload["alerts"]
                if a["labels"]["alertname"] == "SpecGuardFullRollbackRatioHigh" and a["status"] == "firing"
            ]

        auth, alert = wait_until("webhook delivery", delivered, 20, stack.procs)[0]
        timings["delivered"] = time.monotonic() - t0
        assert auth == f"Bearer {TOKEN}"
        assert alert["labels"]["task_type"] == "creative" and alert["labels"]["severity"] == "warning"
        assert alert["annotations"]["runbook_url"].endswith("#specguardfullrollbackratiohigh")
        assert receiver.received[0][2]["version"] == "4"

        # specguard's receiver refuses a post without the token ...
        status, _ = http_post(control_url(specguard) + "/api/v1/alerts", receiver.received[0][2])
        assert status in (401, 403), status

        # ... accepted Alertmanager's, and the guard moved the losing class off speculation
        _, plan, samples = wait_until(
            "creative moved off speculation",
            lambda: moved_off(specguard, "creative", "high"),
            30,
            stack.procs,
        )
        timings["class moved"] = time.monotonic() - t0
        code = [pool for key, pool in plan.items() if key[:2] == ("code", "greedy")]
        assert code and "nospec" not in code, plan
        enabled = {
            (s.labels["task_type"], s.labels["temperature_bucket"], s.labels["load_bucket"]): s.value
            for s in samples
            if s.name == "specguard_speculation_enabled"
        }
        assert {v for k, v in enabled.items() if k[:2] == ("creative", "high")} == {0.0}, enabled
        assert {v for k, v in enabled.items() if k[:2] == ("code", "greedy")} == {1.0}, enabled
        actions = [
            s for s in samples if s.name == "specguard_actions_total" and s.labels["task_type"] == "creative"
        ]
        assert sum(s.value for s in actions) >= 1, actions
        wait_until(
            "decision scraped by Prometheus",
            lambda: prom.value(
                "class_load:specguard_speculation_enabled:max"
                '{task_type="creative",temperature_bucket="high"} == 0'
            ),
            15,
            stack.procs,
        )

        print("seconds after load start:", {k: round(v, 1) for k, v in timings.items()})

        load.join(timeout=60)
    assert results and sum(r.status == 200 for r in results) / len(results) > 0.95
