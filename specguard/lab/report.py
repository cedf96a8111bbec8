"""``specguard report``: what the guard saw and did, from Prometheus, as one self-contained HTML file.

The data comes from range queries over the ``specguard_*`` series (report_data.PromData); every
ratio is computed in PromQL from summed counters, never by averaging ratios. Plots are PNGs
embedded as base64, so the file can be mailed or attached to a ticket.
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from specguard.lab.report_data import PromData  # noqa: E402

CLASS = ("task_type", "temperature_bucket")
MAX_CLASS_PANELS = 12


@dataclass
class ReportData:
    """Everything the report shows, as frames with a ``timestamp`` and a ``value`` column."""

    url: str
    start: float
    end: float
    step_s: float
    window: str
    rc: pd.DataFrame = field(default_factory=pd.DataFrame)
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
    data.actions = _increments(source.range("specguard_actions_total", start, end, step_s), start, step_s)
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


def _increments(frame: pd.DataFrame, start: float, step_s: float) -> pd.DataFrame:
    """Counter samples -> one row per step in which the counter rose (resets count from zero)."""
    if frame.empty:
        return frame
    labels = [c for c in frame.columns if c not in ("timestamp", "value")]
    rows = []
    first_possible = pd.Timestamp(start + 2 * step_s, unit="s", tz="UTC")
    for key, series in frame.sort_values("timestamp").groupby(labels, dropna=False):
        previous = None
        for ts, value in zip(series["timestamp"], series["value"], strict=True):
            if previous is None:
                # a counter child is created on its first increment: a series that appears
                # inside the range started from zero there
                delta = value if ts > first_possible else 0.0
            else:
                delta = value - previous if value >= previous else value
            previous = value
            if delta > 0:
                rows.append({**dict(zip(labels, key, strict=True)), "timestamp": ts, "count": delta})
    return pd.DataFrame(rows)


def current_plan(source: PromData, at: float) -> pd.DataFrame:
    """Per class and load bucket: routed pool, K, speculation on/off, latest RC and its source."""
    keys = ["task_type", "temperature_bucket", "load_bucket"]
    plan = source.instant("specguard_plan_info == 1", at=at)
    if plan.empty:
        return plan
    plan = plan[keys + ["pool"]].drop_duplicates(keys)
    k = source.instant("specguard_num_speculative_tokens", at=at)
    if not k.empty:
        plan = plan.merge(k[keys + ["value"]].rename(columns={"value": "K"}), on=keys, how="left")
    rc = source.instant("specguard_relative_cost_per_token_ratio", at=at)
    if not rc.empty:
        rc = rc.rename(columns={"pool": "measured_on", "value": "RC"})
        cols = keys + ["RC"] + (["measured_on"] if "measured_on" in rc.columns else [])
        plan = plan.merge(rc[cols].drop_duplicates(keys), on=keys, how="left")
    source_info = source.instant("specguard_relative_cost_baseline_info == 1", at=at)
    if not source_info.empty and "source" in source_info.columns:
        plan = plan.merge(
            source_info[keys + ["source"]].drop_duplicates(keys).rename(columns={"source": "baseline"}),
            on=keys,
            how="left",
        )
    return plan.sort_values(keys).reset_index(drop=True)


# ---- rendering -----------------------------------------------------------------------------------


def _class_name(row) -> str:
    return f"{row.get('task_type', '?')}/{row.get('temperature_bucket', '?')}"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _time(frame: pd.DataFrame) -> pd.Series:
    return frame["timestamp"].dt.tz_convert(None)


def plot_rc(data: ReportData) -> str | None:
    """RC per class over time, one panel per class, a line per load bucket, decisions marked."""
    if data.rc.empty:
        return None
    rc = data.rc.copy()
    rc["class"] = rc.apply(_class_name, axis=1)
    classes = sorted(rc["class"].unique())[:MAX_CLASS_PANELS]
    cols = 2 if len(classes) > 1 else 1
    rows = math.ceil(len(classes) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.6 * rows), squeeze=False, sharex=True)
    actions = data.actions.copy()
    if not actions.empty:
        actions["class"] = actions.apply(_class_name, axis=1)
    for ax, name in zip(axes.flat, classes, strict=False):
        part = rc[rc["class"] == name]
        for bucket, series in part.groupby(part.get("load_bucket", pd.Series("all", index=part.index))):
            ax.plot(_time(series), series["value"], label=f"load {bucket}", linewidth=1.4)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        if not actions.empty:
            for _, act in actions[actions["class"] == name].iterrows():
                ts = act["timestamp"].tz_convert(None)
                ax.axvline(ts, color="tab:red", linewidth=1.0, alpha=0.7)
                ax.annotate(
                    str(act.get("action", "act")),
                    (ts, 1.0),
                    xytext=(2, 6),
                    textcoords="offset points",
                    fontsize=7,
                    color="tab:red",
                    rotation=90,
                )
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("RC")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(classes) :]:
        ax.set_visible(False)
    fig.suptitle(
        "Relative cost per token (RC < 1: speculation pays); red lines: guard actions", fontsize=10, y=1.02
    )
    return _png(fig)


def plot_trends(data: ReportData) -> str | None:
    """Accept length, strict accept rate and full-rollback ratio per class over time."""
    panels = [
        (data.accept_length, "accept length (tokens/round)"),
        (data.strict_rate, "strict accept rate"),
        (data.rollback, "full-rollback ratio (rounds)"),
    ]
    if all(frame.empty for frame, _ in panels):
        return None
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    for ax, (frame, label) in zip(axes, panels, strict=True):
        if not frame.empty:
            frame = frame.copy()
            frame["class"] = frame.apply(_class_name, axis=1)
            for name, series in frame.groupby("class"):
                ax.plot(_time(series), series["value"], label=name, linewidth=1.2)
            ax.legend(fontsize=7, ncol=4, loc="upper left")
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Acceptance and rollback per class (rate window {data.window})", fontsize=10)
    return _png(fig)


def plot_pools(data: ReportData) -> str | None:
    """TPOT and output throughput per pool."""
    if data.tpot.empty and data.throughput.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 3))
    for ax, frame, label, scale in (
        (axes[0], data.tpot, "TPOT (ms)", 1000.0),
        (axes[1], data.throughput, "output tokens/s", 1.0),
    ):
        if not frame.empty:
            for pool, series in frame.groupby("pool"):
                ax.plot(_time(series), series["value"] * scale, label=str(pool))
            ax.legend(fontsize=7)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.tick_params(axis="x", labelsize=7, rotation=30)
    return _png(fig)


def _table(frame: pd.DataFrame, empty: str) -> str:
    if frame.empty:
        return f"<p class=empty>{html.escape(empty)}</p>"
    return frame.to_html(index=False, border=0, classes="t", float_format=lambda v: f"{v:.3f}", na_rep="–")


def _actions_table(actions: pd.DataFrame) -> pd.DataFrame:
    if actions.empty:
        return actions
    table = actions.copy()
    table["time (UTC)"] = table["timestamp"].dt.strftime("%Y-%m-%d %H:%M:%S")
    cols = ["time (UTC)"] + [c for c in ("task_type", "temperature_bucket", "action", "reason") if c in table]
    return table[cols + ["count"]].sort_values("time (UTC)")


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table.t{border-collapse:collapse;font-size:0.85em} table.t td,table.t th{padding:3px 10px;
border-bottom:1px solid #eee;text-align:left} .meta{color:#666;font-size:0.85em} img{max-width:100%}
.empty{color:#a60}
"""


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
    for heading, image, missing in (
        ("Relative cost per token per class", plot_rc(data), "No RC series in this range."),
        (
            "Acceptance and rollback trends",
            plot_trends(data),
            "No per-class acceptance series in this range.",
        ),
        ("Pools: TPOT and output throughput", plot_pools(data), "No per-pool series in this range."),
    ):
        parts.append(f"<h2>{heading}</h2>")
        if image:
            parts.append(f"<img alt='{html.escape(heading)}' src='data:image/png;base64,{image}'>")
        else:
            parts.append(f"<p class=empty>{missing}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
