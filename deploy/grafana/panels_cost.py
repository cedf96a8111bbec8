"""Dashboard rows about cost: the verdict (RC per class), the headline, acceptance, latency."""

from __future__ import annotations

from dashboard_kit import (
    ACC,
    BY_CLS,
    CELL,
    CLS,
    CLS_NOPOOL,
    JOB,
    NO_TRAFFIC,
    POOL,
    RC,
    RC_PLANNED,
    RC_PROBE,
    RED_AT_1,
    colour_cells,
    columns,
    mapping_values,
    query,
    rate,
    ratio,
    single,
    special,
    steps,
    ts,
)
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm


def verdict() -> list:
    rc_table = columns(
        "RC bounds and evidence now",
        "Per class, load bucket and speculative pool: the RC point estimate "
        "(pool_class_load:specguard_relative_cost_per_token:ratio), its confidence bounds "
        "(specguard_relative_cost_per_token_{lower,upper}_ratio), the requests behind each side "
        "(specguard_relative_cost_samples), the baseline source (specguard_relative_cost_baseline_info: "
        "live, profile, model or none) and whether the row is the class's planned traffic or probe "
        "traffic (specguard_plan_info).",
        [
            query(f"max by ({CELL}) ({RC})", ref="A", instant=True),
            query(
                f"max by ({CELL}) (specguard_relative_cost_per_token_lower_ratio{{{CLS}}})",
                ref="B",
                instant=True,
            ),
            query(
                f"max by ({CELL}) (specguard_relative_cost_per_token_upper_ratio{{{CLS}}})",
                ref="C",
                instant=True,
            ),
            query(
                f'sum by ({CELL}) (specguard_relative_cost_samples{{{CLS},side="spec"}})',
                ref="D",
                instant=True,
            ),
            query(
                f'sum by ({CELL}) (specguard_relative_cost_samples{{{CLS},side="baseline"}})',
                ref="E",
                instant=True,
            ),
            query(
                f"max by ({CELL}, source) (specguard_relative_cost_baseline_info{{{CLS}}})",
                ref="F",
                instant=True,
            ),
            query(
                f"max by ({CELL}) (class_load:specguard_plan_info:max{{{CLS}}})\nand on ({CELL})\n"
                f'specguard_relative_cost_samples{{{CLS},side="spec"}}',
                ref="G",
                instant=True,
            ),
        ],
        {
            "Value #A": ("RC", "none", 2),
            "Value #B": ("RC lower", "none", 2),
            "Value #C": ("RC upper", "none", 2),
            "Value #D": ("spec samples", "short", 0),
            "Value #E": ("baseline samples", "short", 0),
            "source": ("baseline source", None, 0),
            "Value #G": ("traffic", "none", 0),
        },
        w=24,
    )
    for name in ("RC", "RC lower", "RC upper"):
        rc_table = colour_cells(rc_table, name, RED_AT_1)
    rc_table = rc_table.override_by_name(
        "traffic",
        [
            dm.DynamicConfigValue(
                "mappings",
                [
                    mapping_values({"1": ("plan", "text")}),
                    special(dm.SpecialValueMatch.NULL, "probe", "blue"),
                ],
            )
        ],
    )
    return [
        db.Row("Verdict: does speculation pay, per class?"),
        ts(
            "Relative cost per token (RC) per class, as planned",
            "RC = time per output token with speculation / without, at the same load bucket "
            "(pool_class_load:specguard_relative_cost_per_token:ratio, from "
            "specguard_relative_cost_per_token_ratio weighted by specguard_relative_cost_samples), on the "
            "pool the plan routes each class to (specguard_plan_info). Above the red 1.0 line, "
            "speculation slows this class down. A class moved off speculation leaves this panel; its "
            "probe traffic shows in the panel below.",
            [query(RC_PLANNED, "{{task_type}}/{{temperature_bucket}} @ {{load_bucket}} on {{pool}}")],
            "none",
            w=16,
            red_at=1.0,
            mappings=NO_TRAFFIC,
        ),
        single(
            "Worst RC now",
            "Highest current relative cost per token over the selected classes, on the pool each class is "
            "planned on (pool_class_load:specguard_relative_cost_per_token:ratio and specguard_plan_info; "
            "probe traffic excluded). Red at or above 1.0.",
            query(f"max(\n{RC_PLANNED}\n)", "worst RC"),
            "none",
            h=8,
            thresholds=RED_AT_1,
            mappings=NO_TRAFFIC,
            decimals=2,
        ),
        single(
            "Classes with RC above 1.0",
            "Number of (class, load bucket) cells whose planned pool has a relative cost per token above "
            "1.0 (pool_class_load:specguard_relative_cost_per_token:ratio > 1 on the pool in "
            "specguard_plan_info); probe traffic excluded. 0 when the guard has moved every losing class.",
            query(f"count(\n{RC_PLANNED}\n> 1\n) or vector(0)", "cells above 1.0"),
            "short",
            h=8,
            thresholds=RED_AT_1,
            decimals=0,
        ),
        ts(
            "RC on probe traffic (classes planned elsewhere)",
            "RC measured on the small probe share (tap.probe_share) that a class planned away from a "
            "speculative pool keeps sending there (pool_class_load:specguard_relative_cost_per_token:ratio "
            "for pools not in specguard_plan_info). It is the evidence for restoring speculation, not a "
            "cost paid by the class's traffic.",
            [query(RC_PROBE, "{{task_type}}/{{temperature_bucket}} @ {{load_bucket}} probe on {{pool}}")],
            "none",
            red_at=1.0,
            mappings=NO_TRAFFIC,
        ),
        ts(
            "Baseline available per load bucket",
            "1 when the cost model has a no-speculation baseline at this load bucket from this source "
            "(specguard_baseline_available: live holdout traffic, a calibration profile or the step-time "
            "model); without one, RC is unknown and the guard holds.",
            [
                query(
                    "max by (load_bucket, source) "
                    f'(specguard_baseline_available{{{JOB},load_bucket=~"$load_bucket"}})',
                    "{{load_bucket}}: {{source}}",
                )
            ],
            "short",
            minmax=(0, 1),
            mappings=[mapping_values({"0": ("no", "red"), "1": ("yes", "green")})],
        ),
        rc_table,
    ]


