"""The ``model`` baseline: T_base at a load the no-spec pool has not run at, from a step-cost fit.

A speculative pool at load B runs steps of the same B requests with more verify tokens
(docs/cost-model.md#the-model-baseline, after the budget article in docs/concepts.md#sources):
``T_step ~ c0 + cB*B + cM*M`` with ``M = B*(1 + K*f)``
executed tokens (``f``: share of steps that drafted). Per pool the draft passes and the prefills
its faster-finishing requests bring into each step shift the intercept and the slope, so each
pool gets its own ``c0 + c*B``; what carries over from the speculative pools to the no-spec one is
where the machine turns compute-bound: a hinge ``cH*max(0, M - knee)`` shared by every pool, on
executed tokens whatever made them. The no-spec pool pins its own line at the loads it ran at;
the speculative pools, running at every load, show the knee and the slope beyond it. Without
speculation ``M = B``, so ``TPOT_base(B) = c0 + c*B + cH*max(0, B - knee)`` (one token per step),
with the fit's standard error as its interval. The knee is chosen by AIC over candidate token
counts (no hinge is a candidate; a hinge must be convex: saturation makes tokens dearer).

A model that cannot lie: every step cost is fitted non-negative (``nonnegative``), the interval is
the unconstrained fit's (a cost pinned at zero keeps its uncertainty) and widens by
``EXTRAPOLATION_SD`` per factor e beyond the loads the no-spec pool ran at, and the model is never
read more than ``EXTRAPOLATION_FACTOR`` beyond them (``ModelBaseline.reach`` says why; the
baseline is then ``none``, and ``specguard status`` shows the reason).

Observations, each a ``StepObservation(step_seconds, B, K, draft_share, weight)``:

- the tap's per-request records, binned per (pool, load): decode seconds / engine steps, where a
  request's steps are ``output_tokens - 1 - accepted_tokens`` (each step emits 1 + its accepted
  drafts, exact whether or not the drafter proposed anything) at the load it was sent at;
- the engines' pages between two scrapes (``observation_from_engine``): vLLM's
  ``inter_token_latency_seconds`` (one sample per request per step: mean step time) with
  ``iteration_tokens_total``'s count (steps, so mean batch = request-steps / steps) or else
  ``num_requests_running``; SGLang's per-token latency over its verify calls. Weighted as the
  requests they stand for (request-steps / steps per request), so neither source swamps the other.

Pure: values in, values out. The fit's quality and its inputs go into ``detail``.

Public API (``__all__``), for the cost model and for anything else that needs the no-spec step
time at a load: ``fit(records, k_by_pool, engine) -> ModelBaseline | str`` (a reason when there is
none), ``ModelBaseline.tpot(load) -> (seconds, Var(log))`` / ``.reach(load)`` / ``.detail(load)``,
``StepModel`` (one fit: ``predict(load)``, ``formula()``), the observation builders
``observations_from_records`` and ``observation_from_engine``, ``request_steps``, ``Cache`` (one
fit per evaluation, read per load bucket or cell) with ``bucket_load``, and the shared rules of
reading any step line: ``nonnegative``, ``beyond``, ``EXTRAPOLATION_FACTOR``, ``EXTRAPOLATION_SD``
(``rules.likebase`` reads the live baseline's line by them too).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specguard.errors import InputError
from specguard.exporters.records import RequestRecord
from specguard.exporters.snapshot import EngineSnapshot
from specguard.rules import profile as profile_mod
from specguard.rules.cost_config import CostSettings
from specguard.rules.stepfit import StepObservation, nonnegative

__all__ = [
    "EXTRAPOLATION_FACTOR",
    "EXTRAPOLATION_SD",
    "Cache",
    "ModelBaseline",
    "StepModel",
    "beyond",
    "bucket_load",
    "fit",
    "nonnegative",
    "observation_from_engine",
    "observations_from_records",
    "request_steps",
]

KNEE_CANDIDATES = 24
MIN_OBSERVATIONS = 6
MIN_WEIGHT = 1e-3  # fits with a smaller Akaike weight are left out of the average
DEFAULT_STEPS_PER_REQUEST = 100.0
EXTRAPOLATION_SD = 0.05
"""Standard deviation of log T_base added per unit of log(load / highest no-spec load): a linear
step model a factor e beyond the data is trusted to about 5% (1 sd), however clean the data."""
EXTRAPOLATION_FACTOR = 2.0
"""The furthest a step line is read beyond the loads its pool ran at (above the highest, below the
lowest): past it there is no model baseline, whatever the fit says (a line fitted at 0.4-1.6
requests in flight read at 35 gave 3.7 s per token)."""


def beyond(load: float, low: float, high: float) -> float:
    """How far ``load`` lies outside ``[low, high]``, as a log factor (0 inside)."""
    if load > high > 0:
        return math.log(load / high)
    if 0 < load < low:
        return math.log(low / load)
    return 0.0


@dataclass(frozen=True)
class StepModel:
    """The no-spec pool's step line plus the shared hinge, with the covariance of (c0, c, cH)."""

    intercept: float  # c0 of the no-spec pool, seconds
    slope: float  # c of the no-spec pool, seconds per request
    knee: float | None  # executed tokens per step where the hinge starts (None: no hinge)
    hinge: float  # cH, seconds per token beyond the knee
    covariance: tuple[tuple[float, ...], ...]  # of (c0, c, cH) (cH row/column zero without a hinge)
    residual_rms_seconds: float
    n: int

    def row(self, load: float) -> np.ndarray:
        return np.array([1.0, load, max(0.0, load - self.knee) if self.knee is not None else 0.0])

    def predict(self, load: float) -> tuple[float, float]:
        """``T_step(B=load, K=0)`` and its variance."""
        row = self.row(load)
        value = float(row @ np.array([self.intercept, self.slope, self.hinge]))
        return value, max(0.0, float(row @ np.array(self.covariance) @ row))

    def formula(self) -> str:
        text = f"T_step(B, K=0) = {self.intercept * 1000:.3f} ms + {self.slope * 1000:.4f} ms*B"
        if self.knee is not None:
            text += f" + {self.hinge * 1000:.4f} ms*max(0, B - {self.knee:g})"
        return text

    def quality(self) -> str:
        return f"residual RMS {self.residual_rms_seconds * 1000:.3f} ms over {self.n} observations"


