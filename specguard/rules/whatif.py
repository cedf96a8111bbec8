"""What-if: the RC a class would have on another pool (another K), from data measured at this K.

Per-position acceptance at the measured K comes from the summed per-request accepted
histograms (``h[j]`` = rounds accepting exactly ``j`` drafts): ``p_i`` = share of rounds with
``>= i`` accepted. Then ``A(K') = 1 + sum_{i<=K'} p_i`` (docs/concepts.md) is a measurement
for ``K' <= K``. For ``K' > K`` the tail is extrapolated geometrically with the last measured
conditional acceptance (labelled ``extrapolated``). Without histograms, acceptance is modelled
as i.i.d. per token, fitted to the measured accept length (labelled ``iid``; an assumption).

Predicted ``RC(K') = T_step(pool', load) / (A(K') * T_base(load))``: the step time of the
target pool in the same load bucket, from (in order) its live traffic, the step-cost fit, or the
calibration profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

METHOD_HISTOGRAM = "histogram"
METHOD_EXTRAPOLATED = "extrapolated"
METHOD_IID = "iid"


def per_position(histogram: Sequence[float]) -> tuple[float, ...]:
    """``(p_1..p_K)`` from an accepted histogram of length K+1; empty when it has no rounds."""
    total = float(sum(histogram))
    if total <= 0:
        return ()
    tail = 0.0
    shares: list[float] = []
    for count in reversed(list(histogram)[1:]):
        tail += float(count)
        shares.append(tail / total)
    return tuple(reversed(shares))


def iid_accept_length(rate: float, k: int) -> float:
    """``(1 - a^(K+1)) / (1 - a)``: accept length under i.i.d. per-token acceptance ``a``."""
    if k <= 0:
        return 1.0
    if rate >= 1.0:
        return float(k + 1)
    return (1.0 - rate ** (k + 1)) / (1.0 - rate)


def iid_rate(accept_length: float, k: int) -> float:
    """The i.i.d. per-token acceptance that gives ``accept_length`` at K (bisection, monotone)."""
    if k <= 0 or accept_length <= 1.0:
        return 0.0
    if accept_length >= k + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(80):
        mid = (low + high) / 2.0
        if iid_accept_length(mid, k) < accept_length:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


@dataclass(frozen=True)
class Acceptance:
    """What was measured at K: rounds, the per-position shares (if histograms came) and A."""

    k: int
    rounds: int
    positions: tuple[float, ...] = ()  # p_1..p_K, empty without histograms
    accept_length: float | None = None  # 1 + accepted / rounds

    def at(self, k_prime: int) -> tuple[float, str] | None:
        """Predicted accept length at ``k_prime`` and the method used; ``None`` without data."""
        if k_prime <= 0:
            return (1.0, METHOD_HISTOGRAM)
        if self.positions:
            p = list(self.positions)
            if k_prime <= len(p):
                return (1.0 + sum(p[:k_prime]), METHOD_HISTOGRAM)
            last = p[-1]
            ratio = last / p[-2] if len(p) >= 2 and p[-2] > 0 else last
            ratio = min(max(ratio, 0.0), 1.0)
            extra, term = 0.0, last
            for _ in range(k_prime - len(p)):
                term *= ratio
                extra += term
            return (1.0 + sum(p) + extra, METHOD_EXTRAPOLATED)
        if self.accept_length is None or self.k <= 0:
            return None
        rate = iid_rate(self.accept_length, self.k)
        return (iid_accept_length(rate, k_prime), METHOD_IID)


STEP_LOG_SD = 0.05
"""Log standard deviation of a step time read from the step fit or the profile (not measured in
this window): the uncertainty a what-if carries for the pool it was not measured on."""


@dataclass(frozen=True)
class StepTime:
    """A verify-round (engine step) time for one pool at one load bucket, and where it came from."""

    seconds: float
    source: str  # "live" | "stepfit" | "profile"
    detail: str
    log_sd: float = STEP_LOG_SD  # of the step time (a live one: its ratio of sums')


def acceptance_log_sd(
    histograms: np.ndarray, seconds: np.ndarray, tokens: np.ndarray, k_target: int
) -> float | None:
    """Jackknife (leave one request out) log standard deviation of ``A(k_target) x TPOT``, the part of
    a what-if's ratio to the measurement it was made from that those requests carry:
    ``RC(K') / RC(K) = T_step(K') / (A(K') x TPOT(K))``, the baseline cancelling. ``histograms``:
    per request, rounds accepting exactly j drafts (n x (K+1)); ``seconds``, ``tokens``: its decode
    seconds and tokens. None with fewer than 3 requests."""
    n = len(seconds)
    if n < 3 or k_target <= 0:
        return None
    total = histograms.sum(axis=0)
    rest = total[None, :] - histograms  # leave-one-out histograms, n x (K+1)
    rounds = rest.sum(axis=1)
    at_least = np.cumsum(rest[:, ::-1], axis=1)[:, ::-1]  # rounds with >= j accepted, j = 0..K
    keep = min(k_target, histograms.shape[1] - 1)
    accept = 1.0 + at_least[:, 1 : keep + 1].sum(axis=1) / np.maximum(rounds, 1)
    tpot = (seconds.sum() - seconds) / np.maximum(tokens.sum() - tokens, 1e-12)
    good = (rounds > 0) & (tpot > 0)
    if good.sum() < 3:
        return None
    logs = np.log(accept[good] * tpot[good])
    m = int(good.sum())
    return float(np.sqrt((m - 1) / m * np.sum((logs - logs.mean()) ** 2)))


@dataclass(frozen=True)
class WhatIf:
    """Predicted RC of one class on another pool, with every number behind it."""

    pool: str
    num_speculative_tokens: int
    rc: float | None
    accept_length: float | None
    acceptance_method: str | None  # "histogram" | "extrapolated" | "iid"
    step_seconds: float | None
    step_source: str | None  # "live" | "stepfit" | "profile"
    detail: str
    ratio_spread: float | None = None  # log half-width of rc / (the measured rc it was made from)


def predict(
    acceptance: Acceptance,
    *,
    pool: str,
    k: int,
    step: StepTime | None,
    base_tpot_seconds: float | None,
) -> WhatIf:
    """RC on ``pool`` (K = ``k``); ``rc`` is None (with the reason in ``detail``) when a number is missing."""
    predicted = acceptance.at(k)
    accept, method = predicted if predicted is not None else (None, None)
    step_seconds = step.seconds if step is not None else None
    step_source = step.source if step is not None else None
    missing = []
    if accept is None:
        missing.append(f"no acceptance measured at K={acceptance.k}")
    if step is None:
        missing.append(f"no step time for pool {pool} in this load bucket")
    if base_tpot_seconds is None:
        missing.append("no baseline")
    if missing:
        return WhatIf(pool, k, None, accept, method, step_seconds, step_source, "; ".join(missing))
    rc = step.seconds / (accept * base_tpot_seconds)
    detail = (
        f"A({k})={accept:.3f} ({method}, measured at K={acceptance.k}), "
        f"step {step.seconds * 1000:.2f} ms ({step.detail}), base {base_tpot_seconds * 1000:.2f} ms/token"
    )
    return WhatIf(pool, k, rc, accept, method, step.seconds, step.source, detail)


def model_rc(alpha: float, rho: float, k: int) -> float:
    """Bonus-aware model form ``(1 + rho*K) / (1 + alpha*K)`` (docs/concepts.md)."""
    return (1.0 + rho * k) / (1.0 + alpha * k)


def model_rc_no_bonus(alpha: float, rho: float, k: int) -> float | None:
    """``(1 + rho*K) / (alpha*K)``, the acceptance-vs-speedup article's form (docs/concepts.md#sources):
    no bonus token, conservative; None (infinite) at alpha 0."""
    if alpha <= 0 or k <= 0:
        return None
    return (1.0 + rho * k) / (alpha * k)


def measured_rc(round_seconds: float, base_seconds: float, accept_length: float) -> float:
    """``(T_round / A) / T_base``: time per token with speculation over time per token without."""
    return round_seconds / accept_length / base_seconds
