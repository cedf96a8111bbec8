from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from cost_synth import accept_length, make_records, step_seconds, true_rc

from specguard.rules import cost, profile, stepfit, whatif
from specguard.rules.cost_config import CostSettings

SETTINGS = CostSettings(min_samples=30, baseline_min_samples=30).with_traffic([("low", 4), ("high", None)])


def test_concepts_worked_vectors():
    # RTP-LLM numbers (seed 002): T_round = 5*7 + 18 = 53 ms, base 18 ms/token
    assert whatif.measured_rc(0.053, 0.018, 3) == pytest.approx(0.981, abs=5e-4)
    assert whatif.measured_rc(0.053, 0.018, 4) == pytest.approx(0.736, abs=5e-4)
    assert 1 / whatif.measured_rc(0.053, 0.018, 4) == pytest.approx(1.36, abs=5e-3)
    # bonus-aware model form; seed 002's no-bonus form is the conservative variant
    assert whatif.model_rc(0.6, 0.2, 1) == pytest.approx(0.75)
    assert whatif.model_rc_no_bonus(0.6, 0.2, 1) == pytest.approx(2.0)
    assert whatif.model_rc_no_bonus(0.6, 0.2, 4) == pytest.approx(0.75)  # not the 1.0 the seed's text says
    assert whatif.model_rc_no_bonus(0.4, 0.2, 4) == pytest.approx(1.125)  # not 1.5
    assert whatif.model_rc_no_bonus(0.0, 0.2, 4) is None  # infinite: the flaw of dropping the bonus
    assert whatif.model_rc(0.0, 0.2, 4) == pytest.approx(1.8)


def test_per_position_acceptance_from_a_histogram():
    # 10 rounds: 2 accepted none, 3 accepted one, 1 two, 4 all three
    assert whatif.per_position([2, 3, 1, 4]) == pytest.approx((0.8, 0.5, 0.4))
    assert whatif.per_position([0, 0, 0]) == ()
    accept = whatif.Acceptance(k=3, rounds=10, positions=(0.8, 0.5, 0.4), accept_length=2.7)
    assert accept.at(3) == (pytest.approx(2.7), "histogram")
    assert accept.at(1) == (pytest.approx(1.8), "histogram")
    assert accept.at(0) == (1.0, "histogram")
    longer, method = accept.at(5)
    assert method == "extrapolated"
    assert longer == pytest.approx(2.7 + 0.4 * 0.8 + 0.4 * 0.8 * 0.8)


def test_iid_fallback_without_histograms():
    a = 0.7
    for k in (1, 2, 4, 7):
        assert whatif.iid_rate(whatif.iid_accept_length(a, k), k) == pytest.approx(a, abs=1e-9)
    accept = whatif.Acceptance(k=4, rounds=100, accept_length=whatif.iid_accept_length(a, 4))
    predicted, method = accept.at(2)
    assert method == "iid" and predicted == pytest.approx(1 + a + a * a)
    assert whatif.Acceptance(k=4, rounds=0).at(2) is None
    assert whatif.iid_rate(1.0, 4) == 0.0 and whatif.iid_rate(5.0, 4) == 1.0


def test_prediction_needs_every_number_and_says_which_is_missing():
    accept = whatif.Acceptance(k=4, rounds=10, positions=(0.9, 0.8, 0.7, 0.6))
    missing = whatif.predict(accept, pool="spec-k2", k=2, step=None, base_tpot_seconds=None)
    assert missing.rc is None
    assert "no step time for pool spec-k2" in missing.detail and "no baseline" in missing.detail
    step = whatif.StepTime(0.03, "live", "live")
    ok = whatif.predict(accept, pool="spec-k2", k=2, step=step, base_tpot_seconds=0.02)
    assert ok.rc == pytest.approx(0.03 / (2.7 * 0.02))
    assert ok.accept_length == pytest.approx(2.7) and ok.acceptance_method == "histogram"


def test_shorter_k_prediction_matches_what_the_shorter_k_pool_measures():
    rng = np.random.default_rng(21)
    a, batch = 0.55, 2
    records = make_records(rng, 300, pool="spec-k4", k=4, a=a, batch=batch, task_type="chat")
    # the K=2 pool carries other traffic; its step time is what the prediction uses
    records += make_records(rng, 200, pool="spec-k2", k=2, a=0.9, batch=batch, task_type="code")
    records += make_records(rng, 300, pool="nospec", k=0, batch=batch)
    pools = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
    chat = next(c for c in cost.evaluate(records, pools, None, 0.0, SETTINGS) if c.task_type == "chat")
    (shorter,) = chat.predictions
    assert shorter.pool == "spec-k2" and shorter.step_source == "live"
    assert shorter.step_seconds == pytest.approx(step_seconds(batch, 2), rel=0.03)
    assert shorter.accept_length == pytest.approx(accept_length(a, 2), rel=0.03)
    # now measure chat on K=2 for real
    measured = make_records(rng, 300, pool="spec-k2", k=2, a=a, batch=batch, task_type="chat")
    chat_k2 = next(
        c
        for c in cost.evaluate(records + measured, pools, None, 0.0, SETTINGS)
        if c.task_type == "chat" and c.pool == "spec-k2"
    )
    assert shorter.rc == pytest.approx(chat_k2.rc, rel=0.10)
    assert shorter.rc == pytest.approx(true_rc(a, 2, batch), rel=0.05)


