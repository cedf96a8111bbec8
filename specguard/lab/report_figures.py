"""The report's matplotlib figures, built from ``report.ReportData`` frames.

Every pool and every class keeps one colour across all figures (``Colours``: lines are pools in
the RC and pool figures, classes in the trend figure); legends sit outside
the plotting area so they never cover a line; time axes carry few ticks, each a whole time of day
(the date once under the axis); a panel without data says so instead of staying blank; decisions
are labelled marks, told apart by kind; RC resting on few requests is drawn faint. Each
line carries a ``gid`` (``pool:<name>`` or ``class:<name>``) so tests can check the colours.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

MAX_CLASS_PANELS = 12
NO_DATA = "no data in this range"
LOAD_STYLES = ("-", "--", ":", "-.")
# pools and classes take colours from different palettes, so a pool is never mistaken for a class
POOL_PALETTE = plt.get_cmap("tab10").colors
CLASS_PALETTE = plt.get_cmap("Dark2").colors + plt.get_cmap("Set1").colors


def class_name(row) -> str:
    return f"{row.get('task_type', '?')}/{row.get('temperature_bucket', '?')}"


@dataclass(frozen=True)
class Colours:
    """One colour per pool and per class for the whole report (sorted names, fixed palettes)."""

    pools: dict[str, tuple]
    classes: dict[str, tuple]

    @classmethod
    def of(cls, pools: Iterable[str], classes: Iterable[str]) -> Colours:
        def assign(names: Iterable[str], palette) -> dict[str, tuple]:
            return {n: palette[i % len(palette)] for i, n in enumerate(sorted(set(names)))}

        return cls(assign(pools, POOL_PALETTE), assign(classes, CLASS_PALETTE))


def with_class(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    frame["class"] = frame.apply(class_name, axis=1) if not frame.empty else pd.Series(dtype=str)
    return frame


def _time(frame: pd.DataFrame) -> pd.Series:
    return frame["timestamp"].dt.tz_convert(None)


TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 3 * 3600, 6 * 3600, 12 * 3600)
"""Tick spacings (seconds) a time axis may use: the smallest that gives at most ``MAX_TICKS``."""
MAX_TICKS = 6


def _time_axis(ax, label: bool = True) -> None:
    """Few ticks, each a whole time of day in one format (``20:04:30``, or ``20:05`` from a minute
    up), never "20:04, 30, 20:05"; the date and the zone once, under the axis (``label``). Chosen
    here from the axis's span once everything is drawn, so matplotlib's AutoDateLocator (and its
    warning on short spans) is not used."""
    low, high = ax.get_xlim()
    span = max((high - low) * 86400.0, 1.0)
    step = next((s for s in TICK_STEPS if span / s <= MAX_TICKS), TICK_STEPS[-1])
    if step < 60:
        locator = mdates.SecondLocator(bysecond=range(0, 60, step))
    elif step < 3600:
        locator = mdates.MinuteLocator(byminute=range(0, 60, step // 60))
    else:
        locator = mdates.HourLocator(byhour=range(0, 24, step // 3600))
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if step < 60 else "%H:%M"))
    ax.tick_params(axis="both", labelsize=8)
    if label:
        ax.set_xlabel(f"time (UTC, {mdates.num2date(low).strftime('%Y-%m-%d')})", fontsize=8)


def _no_data(ax, what: str = NO_DATA) -> None:
    ax.text(0.5, 0.5, what, transform=ax.transAxes, ha="center", va="center", color="#a60", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def has_data(frame: pd.DataFrame) -> bool:
    return not frame.empty and bool(frame["value"].map(math.isfinite).any())


def png(fig: Figure, dpi: int = 100) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def rc_classes(rc: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(classes with RC data to draw, classes whose RC series hold no number in the range)."""
    if rc.empty:
        return [], []
    rc = with_class(rc)
    finite = rc[rc["value"].map(math.isfinite)]
    drawn = sorted(finite["class"].unique())
    return drawn, sorted(set(rc["class"]) - set(drawn))


FEW_SAMPLES = 30
"""RC points resting on fewer spec-side requests (the shipped ``min_samples``) are drawn faint:
right after start-up the first RC is a handful of requests, not a measurement to read."""
MOVES = ("off", "shorten", "lengthen", "restore", "revert", "freeze", "unfreeze")
OPERATOR = ("pin", "unpin", "pause", "resume")
# kind -> (legend, colour, line style); a decision marker is drawn and labelled by its kind
MARKS = {
    "move": ("guard move (plan change)", "tab:red", "-"),
    "operator": ("operator (pin, pause)", "tab:purple", "-."),
    "confirm": ("move confirmed by measurement", "tab:green", "--"),
    "report": ("report-only rule breached (never acted on)", "0.55", ":"),
}


