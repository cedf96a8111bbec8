"""`specguard sweep`'s plots from a fixed run (the simulator in virtual time, seeded): readable
size, labels that do not collide, the RC = 1.0 crossing drawn inside each class row, and the
TPOT axis labelled with the swept levels."""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pandas as pd
import pytest
from figcheck import legends_over_axes, overlapping_labels
from PIL import Image

from specguard import cli
from specguard.lab import sweep_plots

LEVELS = [1, 8, 64]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep-plots")
    args = ["sweep", "--levels", ",".join(map(str, LEVELS)), "--requests", "48", "--json",
            "--mix", "code:0.0,chat:0.7,creative:1.0", "-o", str(out)]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(args) == 0
    return out, pd.read_csv(out / "sweep.csv")


@pytest.fixture()
def figures(swept):
    figs = sweep_plots.figures(swept[1])
    yield figs
    for fig in figs.values():
        sweep_plots.plt.close(fig)


def test_pngs_are_readable_on_a_laptop_screen(swept):
    out, _ = swept
    for name in ("rc_heatmap_spec-k4.png", "rc_heatmap_spec-k2.png", "tpot_vs_concurrency.png"):
        with Image.open(out / name) as image:
            width, height = image.size
        assert width >= 900 and height >= 400, (name, width, height)


def test_labels_do_not_overlap_and_the_legend_is_off_the_plot(figures):
    for name, fig in figures.items():
        assert not overlapping_labels(fig), name
        assert not legends_over_axes(fig), name


def test_tpot_axis_reads_the_swept_levels(figures):
    ax = figures["tpot_vs_concurrency.png"].axes[0]
    ax.figure.canvas.draw()
    shown = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert shown == [str(c) for c in LEVELS]
    assert not [t for t in ax.get_xticklabels(minor=True) if t.get_text()]


def test_rc_crossing_is_drawn_inside_each_class_row(figures, swept):
    frame = swept[1]
    ax = figures["rc_heatmap_spec-k4.png"].axes[0]
    assert not ax.collections, "no contour across class rows"
    classes = [t.get_text() for t in ax.get_yticklabels()]
    bars = [line for line in ax.get_lines() if line.get_gid() == "crossing"]
    assert bars
    for bar in bars:
        (x0, x1), (y0, y1) = bar.get_xdata(), bar.get_ydata()
        assert x0 == x1 and y1 - y0 == 1.0 and (y0 + 0.5).is_integer()  # one row, between two levels
        task, bucket = classes[int(y0 + 0.5)].split("/")
        rows = frame[
            (frame.pool == "spec-k4") & (frame.task_type == task) & (frame.temperature_bucket == bucket)
        ]
        rc = rows.sort_values("concurrency")["relative_cost"].tolist()
        left, right = rc[math.floor(x0)], rc[math.ceil(x0)]
        assert (left >= 1.0) != (right >= 1.0), (task, rc, x0)
    # creative at temperature 1 loses at every level: no crossing in its row
    creative = classes.index("creative/high")
    assert all(bar.get_ydata()[0] != creative - 0.5 for bar in bars)


@pytest.mark.parametrize(
    "grid,expected",
    [
        pytest.param([[0.5, 0.9, 1.2]], [(0, 1.5)], id="one-crossing"),
        pytest.param([[0.5, 1.2, 0.8]], [(0, 0.5), (0, 1.5)], id="there-and-back"),
        pytest.param([[0.5, math.nan, 1.2]], [(0, 1.0)], id="across-a-missing-cell"),
        pytest.param([[1.2, 1.3], [0.5, 0.6]], [], id="rows-are-never-compared"),
        pytest.param([[0.99, 1.0]], [(0, 0.5)], id="exactly-one-loses"),
    ],
)
def test_crossings_stay_within_a_row(grid, expected):
    assert sweep_plots.crossings(np.array(grid, dtype=float)) == expected
