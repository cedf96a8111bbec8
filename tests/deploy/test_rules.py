"""deploy/prometheus: promtool check + unit tests, and the alert conventions (ops-conventions §2)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from deployhelp import (
    BUILTIN,
    EXPORTED,
    RULE_TESTS,
    RULES,
    RUNBOOKS,
    alerting_rules,
    load_rules,
    metric_names,
    promtool,
    recording_names,
    run_promtool,
)

LEVELS = {"pool_class_load", "pool_class", "pool_load", "class_load"}
RUNBOOK_BASE = "https://github.com/specguard/specguard/blob/main/docs/runbooks.md#"


def test_promtool_check_rules_passes():
    out = run_promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    n = sum(len(g["rules"]) for g in load_rules()["groups"])
    assert f"SUCCESS: {n} rules found" in out.stdout


def test_promtool_unit_tests_pass():
    assert RULE_TESTS, "no promtool test files in deploy/prometheus/tests"
    out = run_promtool("test", "rules", *map(str, RULE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_rejects_a_broken_rule(tmp_path: Path):
    # the gate is real: a rule with a PromQL syntax error fails the check
    bad = tmp_path / "bad.yaml"
    bad.write_text(RULES.read_text().replace("specguard_engine_up == 0", "specguard_engine_up == == 0"))
    out = run_promtool("check", "rules", str(bad))
    assert out.returncode != 0


def test_rules_avoid_fields_promtool_2_42_rejects():
    for group in load_rules()["groups"]:
        assert set(group) <= {"name", "interval", "limit", "rules"}, group["name"]


@pytest.mark.parametrize("name", sorted(recording_names()))
def test_recording_rule_names_follow_level_metric_operations(name: str):
    level, metric, ops = name.split(":")
    assert level in LEVELS
    assert metric.startswith("specguard_") and not metric.endswith("_total")
    assert re.fullmatch(r"(ratio_)?rate(5m|1h)|ratio|max|sum", ops), ops


def test_ratios_are_computed_from_aggregated_counters_not_averaged():
    for group in load_rules()["groups"]:
        for rule in group["rules"]:
            assert "avg" not in rule["expr"], rule.get("record") or rule.get("alert")
            # a ratio divides with a guarded denominator, or selects from a recorded ratio
            if rule.get("record", "").endswith(("ratio_rate5m", "ratio_rate1h")) and "/" in rule["expr"]:
                assert "> 0)" in rule["expr"], f"{rule['record']}: unguarded denominator"


def test_rules_only_use_exported_or_recorded_metrics():
    known = EXPORTED | recording_names() | BUILTIN  # (SpecGuardDown reads Prometheus's own `up`)
    for group in load_rules()["groups"]:
        for rule in group["rules"]:
            unknown = metric_names(rule["expr"]) - known
            assert not unknown, f"{rule.get('record') or rule.get('alert')}: {sorted(unknown)}"


def runbook_sections() -> dict[str, str]:
    """docs/runbooks.md: GitHub-style anchor of each '## ' heading -> the text of its section."""
    parts = re.split(r"(?m)^##\s+(.+)$", RUNBOOKS.read_text())
    return {
        re.sub(r"[^a-z0-9 -]", "", head.strip().lower()).replace(" ", "-"): body
        for head, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def runbook_anchors() -> set[str]:
    return set(runbook_sections())


ALERTS = alerting_rules()
EXPECTED_ALERTS = {
    "SpecGuardRelativeCostAboveOne",
    "SpecGuardScheduledClassLoses",
    "SpecGuardFullRollbackRatioHigh",
    "SpecGuardAcceptanceCollapseAfterReenable",
    "SpecGuardEngineScrapeFailing",
    "SpecGuardEvaluationStale",
    "SpecGuardFlapping",
    "SpecGuardFrozen",
    "SpecGuardPoolDown",
    "SpecGuardPoolEjected",
    "SpecGuardDown",
    "SpecGuardUpstreamErrors",
    "SpecGuardPlanStale",
    "SpecGuardBaselineMissing",
    "SpecGuardRuleEvaluationsMissed",
    "SpecGuardRuleGroupSlow",
}


def test_the_alert_set_is_complete():
    assert {a["alert"] for a in ALERTS} == EXPECTED_ALERTS


@pytest.mark.parametrize("rule", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_alert_conventions(rule: dict):
    assert rule["alert"].startswith("SpecGuard") and re.fullmatch(r"[A-Z][A-Za-z]+", rule["alert"])
    assert "for" in rule and "keep_firing_for" in rule
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    assert "$value" not in str(rule["labels"]), "values belong in annotations, not identity labels"
    ann = rule["annotations"]
    assert ann["summary"][0].isupper() and ann["summary"].endswith(".") and "{{" not in ann["summary"]
    assert "{{" in ann["description"], "description is templated per instance"
    assert ann["runbook_url"] == RUNBOOK_BASE + rule["alert"].lower()
    assert rule["alert"].lower() in runbook_anchors(), f"no '## {rule['alert']}' in docs/runbooks.md"


@pytest.mark.parametrize("rule", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_the_runbook_says_when_the_alert_fires_and_resolves(rule: dict):
    """A runbook once said the RC alert "resolves once the guard moves the class";
    it keeps firing 15 minutes more (keep_firing_for). Each runbook names both durations."""
    section = runbook_sections()[rule["alert"].lower()]
    timing = f"`for: {rule['for']}`, `keep_firing_for: {rule['keep_firing_for']}`"
    assert timing in section, f"{rule['alert']}: the runbook must say {timing}"


def alert_cases() -> dict[str, tuple[int, int]]:
    """alertname -> (cases asserting not firing, cases asserting firing) over all promtool tests."""
    seen: dict[str, list[int]] = {}
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                quiet, firing = seen.setdefault(case["alertname"], [0, 0])
                if case.get("exp_alerts"):
                    seen[case["alertname"]][1] += 1
                else:
                    seen[case["alertname"]][0] += 1
    return {k: (v[0], v[1]) for k, v in seen.items()}


def test_every_alert_is_tested_on_both_sides_of_its_for_boundary():
    cases = alert_cases()
    for name in EXPECTED_ALERTS:
        quiet, firing = cases.get(name, (0, 0))
        assert quiet >= 1 and firing >= 1, f"{name}: {quiet} not-firing and {firing} firing cases"


@pytest.fixture(scope="module")
def shifted_runs(tmp_path_factory) -> dict[str, tuple[int, str]]:
    """promtool's verdict on the unit tests with each alert's `for` one minute longer.

    The seven runs are started together: promtool mostly waits, so they overlap well."""
    text = RULES.read_text()
    procs = {}
    for rule in ALERTS:
        start = text.index(f"- alert: {rule['alert']}\n")
        tail = text[start:].replace(f"for: {rule['for']}\n", f"for: {int(rule['for'][:-1]) + 1}m\n", 1)
        shifted = tmp_path_factory.mktemp(rule["alert"]) / "prometheus"
        (shifted / "tests").mkdir(parents=True)
        (shifted / "specguard-rules.yaml").write_text(text[:start] + tail)
        for path in RULE_TESTS:
            (shifted / "tests" / path.name).write_text(path.read_text())
        argv = [promtool(), "test", "rules", *[str(shifted / "tests" / p.name) for p in RULE_TESTS]]
        procs[rule["alert"]] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    out = {}
    for name, proc in procs.items():
        with proc:
            output, _ = proc.communicate(timeout=60)
            out[name] = (proc.returncode, output)
    return out


@pytest.mark.parametrize("rule", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_unit_tests_pin_the_for_boundary(rule: dict, shifted_runs: dict):
    # one minute more of `for` must break the unit tests: the boundary cases are tight
    returncode, output = shifted_runs[rule["alert"]]
    assert returncode != 0
    assert rule["alert"] in output
