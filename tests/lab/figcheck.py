"""Checks on rendered matplotlib figures that a reader would notice: labels that run into each
other, legends over the data, blank panels."""

from __future__ import annotations

import math
from itertools import combinations

from matplotlib.figure import Figure


def tick_labels(fig: Figure) -> list:
    """Every tick label a reader sees: visible axes, non-empty text, tick inside the view limits
    (matplotlib keeps labels for ticks just outside them, but does not draw those)."""
    fig.canvas.draw()
    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            slack = (high - low) * 1e-9
            for tick in axis.get_major_ticks():
                for label in (tick.label1, tick.label2):
                    inside = low - slack <= tick.get_loc() <= high + slack
                    if inside and label.get_visible() and label.get_text().strip():
                        out.append(label)
    return out


def overlapping_labels(fig: Figure) -> list[tuple[str, str]]:
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in tick_labels(fig)]
    return [(a, b) for (a, ba), (b, bb) in combinations(boxes, 2) if ba.overlaps(bb)]


def legends_over_axes(fig: Figure) -> list[str]:
    """Legends (figure or axes) whose box overlaps a plotting area."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    areas = [
        ax.get_window_extent(renderer)
        for ax in fig.axes
        if ax.get_visible() and ax.get_label() != "<colorbar>"
    ]
    return [
        ", ".join(t.get_text() for t in legend.get_texts())
        for legend in legends
        if any(legend.get_window_extent(renderer).overlaps(area) for area in areas)
    ]


def blank_panels(fig: Figure) -> list[str]:
    """Visible axes with neither a line holding a number nor a note saying there is no data."""
    out = []
    for ax in fig.axes:
        if not ax.get_visible() or ax.get_label() == "<colorbar>":
            continue
        drawn = any(any(math.isfinite(float(y)) for y in line.get_ydata()) for line in ax.get_lines())
        images = bool(ax.get_images())
        noted = any("no data" in t.get_text() for t in ax.texts)
        if not (drawn or images or noted):
            out.append(ax.get_title() or ax.get_ylabel())
    return out


def colours_by_gid(figs) -> dict[str, set[str]]:
    """gid ("pool:spec-k4", "class:code/greedy") -> the colours its lines have across ``figs``."""
    from matplotlib.colors import to_hex

    out: dict[str, set[str]] = {}
    for fig in figs:
        for ax in fig.axes:
            for line in ax.get_lines():
                if line.get_gid():
                    out.setdefault(line.get_gid(), set()).add(to_hex(line.get_color()))
    return out
