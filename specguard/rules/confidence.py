"""Ratio-of-sums estimates and the confidence interval of RC, a ratio of two of them.

TPOT on one side is ``sum(decode seconds) / sum(output tokens - 1)`` over requests (a ratio
estimator: long requests weigh more, as they do in the engine). RC divides two independent
ones. Three interval methods, all from the per-request samples:

- ``jackknife`` (default): as ``delta`` below, but ``Var(log R)`` of each side is the jackknife
  variance ``(n-1)/n * sum((log R_(-i) - mean)^2)`` (leave-one-request-out ratios), which is a
  little more conservative than the linearised variance at a few dozen requests (e.g. 93.5% vs
  93.0% coverage of a nominal 95% at 50 requests per side with a skewed TPOT spread).
- ``delta``: first-order delta method on the log scale. For a ratio estimator
  ``R = sum(x)/sum(y)`` over ``n`` requests, ``Var(R) ~ sum((x_i - R*y_i)^2) / ((n-1) * n * ybar^2)``;
  ``Var(log RC) = Var(R_spec)/R_spec^2 + Var(R_base)/R_base^2`` (independent sides), and the
  interval is ``RC * exp(+-t * se)``, which stays positive and is asymmetric like the ratio itself.
  ``t`` is the Student quantile at the Welch-Satterthwaite degrees of freedom of the two sides
  (the normal ``z`` undercovers at a few dozen requests: 91.8% instead of 95% at 40 per side).
- ``bootstrap``: both sides resampled independently (seeded numpy Generator), percentile
  interval of the resampled RC. Slower; no normality assumption. A draw whose baseline TPOT is
  zero has no RC and is left out; past one tail's share of such draws there is no interval.

A profile baseline has no per-request samples: it enters as a fixed value with an optional
standard error (zero when the profile has none, which makes the interval narrower than the truth;
the ClassCost says the baseline came from a profile).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True)
class RatioEstimate:
    """``sum(numerators) / sum(denominators)`` over ``n`` units, with the delta-method variance of its log."""

    value: float
    n: int
    numerator_sum: float
    denominator_sum: float
    log_variance: float | None  # None with fewer than 2 units (no spread to measure)
    jackknife_log_variance: float | None = None  # leave-one-out variance of log(value)

    def variance(self, method: str) -> float | None:
        """Var(log value) for an interval ``method`` ("jackknife" or "delta")."""
        return self.jackknife_log_variance if method == "jackknife" else self.log_variance


def ratio_of_sums(numerators: np.ndarray, denominators: np.ndarray) -> RatioEstimate | None:
    """The ratio estimator and its log variance; ``None`` when there is nothing to divide."""
    x = np.asarray(numerators, dtype=float)
    y = np.asarray(denominators, dtype=float)
    n = int(x.size)
    den = float(y.sum())
    if n == 0 or den <= 0:
        return None
    num = float(x.sum())
    value = num / den
    if n < 2 or value <= 0:
        return RatioEstimate(value, n, num, den, None)
    ybar = den / n
    # Var(log value) by the delta method, computed on relative residuals so that a tiny value
    # cannot underflow to a division by zero: sum(((x/value - y) / ybar)^2) / ((n-1) n).
    relative = (x / value - y) / ybar
    log_variance = float((relative**2).sum()) / ((n - 1) * n)
    if not math.isfinite(log_variance):
        return RatioEstimate(value, n, num, den, None)
    jackknife = None
    rest_num, rest_den = num - x, den - y
    if np.all(rest_den > 0) and np.all(rest_num > 0):
        logs = np.log(rest_num / rest_den)
        jackknife = float((n - 1) / n * ((logs - logs.mean()) ** 2).sum())
    return RatioEstimate(value, n, num, den, log_variance, jackknife)


def z_value(confidence: float) -> float:
    """Two-sided standard normal quantile for ``confidence`` (0.95 -> 1.96)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def t_value(confidence: float, df: float) -> float:
    """Two-sided Student-t quantile by the Cornish-Fisher expansion (A&S 26.7.5; df >= 2)."""
    z = z_value(confidence)
    if not math.isfinite(df) or df > 1e6:
        return z
    v = max(df, 2.0)
    z3, z5, z7, z9 = z**3, z**5, z**7, z**9
    return (
        z
        + (z3 + z) / (4 * v)
        + (5 * z5 + 16 * z3 + 3 * z) / (96 * v**2)
        + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * v**3)
        + (79 * z9 + 776 * z7 + 1482 * z5 - 1920 * z3 - 945 * z) / (92160 * v**4)
    )


