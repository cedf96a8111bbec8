"""The live baseline, like for like: the no-spec TPOT the class's own speculative requests would
have had, at their load and with their geometry.

RC compares one operating point (docs/concepts.md): the same class, the same requests in flight,
the same context lengths. Inside one load bucket the no-spec pool rarely runs where the
speculative one does (a holdout at one request in flight against a pool at 1.6), and classes
differ in prompt and output length and in how they sample, so neither the bucket's pooled no-spec
TPOT nor the class's own, taken as they are, is that number.

So the no-spec requests of the window fit a per-request step-cost line (a no-spec step emits one
token, so a request's TPOT is its mean step time)::

    TPOT_i = c0 + cB * B_i + cH * H_i + cS * S_i  (+ c_class, for the class's own level)

with ``B_i`` the requests in flight per replica while request ``i`` decoded (``decode_load``),
``H_i = prompt_tokens + output_tokens / 2`` its mean context (KV history) while it decoded, and
``S_i`` 1 when it sampled (temperature above 0), 0 when it took the most likely token: on
SmolLM2 with vLLM's CPU build, a step that samples at temperature 1 took 10-20% longer than a
greedy one, where 700 tokens of prompt against 50 added 10%.
Weighted least squares with the decode tokens as weights, so that with no term but ``c0`` it is
exactly the ratio of sums ``sum(decode s) / sum(tokens - 1)``. Step costs are never negative
(``cB, cH >= 0``: a negative estimate is noise and is set to zero). The baseline of a (class,
pool) cell is the line at the token-weighted mean geometry of the cell's speculative requests
(``sum_j y_j * TPOT(x_j) / sum_j y_j``), so RC is their measured time over the time the same
requests would have taken without speculation.

Two scopes of level (``cost.baseline_scope``):

- the class's own (``class_then_*``, when it has ``baseline_min_samples`` no-spec requests in the
  bucket): ``c_class`` is fitted, so the baseline is the class's own no-spec TPOT moved along the
  shared slopes to the speculative side's load and context;
- every class's (``load``, ``geometry``, or a class short of its own): the line alone, and, since
  a class may differ from the others in what the line does not see (its sampler, its tokens), the
  spread of the other classes' levels around the line (``tau``, their between-class standard
  deviation on the log scale) is added to the interval. With fewer than two classes to measure it
  on, ``CLASS_SD`` stands in.

The terms used are ``load`` (all scopes), ``context`` and ``sampled`` (``geometry`` and
``class_then_geometry``; ``context`` when every request reports its prompt length). A term whose
values do not spread in the data is left out; its target must then match the data within
``MATCH_TOLERANCE``. A fitted term is not
extrapolated further than ``EXTRAPOLATION_FACTOR`` beyond the range the no-spec requests cover,
and each factor e beyond it adds ``EXTRAPOLATION_SD`` to the log standard deviation: the model
baseline's rules (``rules.modelbase``). Beyond either, there is no live baseline here, and the reason
says why.

Interval: the coefficients' covariance is the heteroskedasticity-robust sandwich (``delta``) or
the closed-form leave-one-request-out jackknife (``jackknife``, the default) of the unconstrained
fit, so a slope set to zero still carries its uncertainty; with no term but ``c0`` both reduce to
the ratio-of-sums variances of ``rules.confidence``.

Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specguard.exporters.records import RequestRecord
from specguard.rules.modelbase import EXTRAPOLATION_FACTOR, EXTRAPOLATION_SD, beyond, nonnegative

TERMS = ("load", "context", "sampled")
MATCH_TOLERANCE = 0.10
"""A term that does not spread in the data (every no-spec request at one load): the target may
differ from it by this share, no more; its slope is unknown."""
SPREAD = 0.05
"""A term spreads when its values span more than this share of their mean."""
CLASS_SD = 0.10
"""Log standard deviation of a class's level around the line when fewer than two classes show it."""
MIN_CLASS_REQUESTS = 5
"""No-spec requests a class needs to count in the between-class spread."""


@dataclass(frozen=True)
class Result:
    """T_base for one (class, pool) cell: the value, ``Var(log)`` and what stands behind it."""

    tpot_seconds: float
    log_variance: float
    samples: int  # no-spec requests in the fit
    own: int  # of them, the class's own (0 when its level is every class's)
    detail: str


Class = tuple[str, str]


class NoSpec:
    """The usable no-spec requests of one load bucket as arrays: built once per evaluation and read
    by every (class, pool) cell of the bucket, with each design's fit kept (a window of 100,000
    records is walked once, not once per cell)."""

    def __init__(self, records: Sequence[RequestRecord]):
        self.records = list(records)
        self.w = np.array([r.output_tokens - 1 for r in self.records], dtype=float)
        seconds = np.array([(r.decode_seconds or 0.0) for r in self.records], dtype=float)
        self.t = seconds / np.maximum(self.w, 1.0)
        self.x = _table(self.records)
        names = [(r.task_type, r.temperature_bucket) for r in self.records]
        self.classes = sorted(set(names))
        index = {c: i for i, c in enumerate(self.classes)}
        self.codes = np.array([index[c] for c in names], dtype=int)
        self.pools = sorted({r.pool for r in self.records})
        self.fits: dict[tuple, tuple[np.ndarray, np.ndarray] | None] = {}
        self.spreads: dict[tuple, tuple[float, int]] = {}
        self.independent: dict[tuple, bool] = {}

    def __len__(self) -> int:
        return len(self.records)

    def mask(self, cls: Class) -> np.ndarray:
        if cls not in self.classes:
            return np.zeros(len(self.records), dtype=bool)
        return self.codes == self.classes.index(cls)


