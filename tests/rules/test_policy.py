"""The policy file: the shipped default loads, every error is reported at once with its position."""

from __future__ import annotations

import pytest

from specguard.errors import ConfigError
from specguard.rules import policy


def test_shipped_default_is_valid_and_documented():
    p = policy.load_default()
    assert [r.name for r in p.all_rules] == ["relative-cost", "full-rollback-requests", "alertmanager"]
    rc = p.rules[0]
    assert (rc.measure, rc.threshold, rc.restore_measure, rc.restore_threshold) == (
        "rc_lower",
        1.0,
        "rc_upper",
        0.95,
    )
    assert rc.limits.stabilization_window_seconds == 300 and rc.limits.consecutive_error_limit == 4
    assert p.rules[1].dry_run is True
    assert p.interval_seconds == 30 and len(p.version) == 12
    text = policy.DEFAULT_POLICY_PATH.read_text()
    for key in (
        "consecutive_failure_limit",
        "stabilization_window_seconds",
        "cooldown_seconds",
        "safe_state",
    ):
        line = next(line for line in text.splitlines() if line.strip().startswith(key))
        assert "#" in line, f"{key} is not documented"


def test_rule_overrides_global_limits():
    p = policy.parse_text(
        """
guard:
  min_samples: 50
  consecutive_failure_limit: 1
  rules:
    - {name: a, measure: rc, threshold: 1.0}
    - {name: b, measure: strict_accept_rate, direction: below, threshold: 0.2, restore_threshold: 0.3,
       min_samples: 10, interval_seconds: 60}
"""
    )
    a, b = p.rules
    assert (a.limits.min_samples, a.limits.consecutive_failure_limit, a.restore_threshold) == (50, 1, 1.0)
    assert (b.limits.min_samples, b.limits.consecutive_failure_limit, b.limits.interval_seconds) == (
        10,
        1,
        60,
    )
    assert b.is_bad(0.1) and not b.is_bad(0.25) and b.is_good(0.31) and not b.is_good(0.25)


def test_every_error_at_once_with_file_line_col():
    text = """guard:
  interval_seconds: 0
  safe_state: off
  failure_limit: -1
  consecutive_failure_limit: -1
  rules:
    - name: a
      measure: rcc
      threshold: 1.0
    - name: a
      query: 'x{a="{{ foo }}"}'
      threshold: 2
      bogus: 1
    - name: c
      threshold: 1.0
      restore_threshold: 1.2
  colour: blue
"""
    with pytest.raises(ConfigError) as info:
        policy.parse_text(text, "g.yaml")
    known_rule = (
        "consecutive_error_limit, consecutive_failure_limit, consecutive_success_limit, direction, dry_run, "
        "failure_limit, failure_window_seconds, interval_seconds, measure, min_samples, name, query, "
        "restore_measure, restore_threshold, stabilization_window_seconds, threshold"
    )
    known_guard = (
        "alerts, best_pool, best_pool_consecutive_limit, best_pool_margin, consecutive_error_limit, "
        "consecutive_failure_limit, consecutive_success_limit, "
        "cooldown_seconds, decider, default_pool, dry_run, enabled, failure_limit, failure_window_seconds, "
        "holdout, holdout_min_share, interval_seconds, local, max_actions_per_hour, memory_seconds, "
        "min_samples, nospec_pool, prior, prometheus, "
        "rc_rises_with_load, restore_on_prediction, rules, safe_state, scaling, shorten, shorten_max_rc, "
        "spread, stabilization_window_seconds, window_seconds"
    )
    measures = ", ".join(repr(m) for m in policy.MEASURES)
    assert [str(i) for i in info.value.issues] == [
        "g.yaml:2:3: guard.interval_seconds: (0.0) must be >= 1",
        "g.yaml:4:3: guard.failure_limit: "
        "failure_limit and consecutive_failure_limit cannot both be disabled (-1)",
        f"g.yaml:8:7: guard.rules[0].measure: ('rcc') must be one of {measures}",
        f"g.yaml:13:7: guard.rules[1].bogus: unknown key (known: {known_rule})",
        "g.yaml:10:7: guard.rules[1].name: duplicate rule name 'a'",
        "g.yaml:11:7: guard.rules[1].query: a rule with a query needs guard.prometheus.url",
        "g.yaml:11:7: guard.rules[1].query: unknown template variable {{ foo }} "
        "(known: task_type, temperature_bucket, load_bucket, pool, window)",
        "g.yaml:16:7: guard.rules[2].restore_threshold: "
        "(1.2) must be <= threshold (1.0) when direction is above",
        "g.yaml:3:3: guard.safe_state: must be a string, got bool False",  # YAML reads a bare `off` as false
        f"g.yaml:17:3: guard.colour: unknown key (known: {known_guard})",
    ]


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"task_type": "code", "window": "5m"}, 'rate(x{task_type="code"}[5m])'),
        ({"task_type": 'a"b', "window": "1h"}, 'rate(x{task_type="a\\"b"}[1h])'),
    ],
)
def test_query_templating_escapes_label_values(variables, expected):
    assert policy.render_query('rate(x{task_type="{{ task_type }}"}[{{window}}])', variables) == expected


@pytest.mark.parametrize(("seconds", "text"), [(300, "5m"), (3600, "1h"), (45, "45s"), (90, "90s")])
def test_window_text(seconds, text):
    assert policy.window_text(seconds) == text


