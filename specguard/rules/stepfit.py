"""Step-cost model: ``T_step ~ c0 + cB*B + cM*M (+ cD*D + cK*K)`` fitted by least squares, every
cost non-negative (``nonnegative``: a step never gets cheaper with more requests, tokens or drafts;
a negative estimate is the noise of a narrow range of loads, and read away from them it prices a
busy pool as cheap).

``B`` = live requests in the step, ``M`` = verify tokens executed (``B*(K+1)`` in static verify),
``D`` = drafted tokens (``B*K``), ``K`` = sequential draft passes. An
additive model fits well in practice (SGLang's DSpark planner uses one). In static verify
``M = B + D`` exactly, so one of the three is collinear; the fit drops such terms (in the order
given) and says so, and its predictions stay exact within the data's span.

Observations come from a sweep (calibration profile ``step_seconds``), from engine snapshots
(mean step latency and running requests between two scrapes), or from live records per pool
and load bucket (decode seconds / verify rounds).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specguard.errors import InputError
from specguard.exporters.records import RequestRecord
from specguard.exporters.snapshot import EngineSnapshot
from specguard.rules import profile as profile_mod
from specguard.rules.cost_config import CostSettings

TERMS = ("batch", "verify_tokens", "draft_tokens", "draft_steps")
DEFAULT_TERMS = TERMS
_SYMBOLS = {"batch": "B", "verify_tokens": "M", "draft_tokens": "D", "draft_steps": "K"}


@dataclass(frozen=True)
class StepObservation:
    """One measured step time at a known shape."""

    step_seconds: float
    batch: float  # B
    k: int  # drafts per request per round (0 = no speculation)
    verify_tokens: float | None = None  # M; default B*(K+1)
    draft_tokens: float | None = None  # D; default B*K*draft_share
    weight: float = 1.0  # e.g. the number of steps averaged
    draft_share: float = 1.0  # share of the steps that drafted (an n-gram drafter may find nothing)

    def feature(self, term: str) -> float:
        if term == "batch":
            return self.batch
        if term == "verify_tokens":
            if self.verify_tokens is not None:
                return self.verify_tokens
            return self.batch * (1 + self.k * self.draft_share)
        if term == "draft_tokens":
            if self.draft_tokens is not None:
                return self.draft_tokens
            return self.batch * self.k * self.draft_share
        if term == "draft_steps":
            return float(self.k) * self.draft_share
        raise InputError(f"unknown step-cost term {term!r} (known: {', '.join(TERMS)})")


@dataclass(frozen=True)
class StepFit:
    """A fitted step-cost model and its quality."""

    terms: tuple[str, ...]  # fitted terms, intercept excluded
    intercept: float  # c0, seconds
    coefficients: tuple[float, ...]  # seconds per unit of each term
    r2: float
    residual_rms_seconds: float
    n: int
    dropped_terms: tuple[str, ...] = ()  # collinear with earlier terms (not identifiable from the data)

    def predict(
        self, batch: float, k: int, verify_tokens: float | None = None, draft_tokens: float | None = None
    ) -> float:
        obs = StepObservation(0.0, batch, k, verify_tokens, draft_tokens)
        return self.intercept + sum(
            c * obs.feature(t) for t, c in zip(self.terms, self.coefficients, strict=True)
        )

    def formula(self) -> str:
        parts = [f"{self.intercept * 1000:.3f} ms"]
        for term, coef in zip(self.terms, self.coefficients, strict=True):
            parts.append(f"{'-' if coef < 0 else '+'} {abs(coef) * 1000:.4f} ms*{_SYMBOLS[term]}")
        return "T_step = " + " ".join(parts)

    def quality(self) -> str:
        text = f"R^2 {self.r2:.4f}, residual RMS {self.residual_rms_seconds * 1000:.3f} ms, n {self.n}"
        if self.dropped_terms:
            text += f", dropped collinear: {', '.join(self.dropped_terms)}"
        return text


def fit(
    observations: Sequence[StepObservation], terms: Sequence[str] = DEFAULT_TERMS, *, constrained: bool = True
) -> StepFit:
    """Weighted least squares, every coefficient >= 0 unless not ``constrained``; raises InputError
    with too few or degenerate observations."""
    obs = [o for o in observations if math.isfinite(o.step_seconds) and o.step_seconds > 0 and o.weight > 0]
    if not obs:
        raise InputError("step-cost fit: no usable observations (need step_seconds > 0)")
    for term in terms:
        obs[0].feature(term)  # validates the name
    y = np.array([o.step_seconds for o in obs])
    w = np.sqrt(np.array([o.weight for o in obs], dtype=float))
    columns = [np.ones(len(obs))]
    kept: list[str] = []
    dropped: list[str] = []
    for term in terms:
        column = np.array([o.feature(term) for o in obs], dtype=float)
        trial = np.column_stack([*columns, column]) * w[:, None]
        norms = np.linalg.norm(trial, axis=0)
        norms[norms == 0] = 1.0
        if np.linalg.matrix_rank(trial / norms, tol=1e-9) == len(columns) + 1:
            columns.append(column)
            kept.append(term)
        else:
            dropped.append(term)
    if len(obs) < len(columns) + 1:
        raise InputError(
            f"step-cost fit: {len(obs)} observations for {len(columns)} coefficients "
            f"({', '.join(['intercept', *kept])}); need at least {len(columns) + 1}"
        )
    design = np.column_stack(columns)
    if constrained:
        solution = nonnegative(design * w[:, None], y * w)
    else:
        solution, *_ = np.linalg.lstsq(design * w[:, None], y * w, rcond=None)
    predicted = design @ solution
    residuals = y - predicted
    weights = w**2
    mean = float(np.average(y, weights=weights))
    total = float(np.sum(weights * (y - mean) ** 2))
    sse = float(np.sum(weights * residuals**2))
    r2 = 1.0 - sse / total if total > 0 else 1.0
    rms = math.sqrt(sse / float(np.sum(weights)))
    return StepFit(
        terms=tuple(kept),
        intercept=float(solution[0]),
        coefficients=tuple(float(c) for c in solution[1:]),
        r2=r2,
        residual_rms_seconds=rms,
        n=len(obs),
        dropped_terms=tuple(dropped),
    )


def nonnegative(
    design: np.ndarray, target: np.ndarray, constrained: Sequence[int] | None = None
) -> np.ndarray:
    """Least squares with the ``constrained`` coefficients (default: all) >= 0. Step costs (a time
    per step, per request, per token) are never negative; a negative estimate is the noise of a
    narrow range of loads, and a line through it predicts nonsense away from them. Active set: the
    most negative constrained coefficient is pinned at zero and the rest refitted, until none is."""
    p = design.shape[1]
    bound = set(range(p) if constrained is None else constrained)
    free = list(range(p))
    beta = np.zeros(p)
    while free:
        solution, *_ = np.linalg.lstsq(design[:, free], target, rcond=None)
        beta = np.zeros(p)
        beta[free] = solution
        negative = [(value, j) for value, j in zip(solution, free, strict=True) if j in bound and value < 0]
        if not negative:
            break
        free.remove(min(negative)[1])
    return beta


def observations_from_profile(profile: profile_mod.Profile) -> list[StepObservation]:
    """One observation per (pool, concurrency) level that recorded ``step_seconds``, weighted by samples."""
    out = []
    for pool in profile.pools:
        for level in pool.levels:
            if level.step_seconds:
                out.append(
                    StepObservation(
                        level.step_seconds, level.concurrency, pool.num_speculative_tokens, weight=1.0
                    )
                )
    return out


def observations_from_frame(frame: Any) -> list[StepObservation]:
    """From a pandas DataFrame: step_seconds, batch, k (optional verify_tokens, draft_tokens, weight)."""
    missing = [c for c in ("step_seconds", "batch", "k") if c not in frame.columns]
    if missing:
        raise InputError(f"step observations frame lacks column(s): {', '.join(missing)}")
    out = []
    for row in frame.to_dict("records"):
        out.append(
            StepObservation(
                float(row["step_seconds"]),
                float(row["batch"]),
                int(row["k"]),
                _opt(row.get("verify_tokens")),
                _opt(row.get("draft_tokens")),
                float(row.get("weight", 1.0) or 1.0),
            )
        )
    return out


def _opt(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def observation_from_snapshots(
    before: EngineSnapshot, after: EngineSnapshot, k: int
) -> StepObservation | None:
    """Mean step time between two scrapes of one engine (vLLM ITL is one sample per request-step).

    ``batch`` is the running-requests gauge at the later scrape (an approximation of the mean).
    """
    if before.step_latency is None or after.step_latency is None or after.running_requests is None:
        return None
    count = after.step_latency.count - before.step_latency.count
    total = after.step_latency.sum - before.step_latency.sum
    if count <= 0 or total <= 0 or after.running_requests <= 0:
        return None
    return StepObservation(total / count, float(after.running_requests), k, weight=float(count))


def observations_from_records(
    records: Iterable[RequestRecord],
    k_by_pool: Mapping[str, int],
    settings: CostSettings,
    scheduled: Collection[str] = (),
) -> list[StepObservation]:
    """Per (pool, load bucket): sum(decode s) / sum(verify rounds) at the bucket's representative concurrency.

    No-spec pools give ``sum(decode s) / sum(output tokens - 1)`` (one token per step). A
    ``scheduled`` pool runs the K its in-engine schedule picks by batch size, so its requests are
    taken per (load bucket, K they ran at): drafts per verify round, and K = 0 for a request that
    verified no draft (its steps are the engine's without speculation).
    """
    seconds: dict[tuple[str, str, int], float] = defaultdict(float)
    steps: dict[tuple[str, str, int], float] = defaultdict(float)
    for r in records:
        if (
            r.pool not in k_by_pool
            or r.decode_seconds is None
            or not 200 <= r.status < 300
            or r.output_tokens < 2
        ):
            continue
        k = k_by_pool[r.pool]
        if r.pool in scheduled and r.spec is not None:  # the K this request ran at
            if r.spec.rounds == 0:
                k = 0
            elif r.spec.draft_tokens is not None:
                k = max(1, min(k, round(r.spec.draft_tokens / r.spec.rounds)))
        if k > 0:
            if r.spec is None or not r.spec.rounds:
                continue
            n_steps = float(r.spec.rounds)
        else:
            n_steps = float(r.output_tokens - 1)
        seconds[(r.pool, r.load_bucket, k)] += r.decode_seconds
        steps[(r.pool, r.load_bucket, k)] += n_steps
    out = []
    for (pool, bucket, k), total in seconds.items():
        band, n = settings.bucket_range(bucket), steps[(pool, bucket, k)]
        if band is None or n <= 0:
            continue
        out.append(StepObservation(total / n, profile_mod.representative_concurrency(*band), k, weight=n))
    return out
