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
from collections.abc import Sequence
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


def _context(record: RequestRecord) -> float | None:
    if record.prompt_tokens is None:
        return None
    return record.prompt_tokens + record.output_tokens / 2.0


def _load(record: RequestRecord) -> float | None:
    return record.decode_load if record.decode_load is not None else record.load


def _sampled(record: RequestRecord) -> float | None:
    return None if record.temperature is None else float(record.temperature > 0)


def _value(record: RequestRecord, term: str) -> float | None:
    return {"load": _load, "context": _context, "sampled": _sampled}[term](record)


@dataclass(frozen=True)
class _Data:
    t: np.ndarray  # per-request TPOT
    w: np.ndarray  # decode tokens
    x: dict[str, np.ndarray]  # term -> values
    cls: list[Class]


def _data(records: Sequence[RequestRecord], terms: Sequence[str]) -> _Data:
    w = np.array([r.output_tokens - 1 for r in records], dtype=float)
    t = np.array([(r.decode_seconds or 0.0) for r in records], dtype=float) / w
    x = {term: np.array([_value(r, term) for r in records], dtype=float) for term in terms}
    return _Data(t, w, x, [(r.task_type, r.temperature_bucket) for r in records])


def usable_terms(scope_terms: Sequence[str], *groups: Sequence[RequestRecord]) -> tuple[tuple[str, ...], str]:
    """The terms every record of every group has a value for, and a note on any left out."""
    kept, notes = [], []
    for term in scope_terms:
        missing = sum(1 for g in groups for r in g if _value(r, term) is None)
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
    no_spec: Sequence[RequestRecord],
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
    own_records = [r for r in no_spec if (r.task_type, r.temperature_bucket) == cls]
    own = scope.startswith("class_then_") and len(own_records) >= min_samples
    if not own and len(no_spec) < min_samples:
        return f"{len(no_spec)} live no-spec requests{where} (< baseline_min_samples {min_samples})"
    wanted = TERMS if scope in ("geometry", "class_then_geometry") else ("load",)
    terms, note = usable_terms(wanted, no_spec, target)
    data = _data(no_spec, terms)
    reference = target if target else (own_records if own else no_spec)
    goal = _data(reference, terms)
    columns = [np.ones(len(no_spec))]
    names = ["c0"]
    row = [1.0]
    if own and len(own_records) < len(no_spec):  # (only the class's own: c0 is its level)
        columns.append(np.array([c == cls for c in data.cls], dtype=float))
        names.append("class")
        row.append(1.0)
    extra_sd = 0.0
    aims: dict[str, float] = {}
    level = np.array([c == cls for c in data.cls]) if own else np.ones(len(no_spec), dtype=bool)
    for term in terms:
        values = data.x[term]
        low, high = float(values.min()), float(values.max())
        aim = _weighted_mean(goal.x[term], goal.w)
        mean = _weighted_mean(values, data.w)
        if high - low <= SPREAD * abs(mean) or not _independent(columns, values, data.w):
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
    design = np.column_stack(columns)
    nonneg = [i for i, name in enumerate(names) if name in TERMS]
    scale = _weighted_mean(data.t, data.w)  # fitted in units of the mean TPOT: no underflow
    if not (scale > 0 and math.isfinite(scale)):
        return f"the no-spec requests{where} have no decode time"
    fitted = _fit(design, data.t / scale, data.w, nonneg, method)
    if fitted is None:
        return f"the no-spec requests{where} do not determine a step-cost line ({', '.join(names)})"
    beta, covariance = fitted
    g = np.array(row)
    relative = float(g @ beta)
    if not relative > 0:
        return f"the no-spec step-cost line{where} predicts {relative * scale * 1000:.3f} ms"
    value = relative * scale
    log_variance = max(0.0, float(g @ covariance @ g)) / relative**2 + extra_sd**2
    beta = beta * scale
    spread = ""
    if not own:
        tau, classes = class_spread(data, design, beta)  # (beta in seconds again)
        log_variance += tau**2
        spread = (
            f"; classes stray {tau:.1%} from it (sd over {classes} classes)"
            if classes >= 2
            else f"; a class may stray {tau:.0%} from it (assumed: fewer than two classes to measure)"
        )
    level = (
        f"class {cls[0]}/{cls[1]}'s own level ({len(own_records)} of {len(no_spec)} requests)"
        if own
        else f"all classes ({len(no_spec)} requests)"
    )
    detail = f"{level}{where}"
    if aims:
        slopes = ", ".join(f"{beta[names.index(t)] * 1000:.4f} ms per {t}" for t in aims)
        at = ", ".join(f"{t} {a:.2f}" for t, a in aims.items())
        detail += f", moved along {slopes} to the speculative requests' {at}"
    detail += spread
    if note:
        detail += f"; {note}"
    return Result(value, log_variance, len(no_spec), len(own_records) if own else 0, detail)


def class_spread(data: _Data, design: np.ndarray, beta: np.ndarray) -> tuple[float, int]:
    """How far classes' no-spec levels stray from the pooled line: the between-class standard
    deviation of their weighted mean log residual, less its sampling part; and how many classes
    had ``MIN_CLASS_REQUESTS`` to show it. Fewer than two: ``CLASS_SD``."""
    predicted = design @ beta
    ratios = np.log(np.maximum(data.t, 1e-12) / np.maximum(predicted, 1e-12))
    levels, noise = [], []
    for cls in sorted(set(data.cls)):
        mask = np.array([c == cls for c in data.cls])
        if int(mask.sum()) < MIN_CLASS_REQUESTS:
            continue
        w = data.w[mask] / data.w[mask].sum()
        mean = float(np.sum(w * ratios[mask]))
        levels.append(mean)
        noise.append(float(np.sum(w**2 * (ratios[mask] - mean) ** 2)) * mask.sum() / (mask.sum() - 1))
    if len(levels) < 2:
        return CLASS_SD, len(levels)
    spread = float(np.mean(np.square(levels))) - float(np.mean(noise))
    return math.sqrt(max(spread, 0.0)), len(levels)
