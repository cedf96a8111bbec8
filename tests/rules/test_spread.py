"""Spread a class over the pools cheapest for it now (``rules.spread``, ``guard.spread``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard.rules import spread
from specguard.rules.evidence import Evidence, PoolEvidence
from tests.rules.test_guard import POLICY, st
from tests.rules.test_planfeed import SETTINGS, window


def cell(rc, samples=50):
    return PoolEvidence("spec-k4", {"rc": rc, "rc_lower": rc - 0.05, "rc_upper": rc + 0.05}, samples=samples)


def test_units_are_rc_carried_to_each_pools_step_and_only_where_evidence_may_move_a_class():
    found = spread.model(window(), POLICY, SETTINGS, None)
    assert isinstance(found, spread.Model)
    code, chat, qa = ("code", "greedy", "high"), ("chat", "greedy", "low"), ("qa", "greedy", "low")
    evidence = {
        code: Evidence(pools={"spec-k4": cell(0.7)}),
        chat: Evidence(pools={"spec-k4": cell(0.7, samples=2)}),  # too thin to move anything
        qa: Evidence(pools={"spec-k4": cell(0.7)}),
    }
    states = {code: st("spec-k4"), chat: st("spec-k4"), qa: st("spec-k4", pin="spec-k4")}
    units = spread.units(states, evidence, 100.0, POLICY, found)
    assert set(units) == {code}  # chat: one pool with evidence (nospec); qa: pinned
    load = found.loads["high"]
    assert units[code]["nospec"] == 1.0
    assert units[code]["spec-k4"] == pytest.approx(0.7 * found.step(0, load) / found.step(4, load))
    # at the load the cell was measured at, the unit gives back the measured TPOT ratio
    assert units[code]["spec-k4"] * found.step(4, load) / found.step(0, load) == pytest.approx(0.7)


def test_no_step_fit_no_spread():
    assert isinstance(spread.model([], POLICY, SETTINGS, None), str)


def test_a_failing_refit_holds_the_last_fit_that_stood_for_a_window_within_its_loads():
    held = spread.Held()
    first = held.model(window(), POLICY, SETTINGS, None, 100.0)
    assert isinstance(first, spread.Model) and first.held == ""
    later = held.model([], POLICY, SETTINGS, None, 100.0 + POLICY.window_seconds)  # this refit fails
    assert isinstance(later, spread.Model) and later.fit == first.fit
    assert "no step-cost fit" in later.held and f"{POLICY.window_seconds:.0f} s ago" in later.held
    assert later.loads != first.loads  # the loads are the window's now (none measured: representative)
    busier = [replace(window()[0], load=1000.0, decode_load=None)]  # past the held fit's loads
    assert isinstance(spread.model(busier, POLICY, SETTINGS, None), str)
    assert isinstance(held.model(busier, POLICY, SETTINGS, None, 100.0 + POLICY.window_seconds), str)
    gone = held.model([], POLICY, SETTINGS, None, 100.0 + POLICY.window_seconds + 1)
    assert isinstance(gone, str) and "no step-cost fit" in gone
    assert isinstance(spread.Held().model([], POLICY, SETTINGS, None, 0.0), str)  # nothing to hold yet
