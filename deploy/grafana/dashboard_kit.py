"""Helpers for building the specguard dashboard with grafana-foundation-sdk: the label selectors,
PromQL snippets and panel factories with the conventions every panel shares (templated data
source, unit, description, thresholds, NaN shown as "No traffic")."""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from specguard.exporters.collector import SPEC_ONLY

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RI = "$__rate_interval"
# label selectors: job filter everywhere; class/pool filters where the series has the labels
JOB = 'job=~"$job"'
POOL = f'{JOB},pool=~"$pool"'
CLS = f'{POOL},task_type=~"$task_type",temperature_bucket=~"$temperature_bucket",load_bucket=~"$load_bucket"'
CLS_NOPOOL = (
    f'{JOB},task_type=~"$task_type",temperature_bucket=~"$temperature_bucket",load_bucket=~"$load_bucket"'
)
# acceptance counters carry no load_bucket (acceptance does not depend on load): the load-bucket
# selector does not apply to them
ACC = f'{POOL},task_type=~"$task_type",temperature_bucket=~"$temperature_bucket"'
ACCEPTANCE = frozenset(f"specguard_{name}_total" for name in (*SPEC_ONLY, "accepted_per_position"))
BY_CLS = "task_type, temperature_bucket"
CELL = "pool, task_type, temperature_bucket, load_bucket"
ACTION_BY = "task_type, temperature_bucket, action, reason"
RC = f"pool_class_load:specguard_relative_cost_per_token:ratio{{{CLS}}}"
# The plan comes from the process that decides it (standalone, or a fleet's leading decider, which
# may be scraped under a job of its own: $job lists it too); it is joined to the followers' RC on
# the class labels, as the recording rules do.
PLANNED = f"(class_load:specguard_plan_info:max{{{CLS}}} == 1)"
HAS_PLAN = f"(class_load:specguard_plan_info:max{{{CLS_NOPOOL}}} == 1)"
CLASS = "task_type, temperature_bucket, load_bucket"
# RC_ON_PLAN: RC on the pool the plan routes each class to. RC_PLANNED: the same, and every pool
# of a class with no plan in view, as the alerts read it (a plan that is not scraped hides no
# losing class). RC_PROBE: RC measured on probe traffic only (a class planned elsewhere keeps
# tap.probe_share on a speculative pool so it can be re-enabled).
RC_ON_PLAN = f"{RC}\nand on ({CELL})\n{PLANNED}"
RC_PLANNED = f"(\n(\n{RC}\nunless on ({CLASS})\n{HAS_PLAN}\n)\nor\n(\n{RC_ON_PLAN}\n)\n)"
RC_PROBE = f"(\n(\n{RC}\nand on ({CLASS})\n{HAS_PLAN}\n)\nunless on ({CELL})\n{PLANNED}\n)"


def special(match: dm.SpecialValueMatch, text: str, color: str | None = None) -> dm.SpecialValueMap:
    result = dm.ValueMappingResult(text=text, color=color, index=0)
    return dm.SpecialValueMap(dm.DashboardSpecialValueMapOptions(match=match, result=result))


def mapping_values(mapping: dict[str, tuple[str, str]]) -> dm.ValueMap:
    return dm.ValueMap(
        {v: dm.ValueMappingResult(text=t, color=c, index=i) for i, (v, (t, c)) in enumerate(mapping.items())}
    )


NO_TRAFFIC = [special(dm.SpecialValueMatch.NA_N, "No traffic")]
UP_DOWN = [mapping_values({"0": ("DOWN", "red"), "1": ("UP", "green")})]


def rate(metric: str, sel: str | None = None) -> str:
    """rate() over the selected series: ACC for acceptance counters, else CLS, unless ``sel``."""
    sel = sel or (ACC if metric in ACCEPTANCE else CLS)
    return f"rate({metric}{{{sel}}}[{RI}])"


def ratio(num: str, den: str, by: str, sel: str | None = None) -> str:
    """sum(rate(num)) / (sum(rate(den)) > 0), both aggregated by the same labels ("" = all)."""
    agg = f"sum by ({by})" if by else "sum"
    return f"{agg} ({rate(num, sel)})\n/\n({agg} ({rate(den, sel)}) > 0)"