def test_rc_rises_with_load_is_on_by_default_documented_and_can_be_turned_off():
    assert policy.load_default().rc_rises_with_load is True
    line = next(
        line
        for line in policy.DEFAULT_POLICY_PATH.read_text().splitlines()
        if line.strip().startswith("rc_rises_with_load")
    )
    assert "#" in line, "rc_rises_with_load is not documented"
    off = policy.parse_text("guard:\n  rc_rises_with_load: false\n  rules: []\n")
    assert off.rc_rises_with_load is False
    with pytest.raises(ConfigError, match=r"p.yaml:2:3: guard.rc_rises_with_load: must be a bool"):
        policy.parse_text("guard:\n  rc_rises_with_load: sometimes\n", "p.yaml")


def test_best_pool_prior_and_holdout_keys_are_documented_and_parsed():
    default = policy.load_default()
    assert (default.best_pool, default.prior, default.holdout) == (True, "profile", "matched_on_demand")
    text = policy.DEFAULT_POLICY_PATH.read_text().splitlines()
    for key in (
        "best_pool",
        "best_pool_margin",
        "best_pool_consecutive_limit",
        "memory_seconds",
        "prior",
        "holdout",
    ):
        line = next(line for line in text if line.strip().startswith(f"{key}:"))
        assert "#" in line, f"{key} is not documented"
    p = policy.parse_text(
        "guard:\n  best_pool: false\n  best_pool_margin: 0.05\n  best_pool_consecutive_limit: 0\n"
        "  memory_seconds: 600\n  prior: none\n  holdout: fixed\n  holdout_min_share: 0.01\n  rules: []\n"
    )
    assert (p.best_pool, p.best_pool_margin, p.best_pool_consecutive_limit, p.memory_seconds) == (
        False,
        0.05,
        0,
        600,
    )
    assert (p.prior, p.holdout, p.holdout_min_share) == ("none", "fixed", 0.01)


def test_best_pool_prior_and_holdout_errors_name_file_line_col():
    with pytest.raises(ConfigError) as info:
        policy.parse_text(
            "guard:\n  best_pool_margin: 0.9\n  prior: sweep\n  holdout: sometimes\n"
            "  holdout_min_share: -1\n",
            "p.yaml",
        )
    text = str(info.value)
    assert "p.yaml:2:3: guard.best_pool_margin:" in text
    assert "p.yaml:3:3: guard.prior:" in text and "profile" in text
    assert "p.yaml:4:3: guard.holdout:" in text and "on_demand" in text
    assert "p.yaml:5:3: guard.holdout_min_share:" in text


def test_a_guard_section_without_rules_gets_the_shipped_rules_with_its_own_limits():
    """`guard:` without `rules:` once silently had no rules (nothing to do, forever)."""
    p = policy.parse_text("guard:\n  dry_run: true\n  min_samples: 8\n  interval_seconds: 15\n")
    shipped = policy.load_default()
    assert (
        [r.name for r in p.rules]
        == [r.name for r in shipped.rules]
        == [
            "relative-cost",
            "full-rollback-requests",
        ]
    )
    assert p.default_rules and not shipped.default_rules
    assert all(r.limits.min_samples == 8 and r.limits.interval_seconds == 15 for r in p.rules)
    assert [(r.measure, r.threshold, r.dry_run) for r in p.rules] == [
        (r.measure, r.threshold, r.dry_run) for r in shipped.rules
    ]
    # an explicit empty list is "no rules": Alertmanager alerts alone move classes
    empty = policy.parse_text("guard:\n  rules: []\n")
    assert empty.rules == () and not empty.default_rules
    with pytest.raises(ConfigError, match="no rules and alerts disabled"):
        policy.parse_text("guard:\n  rules: []\n  alerts: {enabled: false}\n")


def test_the_planner_needs_the_local_window():
    assert policy.parse_text("guard:\n  decider: planner\n").decider == "planner"
    with pytest.raises(ConfigError, match=r"p.yaml:2:3: guard.decider: planner plans from the tap's own"):
        policy.parse_text("guard:\n  decider: planner\n  local: false\n", "p.yaml")


def test_scaling_comes_with_the_planner_and_its_bounds_are_checked():
    found = policy.parse_text(
        "guard:\n  decider: planner\n"
        "  scaling: {target_in_flight: 8, start_delay_seconds: 90, max_replicas: 6}\n"
    )
    assert found.scaling == policy.Scaling(8.0, 90.0, 1, 6) and found.scaling.sustain == 90.0
    at_once = policy.parse_text("guard:\n  decider: planner\n  scaling: {sustain_seconds: 0}\n").scaling
    assert at_once is not None and at_once.sustain == 0.0 and at_once.start_delay_seconds == 120.0
    assert policy.parse_text("guard:\n  decider: planner\n").scaling is None
    with pytest.raises(ConfigError, match=r"guard.scaling.sustain_seconds: \(-1.0\) must be >= 0"):
        policy.parse_text("guard:\n  decider: planner\n  scaling: {sustain_seconds: -1}\n")
    with pytest.raises(ConfigError) as info:
        policy.parse_text(
            "guard:\n  scaling:\n    min_replicas: 3\n    max_replicas: 2\n    target: 4\n", "p.yaml"
        )
    text = str(info.value)
    assert "p.yaml:4:5: guard.scaling.max_replicas: (2) is below min_replicas (3)" in text
    assert "p.yaml:5:5: guard.scaling.target: unknown key" in text
    assert "guard.scaling: desired replicas come from the fleet plan: set decider: planner" in text
