"""Build deploy/grafana/specguard-overview.json (Grafana classic dashboard JSON).

The JSON is committed; this script is its source, so ids, grid positions, the templated
datasource and the label selectors stay consistent. tests/deploy/test_dashboard.py fails
when the committed file differs from what this script prints, and lints the result.

    python3 deploy/grafana/build_dashboard.py > deploy/grafana/specguard-overview.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

UID = "specguard-overview"
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
# label selectors: job filter everywhere; class/pool filters where the series has the labels
JOB = 'job=~"$job"'
POOL = f'{JOB},pool=~"$pool"'
CLS = f'{POOL},task_type=~"$task_type",temperature_bucket=~"$temperature_bucket",load_bucket=~"$load_bucket"'
CLS_NOPOOL = (
    f'{JOB},task_type=~"$task_type",temperature_bucket=~"$temperature_bucket",load_bucket=~"$load_bucket"'
)
ACTION_BY = "task_type, temperature_bucket, action, reason"
NAN_MAPPING = [{"type": "special", "options": {"match": "nan", "result": {"text": "No traffic", "index": 0}}}]


def rate(metric: str, sel: str = CLS) -> str:
    return f"rate({metric}{{{sel}}}[{RI}])"


def ratio(num: str, den: str, by: str, sel: str = CLS) -> str:
    """sum(rate(num)) / (sum(rate(den)) > 0), both aggregated by the same labels ("" = all)."""
    agg = f"sum by ({by})" if by else "sum"
    return f"{agg} ({rate(num, sel)})\n/\n({agg} ({rate(den, sel)}) > 0)"


def target(expr: str, legend: str, ref: str = "A", instant: bool = False, fmt: str = "time_series") -> dict:
    t: dict[str, Any] = {
        "datasource": DS,
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
        "range": not instant,
        "instant": instant,
        "format": fmt,
    }
    return t


def panel(
    title: str,
    description: str,
    targets: list[dict],
    unit: str,
    kind: str = "timeseries",
    w: int = 12,
    h: int = 8,
    minmax: tuple[float, float] | None = None,
    threshold: float | None = None,
    mappings: list[dict] | None = None,
    options: dict | None = None,
) -> dict:
    defaults: dict[str, Any] = {"unit": unit, "mappings": mappings or []}
    if minmax is not None:
        defaults["min"], defaults["max"] = minmax
    if threshold is not None:
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}, {"color": "red", "value": threshold}],
        }
        if kind == "timeseries":
            defaults["custom"] = {"thresholdsStyle": {"mode": "line+area"}}
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options or {},
        "targets": targets,
        "gridPos": {"w": w, "h": h},
    }


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def variable(name: str, label: str, metric: str, sel: str) -> dict:
    query = f"label_values({metric}{{{sel}}}, {name})"
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-query"},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".+",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def panels() -> list[dict]:
    by_cls = "task_type, temperature_bucket"
    return [
        row("Verdict: does speculation pay, per class?"),
        panel(
            "Relative cost per token (RC) per class",
            "RC = time per output token with speculation / without, at the same load bucket "
            "(specguard's cost model; recording rule pool_class_load:specguard_relative_cost_per_token:ratio "
            "from specguard_relative_cost_per_token_ratio weighted by specguard_relative_cost_samples). "
            "Above the red 1.0 line, speculation slows this class down.",
            [
                target(
                    f"pool_class_load:specguard_relative_cost_per_token:ratio{{{CLS}}}",
                    "{{task_type}}/{{temperature_bucket}} @ {{load_bucket}} on {{pool}}",
                )
            ],
            "none",
            w=16,
            threshold=1.0,
            mappings=NAN_MAPPING,
        ),
        panel(
            "Worst RC now",
            "Highest current relative cost per token over the selected classes "
            "(pool_class_load:specguard_relative_cost_per_token:ratio). Red at or above 1.0.",
            [target(f"max(pool_class_load:specguard_relative_cost_per_token:ratio{{{CLS}}})", "worst RC")],
            "none",
            kind="stat",
            w=4,
            threshold=1.0,
            mappings=NAN_MAPPING,
        ),
        panel(
            "Classes with RC above 1.0",
            "Number of (class, load bucket, pool) cells whose relative cost per token is above 1.0 "
            "(pool_class_load:specguard_relative_cost_per_token:ratio > 1).",
            [
                target(
                    f"count(pool_class_load:specguard_relative_cost_per_token:ratio{{{CLS}}} > 1)"
                    " or vector(0)",
                    "cells above 1.0",
                )
            ],
            "short",
            kind="stat",
            w=4,
            threshold=1.0,
        ),
        panel(
            "RC bounds and evidence now",
            "Per class: RC point estimate with its lower/upper confidence bound "
            "(specguard_relative_cost_per_token_{lower,upper}_ratio) and the speculative samples behind it "
            '(specguard_relative_cost_samples{side="spec"}).',
            [
                target(
                    f"max by (pool, {by_cls}, load_bucket) "
                    f"(specguard_relative_cost_per_token_lower_ratio{{{CLS}}})",
                    "lower",
                    "A",
                    instant=True,
                    fmt="table",
                ),
                target(
                    f"max by (pool, {by_cls}, load_bucket) "
                    f"(specguard_relative_cost_per_token_upper_ratio{{{CLS}}})",
                    "upper",
                    "B",
                    instant=True,
                    fmt="table",
                ),
                target(
                    f"sum by (pool, {by_cls}, load_bucket) "
                    f'(specguard_relative_cost_samples{{{CLS},side="spec"}})',
                    "samples",
                    "C",
                    instant=True,
                    fmt="table",
                ),
            ],
            "none",
            kind="table",
            w=24,
            options={"showHeader": True},
        ),
        row("Headline over the selected classes"),
        panel(
            "Strict accept rate",
            "Accepted draft tokens / proposed draft tokens over every selected class and pool "
            "(specguard_accepted_tokens_total / specguard_draft_tokens_total).",
            [target(ratio("specguard_accepted_tokens_total", "specguard_draft_tokens_total", ""), "alpha")],
            "percentunit",
            kind="stat",
            w=4,
            h=4,
            minmax=(0, 1),
            mappings=NAN_MAPPING,
        ),
        panel(
            "Accept length",
            "Output tokens per verify round, bonus included: 1 + accepted / rounds "
            "(specguard_accepted_tokens_total, specguard_verify_rounds_total).",
            [
                target(
                    "1 + " + ratio("specguard_accepted_tokens_total", "specguard_verify_rounds_total", ""),
                    "A",
                )
            ],
            "short",
            kind="stat",
            w=4,
            h=4,
            mappings=NAN_MAPPING,
        ),
        panel(
            "Output tokens from drafts",
            "Share of output tokens that were accepted drafts "
            "(specguard_accepted_tokens_total / specguard_output_tokens_total).",
            [
                target(
                    ratio("specguard_accepted_tokens_total", "specguard_output_tokens_total", ""),
                    "from drafts",
                )
            ],
            "percentunit",
            kind="stat",
            w=4,
            h=4,
            minmax=(0, 1),
            mappings=NAN_MAPPING,
        ),
        panel(
            "Full-rollback rounds",
            "Verify rounds that accepted no draft token / verify rounds "
            "(specguard_full_rollback_rounds_total / specguard_verify_rounds_total). Red above 50 %.",
            [
                target(
                    ratio("specguard_full_rollback_rounds_total", "specguard_verify_rounds_total", ""),
                    "rollback",
                )
            ],
            "percentunit",
            kind="stat",
            w=4,
            h=4,
            minmax=(0, 1),
            threshold=0.5,
            mappings=NAN_MAPPING,
        ),
        panel(
            "Draft tokens / s",
            "Draft tokens proposed per second, and accepted per second "
            "(specguard_draft_tokens_total, specguard_accepted_tokens_total).",
            [
                target(f"sum({rate('specguard_draft_tokens_total')})", "proposed", "A"),
                target(f"sum({rate('specguard_accepted_tokens_total')})", "accepted", "B"),
            ],
            "count:tok/s",
            kind="stat",
            w=4,
            h=4,
        ),
        panel(
            "Cells off speculation",
            "Number of (class, load bucket) cells the guard routes to a non-speculative pool "
            "(class_load:specguard_speculation_enabled:max == 0, from specguard_speculation_enabled).",
            [
                target(
                    f"count(class_load:specguard_speculation_enabled:max{{{CLS_NOPOOL}}} == 0) or vector(0)",
                    "off",
                )
            ],
            "short",
            kind="stat",
            w=4,
            h=4,
        ),
        row("Acceptance per class and temperature bucket"),
        panel(
            "Accept length per class",
            "Output tokens per verify round, bonus token included: 1 + accepted / rounds "
            "(specguard_accepted_tokens_total, specguard_verify_rounds_total; per-request data "
            "from the tap).",
            [
                target(
                    "1 + "
                    + ratio("specguard_accepted_tokens_total", "specguard_verify_rounds_total", by_cls),
                    "{{task_type}}/{{temperature_bucket}}",
                )
            ],
            "short",
            mappings=NAN_MAPPING,
        ),
        panel(
            "Strict accept rate per class",
            "Accepted draft tokens / proposed draft tokens, no bonus "
            "(specguard_accepted_tokens_total / specguard_draft_tokens_total).",
            [
                target(
                    ratio("specguard_accepted_tokens_total", "specguard_draft_tokens_total", by_cls),
                    "{{task_type}}/{{temperature_bucket}}",
                )
            ],
            "percentunit",
            minmax=(0, 1),
            mappings=NAN_MAPPING,
        ),
        panel(
            "Per-position acceptance",
            "Share of verify rounds whose first i+1 drafts were accepted, per class "
            "(specguard_accepted_per_position_total / specguard_verify_rounds_total). "
            "1 - position 0 is the round-level full-rollback ratio.",
            [
                target(
                    f"sum by ({by_cls}, position) ({rate('specguard_accepted_per_position_total')})\n"
                    f"/ ignoring (position) group_left ()\n"
                    f"(sum by ({by_cls}) ({rate('specguard_verify_rounds_total')}) > 0)",
                    "{{task_type}}/{{temperature_bucket}} pos {{position}}",
                )
            ],
            "percentunit",
            minmax=(0, 1),
            mappings=NAN_MAPPING,
        ),
        panel(
            "Full-rollback ratio per class",
            "Round level: rounds that accepted zero drafts / rounds (specguard_full_rollback_rounds_total / "
            "specguard_verify_rounds_total). Request level: requests whose rounds were mostly full rollbacks "
            "(specguard_full_rollback_requests_total / specguard_spec_requests_total).",
            [
                target(
                    ratio("specguard_full_rollback_rounds_total", "specguard_verify_rounds_total", by_cls),
                    "rounds {{task_type}}/{{temperature_bucket}}",
                    "A",
                ),
                target(
                    ratio("specguard_full_rollback_requests_total", "specguard_spec_requests_total", by_cls),
                    "requests {{task_type}}/{{temperature_bucket}}",
                    "B",
                ),
            ],
            "percentunit",
            minmax=(0, 1),
            threshold=0.5,
            mappings=NAN_MAPPING,
        ),
        panel(
            "Token flow: proposed, accepted, wasted",
            "Draft tokens proposed and accepted per second, and wasted (proposed - accepted, verify work "
            "thrown away) per class (specguard_draft_tokens_total, specguard_accepted_tokens_total).",
            [
                target(
                    f"sum by ({by_cls}) ({rate('specguard_draft_tokens_total')})",
                    "proposed {{task_type}}",
                    "A",
                ),
                target(
                    f"sum by ({by_cls}) ({rate('specguard_accepted_tokens_total')})",
                    "accepted {{task_type}}",
                    "B",
                ),
                target(
                    f"sum by ({by_cls}) ({rate('specguard_draft_tokens_total')})\n-\n"
                    f"sum by ({by_cls}) ({rate('specguard_accepted_tokens_total')})",
                    "wasted {{task_type}}",
                    "C",
                ),
            ],
            "count:tok/s",
        ),
        row("Latency: with vs without speculation"),
        panel(
            "TPOT per pool and load bucket",
            "Mean time per output token (decode seconds / decoded tokens, first token excluded) per pool and "
            "load bucket: speculative pools against the no-spec pool at the same load "
            "(specguard_decode_seconds_total / specguard_decode_tokens_total).",
            [
                target(
                    ratio(
                        "specguard_decode_seconds_total", "specguard_decode_tokens_total", "pool, load_bucket"
                    ),
                    "{{pool}} @ {{load_bucket}}",
                )
            ],
            "s",
            mappings=NAN_MAPPING,
        ),
        panel(
            "TPOT p50 / p90 / p99 per pool",
            "Per-request time per output token quantiles per pool "
            "(histogram specguard_time_per_output_token_seconds).",
            [
                target(
                    "histogram_quantile(0.5, sum by (le, pool) "
                    f"({rate('specguard_time_per_output_token_seconds_bucket')}))",
                    "p50 {{pool}}",
                    "A",
                ),
                target(
                    "histogram_quantile(0.9, sum by (le, pool) "
                    f"({rate('specguard_time_per_output_token_seconds_bucket')}))",
                    "p90 {{pool}}",
                    "B",
                ),
                target(
                    "histogram_quantile(0.99, sum by (le, pool) "
                    f"({rate('specguard_time_per_output_token_seconds_bucket')}))",
                    "p99 {{pool}}",
                    "C",
                ),
            ],
            "s",
        ),
        panel(
            "Requests per pool and class",
            "Where each class's traffic goes: requests per second through the tap by pool and class "
            "(specguard_requests_total); shows the guard's routing taking effect.",
            [
                target(
                    f"sum by (pool, {by_cls}) ({rate('specguard_requests_total')})",
                    "{{task_type}} -> {{pool}}",
                )
            ],
            "reqps",
            w=24,
        ),
        row("Guard decisions"),
        panel(
            "Current plan per class",
            "Pool each (class, load bucket) is routed to now, and its speculative tokens K (0 = off) "
            "(specguard_plan_info, specguard_num_speculative_tokens).",
            [
                target(
                    "max by (task_type, temperature_bucket, load_bucket, pool) "
                    f"(specguard_plan_info{{{CLS}}})",
                    "{{pool}}",
                    "A",
                    instant=True,
                    fmt="table",
                ),
                target(
                    "max by (task_type, temperature_bucket, load_bucket) "
                    f"(specguard_num_speculative_tokens{{{CLS_NOPOOL}}})",
                    "K",
                    "B",
                    instant=True,
                    fmt="table",
                ),
            ],
            "short",
            kind="table",
        ),
        panel(
            "Speculative tokens K per class over time",
            "K per (class, load bucket) chosen by the guard; 0 means speculation off "
            "(specguard_num_speculative_tokens). Steps line up with the action annotations.",
            [
                target(
                    "max by (task_type, temperature_bucket, load_bucket) "
                    f"(specguard_num_speculative_tokens{{{CLS_NOPOOL}}})",
                    "{{task_type}}/{{temperature_bucket}} @ {{load_bucket}}",
                )
            ],
            "short",
        ),
        panel(
            "Guard evaluations by result",
            "Evaluations per second by result ok / act / hold / error (specguard_evaluations_total) and "
            "actions per second by action and reason (specguard_actions_total).",
            [
                target(f"sum by (result) ({rate('specguard_evaluations_total', JOB)})", "{{result}}", "A"),
                target(
                    f"sum by (action, reason) ({rate('specguard_actions_total', JOB)})",
                    "{{action}}: {{reason}}",
                    "B",
                ),
            ],
            "ops",
        ),
        panel(
            "Guard health",
            "Seconds since the last finished evaluation (specguard_last_evaluation_timestamp_seconds), "
            "frozen in safe state (specguard_guard_frozen), consecutive errors "
            "(specguard_consecutive_errors).",
            [
                target(
                    f"time() - max(specguard_last_evaluation_timestamp_seconds{{{JOB}}})",
                    "since last eval",
                    "A",
                ),
                target(f"max(specguard_guard_frozen{{{JOB}}})", "frozen", "B"),
                target(f"max(specguard_consecutive_errors{{{JOB}}})", "consecutive errors", "C"),
            ],
            "short",
            kind="stat",
        ),
        row("Engines and alerts"),
        panel(
            "Engine scrape health",
            "1 when specguard's last scrape of the pool's /metrics succeeded (specguard_engine_up), with the "
            "scrape duration (specguard_scrape_duration_seconds on the right axis).",
            [
                target(f"min by (pool) (specguard_engine_up{{{POOL}}})", "up {{pool}}", "A"),
                target(
                    f"max by (pool) (specguard_scrape_duration_seconds{{{POOL}}})", "scrape s {{pool}}", "B"
                ),
            ],
            "short",
            threshold=0.5,
        ),
        panel(
            "Attribution: tap vs engine accepted tokens",
            "Accepted draft tokens per second seen per request by the tap (specguard_accepted_tokens_total) "
            "against the engine's own counter (specguard_engine_accepted_tokens_total); a gap means traffic "
            "that bypasses the tap or requests without per-request stats.",
            [
                target(
                    f"sum by (pool) ({rate('specguard_accepted_tokens_total', POOL)})", "tap {{pool}}", "A"
                ),
                target(
                    f"sum by (pool) ({rate('specguard_engine_accepted_tokens_total', POOL)})",
                    "engine {{pool}}",
                    "B",
                ),
            ],
            "count:tok/s",
        ),
        panel(
            "specguard alerts firing",
            'SpecGuard* alerts currently firing by name and class (ALERTS{alertstate="firing"}); runbooks in '
            "deploy/README.md.",
            [
                target(
                    "count by (alertname, task_type, temperature_bucket) "
                    f'(ALERTS{{{JOB},alertname=~"SpecGuard.*",'
                    'alertstate="firing"})',
                    "{{alertname}} {{task_type}}/{{temperature_bucket}}",
                )
            ],
            "short",
            w=24,
        ),
    ]


def layout(items: list[dict]) -> list[dict]:
    """Assign ids and flow panels left to right, wrapping at 24 columns."""
    x = y = 0
    row_h = 0
    for n, p in enumerate(items, start=1):
        p["id"] = n
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if p["type"] == "row" or x + w > 24:
            x, y = 0, y + row_h
            row_h = 0
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        x += w
        row_h = max(row_h, h)
        if p["type"] == "row":
            x, y, row_h = 0, y + h, 0
    return items


def dashboard() -> dict:
    datasource = {
        "type": "datasource",
        "name": "datasource",
        "label": "Data Source",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
    }
    templating = [
        datasource,
        variable("job", "job", "specguard_requests_total", ""),
        variable("pool", "pool", "specguard_requests_total", JOB),
        variable("task_type", "task type", "specguard_requests_total", POOL),
        variable("temperature_bucket", "temperature bucket", "specguard_requests_total", POOL),
        variable("load_bucket", "load bucket", "specguard_requests_total", POOL),
        {"type": "adhoc", "name": "filters", "label": "Filters", "datasource": DS, "hide": 0},
    ]
    annotations = [
        {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        },
        {
            "name": "Guard actions",
            "datasource": DS,
            "enable": True,
            "iconColor": "red",
            # increase() misses an action series' first sample (it appears at 1): the `unless
            # offset` half catches series that did not exist one step earlier
            "expr": f"(sum by ({ACTION_BY}) (increase(specguard_actions_total{{{JOB}}}[$__interval])) > 0)\n"
            f"or\n(sum by ({ACTION_BY}) (specguard_actions_total{{{JOB}}})\n"
            f" unless sum by ({ACTION_BY}) (specguard_actions_total{{{JOB}}} offset $__interval))",
            "step": "$__interval",
            "titleFormat": "{{action}}",
            "textFormat": "{{task_type}}/{{temperature_bucket}}: {{reason}}",
            "tagKeys": "task_type,temperature_bucket,action",
            "useValueForTime": False,
        },
    ]
    return {
        "uid": UID,
        "title": "specguard / Speculative decoding cost and guard",
        "description": "Per-class relative cost per token, acceptance, full rollbacks, TPOT with and without "
        "speculation, and the guard's decisions (specguard).",
        "tags": ["specguard", "speculative-decoding"],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": annotations},
        "templating": {"list": templating},
        "links": [
            {
                "type": "dashboards",
                "tags": ["specguard"],
                "asDropdown": True,
                "title": "specguard",
                "icon": "external link",
            }
        ],
        "panels": layout(panels()),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
