"""Dashboard rows about operations: the guard's decisions and health, serving health."""

from __future__ import annotations

from dashboard_kit import (
    CLS_NOPOOL,
    JOB,
    PLANNED,
    POOL,
    RC_ON_PLAN,
    RED_AT_1,
    UP_DOWN,
    colour_cells,
    columns,
    mapping_values,
    query,
    rate,
    single,
    steps,
    ts,
)
from grafana_foundation_sdk.builders import dashboard as db

K_NOW = (
    f"max by (task_type, temperature_bucket, load_bucket) (specguard_num_speculative_tokens{{{CLS_NOPOOL}}})"
)


def guard() -> list:
    plan = columns(
        "Current plan per class",
        "Pool each (class, load bucket) is routed to now (specguard_plan_info), its speculative tokens K "
        "(specguard_num_speculative_tokens, 0 = off) and the RC measured there "
        "(pool_class_load:specguard_relative_cost_per_token:ratio; empty on a no-spec pool).",
        [
            query(
                f"max by (task_type, temperature_bucket, load_bucket, pool) {PLANNED}", ref="A", instant=True
            ),
            query(
                K_NOW,
                ref="B",
                instant=True,
            ),
            query(
                f"max by (task_type, temperature_bucket, load_bucket, pool) (\n{RC_ON_PLAN}\n)",
                ref="C",
                instant=True,
            ),
        ],
        {"pool": ("pool", None, 0), "Value #B": ("K", "none", 0), "Value #C": ("RC", "none", 2)},
        w=12,
    )
    plan = colour_cells(plan, "RC", RED_AT_1)
    return [
        db.Row("Guard decisions and health"),
        plan,
        ts(
            "Speculative tokens K per class over time",
            "K per (class, load bucket) chosen by the guard; 0 means speculation off "
            "(specguard_num_speculative_tokens). Steps line up with the action annotations.",
            [
                query(
                    K_NOW,
                    "{{task_type}}/{{temperature_bucket}} @ {{load_bucket}}",
                )
            ],
            "none",
        ),
        ts(
            "Guard evaluations by result, and actions",
            "Evaluations per second by result ok / act / hold / error (specguard_evaluations_total) and "
            "actions per second by action and reason (specguard_actions_total).",
            [
                query(f"sum by (result) ({rate('specguard_evaluations_total', JOB)})", "{{result}}", "A"),
                query(
                    f"sum by (action, reason) ({rate('specguard_actions_total', JOB)})",
                    "{{action}}: {{reason}}",
                    "B",
                ),
            ],
            "ops",
        ),
        single(
            "Since last evaluation",
            "Seconds since the guard last finished an evaluation "
            "(time() - specguard_last_evaluation_timestamp_seconds). Red at 300 s, where "
            "SpecGuardEvaluationStale starts counting.",
            query(
                f"time() - max(specguard_last_evaluation_timestamp_seconds{{{JOB}}})", "since last evaluation"
            ),
            "s",
            h=8,
            thresholds=steps((None, "green"), (60.0, "orange"), (300.0, "red")),
            decimals=0,
        ),
        single(
            "Frozen",
            "1 when a class is frozen in its safe state after too many data-source errors "
            "(specguard_guard_frozen).",
            query(f"max(specguard_guard_frozen{{{JOB}}})", "frozen"),
            "none",
            h=8,
            thresholds=RED_AT_1,
            mappings=[mapping_values({"0": ("no", "green"), "1": ("FROZEN", "red")})],
        ),
        single(
            "Consecutive source errors",
            "Most consecutive data-source errors of any class (specguard_consecutive_errors); above "
            "guard.consecutive_error_limit (default 4) the class freezes.",
            query(f"max(specguard_consecutive_errors{{{JOB}}})", "consecutive errors"),
            "short",
            h=8,
            thresholds=steps((None, "green"), (1.0, "orange"), (5.0, "red")),
            decimals=0,
        ),
        ts(
            "Alertmanager alerts received",
            "Alerts posted to specguard's receiver per second by status and outcome "
            "(specguard_webhook_alerts_total); outcome rejected = a post specguard refused.",
            [
                query(
                    f"sum by (status, outcome) ({rate('specguard_webhook_alerts_total', JOB)})",
                    "{{status}} {{outcome}}",
                )
            ],
            "ops",
        ),
        ts(
            "Actuation and write errors",
            "Failures to apply or persist a decision, per second: actuator applications "
            "(specguard_actuation_errors_total), plan-file writes (specguard_plan_write_errors_total) and "
            "audit-log appends (specguard_audit_write_errors_total). Routing goes on; the decision may not "
            "have reached its actuator.",
            [
                query(
                    f"sum by (actuator) ({rate('specguard_actuation_errors_total', JOB)})",
                    "actuator {{actuator}}",
                    "A",
                ),
                query(f"sum({rate('specguard_plan_write_errors_total', JOB)})", "plan file", "B"),
                query(f"sum({rate('specguard_audit_write_errors_total', JOB)})", "audit log", "C"),
            ],
            "ops",
        ),
    ]