@dataclass(frozen=True)
class ModelBaseline:
    """Step-cost fits (weighted by their AIC) that predict the no-spec TPOT at any load."""

    models: tuple[tuple[float, StepModel], ...]  # (Akaike weight, fit), best first
    nospec_loads: tuple[float, float]  # lowest and highest load the no-spec pool ran at in the data
    inputs: str  # e.g. "412 request-equivalents on nospec, spec-k4; 18 engine-page intervals"

    @property
    def best(self) -> StepModel:
        return self.models[0][1]

    def reach(self, load: float) -> str | None:
        """Why the model may not be read at ``load`` (None: it may): more than
        ``EXTRAPOLATION_FACTOR`` beyond the loads the no-spec pool ran at."""
        low, high = self.nospec_loads
        if beyond(load, low, high) > math.log(EXTRAPOLATION_FACTOR) + 1e-12:
            return (
                f"model: load {load:.1f} is more than {EXTRAPOLATION_FACTOR:g}x beyond the loads the no-spec "
                f"pool ran at ({low:.1f}-{high:.1f}): not extrapolated that far"
            )
        return None

    def tpot(self, load: float, *, limited: bool = True) -> tuple[float, float]:
        """``TPOT_base`` at ``load`` (seconds) and ``Var(log TPOT_base)``; InputError past
        ``reach`` (``limited=False``, for benchmarks only: read it anyway) or where the fit predicts
        no positive time.

        Model-averaged: the weighted mean of the fits' predictions; the variance adds each fit's
        own to the spread between fits (so an uncertain knee widens the interval). Beyond the
        loads the no-spec pool ran at, the interval also grows with the extrapolation (see
        ``EXTRAPOLATION_SD``).
        """
        why = self.reach(load) if limited else None
        if why is not None:
            raise InputError(why)
        predictions = [(w, *m.predict(load)) for w, m in self.models]
        value = sum(w * v for w, v, _ in predictions)
        if not value > 0:
            raise InputError(f"model baseline: predicted T_step(B={load:g}, K=0) is {value:.6f} s")
        variance = sum(w * (var + (v - value) ** 2) for w, v, var in predictions)
        distance = beyond(load, *self.nospec_loads)
        return value, variance / value**2 + (EXTRAPOLATION_SD * distance) ** 2

    def detail(self, load: float, confidence_z: float = 1.96) -> str:
        value, log_var = self.tpot(load)
        low, high = self.nospec_loads
        best = self.best
        return (
            f"model: T_base(load {load:.1f}) = {value * 1000:.2f} ms "
            f"(+-{confidence_z * math.sqrt(log_var):.1%}), "
            f"{best.formula()} ({best.quality()}); inputs {self.inputs}; "
            f"the no-spec pool ran at loads {low:.1f}-{high:.1f}"
        )