def headline() -> list:
    return [
        db.Row("Headline over the selected classes"),
        single(
            "Strict accept rate",
            "Accepted draft tokens / proposed draft tokens over every selected class and pool "
            "(specguard_accepted_tokens_total / specguard_draft_tokens_total).",
            query(ratio("specguard_accepted_tokens_total", "specguard_draft_tokens_total", ""), "alpha"),
            "percentunit",
            minmax=(0, 1),
            mappings=NO_TRAFFIC,
        ),
        single(
            "Accept length",
            "Output tokens per verify round, bonus included: 1 + accepted / rounds "
            "(specguard_accepted_tokens_total, specguard_verify_rounds_total).",
            query(
                "1 + " + ratio("specguard_accepted_tokens_total", "specguard_verify_rounds_total", ""), "A"
            ),
            "short",
            mappings=NO_TRAFFIC,
            decimals=2,
        ),
        single(
            "Output tokens from drafts",
            "Share of output tokens that were accepted drafts, over every load bucket "
            "(specguard_accepted_tokens_total / specguard_output_tokens_total).",
            query(
                ratio("specguard_accepted_tokens_total", "specguard_output_tokens_total", "", ACC),
                "from drafts",
            ),
            "percentunit",
            minmax=(0, 1),
            mappings=NO_TRAFFIC,
        ),
        single(
            "Full-rollback rounds",
            "Verify rounds that accepted no draft token / verify rounds "
            "(specguard_full_rollback_rounds_total / specguard_verify_rounds_total). Red above 50 %.",
            query(
                ratio("specguard_full_rollback_rounds_total", "specguard_verify_rounds_total", ""), "rollback"
            ),
            "percentunit",
            thresholds=steps((None, "green"), (0.5, "red")),
            minmax=(0, 1),
            mappings=NO_TRAFFIC,
        ),
        single(
            "Draft tokens / s",
            "Draft tokens proposed per second over the selected classes (specguard_draft_tokens_total).",
            query(f"sum({rate('specguard_draft_tokens_total')})", "proposed"),
            "count:tok/s",
        ),
        single(
            "Cells off speculation",
            "Number of (class, load bucket) cells the guard routes to a non-speculative pool "
            "(class_load:specguard_speculation_enabled:max == 0, from specguard_speculation_enabled).",
            query(
                f"count(class_load:specguard_speculation_enabled:max{{{CLS_NOPOOL}}} == 0) or vector(0)",
                "off",
            ),
            "short",
            decimals=0,
        ),
    ]