def serving() -> list:
    return [
        db.Row("Serving health: specguard, pools, engines"),
        single(
            "specguard up",
            "Prometheus's own scrape of specguard (up): 0 means the tap, guard and exporter are not being "
            "seen, whatever the other panels show.",
            query(f"min(up{{{JOB}}})", "up"),
            "none",
            h=8,
            thresholds=steps((None, "red"), (1.0, "green")),
            mappings=UP_DOWN,
        ),
        ts(
            "Pool health",
            "1 while specguard serves a pool, 0 while it has marked the pool down and fails its traffic "
            "over (specguard_pool_healthy).",
            [query(f"min by (pool) (specguard_pool_healthy{{{POOL}}})", "{{pool}}")],
            "none",
            w=8,
            minmax=(0, 1),
            mappings=UP_DOWN,
        ),
        ts(
            "Failover requests",
            "Requests per second planned for one pool but served by another because the planned pool was "
            "down (specguard_failover_requests_total).",
            [
                query(
                    f"sum by (pool, to_pool) ({rate('specguard_failover_requests_total', POOL)})",
                    "{{pool}} -> {{to_pool}}",
                )
            ],
            "reqps",
        ),
        ts(
            "Upstream errors",
            "Requests per second the tap could not complete against a pool, by kind: connect, timeout, "
            "broken (failed mid-response), status_5xx (specguard_upstream_errors_total).",
            [
                query(
                    f"sum by (pool, kind) ({rate('specguard_upstream_errors_total', POOL)})",
                    "{{pool}} {{kind}}",
                )
            ],
            "reqps",
        ),
        ts(
            "Unattributed requests",
            "Requests per second forwarded without per-request speculative stats, by pool and reason "
            "(specguard_unattributed_requests_total): the gap between the tap's and the engine's counters.",
            [
                query(
                    f"sum by (pool, reason) ({rate('specguard_unattributed_requests_total', POOL)})",
                    "{{pool}} {{reason}}",
                )
            ],
            "reqps",
        ),
        ts(
            "Engine scrape health",
            "1 when specguard's last scrape of the pool's /metrics succeeded (specguard_engine_up), with the "
            "scrape duration (specguard_scrape_duration_seconds).",
            [
                query(f"min by (pool) (specguard_engine_up{{{POOL}}})", "up {{pool}}", "A"),
                query(
                    f"max by (pool) (specguard_scrape_duration_seconds{{{POOL}}})", "scrape s {{pool}}", "B"
                ),
            ],
            "short",
            red_at=0.5,
        ),
        ts(
            "Attribution: tap vs engine accepted tokens",
            "Accepted draft tokens per second seen per request by the tap (specguard_accepted_tokens_total) "
            "against the engine's own counter (specguard_engine_accepted_tokens_total); a gap means traffic "
            "that bypasses the tap or requests without per-request stats.",
            [
                query(
                    f"sum by (pool) ({rate('specguard_accepted_tokens_total', POOL)})", "tap {{pool}}", "A"
                ),
                query(
                    f"sum by (pool) ({rate('specguard_engine_accepted_tokens_total', POOL)})",
                    "engine {{pool}}",
                    "B",
                ),
            ],
            "count:tok/s",
        ),
        ts(
            "specguard alerts firing",
            'SpecGuard* alerts currently firing by name and class (ALERTS{alertstate="firing"}); runbooks in '
            "docs/runbooks.md.",
            [
                query(
                    "count by (alertname, task_type, temperature_bucket) "
                    f'(ALERTS{{{JOB},alertname=~"SpecGuard.*",alertstate="firing"}})',
                    "{{alertname}} {{task_type}}/{{temperature_bucket}}",
                )
            ],
            "short",
            w=24,
        ),
    ]