def request_steps(record: RequestRecord, k: int) -> float | None:
    """Engine steps of one request's decode phase, or None when unknown (several sequences share
    their steps in ways the record does not say)."""
    if record.sequences != 1:
        return None
    steps = record.output_tokens - 1
    if k > 0:
        if record.spec is None or record.spec.accepted_tokens is None:
            return None
        steps -= record.spec.accepted_tokens
    return float(steps) if steps > 0 else None


def observations_from_records(
    records: Iterable[RequestRecord], k_by_pool: Mapping[str, int]
) -> list[StepObservation]:
    """One observation per (pool, load rounded to a whole request): mean step time at that load.

    The load of a request is its mean load while it decoded (``decode_load``), else the load it
    was sent at.
    """
    bins: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    for r in records:
        k = k_by_pool.get(r.pool)
        load = r.decode_load if r.decode_load is not None else r.load
        if k is None or load is None or r.decode_seconds is None or not 200 <= r.status < 300:
            continue
        steps = request_steps(r, k)
        if steps is None or r.decode_seconds <= 0:
            continue
        acc = bins[(r.pool, round(load))]
        acc[0] += r.decode_seconds
        acc[1] += steps
        acc[2] += load * steps
        acc[3] += min(float(r.spec.rounds or 0), steps) if (k and r.spec is not None) else 0.0
        acc[4] += 1
    out = []
    for (pool, _), (seconds, steps, load_steps, rounds, requests) in sorted(bins.items()):
        k = k_by_pool[pool]
        share = rounds / steps if k else 0.0
        out.append(
            StepObservation(seconds / steps, load_steps / steps, k, weight=requests, draft_share=share)
        )
    return out


def observation_from_engine(
    before: EngineSnapshot, after: EngineSnapshot, k: int, replicas: int = 1
) -> tuple[StepObservation, float] | None:
    """Mean step time between two scrapes of one pool, and the request-steps behind it.

    vLLM: ITL sum / count; batch = request-steps / steps (``iteration_tokens_total``'s count), else
    the running gauge per replica. SGLang (per-token latency): elapsed / verify calls (speculative)
    or / tokens (no speculation). None when the interval saw no decode step or a counter reset.
    """
    replicas = max(1, replicas)
    running = after.running_requests
    if before.step_latency is not None and after.step_latency is not None:
        request_steps_ = after.step_latency.count - before.step_latency.count
        seconds = after.step_latency.sum - before.step_latency.sum
        steps = None
        if before.iteration_tokens is not None and after.iteration_tokens is not None:
            steps = after.iteration_tokens.count - before.iteration_tokens.count
        if steps is not None and steps > 0:
            batch = request_steps_ / steps
        elif running:
            batch = running / replicas
        else:
            return None
    elif before.token_latency is not None and after.token_latency is not None and running:
        seconds = after.token_latency.sum - before.token_latency.sum
        request_steps_ = after.token_latency.count - before.token_latency.count
        if k > 0:
            if before.drafts is None or after.drafts is None:
                return None
            request_steps_ = after.drafts - before.drafts
        batch = running / replicas
    else:
        return None
    if not (request_steps_ > 0 and seconds > 0 and batch > 0):
        return None
    share = 0.0
    if k > 0:
        share = 1.0
        if before.drafts is not None and after.drafts is not None and after.step_latency is not None:
            share = min(1.0, max(0.0, (after.drafts - before.drafts) / request_steps_))
    return StepObservation(seconds / request_steps_, batch, k, draft_share=share), request_steps_