def mark_kind(action: str) -> str:
    """Which kind of marker an action of ``specguard_actions_total`` is."""
    if action in OPERATOR:
        return "operator"
    if action == "confirm":
        return "confirm"
    if action == "report":
        return "report"
    return "move"


def _marks(ax, acts: pd.DataFrame) -> set[str]:
    """The class's decisions as vertical lines, each labelled with its action at the top, coloured
    and styled by kind (moves, operator, confirmations, report-only events told apart)."""
    if acts.empty:
        return set()
    low, high = ax.get_xlim()
    near = (high - low) / 10  # labels closer than this are stacked, not drawn over each other
    kinds, last_x, level = set(), None, 0
    for _, act in acts.sort_values("timestamp").iterrows():
        kind = mark_kind(str(act.get("action", "")))
        _, colour, style = MARKS[kind]
        x = mdates.date2num(act["timestamp"].tz_convert(None))
        ax.axvline(x, color=colour, linestyle=style, linewidth=1.1, alpha=0.9)
        level = level + 1 if last_x is not None and x - last_x < near else 0
        last_x = x
        label = str(act.get("action", "")) if kind != "report" else "report"
        ax.text(
            x,
            0.97 - 0.14 * (level % 4),
            f" {label}",
            transform=ax.get_xaxis_transform(),
            color=colour,
            fontsize=7,
            ha="left",
            va="top",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.5},
        )
        kinds.add(kind)
    return kinds


def _enough(series: pd.DataFrame, samples: pd.DataFrame | None) -> pd.Series:
    """True where the RC point rests on at least ``FEW_SAMPLES`` spec-side requests (all True when
    the sample counts are not known)."""
    if samples is None or samples.empty:
        return pd.Series(True, index=series.index)
    keys = [c for c in LABEL_KEYS if c in series.columns and c in samples.columns]
    merged = series.merge(
        samples[[*keys, "timestamp", "value"]].rename(columns={"value": "samples"}),
        on=[*keys, "timestamp"],
        how="left",
    )
    return pd.Series((merged["samples"].fillna(0) >= FEW_SAMPLES).to_numpy(), index=series.index)


LABEL_KEYS = ("task_type", "temperature_bucket", "load_bucket", "pool", "instance", "job")


def rc_figure(
    rc: pd.DataFrame, actions: pd.DataFrame, colours: Colours, samples: pd.DataFrame | None = None
) -> Figure | None:
    """RC per class over time: a panel per class, a line per pool in the pool's colour and per
    load bucket in its own line style (faint where fewer than ``FEW_SAMPLES`` requests stand
    behind it), the guard's decisions as labelled marks at their time, by kind."""
    drawn, _ = rc_classes(rc)
    drawn = drawn[:MAX_CLASS_PANELS]
    if not drawn:
        return None
    rc = with_class(rc)
    if "load_bucket" not in rc:
        rc["load_bucket"] = "all"
    buckets = sorted(rc["load_bucket"].dropna().unique())
    style = {b: LOAD_STYLES[i % len(LOAD_STYLES)] for i, b in enumerate(buckets)}
    acts = with_class(actions) if not actions.empty else actions
    cols = 2 if len(drawn) > 1 else 1
    rows = math.ceil(len(drawn) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.9 * rows + 0.8), squeeze=False, sharex=True)
    pools: set[str] = set()
    faint = False
    for ax, name in zip(axes.flat, drawn, strict=False):
        part = rc[rc["class"] == name]
        for (pool, bucket), series in part.groupby(["pool", "load_bucket"]):
            series = series.sort_values("timestamp")
            enough = _enough(series, samples)
            for solid in (True, False):
                shown = series.assign(value=series["value"].where(enough if solid else ~enough))
                if not shown["value"].map(math.isfinite).any():
                    continue
                times, values = gapped(shown)
                (line,) = ax.plot(
                    times,
                    values,
                    color=colours.pools[pool],
                    linestyle=style[bucket],
                    linewidth=1.6 if solid else 1.0,
                    alpha=1.0 if solid else 0.35,
                )
                line.set_gid(f"pool:{pool}")
                faint = faint or not solid
            pools.add(pool)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(name, fontsize=10, loc="left", fontweight="bold")
        ax.set_ylabel("RC", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(drawn) :]:
        ax.set_visible(False)
    kinds: set[str] = set()
    for ax, name in zip(axes.flat, drawn, strict=False):
        _time_axis(ax, label=any(ax is bottom for bottom in axes[-1]))
        if not acts.empty:
            kinds |= _marks(ax, acts[acts["class"] == name])
    for ax in axes[-1]:
        ax.xaxis.set_tick_params(labelbottom=True)
    handles = [Line2D([], [], color=colours.pools[p], label=p) for p in sorted(pools)]
    if len(buckets) > 1:
        handles += [Line2D([], [], color="0.3", linestyle=style[b], label=f"load {b}") for b in buckets]
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.8, label="RC = 1.0"))
    if faint:
        handles.append(
            Line2D([], [], color="0.3", alpha=0.35, label=f"fewer than {FEW_SAMPLES} requests (start-up)")
        )
    for kind in MARKS:
        if kind in kinds:
            legend, colour, line_style = MARKS[kind]
            handles.append(Line2D([], [], color=colour, linestyle=line_style, label=legend))
    ncol = min(len(handles), 4)
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol, fontsize=9)
    fig.tight_layout()
    return fig


