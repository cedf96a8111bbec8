"""``specguard report``: what the guard saw and did, from Prometheus, as one self-contained HTML file.

The data comes from range queries over the ``specguard_*`` series (report_data.PromData); every
ratio is computed in PromQL from summed counters, never by averaging ratios. Plots are PNGs
embedded as base64, so the file can be mailed or attached to a ticket.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd

from specguard.lab import report_figures as figures
from specguard.lab.report_data import PromData

CLASS = ("task_type", "temperature_bucket")


@dataclass
class ReportData:
    """Everything the report shows, as frames with a ``timestamp`` and a ``value`` column."""

    url: str
    start: float
    end: float
    step_s: float
    window: str
    rc: pd.DataFrame = field(default_factory=pd.DataFrame)
    rc_samples: pd.DataFrame = field(default_factory=pd.DataFrame)  # spec-side requests behind each RC
    actions: pd.DataFrame = field(default_factory=pd.DataFrame)
    accept_length: pd.DataFrame = field(default_factory=pd.DataFrame)
    strict_rate: pd.DataFrame = field(default_factory=pd.DataFrame)
    rollback: pd.DataFrame = field(default_factory=pd.DataFrame)
    tpot: pd.DataFrame = field(default_factory=pd.DataFrame)
    throughput: pd.DataFrame = field(default_factory=pd.DataFrame)
    plan: pd.DataFrame = field(default_factory=pd.DataFrame)
    requests: float = 0.0


def rate_window(step_s: float) -> str:
    """A rate() window that always spans several scrapes: max(4 steps, 20 s)."""
    return f"{max(4 * step_s, 20.0):g}s"


def _ratio(num: str, den: str, by: str, window: str, plus_one: bool = False) -> str:
    expr = f"sum by ({by}) (rate({num}[{window}])) / sum by ({by}) (rate({den}[{window}]) > 0)"
    return f"1 + {expr}" if plus_one else expr


def collect(
    source: PromData, start: float, end: float, step_s: float, window: str | None = None
) -> ReportData:
    """Run the report's queries over [start, end]; raises SourceError if Prometheus fails."""
    window = window or rate_window(step_s)
    by = ",".join(CLASS)
    data = ReportData(source.url, start, end, step_s, window)
    data.rc = source.range("specguard_relative_cost_per_token_ratio", start, end, step_s)
    data.rc_samples = source.range('specguard_relative_cost_samples{side="spec"}', start, end, step_s)
    data.actions = _increments(
        source.range("specguard_actions_total", start, end, step_s),
        source.instant("specguard_actions_created", at=end),
        start,
        step_s,
    )
    data.accept_length = source.range(
        _ratio("specguard_accepted_tokens_total", "specguard_verify_rounds_total", by, window, True),
        start,
        end,
        step_s,
    )
    data.strict_rate = source.range(
        _ratio("specguard_accepted_tokens_total", "specguard_draft_tokens_total", by, window),
        start,
        end,
        step_s,
    )
    data.rollback = source.range(
        _ratio("specguard_full_rollback_rounds_total", "specguard_verify_rounds_total", by, window),
        start,
        end,
        step_s,
    )
    data.tpot = source.range(
        _ratio("specguard_decode_seconds_total", "specguard_decode_tokens_total", "pool", window),
        start,
        end,
        step_s,
    )
    data.throughput = source.range(
        f"sum by (pool) (rate(specguard_output_tokens_total[{window}]))", start, end, step_s
    )
    total = source.instant("sum(specguard_requests_total)", at=end)
    data.requests = float(total["value"].iloc[0]) if len(total) else 0.0
    data.plan = current_plan(source, end)
    return data


def _increments(frame: pd.DataFrame, created: pd.DataFrame, start: float, step_s: float) -> pd.DataFrame:
    """Counter samples -> one row per step in which the counter rose (resets count from zero).

    A counter child is created on its first increment, so a series that appears inside the range
    started from zero there. Its first rise is placed at ``created`` (the counter's ``_created``
    time: when it really happened, also before Prometheus's first scrape) where specguard exports
    it; else at the first sample, and a series seen from the range's first steps is taken as older.
    """
    if frame.empty:
        return frame
    labels = [c for c in frame.columns if c not in ("timestamp", "value")]
    born = _created_times(created, labels)
    rows = []
    first_possible = pd.Timestamp(start + 2 * step_s, unit="s", tz="UTC")
    for key, series in frame.sort_values("timestamp").groupby(labels, dropna=False):
        previous = None
        for ts, value in zip(series["timestamp"], series["value"], strict=True):
            at = ts
            if previous is None:
                when = born.get(key)
                if when is None:
                    delta = value if ts > first_possible else 0.0
                else:
                    delta = value if when >= start else 0.0
                    at = min(ts, pd.Timestamp(when, unit="s", tz="UTC"))
            else:
                delta = value - previous if value >= previous else value
            previous = value
            if delta > 0:
                rows.append({**dict(zip(labels, key, strict=True)), "timestamp": at, "count": int(delta)})
    return pd.DataFrame(rows)


def _created_times(created: pd.DataFrame, labels: list[str]) -> dict[tuple, float]:
    if created.empty or not set(labels) <= set(created.columns):
        return {}
    return {tuple(row[c] for c in labels): float(row["value"]) for _, row in created.iterrows()}