def test_step_time_falls_back_to_the_step_fit_then_the_profile():
    rng = np.random.default_rng(22)
    records = make_records(rng, 100, pool="spec-k4", k=4, a=0.6) + make_records(rng, 100, pool="nospec", k=0)
    pools = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
    nothing = next(c for c in cost.evaluate(records, pools, None, 0.0, SETTINGS) if c.pool == "spec-k4")
    assert nothing.predictions[0].rc is None
    prof = profile.Profile(
        pools=(
            profile.ProfilePool(
                "spec-k2",
                2,
                (
                    profile.ProfileLevel(2, 0.01, 50, step_seconds=step_seconds(2, 2)),
                    profile.ProfileLevel(8, 0.01, 50, step_seconds=step_seconds(8, 2)),
                ),
            ),
        ),
        source="sweep.yaml",
    )
    from_profile = next(c for c in cost.evaluate(records, pools, prof, 0.0, SETTINGS) if c.pool == "spec-k4")
    assert from_profile.predictions[0].step_source == "profile"
    assert "sweep.yaml pool spec-k2 concurrency 2" in from_profile.predictions[0].detail
    assert from_profile.predictions[0].rc == pytest.approx(true_rc(0.6, 2, 2), rel=0.08)
    observations = [
        stepfit.StepObservation(step_seconds(b, k), b, k) for b in (1, 2, 4, 8, 16) for k in (0, 2, 4)
    ]
    fit = stepfit.fit(observations)
    from_fit = next(c for c in cost.evaluate(records, pools, prof, 0.0, SETTINGS, fit) if c.pool == "spec-k4")
    predicted = from_fit.predictions[0]
    assert predicted.step_source == "stepfit"
    assert predicted.step_seconds == pytest.approx(step_seconds(2.5, 2))
    assert predicted.rc == pytest.approx(true_rc(0.6, 2, 2.5), rel=0.08)


def test_classes_measured_on_two_pools_get_predictions_for_each_other():
    rng = np.random.default_rng(23)
    records = make_records(rng, 100, pool="spec-k4", k=4, a=0.6)
    records += make_records(rng, 100, pool="spec-k2", k=2, a=0.6, route="probe")
    records += make_records(rng, 100, pool="nospec", k=0)
    results = cost.evaluate(records, {"spec-k4": 4, "spec-k2": 2, "nospec": 0}, None, 0.0, SETTINGS)
    by_pool = {c.pool: c for c in results}
    assert by_pool["spec-k2"].predictions[0].pool == "spec-k4"
    assert by_pool["spec-k2"].predictions[0].acceptance_method == "extrapolated"
    assert by_pool["spec-k4"].predictions[0].rc == pytest.approx(by_pool["spec-k2"].rc, rel=0.08)
    assert dataclasses.asdict(by_pool["spec-k4"])["predictions"][0]["pool"] == "spec-k2"


def test_a_what_if_carries_the_interval_of_its_ratio_to_the_measurement_it_came_from():
    """The benefit of a move to a shorter K is ``RC(K') / RC(K)``: the baseline cancels, and what is
    left is the acceptance and TPOT of the same requests and the target pool's step time. Its
    interval is narrower than either RC's, and it covers what K=2 then measures."""
    rng = np.random.default_rng(31)
    records = make_records(rng, 120, pool="spec-k4", k=4, a=0.6)
    records += make_records(rng, 120, pool="spec-k2", k=2, a=0.6, route="probe")
    records += make_records(rng, 60, pool="nospec", k=0)
    results = cost.evaluate(records, {"spec-k4": 4, "spec-k2": 2, "nospec": 0}, None, 0.0, SETTINGS)
    by_pool = {c.pool: c for c in results}
    k4, k2 = by_pool["spec-k4"], by_pool["spec-k2"]
    (to_k2,) = k4.predictions
    assert to_k2.ratio_spread is not None and 0 < to_k2.ratio_spread < math.log(k4.upper / k4.rc)
    predicted, measured = to_k2.rc / k4.rc, k2.rc / k4.rc
    combined = math.hypot(to_k2.ratio_spread, k2.spec_spread)  # and K=2's own measurement noise
    assert abs(math.log(predicted / measured)) < combined
    assert 0 < k4.spec_spread < math.log(k4.upper / k4.rc)  # the spec side alone: no baseline in it