def query(expr: str, legend: str = "__auto", ref: str = "A", instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().datasource(DS).expr(expr).legend_format(legend).ref_id(ref)
    return q.instant().format(pm.PromQueryFormat.TABLE) if instant else q.range()


def steps(*pairs: tuple[float | None, str]) -> db.ThresholdsConfig:
    """Absolute thresholds: (None, base colour), then (value, colour at or above it)."""
    return (
        db.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=v, color=c) for v, c in pairs])
    )


RED_AT_1 = steps((None, "green"), (1.0, "red"))


def _common(panel, title: str, description: str, unit: str, w: int, h: int, targets: list):
    panel = panel.title(title).description(description).datasource(DS).unit(unit).span(w).height(h)
    for t in targets:
        panel = panel.with_target(t)
    return panel


def ts(
    title: str,
    description: str,
    targets: list,
    unit: str,
    w: int = 12,
    h: int = 8,
    minmax: tuple[float, float] | None = None,
    red_at: float | None = None,
    mappings: list | None = None,
) -> timeseries.Panel:
    panel = _common(timeseries.Panel(), title, description, unit, w, h, targets)
    panel = panel.legend(
        cb.VizLegendOptions()
        .show_legend(True)
        .display_mode(cm.LegendDisplayMode.LIST)
        .placement(cm.LegendPlacement.BOTTOM)
    )
    if minmax is not None:
        panel = panel.min(minmax[0]).max(minmax[1])
    if red_at is not None:
        panel = panel.thresholds(steps((None, "green"), (red_at, "red"))).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE_AND_AREA)
        )
    return panel.mappings(mappings) if mappings else panel


def single(
    title: str,
    description: str,
    target: prometheus.Dataquery,
    unit: str,
    w: int = 4,
    h: int = 4,
    thresholds: db.ThresholdsConfig | None = None,
    minmax: tuple[float, float] | None = None,
    mappings: list | None = None,
    decimals: int | None = None,
) -> stat.Panel:
    """A stat panel; with thresholds its background turns to the threshold's colour."""
    panel = _common(stat.Panel(), title, description, unit, w, h, [target])
    panel = panel.graph_mode(cm.BigValueGraphMode.AREA).reduce_options(
        cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)
    )
    if thresholds is not None:
        panel = panel.thresholds(thresholds).color_mode(cm.BigValueColorMode.BACKGROUND)
    else:
        panel = panel.color_mode(cm.BigValueColorMode.NONE)
    if minmax is not None:
        panel = panel.min(minmax[0]).max(minmax[1])
    if decimals is not None:
        panel = panel.decimals(decimals)
    return panel.mappings(mappings) if mappings else panel


def columns(
    title: str,
    description: str,
    targets: list,
    cols: dict[str, tuple[str, str | None, int]],
    w: int,
    h: int = 8,
) -> table.Panel:
    """An instant table: one row per label set, every query's value merged in as a column.

    ``cols`` maps a field ("Value #A" or a label) to (column title, unit, decimals), unit None for
    a label; a "Value #X" not in ``cols`` is hidden (its query only contributes labels), and so is
    the Time column.
    """
    panel = _common(table.Panel(), title, description, "none", w, h, targets).show_header(True)
    hidden = {"Time": True} | {f"Value #{t.build().ref_id}": True for t in targets}
    for field in cols:
        hidden.pop(field, None)
    panel = panel.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    panel = panel.with_transformation(
        dm.DataTransformerConfig(
            id_val="organize",
            options={"excludeByName": hidden, "renameByName": {f: c[0] for f, c in cols.items()}},
        )
    )
    for name, unit, decimals in cols.values():
        if unit is None:
            continue
        panel = panel.override_by_name(
            name, [dm.DynamicConfigValue("unit", unit), dm.DynamicConfigValue("decimals", decimals)]
        )
    return panel


def colour_cells(panel: table.Panel, name: str, thresholds: db.ThresholdsConfig) -> table.Panel:
    return panel.override_by_name(
        name,
        [
            dm.DynamicConfigValue("custom.cellOptions", {"type": "color-text"}),
            dm.DynamicConfigValue("thresholds", thresholds.build()),
        ],
    )