def _table(records: Sequence[RequestRecord]) -> dict[str, np.ndarray]:
    """Every term's value per request (nan where unknown), in one pass over the records."""
    rows = np.full((len(records), 3), np.nan)
    for i, r in enumerate(records):
        load = r.decode_load if r.decode_load is not None else r.load
        if load is not None:
            rows[i, 0] = load
        if r.prompt_tokens is not None:
            rows[i, 1] = r.prompt_tokens + r.output_tokens / 2.0
        if r.temperature is not None:
            rows[i, 2] = float(r.temperature > 0)
    return {term: rows[:, j] for j, term in enumerate(TERMS)}


def usable_terms(
    scope_terms: Sequence[str], data: NoSpec, target: Mapping[str, np.ndarray]
) -> tuple[tuple[str, ...], str]:
    """The terms every no-spec and target request has a value for, and a note on any left out."""
    kept, notes = [], []
    for term in scope_terms:
        missing = int(np.isnan(data.x[term]).sum()) + int(np.isnan(target[term]).sum())
        if missing:
            what = {"load": "a load", "context": "a prompt length", "sampled": "a temperature"}[term]
            notes.append(f"{term} left out: {missing} requests without {what}")
        else:
            kept.append(term)
    return tuple(kept), "; ".join(notes)


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    return float(np.sum(values * weights) / np.sum(weights))


def _independent(columns: Sequence[np.ndarray], values: np.ndarray, w: np.ndarray) -> bool:
    """Whether ``values`` add a direction the columns so far do not span (weighted)."""
    trial = np.column_stack([*columns, values]) * np.sqrt(w)[:, None]
    norms = np.maximum(np.linalg.norm(trial, axis=0), 1e-300)
    return int(np.linalg.matrix_rank(trial / norms, tol=1e-9)) == trial.shape[1]