def welch_df(spec_log_variance: float, spec_n: int, base_log_variance: float, base_n: int | None) -> float:
    """Welch-Satterthwaite degrees of freedom; ``base_n=None`` is a fixed (profile) baseline."""
    parts = spec_log_variance**2 / max(spec_n - 1, 1)
    if base_n is not None:
        parts += base_log_variance**2 / max(base_n - 1, 1)
    if parts <= 0:
        return math.inf
    return (spec_log_variance + base_log_variance) ** 2 / parts


def delta_interval(
    rc: float,
    spec_log_variance: float | None,
    base_log_variance: float | None,
    confidence: float,
    *,
    spec_n: int | None = None,
    base_n: int | None = None,
) -> tuple[float, float] | None:
    """``rc * exp(+-t*se)``; ``None`` when either side has no variance estimate.

    Without ``spec_n`` the normal quantile is used; ``base_n=None`` marks a fixed baseline.
    """
    if spec_log_variance is None or base_log_variance is None or rc <= 0:
        return None
    se = math.sqrt(spec_log_variance + base_log_variance)
    if spec_n is None:
        q = z_value(confidence)
    else:
        q = t_value(confidence, welch_df(spec_log_variance, spec_n, base_log_variance, base_n))
    return (rc * math.exp(-q * se), rc * math.exp(q * se))


def bootstrap_interval(
    spec_seconds: np.ndarray,
    spec_tokens: np.ndarray,
    base_seconds: np.ndarray | None,
    base_tokens: np.ndarray | None,
    *,
    fixed_base: float | None = None,
    fixed_base_log_sd: float = 0.0,
    base_ratios: np.ndarray | None = None,
    confidence: float,
    resamples: int,
    seed: int,
) -> tuple[float, float] | None:
    """Percentile interval of RC from independent resampling of each side (deterministic per seed).

    With ``fixed_base`` (a profile baseline) only the spec side is resampled, and the baseline
    is jittered log-normally by ``fixed_base_log_sd`` when the profile gave a standard error.
    ``base_ratios`` are baseline resamples already drawn (``resampled_ratios``), shared by every
    class of a load bucket so the large no-spec side is resampled once per evaluation.
    """
    rng = np.random.default_rng(seed)
    spec_ratio = _resampled_ratios(rng, spec_seconds, spec_tokens, resamples)
    if spec_ratio is None:
        return None
    if base_ratios is not None:
        base_ratio = base_ratios
    elif fixed_base is not None:
        base_ratio = fixed_base * np.exp(rng.normal(0.0, fixed_base_log_sd, resamples))
    else:
        if base_seconds is None or base_tokens is None:
            return None
        base_ratio = _resampled_ratios(rng, base_seconds, base_tokens, resamples)
        if base_ratio is None:
            return None
    # A draw whose baseline TPOT is zero (its no-spec requests all took 0 s) has no RC, as the
    # point estimate has none without a positive baseline: it is left out, never divided.
    defined = np.isfinite(spec_ratio) & np.isfinite(base_ratio) & (base_ratio > 0)
    tail = (1.0 - confidence) / 2.0
    if int(defined.sum()) == 0 or (1.0 - defined.mean()) > tail:
        # more undefined draws than one tail holds: either bound could lie among them
        return None
    rc = spec_ratio[defined] / base_ratio[defined]
    low, high = np.percentile(rc, [tail * 100.0, 100.0 - tail * 100.0])
    return (float(low), float(high))


def resampled_ratios(seed: int, seconds: np.ndarray, tokens: np.ndarray, resamples: int) -> np.ndarray | None:
    """``resamples`` bootstrap ratio-of-sums values of one side (None with fewer than 2 samples)."""
    return _resampled_ratios(np.random.default_rng(seed), seconds, tokens, resamples)


def _resampled_ratios(
    rng: np.random.Generator, seconds: np.ndarray, tokens: np.ndarray, resamples: int
) -> np.ndarray | None:
    x = np.asarray(seconds, dtype=float)
    y = np.asarray(tokens, dtype=float)
    n = x.size
    if n < 2:
        return None
    # chunked so memory stays bounded for large windows
    out = np.empty(resamples)
    chunk = max(1, min(resamples, 2_000_000 // n))
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        num, den = x[idx].sum(axis=1), y[idx].sum(axis=1)
        # a draw with no tokens has no ratio (NaN), as ratio_of_sums has none
        out[start:stop] = np.divide(num, den, out=np.full(stop - start, np.nan), where=den > 0)
    return out