def current_plan(source: PromData, at: float) -> pd.DataFrame:
    """Per class and load bucket: routed pool, K, and the latest RC there with its baseline source."""
    keys = ["task_type", "temperature_bucket", "load_bucket"]
    plan = source.instant("specguard_plan_info == 1", at=at)
    if plan.empty:
        return plan
    plan = plan[keys + ["pool"]].drop_duplicates(keys)
    k = source.instant("specguard_num_speculative_tokens", at=at)
    if not k.empty:
        plan = plan.merge(k[keys + ["value"]].rename(columns={"value": "K"}), on=keys, how="left")
        plan["K"] = plan["K"].round().astype("Int64")  # a count of tokens: 4, not 4.000
    # RC and its baseline source on the pool the class is planned on (none on a no-spec pool)
    rc = source.instant("specguard_relative_cost_per_token_ratio", at=at)
    if not rc.empty:
        rc = rc[keys + ["pool", "value"]].drop_duplicates(keys + ["pool"]).rename(columns={"value": "RC"})
        plan = plan.merge(rc, on=keys + ["pool"], how="left")
    source_info = source.instant("specguard_relative_cost_baseline_info == 1", at=at)
    if not source_info.empty and "source" in source_info.columns:
        info = source_info[keys + ["pool", "source"]].drop_duplicates(keys + ["pool"])
        plan = plan.merge(info.rename(columns={"source": "baseline"}), on=keys + ["pool"], how="left")
    return plan.sort_values(keys).reset_index(drop=True)


# ---- rendering -----------------------------------------------------------------------------------


def _table(frame: pd.DataFrame, empty: str) -> str:
    if frame.empty:
        return f"<p class=empty>{html.escape(empty)}</p>"
    return frame.to_html(index=False, border=0, classes="t", float_format=lambda v: f"{v:.3f}", na_rep="–")


def _actions_table(actions: pd.DataFrame) -> pd.DataFrame:
    if actions.empty:
        return actions
    table = actions.copy()
    table["time (UTC)"] = table["timestamp"].dt.strftime("%Y-%m-%d %H:%M:%S")
    table["count"] = table["count"].astype(int)
    cols = ["time (UTC)"] + [c for c in ("task_type", "temperature_bucket", "action", "reason") if c in table]
    return table[cols + ["count"]].sort_values("time (UTC)")


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table.t{border-collapse:collapse;font-size:0.85em} table.t td,table.t th{padding:3px 10px;
border-bottom:1px solid #eee;text-align:left} .meta{color:#666;font-size:0.85em} img{max-width:100%}
.empty{color:#a60}
"""


def colours(data: ReportData) -> figures.Colours:
    """The report's colour for every pool and class it shows."""
    pools = {
        p for f in (data.tpot, data.throughput, data.rc, data.plan) if "pool" in f for p in f["pool"].dropna()
    }
    frames = (data.rc, data.accept_length, data.strict_rate, data.rollback, data.actions, data.plan)
    classes = {c for f in frames if not f.empty for c in figures.with_class(f)["class"]}
    return figures.Colours.of(pools, classes)


def build_figures(data: ReportData) -> dict[str, figures.Figure | None]:
    """The report's figures by heading (None: nothing to draw in the range)."""
    paint = colours(data)
    trends = [
        (data.accept_length, "accept length (tokens/round)"),
        (data.strict_rate, "strict accept rate"),
        (data.rollback, "full-rollback ratio (rounds)"),
    ]
    return {
        "Relative cost per token per class": figures.rc_figure(data.rc, data.actions, paint, data.rc_samples),
        "Acceptance and rollback trends": figures.trends_figure(trends, data.window, paint),
        "Pools: TPOT and output throughput": figures.pools_figure(data.tpot, data.throughput, paint),
    }


MISSING = {
    "Relative cost per token per class": "No RC series in this range (no baseline yet, or no spec traffic).",
    "Acceptance and rollback trends": "No per-class acceptance series in this range.",
    "Pools: TPOT and output throughput": "No per-pool series in this range.",
}


def render_html(data: ReportData, title: str = "specguard report") -> str:
    """The whole report as one HTML string (no external resources)."""
    fmt = "%Y-%m-%d %H:%M:%S UTC"
    start = pd.Timestamp(data.start, unit="s", tz="UTC").strftime(fmt)
    end = pd.Timestamp(data.end, unit="s", tz="UTC").strftime(fmt)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class=meta>Prometheus {html.escape(data.url)} &middot; {start} to {end} &middot; "
        f"step {data.step_s:g} s &middot; rate window {data.window} &middot; "
        f"{data.requests:.0f} requests seen by the tap in total</p>",
        "<h2>Current plan</h2>",
        "<p class=meta>Where each class and load bucket is routed now, its K, and the latest measured "
        "relative cost per token (RC &lt; 1: speculation pays on this stack).</p>",
        _table(data.plan, "No plan exported (specguard_plan_info is absent: is the guard running?)"),
        "<h2>Guard decisions</h2>",
        _table(_actions_table(data.actions), "No guard actions in this range."),
    ]
    for heading, fig in build_figures(data).items():
        parts.append(f"<h2>{heading}</h2>")
        if fig is None:
            parts.append(f"<p class=empty>{MISSING[heading]}</p>")
            continue
        parts.append(f"<img alt='{html.escape(heading)}' src='data:image/png;base64,{figures.png(fig)}'>")
        if heading.startswith("Relative cost"):
            parts.append(_rc_note(data.rc))
    parts.append("</body></html>")
    return "\n".join(parts)


def _rc_note(rc: pd.DataFrame) -> str:
    drawn, empty = figures.rc_classes(rc)
    notes = []
    if empty:
        notes.append(f"No RC value in this range for {', '.join(empty)} (no baseline or no samples yet).")
    if len(drawn) > figures.MAX_CLASS_PANELS:
        rest = drawn[figures.MAX_CLASS_PANELS :]
        notes.append(f"{len(rest)} more classes not drawn: {', '.join(rest)}.")
    return "".join(f"<p class=empty>{html.escape(n)}</p>" for n in notes)