def fit(
    records: Sequence[RequestRecord],
    k_by_pool: Mapping[str, int],
    engine: Sequence[tuple[str, StepObservation, float]] = (),
) -> ModelBaseline | str:
    """The model baseline from the window's records and engine-page intervals
    ``(pool, observation, request-steps)``, or the reason there is none."""
    rows = _record_observations(records, k_by_pool)
    steps_per_request = _steps_per_request(records, k_by_pool)
    for pool, obs, request_steps_ in engine:
        weight = request_steps_ / steps_per_request.get(pool, DEFAULT_STEPS_PER_REQUEST)
        rows.append((pool, replace(obs, weight=weight)))
    nospec = [o for _, o in rows if o.k == 0]
    if len({round(o.batch) for o in nospec}) < 2:
        return "model: the no-spec pool has not run at two loads yet"
    if not any(o.k > 0 for _, o in rows):
        return "model: no step observations of a speculative pool yet"
    if len(rows) < MIN_OBSERVATIONS:
        return f"model: {len(rows)} step observations (< {MIN_OBSERVATIONS})"
    models = _fits(rows)
    if not models:
        return "model: the step observations do not determine a fit"
    loads = [o.batch for o in nospec]
    n_requests = sum(int(o.weight) for _, o in rows)
    inputs = f"{n_requests} request-equivalents on {', '.join(sorted({p for p, _ in rows}))}"
    if engine:
        inputs += f", {len(engine)} engine-page intervals"
    return ModelBaseline(tuple(models), (min(loads), max(loads)), inputs)


def _record_observations(
    records: Sequence[RequestRecord], k_by_pool: Mapping[str, int]
) -> list[tuple[str, StepObservation]]:
    by_pool: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.pool in k_by_pool:
            by_pool[r.pool].append(r)
    return [
        (pool, obs) for pool in sorted(by_pool) for obs in observations_from_records(by_pool[pool], k_by_pool)
    ]


def _steps_per_request(records: Sequence[RequestRecord], k_by_pool: Mapping[str, int]) -> dict[str, float]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in records:
        k = k_by_pool.get(r.pool)
        steps = request_steps(r, k) if k is not None else None
        if steps is not None:
            totals[r.pool][0] += steps
            totals[r.pool][1] += 1
    return {pool: steps / n for pool, (steps, n) in totals.items() if n}


def _design(rows: Sequence[tuple[str, StepObservation]], knee: float | None) -> np.ndarray:
    """Columns: the no-spec intercept and slope, each speculative pool's, then the hinge."""
    batch = np.array([o.batch for _, o in rows])
    nospec = np.array([o.k == 0 for _, o in rows], dtype=float)
    cols = [nospec, nospec * batch]
    for pool in sorted({p for p, o in rows if o.k > 0}):
        mask = np.array([p == pool and o.k > 0 for p, o in rows], dtype=float)
        cols += [mask, mask * batch]
    if knee is not None:
        cols.append(np.array([max(0.0, o.feature("verify_tokens") - knee) for _, o in rows]))
    return np.column_stack(cols)


def _solve(rows: Sequence[tuple[str, StepObservation]], knee: float | None) -> tuple[StepModel, float] | None:
    """One design's fit and its AIC; None when it is degenerate.

    Weighted least squares with a residual variance of each pool's own (a busy speculative pool's
    bins scatter more than the no-spec pool's): two reweighting passes, then the Gaussian
    likelihood with those variances gives the AIC (the knee's position counts as a parameter).
    """
    x = _design(rows, knee)
    y = np.array([o.step_seconds for _, o in rows])
    base = np.array([o.weight for _, o in rows], dtype=float)
    groups = np.array([p for p, _ in rows])
    n, p = x.shape
    if n <= p:
        return None
    w = base
    for _ in range(3):
        sw = np.sqrt(w)
        xw = x * sw[:, None]
        if np.linalg.matrix_rank(xw / np.maximum(np.linalg.norm(xw, axis=0), 1e-300)) < p:
            return None
        free = np.linalg.lstsq(xw, y * sw, rcond=None)[0]
        beta = nonnegative(xw, y * sw)
        residuals = y - x @ beta
        variances = {g: _variance(base, residuals, groups == g) for g in set(groups.tolist())}
        w = base / np.array([variances[g] for g in groups])
    # the covariance of the unconstrained fit: a cost pinned at zero keeps its uncertainty
    free_residuals = y - x @ free
    covariance = np.linalg.pinv(xw.T @ xw) * (float(np.sum(w * free_residuals**2)) / (n - p))
    loglik = sum(float(np.sum(groups == g)) * math.log(v) for g, v in variances.items())
    aic = loglik + 2 * (p + len(variances) + (1 if knee is not None else 0))
    keep = [0, 1] + ([p - 1] if knee is not None else [])
    cov = np.zeros((3, 3))
    cov[: len(keep), : len(keep)] = covariance[np.ix_(keep, keep)]
    rms = math.sqrt(float(np.sum(base * residuals**2) / np.sum(base)))
    model = StepModel(
        intercept=float(beta[0]),
        slope=float(beta[1]),
        knee=knee,
        hinge=float(beta[-1]) if knee is not None else 0.0,
        covariance=tuple(tuple(float(v) for v in row) for row in cov),
        residual_rms_seconds=rms,
        n=n,
    )
    return model, aic