def acceptance() -> list:
    cls = "{{task_type}}/{{temperature_bucket}}"
    return [
        db.Row("Acceptance per class and temperature bucket, over every load bucket"),
        ts(
            "Accept length per class",
            "Output tokens per verify round, bonus token included: 1 + accepted / rounds "
            "(specguard_accepted_tokens_total, specguard_verify_rounds_total; per-request data "
            "from the tap).",
            [
                query(
                    "1 + "
                    + ratio("specguard_accepted_tokens_total", "specguard_verify_rounds_total", BY_CLS),
                    cls,
                )
            ],
            "short",
            mappings=NO_TRAFFIC,
        ),
        ts(
            "Strict accept rate per class",
            "Accepted draft tokens / proposed draft tokens, no bonus "
            "(specguard_accepted_tokens_total / specguard_draft_tokens_total).",
            [query(ratio("specguard_accepted_tokens_total", "specguard_draft_tokens_total", BY_CLS), cls)],
            "percentunit",
            minmax=(0, 1),
            mappings=NO_TRAFFIC,
        ),
        ts(
            "Per-position acceptance",
            "Share of verify rounds whose first i+1 drafts were accepted, per class "
            "(specguard_accepted_per_position_total / specguard_verify_rounds_total). "
            "1 - position 0 is the round-level full-rollback ratio.",
            [
                query(
                    f"sum by ({BY_CLS}, position) ({rate('specguard_accepted_per_position_total')})\n"
                    f"/ ignoring (position) group_left ()\n"
                    f"(sum by ({BY_CLS}) ({rate('specguard_verify_rounds_total')}) > 0)",
                    f"{cls} pos {{{{position}}}}",
                )
            ],
            "percentunit",
            minmax=(0, 1),
            mappings=NO_TRAFFIC,
        ),
        ts(
            "Full-rollback ratio per class",
            "Round level: rounds that accepted zero drafts / rounds (specguard_full_rollback_rounds_total / "
            "specguard_verify_rounds_total). Request level: requests whose rounds were mostly full rollbacks "
            "(specguard_full_rollback_requests_total / specguard_spec_requests_total).",
            [
                query(
                    ratio("specguard_full_rollback_rounds_total", "specguard_verify_rounds_total", BY_CLS),
                    f"rounds {cls}",
                    "A",
                ),
                query(
                    ratio("specguard_full_rollback_requests_total", "specguard_spec_requests_total", BY_CLS),
                    f"requests {cls}",
                    "B",
                ),
            ],
            "percentunit",
            minmax=(0, 1),
            red_at=0.5,
            mappings=NO_TRAFFIC,
        ),
        ts(
            "Token flow: proposed, accepted, wasted",
            "Draft tokens proposed and accepted per second, and wasted (proposed - accepted, verify work "
            "thrown away) per class (specguard_draft_tokens_total, specguard_accepted_tokens_total).",
            [
                query(f"sum by ({BY_CLS}) ({rate('specguard_draft_tokens_total')})", f"proposed {cls}", "A"),
                query(
                    f"sum by ({BY_CLS}) ({rate('specguard_accepted_tokens_total')})", f"accepted {cls}", "B"
                ),
                query(
                    f"sum by ({BY_CLS}) ({rate('specguard_draft_tokens_total')})\n-\n"
                    f"sum by ({BY_CLS}) ({rate('specguard_accepted_tokens_total')})",
                    f"wasted {cls}",
                    "C",
                ),
            ],
            "count:tok/s",
            w=24,
        ),
    ]


def latency() -> list:
    # the histogram carries pool and load bucket only (per class, TPOT is the decode counters' ratio)
    tpot_bucket = rate(
        "specguard_time_per_output_token_seconds_bucket", f'{POOL},load_bucket=~"$load_bucket"'
    )
    return [
        db.Row("Latency and traffic: with vs without speculation"),
        ts(
            "TPOT per pool and load bucket",
            "Mean time per output token (decode seconds / decoded tokens, first token excluded) per pool and "
            "load bucket: speculative pools against the no-spec pool at the same load "
            "(specguard_decode_seconds_total / specguard_decode_tokens_total).",
            [
                query(
                    ratio(
                        "specguard_decode_seconds_total", "specguard_decode_tokens_total", "pool, load_bucket"
                    ),
                    "{{pool}} @ {{load_bucket}}",
                )
            ],
            "s",
            mappings=NO_TRAFFIC,
        ),
        ts(
            "TPOT p50 / p90 / p99 per pool",
            "Per-request time per output token quantiles per pool, over every class "
            "(histogram specguard_time_per_output_token_seconds, labelled by pool and load bucket).",
            [
                query(
                    f"histogram_quantile({q}, sum by (le, pool) ({tpot_bucket}))", f"p{p} {{{{pool}}}}", ref
                )
                for q, p, ref in ((0.5, 50, "A"), (0.9, 90, "B"), (0.99, 99, "C"))
            ],
            "s",
        ),
        ts(
            "Requests per pool and class",
            "Where each class's traffic goes: requests per second through the tap by pool and class "
            "(specguard_requests_total); shows the guard's routing taking effect.",
            [
                query(
                    f"sum by (pool, {BY_CLS}) ({rate('specguard_requests_total')})",
                    "{{task_type}}/{{temperature_bucket}} -> {{pool}}",
                )
            ],
            "reqps",
        ),
        ts(
            "In-flight requests per pool",
            "Requests currently open through the tap to each pool (specguard_pool_in_flight_requests); "
            "the tap's load buckets are read from this count.",
            [query(f"sum by (pool) (specguard_pool_in_flight_requests{{{POOL}}})", "{{pool}}")],
            "short",
        ),
    ]
