"""One rule's verdict (``rules.assess``) on RC: only the interval's bound counts, whatever the
baseline and whatever RC measure the rule names (no move on a point estimate)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard.rules import assess
from specguard.rules.evidence import Evidence, PoolEvidence
from tests.rules.test_guard import POLICY, RC

SOURCES = ["live", "profile", "model"]


def measured(rc, lower, upper, source):
    values = {"rc": rc, "rc_lower": lower, "rc_upper": upper}
    return Evidence(pools={"spec-k4": PoolEvidence("spec-k4", values, samples=50, baseline_source=source)})


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(
    ("numbers", "restoring", "phase", "reason"),
    [
        pytest.param(
            (1.2, 0.9, 1.5), False, "ok", "rc_lower (0.900) within threshold", id="point-bad-bound-not"
        ),
        pytest.param(
            (1.2, 1.05, 1.4), False, "act", "rc_lower (1.050) > threshold", id="bound-past-threshold"
        ),
        pytest.param(
            (0.9, 0.7, 1.1), True, "act", "rc_upper (1.100) not < restore", id="restore-needs-upper"
        ),
        pytest.param((0.8, 0.7, 0.9), True, "ok", "rc_upper (0.900) < restore", id="restore-on-upper"),
    ],
)
def test_rc_is_judged_on_the_interval_bound_on_any_baseline(numbers, restoring, phase, reason, source):
    """The relative-cost rule named ``rc``: the real tier's creative class at RC 1.239 [0.88, 1.63]
    was moved off on its point; the bound would have held (a live baseline, not only the model)."""
    found = assess.assess(RC, "spec-k4", measured(*numbers, source), POLICY, restoring=restoring)
    assert found.phase.value == phase
    assert reason in found.reason
    assert "judged on the interval bound" in found.reason and "no move on a point estimate" in found.reason


def test_a_rule_on_the_upper_bound_still_acts_only_on_the_lower():
    """Naming the less careful bound does not loosen it: acting off reads rc_lower."""
    loose = replace(RC, measure="rc_upper")
    found = assess.assess(loose, "spec-k4", measured(1.2, 0.9, 1.5, "live"), POLICY, restoring=False)
    assert found.phase.value == "ok" and "rc_lower (0.900)" in found.reason


def test_an_rc_without_an_interval_holds():
    evidence = Evidence(
        pools={"spec-k4": PoolEvidence("spec-k4", {"rc": 1.5}, samples=50, baseline_source="live")}
    )
    found = assess.assess(RC, "spec-k4", evidence, POLICY, restoring=False)
    assert found.phase.value == "hold" and "no value for rc_lower (no interval)" in found.reason
