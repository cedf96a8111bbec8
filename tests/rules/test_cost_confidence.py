"""The RC interval's coverage, measured by simulation of synthetic per-request samples (seeded)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specguard.rules import confidence


def draw(rng, n, tpot, sigma):
    """Requests of 20..400 decode tokens whose own TPOT is log-normal around ``tpot``."""
    tokens = rng.integers(20, 400, n).astype(float)
    seconds = tokens * tpot * np.exp(rng.normal(0.0, sigma, n))
    return seconds, tokens


def truth(tpot_spec, sigma_spec, tpot_base, sigma_base):
    # E[x]/E[y] with x = y * t * exp(e): t * E[exp(e)] = t * exp(sigma^2 / 2)
    return (tpot_spec * math.exp(sigma_spec**2 / 2)) / (tpot_base * math.exp(sigma_base**2 / 2))


def rc_interval(method, spec, base, confidence_level, seed):
    s = confidence.ratio_of_sums(*spec)
    b = confidence.ratio_of_sums(*base)
    rc = s.value / b.value
    if method in ("delta", "jackknife"):
        return confidence.delta_interval(
            rc, s.variance(method), b.variance(method), confidence_level, spec_n=s.n, base_n=b.n
        )
    return confidence.bootstrap_interval(*spec, *base, confidence=confidence_level, resamples=400, seed=seed)


@pytest.mark.parametrize(
    "method,reps,n_spec,n_base,low,high",
    [
        ("delta", 600, 40, 40, 0.92, 0.975),
        ("jackknife", 600, 40, 40, 0.92, 0.975),
        ("jackknife", 400, 12, 12, 0.91, 0.975),
        ("delta", 400, 200, 60, 0.925, 0.97),
        ("bootstrap", 200, 60, 60, 0.90, 0.98),
    ],
)
def test_95_percent_interval_covers_the_truth_about_95_percent_of_the_time(
    method, reps, n_spec, n_base, low, high
):
    rng = np.random.default_rng(42)
    target = truth(0.012, 0.35, 0.018, 0.2)
    covered = 0
    for rep in range(reps):
        spec = draw(rng, n_spec, 0.012, 0.35)
        base = draw(rng, n_base, 0.018, 0.2)
        lower, upper = rc_interval(method, spec, base, 0.95, rep)
        covered += lower <= target <= upper
    assert low <= covered / reps <= high


def test_interval_narrows_with_samples_and_widens_with_confidence():
    rng = np.random.default_rng(7)
    widths = []
    for n in (30, 300, 3000):
        spec, base = draw(rng, n, 0.012, 0.3), draw(rng, n, 0.018, 0.3)
        lower, upper = rc_interval("delta", spec, base, 0.95, 0)
        widths.append(math.log(upper / lower))
    assert widths[0] > 2.5 * widths[1] > 2.5 * 2.5 * widths[2]
    spec, base = draw(rng, 100, 0.012, 0.3), draw(rng, 100, 0.018, 0.3)
    narrow = rc_interval("delta", spec, base, 0.80, 0)
    wide = rc_interval("delta", spec, base, 0.99, 0)
    assert wide[0] < narrow[0] < narrow[1] < wide[1]


def test_ratio_of_sums_and_its_edge_cases():
    est = confidence.ratio_of_sums(np.array([1.0, 3.0]), np.array([10.0, 10.0]))
    assert est.value == pytest.approx(0.2) and est.n == 2 and est.log_variance > 0
    assert confidence.ratio_of_sums(np.array([]), np.array([])) is None
    assert confidence.ratio_of_sums(np.array([1.0]), np.array([0.0])) is None
    single = confidence.ratio_of_sums(np.array([1.0]), np.array([10.0]))
    assert single.value == pytest.approx(0.1) and single.log_variance is None
    assert confidence.delta_interval(1.0, None, 0.01, 0.95) is None
    # identical per-request TPOT: no spread, a zero-width interval
    flat = confidence.ratio_of_sums(np.array([1.0, 2.0]), np.array([10.0, 20.0]))
    assert flat.log_variance == pytest.approx(0.0) and flat.jackknife_log_variance == pytest.approx(0.0)
    # the jackknife variance is close to the linearised one, and not smaller on skewed samples
    rng = np.random.default_rng(0)
    skewed = confidence.ratio_of_sums(*draw(rng, 50, 0.012, 0.6))
    assert skewed.log_variance <= skewed.jackknife_log_variance <= 1.3 * skewed.log_variance
    assert skewed.variance("delta") == skewed.log_variance
    assert skewed.variance("jackknife") == skewed.jackknife_log_variance
    assert confidence.z_value(0.95) == pytest.approx(1.959964, rel=1e-6)


def test_bootstrap_is_deterministic_per_seed_and_handles_a_fixed_baseline():
    rng = np.random.default_rng(3)
    spec = draw(rng, 80, 0.012, 0.3)
    base = draw(rng, 80, 0.018, 0.3)
    one = confidence.bootstrap_interval(*spec, *base, confidence=0.95, resamples=300, seed=5)
    two = confidence.bootstrap_interval(*spec, *base, confidence=0.95, resamples=300, seed=5)
    other = confidence.bootstrap_interval(*spec, *base, confidence=0.95, resamples=300, seed=6)
    assert one == two != other
    fixed = confidence.bootstrap_interval(
        *spec, None, None, fixed_base=0.018, confidence=0.95, resamples=300, seed=5
    )
    rc = (spec[0].sum() / spec[1].sum()) / 0.018
    assert fixed[0] < rc < fixed[1]
    assert (
        confidence.bootstrap_interval(spec[0][:1], spec[1][:1], *base, confidence=0.95, resamples=300, seed=0)
        is None
    )


def test_bootstrap_leaves_out_draws_with_a_zero_baseline_and_gives_none_past_one_tail():
    """A resampled baseline of 0 s has no RC, as the point estimate has none: never divided by."""
    spec = (np.array([1.0, 1.2, 0.9, 1.1]), np.array([10.0, 10.0, 10.0, 10.0]))
    # 1 request of 0 s among 200: a draw is all-zero with probability 200**-200, never
    many = (np.r_[np.zeros(1), np.full(199, 2.0)], np.full(200, 10.0))
    kept = confidence.bootstrap_interval(*spec, *many, confidence=0.95, resamples=300, seed=1)
    assert kept is not None and 0 < kept[0] <= kept[1]
    # 1 of 2 requests took 0 s: a quarter of the draws have no baseline, more than one 2.5% tail
    half = (np.array([0.0, 2.0]), np.array([10.0, 10.0]))
    assert confidence.bootstrap_interval(*spec, *half, confidence=0.95, resamples=300, seed=1) is None
    # shared baseline draws (one load bucket), some of them zero or without tokens (NaN)
    drawn = np.r_[np.full(99, 0.2), 0.0]
    shared = confidence.bootstrap_interval(
        *spec, None, None, base_ratios=drawn, confidence=0.95, resamples=100, seed=1
    )
    assert shared is not None and math.isfinite(shared[1])
    tokens_none = confidence.resampled_ratios(0, np.array([0.0, 0.0]), np.array([0.0, 0.0]), 50)
    assert np.isnan(tokens_none).all()
    assert (
        confidence.bootstrap_interval(
            *spec, *(np.zeros(3), np.zeros(3)), confidence=0.95, resamples=50, seed=0
        )
        is None
    )
    assert (
        confidence.bootstrap_interval(
            *spec, None, None, fixed_base=0.0, confidence=0.95, resamples=50, seed=0
        )
        is None
    )
