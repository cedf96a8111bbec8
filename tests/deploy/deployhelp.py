"""Shared paths and the metric-name contract for the deploy/ tests."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "specguard-rules.yaml"
RULE_TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yaml"))
DASHBOARD = DEPLOY / "grafana" / "specguard-overview.json"
RUNBOOKS = DEPLOY.parent / "docs" / "runbooks.md"  # one "## AlertName" section per alert
KUSTOMIZE_DIR = DEPLOY / "kubernetes"

# Metric names exported by specguard (team contract, notes/contracts.md "Metric names").
# tests/stack checks that a running specguard really exposes the ones it can.
EXPORTED = frozenset(
    """
    specguard_requests_total specguard_spec_requests_total specguard_output_tokens_total
    specguard_verify_rounds_total specguard_draft_tokens_total specguard_accepted_tokens_total
    specguard_full_rollback_rounds_total specguard_full_rollback_requests_total
    specguard_decode_seconds_total specguard_decode_tokens_total
    specguard_time_per_output_token_seconds specguard_time_per_output_token_seconds_bucket
    specguard_time_per_output_token_seconds_sum specguard_time_per_output_token_seconds_count
    specguard_accepted_per_position_total specguard_unattributed_requests_total
    specguard_unclassified_requests_total specguard_upstream_errors_total specguard_pool_in_flight_requests
    specguard_engine_up specguard_scrape_duration_seconds specguard_engine_counter_resets_total
    specguard_engine_verify_rounds_total specguard_engine_draft_tokens_total
    specguard_engine_accepted_tokens_total specguard_engine_generation_tokens_total
    specguard_relative_cost_per_token_ratio specguard_relative_cost_per_token_lower_ratio
    specguard_relative_cost_per_token_upper_ratio specguard_relative_cost_samples
    specguard_relative_cost_baseline_info specguard_predicted_relative_cost_per_token_ratio
    specguard_schedule_speculative_tokens specguard_schedule_class_loses
    specguard_speculation_enabled specguard_num_speculative_tokens specguard_plan_info
    specguard_actions_total specguard_evaluations_total specguard_last_evaluation_timestamp_seconds
    specguard_guard_frozen specguard_consecutive_errors specguard_webhook_alerts_total
    specguard_pool_healthy specguard_failover_requests_total specguard_pool_ejections_total
    specguard_tap_refused_requests_total specguard_scrape_non_finite_samples_total
    specguard_api_auth_failures_total
    specguard_audit_write_errors_total specguard_config_info specguard_actuation_errors_total
    specguard_plan_write_errors_total specguard_plan_version specguard_policy_reloads_total
    specguard_plan_age_seconds specguard_guard_leader specguard_last_evaluation_duration_seconds
    specguard_pool_desired_replicas
    specguard_baseline_available specguard_relative_cost_evidence_info
    """.split()
)
# Agreed names other issues are adding (tools CROSS.md): the dashboard may use them before they
# land; tests/stack/test_dashboard_data.py lists the panels that stay empty until then.
PENDING: frozenset[str] = frozenset()
# Series Prometheus itself provides.
BUILTIN = frozenset({"ALERTS", "ALERTS_FOR_STATE", "up"})

NAME_RE = re.compile(
    r"\b([a-zA-Z_][a-zA-Z0-9_]*(?::[a-zA-Z0-9_]+)+|specguard_[a-zA-Z0-9_]+|ALERTS|up(?=\{))\b"
)


def load_rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def recording_names() -> set[str]:
    return {r["record"] for g in load_rules()["groups"] for r in g["rules"] if "record" in r}


def alerting_rules() -> list[dict]:
    return [r for g in load_rules()["groups"] for r in g["rules"] if "alert" in r]


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (specguard_*, recording rules, ALERTS, up{...})."""
    # label names never start with specguard_ nor contain colons, so they do not match
    return set(NAME_RE.findall(expr))


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: install Debian's `prometheus` package (scripts/test does)"
    return path


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60, cwd=cwd)
