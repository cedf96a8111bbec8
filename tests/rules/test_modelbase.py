"""The model baseline (``rules.modelbase``): the step-cost fit over both kinds of pool, its TPOT_base
with an interval at loads the no-spec pool never ran, and where it sits in the trust order."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from specguard.errors import InputError
from specguard.exporters.records import RequestRecord, SpecStats
from specguard.exporters.snapshot import EngineSnapshot, HistogramTotals
from specguard.rules import baseline, cost, modelbase, profile
from specguard.rules.cost_config import CostSettings
from specguard.rules.stepfit import StepObservation

POOLS = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
SETTINGS = CostSettings(min_samples=10, baseline_min_samples=10).with_traffic(
    [("low", 16), ("medium", 48), ("high", None)], 0.5
)
KNEE = 160  # executed tokens per step where the synthetic machine saturates


def step(batch: float, k: int) -> float:
    """Truth: 16 ms + 0.05 ms per request + 0.03 ms per executed token, 0.2 ms beyond the knee, and
    1.5 ms per draft pass."""
    m = batch * (k + 1)
    return 0.016 + 0.00005 * batch + 0.00003 * m + 0.0002 * max(0.0, m - KNEE) + 0.0015 * k


def record(pool, k, load, rng, tokens=101, bucket="low", accept=2.5, route="plan"):
    """One request at ``load`` whose decode took its steps x the true step time (noise 2%)."""
    accepted = 0
    spec = None
    if k:
        steps = round((tokens - 1) / accept)
        accepted = tokens - 1 - steps
        spec = SpecStats("vllm", rounds=steps, draft_tokens=steps * k, accepted_tokens=accepted)
    steps = tokens - 1 - accepted
    seconds = steps * step(load, k) * float(rng.lognormal(0, 0.02))
    return RequestRecord(
        pool=pool,
        task_type="chat",
        temperature_bucket="medium",
        load_bucket=bucket,
        route=route,
        started_at=0.0,
        status=200,
        streamed=True,
        output_tokens=tokens,
        decode_seconds=seconds,
        spec=spec,
        load=load,
        decode_load=load,
    )


def world(seed=0, nospec_loads=range(1, 9), spec_loads=range(2, 81, 2)):
    """The no-spec pool at low load only, the speculative pools from low to high load."""
    rng = np.random.default_rng(seed)
    out = []
    for load in nospec_loads:
        out += [record("nospec", 0, load, rng, route="holdout") for _ in range(20)]
    for load in spec_loads:
        bucket = "low" if load <= 16 else "medium" if load <= 48 else "high"
        out += [record("spec-k4", 4, load, rng, bucket=bucket) for _ in range(6)]
        out += [record("spec-k2", 2, load, rng, bucket=bucket, accept=2.0) for _ in range(6)]
    return out


def test_steps_of_a_request_are_its_tokens_less_its_accepted_drafts():
    rng = np.random.default_rng(0)
    r = record("spec-k4", 4, 10, rng, tokens=101, accept=4.0)
    assert modelbase.request_steps(r, 4) == 25  # 100 decode tokens in rounds of 4 tokens
    assert modelbase.request_steps(record("nospec", 0, 10, rng), 0) == 100
    assert modelbase.request_steps(replace(r, spec=None), 4) is None  # unknown, not guessed
    obs = modelbase.observations_from_records([r, replace(r, decode_load=12.0)], POOLS)
    assert [round(o.batch) for o in obs] == [10, 12]  # the mean load while decoding wins
    assert obs[0].step_seconds == pytest.approx(r.decode_seconds / 25)


def test_the_fit_predicts_tpot_base_where_the_nospec_pool_never_ran_with_an_interval():
    fitted = modelbase.fit(world(nospec_loads=range(1, 21)), POOLS)
    assert isinstance(fitted, modelbase.ModelBaseline), fitted
    assert fitted.nospec_loads == (pytest.approx(1.0), pytest.approx(20.0))
    widths = []
    for load in (20.0, 30.0, 40.0):  # the highest no-spec load, 1.5x and 2x it
        value, log_var = fitted.tpot(load)
        assert value == pytest.approx(step(load, 0), rel=0.04)
        assert abs(math.log(value / step(load, 0))) <= 1.96 * math.sqrt(log_var)
        widths.append(1.96 * math.sqrt(log_var))
    assert widths[0] < widths[1] < widths[2] < 0.25  # wider with the distance, never useless
    assert "model: T_base(load 40.0)" in fitted.detail(40.0) and "ran at loads 1.0-20.0" in fitted.detail(
        40.0
    )


def test_the_model_is_not_read_past_twice_the_loads_the_no_spec_pool_ran_at():
    """Whatever the fit says there: a line fitted at a few requests in flight, read at 35, once
    gave 3.7 s per token. ``none`` beyond, with the reason in the baseline's detail."""
    fitted = modelbase.fit(world(), POOLS)  # the no-spec pool at 1-8
    assert fitted.tpot(16.0)[0] == pytest.approx(step(16.0, 0), rel=0.04)
    assert "load 16.1 is more than 2x beyond" in fitted.reach(16.1)
    with pytest.raises(InputError, match="more than 2x beyond the loads the no-spec pool ran at"):
        fitted.tpot(64.0)
    assert "not extrapolated" in fitted.reach(0.4)  # below the lowest too
    costs, buckets = cost.evaluate_all(world(), POOLS, None, 0.0, SETTINGS)
    high = next(c for c in costs if c.load_bucket == "high" and c.pool == "spec-k4")
    assert (high.baseline_source, high.rc) == ("none", None)
    assert "more than 2x beyond the loads the no-spec pool ran at (1.0-8.0)" in high.baseline_detail
    assert buckets["high"].source == "none" and "2x beyond" in buckets["high"].detail


