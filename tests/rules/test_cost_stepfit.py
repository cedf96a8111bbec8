from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from cost_synth import make_records, step_seconds

from specguard.errors import InputError
from specguard.exporters.snapshot import EngineSnapshot, HistogramTotals
from specguard.rules import profile, stepfit
from specguard.rules.cost_config import CostSettings
from specguard.sim import config as sim_config


def test_recovers_a_linear_model_and_drops_the_collinear_term():
    rng = np.random.default_rng(0)
    c0, cb, cm, ck = 0.012, 0.0002, 0.0004, 0.0015
    observations = []
    for b in (1, 2, 4, 8, 16, 32):
        for k in (0, 1, 2, 4):
            t = c0 + cb * b + cm * b * (k + 1) + ck * k
            observations.append(stepfit.StepObservation(t * (1 + rng.normal(0, 0.002)), b, k))
    fit = stepfit.fit(observations)
    assert fit.terms == ("batch", "verify_tokens", "draft_steps")
    assert fit.dropped_terms == ("draft_tokens",)  # M = B + D in static verify
    assert fit.intercept == pytest.approx(c0, rel=0.05)
    assert dict(zip(fit.terms, fit.coefficients, strict=True)) == pytest.approx(
        {"batch": cb, "verify_tokens": cm, "draft_steps": ck}, rel=0.1
    )
    assert fit.r2 > 0.999 and fit.n == 24
    assert fit.residual_rms_seconds < 0.0002
    assert fit.predict(10, 3) == pytest.approx(c0 + cb * 10 + cm * 40 + ck * 3, rel=0.01)
    assert (
        fit.formula().startswith("T_step = 11.9") and " + 0.20" in fit.formula() and "ms*K" in fit.formula()
    )
    assert "dropped collinear: draft_tokens" in fit.quality()


def test_fits_the_simulator_cost_model_below_its_knee():
    cost = sim_config.load(None).cost
    observations = [
        stepfit.StepObservation(cost.step_seconds(b, k), b, k)
        for b in (1, 2, 3, 5, 6, 7, 9, 12)
        for k in (0, 1, 2, 4)
    ]
    fit = stepfit.fit(observations)
    assert fit.r2 > 0.98
    for b, k in ((4, 2), (10, 3), (8, 4)):
        assert fit.predict(b, k) == pytest.approx(cost.step_seconds(b, k), rel=0.05)


def test_no_step_cost_is_fitted_negative_so_no_pool_gets_cheaper_with_load():
    # past a knee: the executed tokens carry the step, and a plain line gives requests a negative cost
    # (no-spec steps that get cheaper the busier the engine is: a spread floods the no-spec replica)
    observations = [
        stepfit.StepObservation(0.010 + 0.0004 * b * (k + 1) - 0.0005 * b, b, k)
        for b in (20, 30, 40)
        for k in (0, 2, 4)
    ]
    plain = stepfit.fit(observations, constrained=False)
    assert dict(zip(plain.terms, plain.coefficients, strict=True))["batch"] < 0
    assert plain.predict(80, 0) < plain.predict(40, 0)
    fit = stepfit.fit(observations)
    assert min(fit.intercept, *fit.coefficients) >= 0
    assert fit.predict(80, 0) >= fit.predict(40, 0) > 0
    for b, k in ((30, 2), (40, 4)):  # still close where it was fitted
        assert fit.predict(b, k) == pytest.approx(plain.predict(b, k), rel=0.15)


def test_too_few_or_bad_observations_are_clear_errors():
    with pytest.raises(InputError, match="no usable observations"):
        stepfit.fit([stepfit.StepObservation(0.0, 1, 0)])
    with pytest.raises(InputError, match="need at least"):
        stepfit.fit([stepfit.StepObservation(0.01, 1, 0), stepfit.StepObservation(0.02, 2, 1)])
    with pytest.raises(InputError, match="unknown step-cost term 'bogus'"):
        stepfit.fit([stepfit.StepObservation(0.01, 1, 0)], terms=("bogus",))


def test_observations_from_a_profile_a_frame_snapshots_and_records():
    prof = profile.Profile(
        pools=(
            profile.ProfilePool("nospec", 0, (profile.ProfileLevel(1, 0.01, 10, step_seconds=0.01),)),
            profile.ProfilePool("k4", 4, (profile.ProfileLevel(1, 0.004, 10, step_seconds=0.02),)),
        )
    )
    assert [(o.batch, o.k, o.step_seconds) for o in stepfit.observations_from_profile(prof)] == [
        (1, 0, 0.01),
        (1, 4, 0.02),
    ]
    frame = pd.DataFrame({"step_seconds": [0.01, 0.02], "batch": [1, 2], "k": [0, 4], "weight": [1.0, 3.0]})
    rows = stepfit.observations_from_frame(frame)
    assert rows[1].k == 4 and rows[1].weight == 3.0 and rows[1].feature("verify_tokens") == 10
    with pytest.raises(InputError, match="lacks column"):
        stepfit.observations_from_frame(pd.DataFrame({"batch": [1]}))
    before = EngineSnapshot("vllm", step_latency=HistogramTotals(1.0, 100), running_requests=3)
    after = EngineSnapshot("vllm", step_latency=HistogramTotals(3.0, 200), running_requests=4)
    obs = stepfit.observation_from_snapshots(before, after, 4)
    assert (obs.step_seconds, obs.batch, obs.k, obs.weight) == (0.02, 4.0, 4, 100.0)
    assert stepfit.observation_from_snapshots(after, after, 4) is None
    rng = np.random.default_rng(1)
    records = make_records(rng, 50, pool="k4", k=4, a=0.5, batch=2, noise=0.0)
    records += make_records(rng, 50, pool="nospec", k=0, batch=2, noise=0.0)
    settings = CostSettings().with_traffic([("low", 4)])
    found = {o.k: o for o in stepfit.observations_from_records(records, {"k4": 4, "nospec": 0}, settings)}
    assert found[4].step_seconds == pytest.approx(step_seconds(2, 4))
    assert found[0].step_seconds == pytest.approx(step_seconds(2, 0))
    assert found[4].batch == 2.5  # the representative concurrency of (0, 4]
