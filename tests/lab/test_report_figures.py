"""`specguard report` from a fixed run (tests/fixtures/report-run.json: a real Prometheus's answers
recorded by tests/lab/reportrun.py, replayed): what a reader of the HTML sees."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pandas as pd
import pytest
from figcheck import blank_panels, colours_by_gid, legends_over_axes, overlapping_labels
from reportrun import Replay, load

from specguard.lab import report, report_figures
from specguard.lab.report_data import PromData

RECORDED = load()


@pytest.fixture(scope="module")
def data() -> report.ReportData:
    meta = RECORDED["meta"]
    source = PromData(meta["url"], connect=Replay(RECORDED))
    return report.collect(source, meta["start"], meta["end"], meta["step"], meta["window"])


@pytest.fixture()
def figures(data):
    figs = report.build_figures(data)
    yield figs
    for fig in figs.values():
        if fig is not None:
            report_figures.plt.close(fig)


class Tables(HTMLParser):
    """The HTML's tables as lists of {header: cell text} rows."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_data(self, text):
        if self._cell is not None:
            self._cell.append(text)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def rows(self, n: int) -> list[dict[str, str]]:
        head, *body = self.tables[n]
        return [dict(zip(head, row, strict=True)) for row in body]


def test_k_and_decision_counts_are_integers(data):
    parser = Tables()
    parser.feed(report.render_html(data))
    plan, decisions = parser.rows(0), parser.rows(1)
    assert {r["K"] for r in plan} <= {"0", "2", "4"} and plan
    assert all(re.fullmatch(r"\d+", r["count"]) for r in decisions) and decisions
    assert all(re.fullmatch(r"\d\.\d{3}|–", r["RC"]) for r in plan)


def test_tick_labels_do_not_overlap(figures):
    for heading, fig in figures.items():
        assert fig is not None, heading
        assert not overlapping_labels(fig), heading


def test_legends_do_not_cover_the_plots(figures):
    for heading, fig in figures.items():
        assert fig.legends, heading
        assert not legends_over_axes(fig), heading


def test_one_colour_per_pool_and_per_class_across_figures(figures):
    colours = colours_by_gid(figures.values())
    pools = {gid: c for gid, c in colours.items() if gid.startswith("pool:")}
    classes = {gid: c for gid, c in colours.items() if gid.startswith("class:")}
    assert set(pools) == {"pool:spec-k4", "pool:spec-k2", "pool:nospec"}
    assert len(classes) == 4
    for gid, found in colours.items():
        assert len(found) == 1, (gid, found)
    assert len({c for (c,) in pools.values()}) == len(pools)
    assert len({c for (c,) in classes.values()}) == len(classes)
    # the same pool in the RC grid and in the TPOT/throughput figure
    rc_pools = colours_by_gid([figures["Relative cost per token per class"]])
    assert (
        rc_pools["pool:spec-k4"]
        == colours_by_gid([figures["Pools: TPOT and output throughput"]])["pool:spec-k4"]
    )


def test_no_blank_panels(figures, data):
    for heading, fig in figures.items():
        assert not blank_panels(fig), heading
    # a panel without data says so, and RC series holding no number are left out with a note
    fig = report_figures.pools_figure(data.tpot, pd.DataFrame(), report.colours(data))
    assert not blank_panels(fig) and any("no data" in t.get_text() for ax in fig.axes for t in ax.texts)
    report_figures.plt.close(fig)
    rc = data.rc.copy()
    rc.loc[rc["task_type"] == "chat", "value"] = float("nan")
    drawn, empty = report_figures.rc_classes(rc)
    assert "chat/medium" in empty and "chat/medium" not in drawn
    data_without = report.ReportData(**{**data.__dict__, "rc": rc})
    assert "No RC value in this range for chat/medium" in report.render_html(data_without)


def test_a_decision_before_the_first_scrape_is_at_its_real_time(data):
    first_scrape = min(data.rc["timestamp"].min(), data.throughput["timestamp"].min())
    (pin,) = data.actions[data.actions["action"] == "pin"].itertuples()
    created = next(
        r for r in RECORDED["instant"]["specguard_actions_created"] if r["metric"]["action"] == "pin"
    )
    assert pin.timestamp == pd.Timestamp(float(created["value"][1]), unit="s", tz="UTC")
    assert pin.timestamp < first_scrape
    # without the counter's creation time it could only be placed at its first sample
    actions = RECORDED["range"]["specguard_actions_total"]
    frame = PromData("x", connect=Replay({"range": {"q": actions}})).range("q", 0, 1, 1)
    meta = RECORDED["meta"]
    fallback = report._increments(frame, pd.DataFrame(), meta["start"], meta["step"])
    assert fallback[fallback["action"] == "pin"]["timestamp"].iloc[0] > pin.timestamp


def test_time_ticks_are_whole_times_in_one_format_without_matplotlibs_warnings(data, recwarn):
    figs = report.build_figures(data)
    for heading, fig in figs.items():
        fig.canvas.draw()
        labels = [
            t.get_text() for ax in fig.axes if ax.get_visible() for t in ax.get_xticklabels() if t.get_text()
        ]
        assert labels, heading
        assert all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", text) for text in labels), (heading, labels)
        assert len({len(text) for text in labels}) == 1, (heading, labels)  # never "20:04, 30, 20:05"
        assert any(ax.get_xlabel().startswith("time (UTC, ") for ax in fig.axes), heading
        report_figures.plt.close(fig)
    assert not [w for w in recwarn.list if "AutoDateLocator" in str(w.message)]


def test_decisions_are_labelled_marks_told_apart_by_kind(data):
    fig = report.build_figures(data)["Relative cost per token per class"]
    texts = {t.get_text().strip(): t.get_color() for ax in fig.axes for t in ax.texts}
    actions = set(data.actions["action"])
    assert actions and actions <= set(texts), (actions, texts)  # every decision carries its action
    kinds = {report_figures.mark_kind(a) for a in actions}
    assert len({report_figures.MARKS[k][1] for k in kinds}) == len(kinds)  # a colour per kind
    legend = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "guard move (plan change)" in legend and "operator (pin, pause)" in legend
    assert report_figures.mark_kind("report") == "report" and report_figures.mark_kind("off") == "move"
    report_figures.plt.close(fig)


def test_rc_on_few_requests_is_drawn_faint_not_as_a_measurement(data):
    fig = report.build_figures(data)["Relative cost per token per class"]
    alphas = {line.get_alpha() for ax in fig.axes for line in ax.lines if line.get_gid()}
    assert alphas == {1.0, 0.35}  # measured, and start-up / probe points on fewer than 30 requests
    few = data.rc_samples[data.rc_samples["value"] < report_figures.FEW_SAMPLES]
    assert not few.empty  # the recorded run starts with RC on a handful of requests
    legend = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert f"fewer than {report_figures.FEW_SAMPLES} requests (start-up)" in legend
    report_figures.plt.close(fig)
