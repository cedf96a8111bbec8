"""Losses inherited upwards along the load buckets (policy ``guard.rc_rises_with_load``).

A (class, pool, load bucket) with too few samples gets the ``rc_lower`` of the nearest lower
bucket with enough samples, but only when that bound is a loss (> 1): a bound, labelled, never a
gain and never restore evidence. Driven through the real state machine, the higher bucket then
moves after the usual consecutive failures instead of first waiting for ``min_samples``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard.rules import guard
from specguard.rules import policy as policy_mod
from specguard.rules.cost import ClassCost
from specguard.rules.cost_config import LoadBucket
from specguard.rules.evidence import evidence_from_costs, inherit_losses_upward, load_order
from specguard.rules.guard import Phase
from specguard.rules.whatif import WhatIf

POOLS = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
POLICY = policy_mod.load_default().with_pools(POOLS, "spec-k4", "nospec")
ORDER = ("low", "medium", "high")
MIN = POLICY.rules[0].limits.min_samples


def cost(load, rc, lower, n, pool="spec-k4", task="chat", temp="medium", predictions=()):
    return ClassCost(
        task_type=task,
        temperature_bucket=temp,
        load_bucket=load,
        pool=pool,
        num_speculative_tokens=POOLS[pool],
        status="ok" if n >= MIN else "few_samples",
        rc=rc,
        lower=lower,
        upper=None if rc is None else rc * 1.2,
        confidence=0.95,
        interval_method="jackknife",
        n_spec=n,
        n_base=100,
        spec_tpot_seconds=None,
        base_tpot_seconds=None,
        baseline_source="profile",
        baseline_detail="",
        accept_length=2.0,
        predictions=tuple(predictions),
    )


def whatif(pool, rc):
    return WhatIf(pool, POOLS[pool], rc, 2.0, "histogram", 0.01, "profile", "")


def key(load, task="chat", temp="medium"):
    return (task, temp, load)


def test_a_loss_at_a_lower_bucket_becomes_a_labelled_bound_at_a_thin_higher_bucket():
    costs = [cost("low", 1.45, 1.31, 60), cost("medium", 0.9, 0.5, 5), cost("high", None, None, 0)]
    ev = evidence_from_costs(costs, policy=POLICY, load_order=ORDER)
    for load in ("medium", "high"):
        found = ev[key(load)].pools["spec-k4"]
        assert found.inherited_from == "low" and not found.predicted
        assert dict(found.values) == {"rc_lower": 1.31}  # the bound only: no rc, no rc_upper
        assert found.samples == 60
        assert "inherited from load_bucket=low (rc_lower 1.31 > 1.0" in found.note
    own = ev[key("low")].pools["spec-k4"]
    assert own.inherited_from is None and own.values["rc"] == 1.45


def test_no_inheritance_without_the_policy_or_with_the_option_off():
    costs = [cost("low", 1.45, 1.31, 60), cost("medium", 0.9, 0.5, 5)]
    for ev in (
        evidence_from_costs(costs),
        evidence_from_costs(costs, policy=replace(POLICY, rc_rises_with_load=False), load_order=ORDER),
        evidence_from_costs(costs, policy=POLICY),  # no load order known: nothing to inherit along
    ):
        found = ev[key("medium")].pools["spec-k4"]
        assert found.inherited_from is None and found.values["rc"] == 0.9 and found.samples == 5


@pytest.mark.parametrize(
    ("rc", "lower", "why"),
    [(0.6, 0.5, "a gain says nothing about higher loads"), (1.05, 0.98, "an unclear interval is no loss")],
)
def test_gains_and_unclear_results_are_never_inherited(rc, lower, why):
    ev = evidence_from_costs(
        [cost("low", rc, lower, 60), cost("medium", 0.9, 0.5, 5)], policy=POLICY, load_order=ORDER
    )
    assert ev[key("medium")].pools["spec-k4"].inherited_from is None, why


def test_a_bucket_with_enough_samples_keeps_its_own_measurement_and_is_the_nearest_source():
    costs = [
        cost("low", 1.45, 1.31, 60),
        cost("medium", 0.8, 0.7, 40),  # enough samples, and a gain: medium is its own
        cost("high", None, None, 3),
    ]
    ev = evidence_from_costs(costs, policy=POLICY, load_order=ORDER)
    assert ev[key("medium")].pools["spec-k4"].values["rc"] == 0.8
    # the nearest lower bucket with enough samples (medium) shows no loss: high inherits nothing,
    # even though low, further down, lost
    assert ev[key("high")].pools["spec-k4"].inherited_from is None


def test_the_nearest_lower_bucket_with_enough_samples_is_used_when_the_next_one_is_thin():
    costs = [cost("low", 1.6, 1.4, 50), cost("medium", 1.1, 0.9, 10), cost("high", 1.0, 0.8, 4)]
    ev = evidence_from_costs(costs, policy=POLICY, load_order=["low", "medium", "high"])
    assert ev[key("high")].pools["spec-k4"].inherited_from == "low"
    assert ev[key("high")].pools["spec-k4"].values == {"rc_lower": 1.4}


def test_only_the_same_class_and_pool_inherit_and_unknown_buckets_are_left_alone():
    costs = [
        cost("low", 1.45, 1.31, 60, pool="spec-k2"),
        cost("medium", 0.9, 0.5, 5, pool="spec-k4", predictions=[whatif("spec-k2", 0.7)]),
        cost("medium", 0.9, 0.5, 5, task="code"),
        cost("weird", 0.9, 0.5, 5),
    ]
    ev = evidence_from_costs(costs, policy=POLICY, load_order=ORDER)
    medium = ev[key("medium")].pools
    assert medium["spec-k4"].inherited_from is None  # no loss measured on K=4
    # a measured loss on K=2 at low load overrides a thin what-if saying K=2 would pay
    assert medium["spec-k2"].inherited_from == "low" and not medium["spec-k2"].predicted
    assert ev[key("medium", task="code")].pools["spec-k4"].inherited_from is None
    assert ev[key("weird")].pools["spec-k4"].inherited_from is None


def test_a_bound_a_rule_would_not_call_bad_is_not_inherited():
    lenient = replace(POLICY.rules[0], threshold=1.5, restore_threshold=1.4)
    policy = replace(POLICY, rules=(lenient,))
    ev = evidence_from_costs(
        [cost("low", 1.45, 1.31, 60), cost("medium", 0.9, 0.5, 5)], policy=policy, load_order=ORDER
    )
    assert ev[key("medium")].pools["spec-k4"].inherited_from is None


def test_load_order_sorts_buckets_by_their_max_with_the_open_one_last():
    buckets = [LoadBucket("high", None), LoadBucket("low", 16), LoadBucket("medium", 48.0)]
    assert load_order(buckets) == ("low", "medium", "high")
    assert inherit_losses_upward({}, ORDER, POLICY) == {}


def run(policy, evidence_at, evaluations):
    """Step one class ``evaluations`` times (one interval apart) on ``evidence_at(i)``."""
    k = key("medium")
    state = guard.initial_state(k, policy)
    decisions = []
    interval = policy.interval_seconds
    for i in range(evaluations):
        state, decision = guard.step(state, evidence_at(i)[k], 1000.0 + i * interval, policy)
        decisions.append(decision)
    return state, decisions


def test_the_guard_moves_a_thin_higher_bucket_after_the_usual_consecutive_failures():
    limits = POLICY.rules[0].limits
    costs = [cost("low", 1.45, 1.31, 60), cost("medium", None, None, 2)]
    ev = evidence_from_costs(costs, policy=POLICY, load_order=ORDER)
    state, decisions = run(POLICY, lambda i: ev, limits.consecutive_failure_limit + 1)
    assert [d.phase for d in decisions] == [Phase.HOLD] * limits.consecutive_failure_limit + [Phase.ACT]
    last = decisions[-1]
    assert last.action == "off" and last.to_pool == "nospec" and state.pool == "nospec"
    assert "rc_lower (1.310) > threshold (1.0)" in last.reason
    # without inheritance the same evidence only ever holds: too few samples at this bucket
    plain = evidence_from_costs(costs)
    state, decisions = run(POLICY, lambda i: plain, 10)
    assert state.pool == "spec-k4" and {d.phase for d in decisions} == {Phase.HOLD}


def test_inherited_evidence_never_shortens_on_a_thin_prediction_and_never_restores():
    limits = POLICY.rules[0].limits
    thin = cost("medium", None, None, 2, predictions=[whatif("spec-k2", 0.5)])
    ev = evidence_from_costs([cost("low", 1.45, 1.31, 60), thin], policy=POLICY, load_order=ORDER)
    state, decisions = run(POLICY, lambda i: ev, 40)
    moves = [d for d in decisions if d.changes_plan]
    assert [(d.action, d.to_pool) for d in moves] == [("off", "nospec")]
    assert moves[0].at == 1000.0 + limits.consecutive_failure_limit * POLICY.interval_seconds
    assert state.pool == "nospec"  # 40 evaluations of inherited loss never restore


def test_the_state_machine_limits_still_apply_to_inherited_evidence():
    limits = POLICY.rules[0].limits
    bad = evidence_from_costs(
        [cost("low", 1.45, 1.31, 60), cost("medium", None, None, 2)], policy=POLICY, load_order=ORDER
    )
    good = evidence_from_costs(
        [cost("low", 0.7, 0.6, 60), cost("medium", None, None, 2)], policy=POLICY, load_order=ORDER
    )
    # bad, then a lower bucket that no longer loses (nothing inherited: hold, not a success),
    # then bad again: the streak is not reset by the hold, so it still acts after three bad ones
    pattern = [bad, good, bad, bad]
    state, decisions = run(POLICY, lambda i: pattern[i], len(pattern))
    assert [d.phase for d in decisions][:3] == [Phase.HOLD] * 3
    assert decisions[-1].action == "off"
    # dry-run decides but never moves; a pause never acts
    state, decisions = run(replace(POLICY, dry_run=True), lambda i: bad, limits.consecutive_failure_limit + 1)
    assert decisions[-1].dry_run and state.pool == "spec-k4"
    k = key("medium")
    paused = replace(guard.initial_state(k, POLICY), paused=True)
    for i in range(5):
        paused, decision = guard.step(paused, bad[k], 1000.0 + i * POLICY.interval_seconds, POLICY)
        assert not decision.changes_plan