def test_step_costs_are_never_negative_and_a_pinned_one_keeps_its_uncertainty():
    """Two no-spec loads whose TPOT rises faster than the intercept allows (77 ms at 1, 182 ms at
    2): unconstrained, ``-28.3 ms + 105 ms*B``; constrained, a line through the origin region that
    never goes below zero, and the unconstrained fit's covariance."""
    rng = np.random.default_rng(7)
    rows = []
    for load, tpot in ((1.0, 0.0767), (2.0, 0.1817)):
        for _ in range(20):
            rows.append(("nospec", StepObservation(tpot * float(rng.lognormal(0, 0.03)), load, 0)))
    for load in (1.0, 1.5, 2.0):
        for _ in range(10):
            rows.append(("spec", StepObservation(0.12 * load * float(rng.lognormal(0, 0.03)), load, 4)))
    model, _ = modelbase._solve(rows, None)
    assert model.intercept >= 0.0 and model.slope >= 0.0
    assert model.predict(1.5)[0] > 0
    assert model.covariance[0][0] > 0  # the intercept pinned at zero is still uncertain
    design = np.array([[1.0, 2.0], [1.0, 1.0], [0.0, 1.0]])
    beta = modelbase.nonnegative(design, np.array([1.0, -1.0, 2.0]))
    assert (beta >= 0).all()
    assert modelbase.nonnegative(design, np.array([1.0, -1.0, 2.0]), constrained=[1])[0] < 0


def test_the_fit_says_why_when_it_cannot_be_made():
    rng = np.random.default_rng(1)
    only_spec = [r for r in world() if r.pool != "nospec"]
    assert "no-spec pool has not run at two loads" in modelbase.fit(only_spec, POOLS)
    one_load = only_spec + [record("nospec", 0, 3, rng) for _ in range(5)]
    assert "two loads" in modelbase.fit(one_load, POOLS)
    only_nospec = [r for r in world() if r.pool == "nospec"]
    assert "no step observations of a speculative pool" in modelbase.fit(only_nospec, POOLS)


def snap(itl_sum, itl_count, steps=None, running=8.0, drafts=None):
    return EngineSnapshot(
        engine="vllm",
        step_latency=HistogramTotals(itl_sum, itl_count),
        iteration_tokens=None if steps is None else HistogramTotals(steps * 10.0, steps),
        running_requests=running,
        drafts=drafts,
    )


def test_engine_pages_give_mean_step_time_and_batch_between_two_scrapes():
    # vLLM: 400 request-steps in 50 engine steps (batch 8), 20 ms each; half of them drafted
    obs, request_steps = modelbase.observation_from_engine(
        snap(1.0, 100, 10, drafts=0.0), snap(9.0, 500, 60, drafts=200.0), k=4
    )
    assert (obs.step_seconds, obs.batch, obs.draft_share, request_steps) == (
        pytest.approx(0.02),
        pytest.approx(8.0),
        pytest.approx(0.5),
        400,
    )
    # no iteration_tokens family: the running gauge per replica stands in for the batch
    obs, _ = modelbase.observation_from_engine(snap(0.0, 0), snap(4.0, 200, running=12.0), k=0, replicas=2)
    assert obs.batch == pytest.approx(6.0) and obs.draft_share == 0.0
    assert modelbase.observation_from_engine(snap(1.0, 100), snap(1.0, 100), k=0) is None  # no step


