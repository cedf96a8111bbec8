"""Grouping the cost model's results into evidence per class: which number stands for a pool.

A measurement beats a what-if for the same pool, unless the measurement rests on fewer than
``min_samples`` requests and the what-if on at least that many (issue 16 defect 3: four requests
on K=2 replaced a what-if built on 114, the shorten target then rejected the thin measurement and
the class went off instead of to K=2).
"""

from __future__ import annotations

import pytest

from specguard.rules import guard
from specguard.rules.evidence import evidence_from_costs
from tests.rules.test_evidence_inherit import MIN, ORDER, POLICY, cost, key, whatif

K4_LOSING = cost("medium", 1.30, 1.20, 114, predictions=[whatif("spec-k2", 0.85)])
K2_THIN = cost("medium", 1.10, 0.70, 4, pool="spec-k2", predictions=[whatif("spec-k4", 1.2)])
K2_MEASURED = cost("medium", 0.90, 0.86, MIN + 5, pool="spec-k2")


@pytest.mark.parametrize("order", [1, -1], ids=["k4-first", "k2-first"])
def test_a_thin_measurement_does_not_replace_a_well_supported_what_if(order):
    evidence = evidence_from_costs([K4_LOSING, K2_THIN][::order], policy=POLICY, load_order=ORDER)
    k2 = evidence[key("medium")].pools["spec-k2"]
    assert k2.predicted and k2.samples == 114 and k2.values["rc"] == pytest.approx(0.85)
    assert not evidence[key("medium")].pools["spec-k4"].predicted  # K=4's own measurement stands


@pytest.mark.parametrize("order", [1, -1], ids=["k4-first", "k2-first"])
def test_a_measurement_with_enough_samples_beats_the_what_if(order):
    evidence = evidence_from_costs([K4_LOSING, K2_MEASURED][::order], policy=POLICY, load_order=ORDER)
    k2 = evidence[key("medium")].pools["spec-k2"]
    assert not k2.predicted and k2.samples == MIN + 5 and k2.values["rc"] == pytest.approx(0.90)


def test_the_losing_class_shortens_to_k2_instead_of_going_off():
    evidence = evidence_from_costs([K2_THIN, K4_LOSING], policy=POLICY, load_order=ORDER)[key("medium")]
    state = guard.initial_state(key("medium"), POLICY)
    limit = POLICY.rules[0].limits.consecutive_failure_limit
    for tick in range(limit + 1):
        state, decision = guard.step(state, evidence, 30.0 * (tick + 1), POLICY)
    assert (decision.action, decision.to_pool) == ("shorten", "spec-k2")
    assert decision.numbers["target_predicted"] is True