def _variance(base: np.ndarray, residuals: np.ndarray, mask: np.ndarray) -> float:
    """Residual variance per unit weight of one pool's observations (floored)."""
    count = int(mask.sum())
    return max(float(np.sum(base[mask] * residuals[mask] ** 2)) / max(count, 1), 1e-14)


def _fits(rows: Sequence[tuple[str, StepObservation]]) -> list[tuple[float, StepModel]]:
    """No hinge and a convex hinge at each candidate knee, with Akaike weights (best first)."""
    found = []
    plain = _solve(rows, None)
    if plain is not None:
        found.append(plain)
    tokens = np.array([o.feature("verify_tokens") for _, o in rows if o.k > 0])
    if tokens.size >= 3:
        for knee in np.unique(np.quantile(tokens, np.linspace(0.05, 0.95, KNEE_CANDIDATES)).round(1)):
            trial = _solve(rows, float(knee))
            if trial is not None and trial[0].hinge > 0:
                found.append(trial)
    if not found:
        return []
    best = min(aic for _, aic in found)
    weights = [(math.exp(-(aic - best) / 2), model) for model, aic in found]
    total = sum(w for w, _ in weights)
    kept = sorted(((w / total, m) for w, m in weights if w / total >= MIN_WEIGHT), key=lambda item: -item[0])
    scale = sum(w for w, _ in kept)
    return [(w / scale, m) for w, m in kept]


class Cache:
    """The model baseline of one evaluation: fitted once, on first need, then read per load bucket."""

    def __init__(
        self,
        records: Sequence[RequestRecord],
        ks: Mapping[str, int],
        engine_steps: Sequence[tuple[str, StepObservation, float]],
    ):
        self._args = (records, ks, engine_steps)
        self._fit: ModelBaseline | str | None = None

    def at(
        self, load_bucket: str, spec_records: Sequence[RequestRecord], settings: CostSettings
    ) -> tuple[float, float, str] | str:
        """``(TPOT_base, Var(log), detail)`` at the load ``spec_records`` (the speculative requests
        the baseline is for: one cell, or a whole bucket) decoded at, or why there is none."""
        if self._fit is None:
            self._fit = fit(*self._args)
        if isinstance(self._fit, str):
            return self._fit
        load = bucket_load(spec_records, load_bucket, settings)
        if load is None:
            return f"model: load bucket {load_bucket!r} is not configured"
        try:
            value, log_variance = self._fit.tpot(load)
        except InputError as exc:
            return str(exc)
        return value, log_variance, self._fit.detail(load)


def bucket_load(records: Sequence[RequestRecord], load_bucket: str, settings: CostSettings) -> float | None:
    """The load a bucket's speculative traffic ran at: its decode-token-weighted mean load while
    decoding (else when sent), or the bucket's representative concurrency without such records."""
    pairs = [
        (r.decode_load if r.decode_load is not None else r.load, r.output_tokens - 1)
        for r in records
        if (r.decode_load is not None or r.load is not None) and r.output_tokens >= 2
    ]
    if pairs:
        weight = sum(w for _, w in pairs)
        return sum(load * w for load, w in pairs) / weight  # type: ignore[operator]
    band = settings.bucket_range(load_bucket)
    return None if band is None else profile_mod.representative_concurrency(*band)
