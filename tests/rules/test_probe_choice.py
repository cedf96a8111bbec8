"""Probe pool and share by expected cost (``rules.probes``)."""

from __future__ import annotations

import pytest

from specguard.rules import policy as policy_mod
from specguard.rules import probes
from specguard.rules.evidence import Evidence, PoolEvidence
from specguard.rules.guard import ClassState

POOLS = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
POLICY = policy_mod.load_default().with_pools(POOLS, "spec-k4", "nospec")
MIN = POLICY.rules[0].limits.min_samples
SHARE = 0.05


def measured(name, rc, samples=MIN + 10):
    return PoolEvidence(pool=name, values={"rc": rc}, samples=samples)


def exact(name, rc, samples=MIN + 10):
    return PoolEvidence(pool=name, values={"rc": rc}, samples=samples, predicted=True, method="histogram")


def ev(*pools, prior=None):
    return Evidence(pools={p.pool: p for p in pools}, prior=dict(prior or {}))


@pytest.mark.parametrize(
    ("evidence", "memory", "expected"),
    [
        pytest.param(ev(), {}, ("spec-k4", SHARE, None), id="nothing-known-default-pool"),
        pytest.param(
            ev(measured("spec-k4", 1.9), exact("spec-k2", 0.85)),
            {},
            ("spec-k2", SHARE, "what-if"),
            id="k4-loses-k2-pays-probe-k2",
        ),
        pytest.param(
            ev(measured("spec-k4", 2.0), exact("spec-k2", 1.6)),
            {},
            ("spec-k2", pytest.approx(0.005 / 0.6), "what-if"),
            id="both-lose-less-probing",
        ),
        pytest.param(
            ev(measured("spec-k4", 3.5)),
            {},
            ("spec-k4", SHARE * probes.MIN_FRACTION, "measured"),
            id="never-below-the-floor",
        ),
        pytest.param(
            ev(measured("spec-k4", 1.9), exact("spec-k2", 0.85)),
            {"spec-k2": (1.3, 90.0)},
            ("spec-k2", pytest.approx(0.005 / 0.3), "memory"),
            id="remembered-measurement-beats-the-what-if",
        ),
        pytest.param(
            ev(measured("spec-k4", 1.9), exact("spec-k2", 0.85, samples=3)),
            {},
            ("spec-k4", pytest.approx(0.005 / 0.9), "measured"),
            id="thin-what-if-ignored",
        ),
        pytest.param(
            ev(measured("spec-k2", 0.93, samples=MIN - 5), measured("spec-k4", 1.1, samples=MIN - 20)),
            {"spec-k4": (1.09, 90.0)},
            ("spec-k2", SHARE, probes.THIN),
            id="thin-measurement-where-nothing-else-keeps-the-probes-on-k2",
        ),
        pytest.param(
            ev(prior={"spec-k4": 1.4, "spec-k2": 1.05}),
            {},
            ("spec-k2", SHARE, "profile"),
            id="profile-where-nothing-live",
        ),
    ],
)
def test_choose(evidence, memory, expected):
    probe = probes.choose(evidence, memory, 100.0, POLICY, SHARE)
    assert (probe.pool, probe.share, probe.basis or None) == expected
    assert probe.pool in probe.reason


def test_share_keeps_the_expected_cost_within_the_budget():
    for rc in (1.05, 1.2, 1.5, 2.0, 3.0):
        share = probes.share_for(rc, SHARE)
        assert share * (rc - 1) <= probes.COST_BUDGET + 1e-12 or share == SHARE * probes.MIN_FRACTION
    assert probes.share_for(0.8, SHARE) == probes.share_for(None, SHARE) == SHARE


def test_plan_covers_the_classes_off_speculation_only():
    off, on = ("chat", "medium", "low"), ("code", "greedy", "low")
    states = {off: ClassState(off, "nospec"), on: ClassState(on, "spec-k4")}
    evidence = {off: ev(measured("spec-k4", 1.9), exact("spec-k2", 0.85))}
    out = probes.plan(states, evidence, 100.0, POLICY, SHARE)
    assert set(out) == {off} and out[off].pool == "spec-k2"
