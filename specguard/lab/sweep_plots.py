"""PNG plots of a sweep: RC heatmap (class x concurrency) per K with the 1.0 contour; TPOT vs concurrency."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from specguard.lab.sweep import ALL  # noqa: E402


def _classes(frame: pd.DataFrame) -> list[str]:
    part = frame[frame["task_type"] != ALL]
    return sorted({f"{t}/{b}" for t, b in zip(part["task_type"], part["temperature_bucket"], strict=True)})


def write_plots(frame: pd.DataFrame, out: Path) -> list[Path]:
    paths = []
    spec = frame[frame["num_speculative_tokens"] > 0]
    classes = _classes(frame)
    levels = sorted(frame["concurrency"].unique())
    for (pool, k), part in spec.groupby(["pool", "num_speculative_tokens"]):
        grid = np.full((len(classes), len(levels)), np.nan)
        for _, row in part[part["task_type"] != ALL].iterrows():
            i = classes.index(f"{row['task_type']}/{row['temperature_bucket']}")
            grid[i, levels.index(row["concurrency"])] = row["relative_cost"]
        fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(levels), 1.2 + 0.5 * len(classes)))
        image = ax.imshow(grid, cmap="RdYlGn_r", vmin=0.3, vmax=1.7, aspect="auto")
        if np.isfinite(grid).sum() >= 4 and len(classes) > 1 and len(levels) > 1:
            ax.contour(np.nan_to_num(grid, nan=1.0), levels=[1.0], colors="black", linewidths=1.5)
        for i in range(len(classes)):
            for j in range(len(levels)):
                if math.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(levels)), [str(c) for c in levels])
        ax.set_yticks(range(len(classes)), classes)
        ax.set_xlabel("concurrency")
        ax.set_title(f"RC on {pool} (K={k}); black line: RC = 1.0")
        fig.colorbar(image, ax=ax, label="RC (<1: speculation pays)")
        path = out / f"rc_heatmap_{pool}.png"
        fig.savefig(path, dpi=90, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    fig, ax = plt.subplots(figsize=(7, 4))
    whole = frame[frame["task_type"] == ALL]
    for (pool, k), part in whole.groupby(["pool", "num_speculative_tokens"]):
        part = part.sort_values("concurrency")
        ax.plot(part["concurrency"], part["tpot_seconds"] * 1000, marker="o", label=f"{pool} (K={k})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("TPOT (ms), whole mix")
    ax.grid(alpha=0.3)
    ax.legend()
    path = out / "tpot_vs_concurrency.png"
    fig.savefig(path, dpi=90, bbox_inches="tight")
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
