"""The two answers a K sweep exists for: the best K per class per concurrency, and where each
class's RC crosses 1.0 (docs/commands.md#specguard-sweep).

Both read a ``sweep.to_frame`` frame, so they work the same on the simulator and on real engines.
"""

from __future__ import annotations

import math

import pandas as pd

from specguard.lab.sweep import ALL

CLASS_KEYS = ["geometry", "task_type", "temperature_bucket"]


def best_k(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (geometry, concurrency, class): the pool with the lowest TPOT (RC against no-spec).

    The no-spec pool competes too (RC 1.0), so "best K = 0" means speculation does not pay there.
    The class ``all`` rows answer for the whole mix.
    """
    rows = []
    keys = ["geometry", "concurrency", "task_type", "temperature_bucket"]
    usable = frame[frame["tpot_seconds"].notna()]
    for key, cell in usable.groupby(keys, sort=True):
        best = cell.loc[cell["tpot_seconds"].idxmin()]
        nospec = cell[cell["num_speculative_tokens"] == 0]
        rows.append(
            dict(zip(keys, key, strict=True))
            | {
                "best_pool": best["pool"],
                "best_k": int(best["num_speculative_tokens"]),
                "best_rc": float(best["relative_cost"]),
                "best_tpot_seconds": float(best["tpot_seconds"]),
                "nospec_tpot_seconds": float(nospec["tpot_seconds"].iloc[0]) if len(nospec) else math.nan,
                "candidates": int(len(cell)),
            }
        )
    return pd.DataFrame(rows)


def rc_crossings(frame: pd.DataFrame) -> pd.DataFrame:
    """Per speculative pool, geometry and class: the concurrency where RC crosses 1.0.

    Between two swept levels the crossing is interpolated linearly in log2(concurrency) (levels are
    usually powers of two). ``status``: ``crosses`` (RC < 1 below, >= 1 above: speculation stops
    paying), ``crosses-down`` (the other way), ``pays-everywhere`` or ``never-pays`` (no crossing
    within the swept levels; ``crossing_concurrency`` is then NaN).
    """
    rows = []
    spec = frame[(frame["num_speculative_tokens"] > 0) & frame["relative_cost"].notna()]
    for (pool, k, *key), part in spec.groupby(["pool", "num_speculative_tokens", *CLASS_KEYS], sort=True):
        part = part.sort_values("concurrency")
        levels = [int(c) for c in part["concurrency"]]
        rcs = [float(r) for r in part["relative_cost"]]
        status, where, between = _crossing(levels, rcs)
        rows.append(
            {"pool": pool, "num_speculative_tokens": int(k)}
            | dict(zip(CLASS_KEYS, key, strict=True))
            | {
                "status": status,
                "crossing_concurrency": where,
                "between": between,
                "min_concurrency": levels[0],
                "max_concurrency": levels[-1],
            }
        )
    return pd.DataFrame(rows)


def _crossing(levels: list[int], rcs: list[float]) -> tuple[str, float, str]:
    points = list(zip(levels, rcs, strict=True))
    for (c1, r1), (c2, r2) in zip(points, points[1:], strict=False):
        if (r1 < 1.0) != (r2 < 1.0):
            x1, x2 = math.log2(c1), math.log2(c2)
            x = x1 + (1.0 - r1) / (r2 - r1) * (x2 - x1)
            return ("crosses" if r1 < 1.0 else "crosses-down"), round(2.0**x, 2), f"{c1}-{c2}"
    if all(r < 1.0 for r in rcs):
        return "pays-everywhere", math.nan, ""
    return "never-pays", math.nan, ""


def crossing_lines(crossings: pd.DataFrame) -> list[str]:
    """One human line per row of ``rc_crossings``."""
    out = []
    several = crossings["geometry"].nunique() > 1 if len(crossings) else False
    for _, row in crossings.iterrows():
        cls = f"{row['task_type']}/{row['temperature_bucket']}"
        name = f"{row['pool']} {cls}" + (f" [{row['geometry']}]" if several else "")
        top = row["max_concurrency"]
        text = {
            "crosses": f"RC crosses 1.0 at concurrency ~{row['crossing_concurrency']:g} "
            f"(between {row['between']}): speculation stops paying above it",
            "crosses-down": f"RC falls below 1.0 at concurrency ~{row['crossing_concurrency']:g} "
            f"(between {row['between']})",
            "pays-everywhere": f"RC < 1 at every level up to {top}",
            "never-pays": "RC >= 1 at every level (speculation never pays)",
        }[row["status"]]
        out.append(f"{name}: {text}")
    return out


def best_k_lines(table: pd.DataFrame) -> list[str]:
    """The best-K table as aligned text, one line per (geometry, concurrency, class)."""
    if table.empty:
        return []
    several = table["geometry"].nunique() > 1
    lines = []
    for _, row in table.iterrows():
        cls = "whole mix" if row["task_type"] == ALL else f"{row['task_type']}/{row['temperature_bucket']}"
        where = f"{row['geometry']} " if several else ""
        lines.append(
            f"{where}c={int(row['concurrency']):<4} {cls:<22} best K={row['best_k']} "
            f"({row['best_pool']}, RC {row['best_rc']:.2f})"
        )
    return lines
