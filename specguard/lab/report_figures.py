"""The report's matplotlib figures, built from ``report.ReportData`` frames.

Every pool and every class keeps one colour across all figures (``Colours``: lines are pools in
the RC and pool figures, classes in the trend figure); legends sit outside
the plotting area so they never cover a line; time axes use concise date labels with few ticks so
they do not run into each other; a panel without data says so instead of staying blank. Each
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


def _time_axis(ax) -> None:
    locator = mdates.AutoDateLocator(minticks=3, maxticks=6)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, show_offset=True))
    ax.tick_params(axis="both", labelsize=8)


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


def rc_figure(rc: pd.DataFrame, actions: pd.DataFrame, colours: Colours) -> Figure | None:
    """RC per class over time: a panel per class, a line per pool in
    the pool's colour and per load bucket in its own line style, the guard's decisions as red
    marks at their time."""
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
    for ax, name in zip(axes.flat, drawn, strict=False):
        part = rc[rc["class"] == name]
        for (pool, bucket), series in part.groupby(["pool", "load_bucket"]):
            times, values = gapped(series)
            (line,) = ax.plot(
                times, values, color=colours.pools[pool], linestyle=style[bucket], linewidth=1.6
            )
            line.set_gid(f"pool:{pool}")
            pools.add(pool)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        if not acts.empty:
            for _, act in acts[acts["class"] == name].iterrows():
                ax.axvline(act["timestamp"].tz_convert(None), color="tab:red", linewidth=1.0, alpha=0.8)
        ax.set_title(name, fontsize=10, loc="left", fontweight="bold")
        ax.set_ylabel("RC", fontsize=9)
        ax.grid(alpha=0.3)
        _time_axis(ax)
    for ax in list(axes.flat)[len(drawn) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.xaxis.set_tick_params(labelbottom=True)
    handles = [Line2D([], [], color=colours.pools[p], label=p) for p in sorted(pools)]
    if len(buckets) > 1:
        handles += [Line2D([], [], color="0.3", linestyle=style[b], label=f"load {b}") for b in buckets]
    handles += [
        Line2D([], [], color="black", linestyle="--", linewidth=0.8, label="RC = 1.0"),
        Line2D([], [], color="tab:red", label="guard decision"),
    ]
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(handles), fontsize=9)
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
    _time_axis(ax)
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
    _side_legend(fig, colours.pools, shown, "pool")
    fig.tight_layout()
    return fig
