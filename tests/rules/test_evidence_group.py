"""Grouping the cost model's results into evidence per class: which number stands for a pool.

A measurement beats a what-if for the same pool, unless the measurement rests on fewer than
``min_samples`` requests and the what-if on at least that many (once, four requests
on K=2 replaced a what-if built on 114, the shorten target then rejected the thin measurement and
the class went off instead of to K=2).
"""

from __future__ import annotations

from dataclasses import replace

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


def decide(*costs):
    evidence = evidence_from_costs(list(costs), policy=POLICY, load_order=ORDER)[key("medium")]
    state = guard.initial_state(key("medium"), POLICY)
    limit = POLICY.rules[0].limits.consecutive_failure_limit
    for tick in range(limit + 1):
        state, decision = guard.step(state, evidence, 30.0 * (tick + 1), POLICY)
    return evidence, decision


def test_the_losing_class_shortens_to_k2_instead_of_going_off():
    tight = replace(K4_LOSING, lower=1.25, upper=1.35)
    evidence, decision = decide(K2_THIN, tight)
    assert (decision.action, decision.to_pool) == ("shorten", "spec-k2")
    assert decision.numbers["target_predicted"] is True
    # the what-if carries the relative interval of the measurement it was made from
    k2 = evidence.pools["spec-k2"].values
    assert (k2["rc_lower"], k2["rc_upper"]) == pytest.approx((0.85 * 1.25 / 1.30, 0.85 * 1.35 / 1.30))


def test_a_shorter_k_whose_upper_bound_is_not_good_is_no_place_to_go():
    """K=2 predicted 0.85 from a K=4 measurement of [1.20, 1.56]: up to 1.02, so off instead."""
    _, decision = decide(K2_THIN, K4_LOSING)
    assert (decision.action, decision.to_pool) == ("off", "nospec")
