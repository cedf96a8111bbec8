"""One rule's verdict (``rules.assess``) when the RC rests on the model baseline: only its bound counts."""

from __future__ import annotations

import pytest

from specguard.rules import assess
from specguard.rules.evidence import Evidence, PoolEvidence
from tests.rules.test_guard import POLICY, RC


def model(rc, lower, upper, source="model"):
    values = {"rc": rc, "rc_lower": lower, "rc_upper": upper}
    return Evidence(pools={"spec-k4": PoolEvidence("spec-k4", values, samples=50, baseline_source=source)})


@pytest.mark.parametrize(
    ("evidence", "restoring", "phase", "reason"),
    [
        pytest.param(
            model(1.2, 0.9, 1.5), False, "ok", "rc_lower (0.900) within threshold", id="point-bad-bound-not"
        ),
        pytest.param(
            model(1.2, 1.05, 1.4), False, "act", "rc_lower (1.050) > threshold", id="bound-past-threshold"
        ),
        pytest.param(
            model(0.9, 0.7, 1.1), True, "act", "rc_upper (1.100) not < restore", id="restore-needs-upper"
        ),
        pytest.param(model(0.8, 0.7, 0.9), True, "ok", "rc_upper (0.900) < restore", id="restore-on-upper"),
        pytest.param(
            model(1.2, 0.9, 1.5, "live"), False, "act", "rc (1.200) > threshold", id="live-uses-point"
        ),
    ],
)
def test_model_baseline_is_judged_on_the_interval_bound(evidence, restoring, phase, reason):
    found = assess.assess(RC, "spec-k4", evidence, POLICY, restoring=restoring)
    assert found.phase.value == phase
    assert reason in found.reason
    if evidence.pools["spec-k4"].baseline_source == "model":
        assert "baseline is the model (no live or profile one): judged on the interval bound" in found.reason


def test_model_baseline_without_a_bound_holds():
    evidence = Evidence(
        pools={"spec-k4": PoolEvidence("spec-k4", {"rc": 1.5}, samples=50, baseline_source="model")}
    )
    found = assess.assess(RC, "spec-k4", evidence, POLICY, restoring=False)
    assert found.phase.value == "hold" and "model baseline: no interval bound" in found.reason
