"""PNG plots of a sweep: an RC heatmap (class x concurrency) per speculative pool with the RC = 1.0
crossing drawn per class, and TPOT against concurrency per pool.

Sized to be read on a laptop screen (about 1000 px wide and more) with the concurrency levels
as they were swept (1, 8, 64, not 2^n). The crossing is a bar between the two levels of one class
row where RC goes from below 1.0 to 1.0 or above (or back): rows are different classes, so
nothing is interpolated across them.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from specguard.lab.sweep import ALL  # noqa: E402

DPI = 120


def _classes(frame: pd.DataFrame) -> list[str]:
    part = frame[frame["task_type"] != ALL]
    return sorted({f"{t}/{b}" for t, b in zip(part["task_type"], part["temperature_bucket"], strict=True)})


def rc_grid(part: pd.DataFrame, classes: list[str], levels: list[int]) -> np.ndarray:
    """RC of one pool as a (class, level) array; NaN where the cell has no RC."""
    grid = np.full((len(classes), len(levels)), np.nan)
    for _, row in part[part["task_type"] != ALL].iterrows():
        i = classes.index(f"{row['task_type']}/{row['temperature_bucket']}")
        grid[i, levels.index(row["concurrency"])] = row["relative_cost"]
    return grid


def crossings(grid: np.ndarray) -> list[tuple[int, float]]:
    """(row, x) of every RC = 1.0 crossing inside one class row: x = j + 0.5 sits between the
    levels j and j + 1 whose RC lie on either side of 1.0 (cells without RC are skipped over)."""
    out = []
    for i, row in enumerate(grid):
        known = [(j, v) for j, v in enumerate(row) if math.isfinite(v)]
        for (j0, v0), (j1, v1) in zip(known, known[1:], strict=False):
            if (v0 >= 1.0) != (v1 >= 1.0):
                out.append((i, (j0 + j1) / 2))
    return out


def heatmap_figure(grid: np.ndarray, classes: list[str], levels: list[int], pool: str, k: int) -> Figure:
    fig, ax = plt.subplots(figsize=(max(8.0, 2.8 + 0.9 * len(levels)), max(4.0, 1.6 + 0.55 * len(classes))))
    image = ax.imshow(grid, cmap="RdYlGn_r", vmin=0.3, vmax=1.7, aspect="auto")
    for i, x in crossings(grid):
        ax.plot(
            [x, x], [i - 0.5, i + 0.5], color="black", linewidth=3.0, solid_capstyle="butt", gid="crossing"
        )
    for i in range(len(classes)):
        for j in range(len(levels)):
            if math.isfinite(grid[i, j]):
                r, g, b, _ = image.cmap(image.norm(grid[i, j]))
                colour = (
                    "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
                )  # readable on the cell
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=9, color=colour)
    ax.set_xticks(range(len(levels)), [str(c) for c in levels], fontsize=10)
    ax.set_yticks(range(len(classes)), classes, fontsize=10)
    ax.set_xlabel("concurrency (requests in flight)", fontsize=10)
    ax.set_title(f"RC on {pool} (K={k}); black bar: RC crosses 1.0 between two levels", fontsize=11)
    fig.colorbar(image, ax=ax, label="RC (< 1: speculation pays)")
    fig.tight_layout()
    return fig


def tpot_figure(frame: pd.DataFrame) -> Figure:
    fig, ax = plt.subplots(figsize=(9, 5))
    whole = frame[frame["task_type"] == ALL]
    for (pool, k), part in whole.groupby(["pool", "num_speculative_tokens"]):
        part = part.sort_values("concurrency")
        ax.plot(part["concurrency"], part["tpot_seconds"] * 1000, marker="o", label=f"{pool} (K={k})")
    levels = sorted(int(c) for c in whole["concurrency"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("concurrency (requests in flight, log scale)", fontsize=10)
    ax.set_ylabel("TPOT (ms), whole mix", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    fig.tight_layout()
    return fig


def figures(frame: pd.DataFrame) -> dict[str, Figure]:
    """File name -> figure, for every plot of the sweep."""
    out = {}
    spec = frame[frame["num_speculative_tokens"] > 0]
    classes = _classes(frame)
    levels = sorted(int(c) for c in frame["concurrency"].unique())
    for (pool, k), part in spec.groupby(["pool", "num_speculative_tokens"]):
        out[f"rc_heatmap_{pool}.png"] = heatmap_figure(
            rc_grid(part, classes, levels), classes, levels, pool, k
        )
    out["tpot_vs_concurrency.png"] = tpot_figure(frame)
    return out


def write_plots(frame: pd.DataFrame, out: Path) -> list[Path]:
    paths = []
    for name, fig in figures(frame).items():
        path = out / name
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def crossovers(frame: pd.DataFrame) -> list[str]:
    """Per speculative pool and class: the lowest concurrency where RC >= 1.0 (or "never")."""
    out = []
    spec = frame[(frame["num_speculative_tokens"] > 0) & (frame["task_type"] != ALL)]
    for (pool, task, bucket), part in spec.groupby(["pool", "task_type", "temperature_bucket"]):
        part = part.sort_values("concurrency")
        losing = part[part["relative_cost"] >= 1.0]
        if losing.empty:
            where = f"RC < 1 at every level up to {int(part['concurrency'].max())}"
        elif len(losing) == len(part):
            where = "RC >= 1 at every level (speculation never pays)"
        else:
            where = f"RC crosses 1.0 at concurrency {int(losing['concurrency'].iloc[0])}"
        out.append(f"{pool} {task}/{bucket}: {where}")
    return out