def gapped(series: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Times and values with a break wherever samples are missing, so a line that stops and
    starts again is not drawn straight across the gap."""
    series = series.sort_values("timestamp")
    times, values = _time(series).reset_index(drop=True), series["value"].reset_index(drop=True)
    if len(times) < 3:
        return times, values
    step = times.diff().median()
    breaks = times.diff() > 1.5 * step
    for i in reversed(list(breaks[breaks].index)):
        times = pd.concat([times[:i], pd.Series([times[i - 1] + step / 2]), times[i:]], ignore_index=True)
        values = pd.concat([values[:i], pd.Series([math.nan]), values[i:]], ignore_index=True)
    return times, values


def _lines(ax, frame: pd.DataFrame, key: str, palette: dict[str, tuple], scale: float = 1.0) -> set[str]:
    """One line per ``key`` value in its palette colour (gid ``<key>:<name>``); a note when empty."""
    if not has_data(frame):
        _no_data(ax)
        return set()
    for name, series in frame.groupby(key):
        times, values = gapped(series)
        (line,) = ax.plot(times, values * scale, color=palette[name], linewidth=1.4)
        line.set_gid(f"{key}:{name}")
    ax.grid(alpha=0.3)
    return set(frame[key])


def _side_legend(fig: Figure, palette: dict[str, tuple], names: set[str], title: str) -> None:
    handles = [Line2D([], [], color=palette[n], label=n) for n in sorted(names)]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, title=title)


def trends_figure(panels: list[tuple[pd.DataFrame, str]], window: str, colours: Colours) -> Figure | None:
    """Accept length, strict accept rate and full-rollback ratio per class, one colour per class."""
    if not any(has_data(frame) for frame, _ in panels):
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 2.8 * len(panels)), sharex=True)
    shown: set[str] = set()
    for ax, (frame, label) in zip(axes, panels, strict=True):
        ax.set_ylabel(label, fontsize=9)
        shown |= _lines(ax, with_class(frame), "class", colours.classes)
    for ax in axes:
        if ax.lines:
            _time_axis(ax, label=ax is axes[-1])
    _side_legend(fig, colours.classes, shown, "class")
    fig.suptitle(f"Acceptance and rollback per class (rate window {window})", fontsize=11)
    fig.tight_layout()
    return fig


def pools_figure(tpot: pd.DataFrame, throughput: pd.DataFrame, colours: Colours) -> Figure | None:
    """TPOT and output throughput per pool, one colour per pool."""
    if not has_data(tpot) and not has_data(throughput):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    shown: set[str] = set()
    for ax, frame, label, scale in (
        (axes[0], tpot, "TPOT (ms)", 1000.0),
        (axes[1], throughput, "output tokens/s", 1.0),
    ):
        ax.set_ylabel(label, fontsize=9)
        shown |= _lines(ax, frame, "pool", colours.pools, scale)
        if ax.lines:
            _time_axis(ax)
    _side_legend(fig, colours.pools, shown, "pool")
    fig.tight_layout()
    return fig