def test_engine_intervals_join_the_fit_weighted_as_the_requests_they_stand_for():
    records = world()
    engine = []
    for load in (3.0, 6.0):
        obs, n = modelbase.observation_from_engine(
            snap(0.0, 0, 0), snap(step(load, 0) * 1000 * load, 1000 * load, 1000, running=load), k=0
        )
        engine.append(("nospec", obs, n))
    fitted = modelbase.fit(records, POOLS, engine)
    assert "2 engine-page intervals" in fitted.inputs
    assert fitted.tpot(16.0)[0] == pytest.approx(step(16.0, 0), rel=0.04)


def evaluate(records, profile_=None, stack=None, settings=SETTINGS):
    return cost.evaluate_all(records, POOLS, profile_, 0.0, settings, stack=stack)


def medium(costs):
    return next(c for c in costs if c.load_bucket == "medium" and c.pool == "spec-k4")


def test_trust_order_live_then_fresh_profile_then_model_then_none():
    records = world(nospec_loads=range(1, 21))
    costs, buckets = evaluate(records)
    # the no-spec pool ran at low load only: live there, the model at medium and high
    assert buckets["low"].source == "live" and buckets["low"].available == ("live", "model")
    row = medium(costs)
    assert (row.baseline_source, row.baselines_available) == ("model", ("model",))
    assert row.rc == pytest.approx(row.spec_tpot_seconds / row.base_tpot_seconds)
    assert row.lower < row.rc < row.upper  # the model's uncertainty is in the interval
    assert "model: T_base" in row.baseline_detail and "live no-spec requests" in row.baseline_detail
    # a profile covering the bucket comes before the model while it is fresh ...
    levels = tuple(profile.ProfileLevel(c, step(c, 0), 500) for c in (16, 32, 48))
    prof = profile.Profile(
        (profile.ProfilePool("nospec", 0, levels),), stack={"engine_version": "0.32.0", "model": "m"}
    )
    costs, _ = evaluate(records, prof, {"engine_version": "0.32.0", "model": "m"})
    assert medium(costs).baseline_source == "profile"
    assert medium(costs).baselines_available == ("profile", "model")
    # ... and not once the engine it was measured on was upgraded
    costs, _ = evaluate(records, prof, {"engine_version": "0.33.0", "model": "m"})
    assert medium(costs).baseline_source == "model"
    assert "stale: engine_version '0.32.0' in its header, '0.33.0' now" in medium(costs).baseline_detail
    # with the model off and nothing else: none, saying how to get a baseline
    costs, buckets = evaluate(records, settings=replace(SETTINGS, model_baseline=False))
    assert medium(costs).baseline_source == "none" and medium(costs).rc is None
    assert (
        "capacity_matched" in buckets["medium"].detail
        and "specguard sweep --http" in buckets["medium"].detail
    )


def test_profile_staleness_compares_only_what_both_sides_know():
    prof = profile.Profile(
        (profile.ProfilePool("nospec", 0, ()), profile.ProfilePool("spec", 4, ())),
        stack={"engine_version": "0.32.0", "model": "llama"},
    )
    assert profile.staleness(prof, {"engine_version": "0.32.0"}) is None  # model unknown now
    assert profile.staleness(prof, {}) is None
    assert "model 'llama' in its header, 'qwen' now" in profile.staleness(prof, {"model": "qwen"})
    assert "pool spec has K=4 in it, K=2 now" in profile.staleness(prof, {}, {"spec": 2, "nospec": 0})
    assert profile.staleness(None, {"model": "x"}) is None


def test_bucket_load_is_the_decode_weighted_mean_load():
    rng = np.random.default_rng(3)
    rows = [record("spec-k4", 4, 20, rng, tokens=11), record("spec-k4", 4, 40, rng, tokens=31)]
    assert modelbase.bucket_load(rows, "medium", SETTINGS) == pytest.approx((20 * 10 + 40 * 30) / 40)
    assert modelbase.bucket_load([], "medium", SETTINGS) == pytest.approx(32.5)  # representative
    assert baseline.SOURCES == ("live", "profile", "model", "none")


def test_sglang_pages_give_step_time_from_per_token_latency_over_verify_calls():
    def sg(seconds, tokens, drafts, running=6.0):
        return EngineSnapshot(
            engine="sglang",
            token_latency=HistogramTotals(seconds, tokens),
            drafts=drafts,
            running_requests=running,
        )

    # speculative: 12 s over 600 request-steps (verify calls) = 20 ms a step, whatever the tokens
    obs, steps = modelbase.observation_from_engine(sg(0.0, 0, 0.0), sg(12.0, 1800, 600.0), k=3)
    assert (obs.step_seconds, obs.batch, steps) == (pytest.approx(0.02), 6.0, 600)
    # no speculation: one token per step
    obs, steps = modelbase.observation_from_engine(sg(0.0, 0, None), sg(8.0, 400, None), k=0)
    assert (obs.step_seconds, steps) == (pytest.approx(0.02), 400)
