"""Build deploy/grafana/specguard-overview.json (Grafana classic dashboard JSON) with Grafana's
typed builder, grafana-foundation-sdk.

The JSON is committed; this script is its source. tests/deploy/test_dashboard.py fails when the
committed file differs from what this script prints, and lints the result; tests/stack runs every
query against a real Prometheus holding real specguard data.

    python3 deploy/grafana/build_dashboard.py > deploy/grafana/specguard-overview.json
    python3 deploy/sync_generated.py      # the copy kustomize ships
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, however this is loaded
sys.path.append(str(Path(__file__).resolve().parents[2]))  # specguard itself, from a clone not installed

from dashboard_kit import ACTION_BY, DS, JOB, POOL  # noqa: E402
from grafana_foundation_sdk.builders import dashboard as db  # noqa: E402
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.models import dashboard as dm  # noqa: E402
from panels_cost import acceptance, headline, latency, verdict  # noqa: E402
from panels_ops import guard, serving  # noqa: E402

UID = "specguard-overview"


def variable(name: str, label: str, sel: str, metric: str = "specguard_requests_total") -> db.QueryVariable:
    expr = f"label_values({metric}{{{sel}}}, {name})"
    return (
        db.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query({"query": expr, "refId": f"{name}-query"})
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".+")
        .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
    )


# Prometheus annotation fields the SDK's AnnotationQuery has no setter for; merged in by render().
# increase() misses an action series' first sample (it appears at 1): the `unless offset` half
# catches series that did not exist one step earlier.
ACTIONS_ANNOTATION = {
    "step": "$__interval",
    "titleFormat": "{{action}}",
    "textFormat": "{{task_type}}/{{temperature_bucket}}: {{reason}}",
    "tagKeys": "task_type,temperature_bucket,action",
    "useValueForTime": False,
}
ACTIONS_EXPR = (
    f"(sum by ({ACTION_BY}) (increase(specguard_actions_total{{{JOB}}}[$__interval])) > 0)\n"
    f"or\n(sum by ({ACTION_BY}) (specguard_actions_total{{{JOB}}})\n"
    f" unless sum by ({ACTION_BY}) (specguard_actions_total{{{JOB}}} offset $__interval))"
)


def dashboard() -> db.Dashboard:
    builder = (
        db.Dashboard("specguard / Speculative decoding cost and guard")
        .uid(UID)
        .description(
            "Per-class relative cost per token, acceptance, full rollbacks, TPOT with and without "
            "speculation, the guard's decisions and health (specguard)."
        )
        .tags(["specguard", "speculative-decoding"])
        .timezone("utc")
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .version(1)
        .time("now-1h", "now")
        .with_variable(db.DatasourceVariable("datasource").label("Data Source").type("prometheus"))
        # every specguard process exports its plan version: the followers' jobs and the deciders'
        .with_variable(variable("job", "job", "", "specguard_plan_version"))
        .with_variable(variable("pool", "pool", JOB))
        .with_variable(variable("task_type", "task type", POOL))
        .with_variable(variable("temperature_bucket", "temperature bucket", POOL))
        .with_variable(variable("load_bucket", "load bucket", POOL))
        .with_variable(db.AdHocVariable("filters").label("Filters").datasource(DS))
        .annotation(
            db.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .built_in(1)
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
        )
        .annotation(
            db.AnnotationQuery()
            .name("Guard actions")
            .datasource(DS)
            .enable(True)
            .icon_color("red")
            .expr(ACTIONS_EXPR)
        )
        .link(
            db.DashboardLink("specguard")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(["specguard"])
            .as_dropdown(True)
            .icon("external link")
        )
    )
    for section in (verdict, headline, acceptance, latency, guard, serving):
        for item in section():
            builder = builder.with_row(item) if isinstance(item, db.Row) else builder.with_panel(item)
    return builder


def render() -> str:
    model = dashboard().build()
    for n, panel in enumerate(model.panels or [], start=1):
        panel.id_val = n
    data = json.loads(JSONEncoder(sort_keys=False).encode(model))
    for annotation in data["annotations"]["list"]:
        if annotation.get("expr") == ACTIONS_EXPR:
            annotation.update(ACTIONS_ANNOTATION)
    return json.dumps(data, indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