def _fit(
    design: np.ndarray, t: np.ndarray, w: np.ndarray, nonneg: Sequence[int], method: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """Constrained WLS point estimate and the robust covariance of the unconstrained fit."""
    n, p = design.shape
    if n <= p:
        return None
    sw = np.sqrt(w)
    xw = design * sw[:, None]
    if np.linalg.matrix_rank(xw / np.maximum(np.linalg.norm(xw, axis=0), 1e-300)) < p:
        return None
    xtx_inv = np.linalg.inv(xw.T @ xw)
    beta = xtx_inv @ (xw.T @ (t * sw))
    residuals = t - design @ beta
    scores = design * (w * residuals)[:, None]  # per-request influence on X'W(t - X beta)
    if method == "jackknife":
        leverage = np.einsum("ij,jk,ik->i", xw, xtx_inv, xw)
        scores = scores / np.maximum(1.0 - leverage, 1e-9)[:, None]
        centred = scores - scores.mean(axis=0)
        meat = centred.T @ centred * (n - 1) / n
    else:
        meat = scores.T @ scores * n / (n - p)
    covariance = xtx_inv @ meat @ xtx_inv
    point = nonnegative(xw, t * sw, nonneg)
    return point, covariance


def baseline(
    no_spec: NoSpec | Sequence[RequestRecord],
    target: Sequence[RequestRecord],
    *,
    cls: Class,
    scope: str,
    min_samples: int,
    method: str = "jackknife",
    where: str = "",
) -> Result | str:
    """The like-for-like T_base of ``cls`` for its speculative requests ``target`` (usable ones),
    from the usable no-spec requests ``no_spec`` of the same load bucket; or why there is none.

    ``scope`` is ``cost.baseline_scope``; ``where`` names the pools and bucket for the detail."""
    data = no_spec if isinstance(no_spec, NoSpec) else NoSpec(no_spec)
    n = len(data)
    own_mask = data.mask(cls)
    n_own = int(own_mask.sum())
    own = scope.startswith("class_then_") and n_own >= min_samples
    if not own and n < min_samples:
        return f"{n} live no-spec requests{where} (< baseline_min_samples {min_samples})"
    wanted = TERMS if scope in ("geometry", "class_then_geometry") else ("load",)
    targets = _table(target)
    terms, note = usable_terms(wanted, data, targets)
    if target:
        goal_w = np.array([r.output_tokens - 1 for r in target], dtype=float)
        goal = {t: targets[t] for t in terms}
    else:  # the level's own requests stand for the target
        level_mask = own_mask if own else np.ones(n, dtype=bool)
        goal_w = data.w[level_mask]
        goal = {t: data.x[t][level_mask] for t in terms}
    dummy = own and n_own < n  # (only the class's own: c0 is its level)
    columns = [np.ones(n)] + ([own_mask.astype(float)] if dummy else [])
    names = ["c0"] + (["class"] if dummy else [])
    row = [1.0] + ([1.0] if dummy else [])
    extra_sd = 0.0
    aims: dict[str, float] = {}
    level = own_mask if own else np.ones(n, dtype=bool)
    for term in terms:
        values = data.x[term]
        low, high = float(values.min()), float(values.max())
        aim = _weighted_mean(goal[term], goal_w)
        mean = _weighted_mean(values, data.w)
        found = (tuple(names), cls if dummy else None, term)
        if found not in data.independent:
            data.independent[found] = _independent(columns, values, data.w)
        if high - low <= SPREAD * abs(mean) or not data.independent[found]:
            # no slope to read: the level's own requests must already be where the target is (a
            # class's own requests all sampling, say, when its level is fitted: its sampler is in it)
            at = _weighted_mean(values[level], data.w[level])
            if abs(aim - at) > MATCH_TOLERANCE * abs(at):
                return (
                    f"{term} {aim:.2f} of the speculative requests is not matched by the no-spec "
                    f"requests{where} (at {at:.2f}, with no spread to read its cost from)"
                )
            continue
        distance = beyond(aim, low, high)
        if distance > math.log(EXTRAPOLATION_FACTOR) + 1e-12:
            return (
                f"{term} {aim:.2f} of the speculative requests is more than {EXTRAPOLATION_FACTOR:g}x beyond "
                f"the no-spec requests' {low:.2f}-{high:.2f}{where}"
            )
        extra_sd += EXTRAPOLATION_SD * distance
        columns.append(values)
        names.append(term)
        row.append(aim)
        aims[term] = aim
    scale = _weighted_mean(data.t, data.w)  # fitted in units of the mean TPOT: no underflow
    if not (scale > 0 and math.isfinite(scale)):
        return f"the no-spec requests{where} have no decode time"
    key = (tuple(names), cls if dummy else None, method)
    if key not in data.fits:
        nonneg = [i for i, name in enumerate(names) if name in TERMS]
        data.fits[key] = _fit(np.column_stack(columns), data.t / scale, data.w, nonneg, method)
    fitted = data.fits[key]
    if fitted is None:
        return f"the no-spec requests{where} do not determine a step-cost line ({', '.join(names)})"
    beta, covariance = fitted
    g = np.array(row)
    relative = float(g @ beta)
    if not relative > 0:
        return f"the no-spec step-cost line{where} predicts {relative * scale * 1000:.3f} ms"
    value = relative * scale
    log_variance = max(0.0, float(g @ covariance @ g)) / relative**2 + extra_sd**2
    spread = ""
    if not own:
        if key not in data.spreads:
            data.spreads[key] = class_spread(data, np.column_stack(columns) @ (beta * scale))
        tau, classes = data.spreads[key]
        log_variance += tau**2
        spread = (
            f"; classes stray {tau:.1%} from it (sd over {classes} classes)"
            if classes >= 2
            else f"; a class may stray {tau:.0%} from it (assumed: fewer than two classes to measure)"
        )
    detail = (
        f"class {cls[0]}/{cls[1]}'s own level ({n_own} of {n} requests){where}"
        if own
        else f"all classes ({n} requests){where}"
    )
    if aims:
        slopes = ", ".join(f"{beta[names.index(t)] * scale * 1000:.4f} ms per {t}" for t in aims)
        at = ", ".join(f"{t} {a:.2f}" for t, a in aims.items())
        detail += f", moved along {slopes} to the speculative requests' {at}"
    detail += spread
    if note:
        detail += f"; {note}"
    return Result(value, log_variance, n, n_own if own else 0, detail)


def class_spread(data: NoSpec, predicted: np.ndarray) -> tuple[float, int]:
    """How far classes' no-spec levels stray from the pooled line (``predicted`` per request): the
    between-class standard deviation of their weighted mean log residual, less its sampling part;
    and how many classes had ``MIN_CLASS_REQUESTS`` to show it. Fewer than two: ``CLASS_SD``."""
    ratios = np.log(np.maximum(data.t, 1e-12) / np.maximum(predicted, 1e-12))
    levels, noise = [], []
    for code in range(len(data.classes)):
        mask = data.codes == code
        count = int(mask.sum())
        if count < MIN_CLASS_REQUESTS:
            continue
        w = data.w[mask] / data.w[mask].sum()
        mean = float(np.sum(w * ratios[mask]))
        levels.append(mean)
        noise.append(float(np.sum(w**2 * (ratios[mask] - mean) ** 2)) * count / (count - 1))
    if len(levels) < 2:
        return CLASS_SD, len(levels)
    spread = float(np.mean(np.square(levels))) - float(np.mean(noise))
    return math.sqrt(max(spread, 0.0)), len(levels)
