"""Which pool is cheapest for one class: the estimate of every pool's rc, and the pool to move to.

RC < 1 only says speculation pays; the pool to be on is the one with the lowest relative cost per
token (docs/concepts.md). For each pool the best evidence at hand is its estimate, in order:

1. ``measured``: this window's measurement with at least ``min_samples`` requests;
2. ``memory``: the class's last such measurement of a pool it has left (``guard.memory_seconds``),
   so a prediction cannot send it back to a pool that measured worse. A memory only blocks: it
   moves a class only back to the pool a still unconfirmed move came from (the prediction that
   made the move was wrong), since an older measurement was taken under other conditions;
3. ``what-if``: the cost model's prediction from the current pool's per-position acceptance
   (exact for a shorter K; a longer K's extrapolation is used only after the profile), built on at
   least ``min_samples`` requests (a thinner one is used only where the profile has no value);
4. ``profile``: the calibration profile's rc (``rules.prior``), scaled by the ratio of the current
   pool's live rc to its profile rc, so the profile gives relative costs and live data the level;
5. ``extrapolated``: a what-if for a longer K than was measured (only with
   ``guard.restore_on_prediction``; by default a longer K needs a measurement, memory or profile).

The no-spec pool costs exactly 1.0 by definition. No move rests on a point estimate, whatever
the baseline: every estimate carries an interval (a measurement its own; a memory the one it was
measured with; a what-if the relative interval of the measurement it was made from, and its ratio
to it; the profile's from its standard errors; the no-spec pool [1.0, 1.0]), and a pool is
*cheaper* only when the benefit's interval clears ``best_pool_margin`` at its worst end
(``clears``). An estimate without an interval may block a move but never makes one. Moving needs
that for more than
``best_pool_consecutive_limit`` evaluations in a row (the guard counts), except for a class with no
live evidence of its own yet, which starts on the profile's choice at once (the warm start). A move
back to the pool the class left at its last move waits for the stabilization window, doubled per
recent reversal (``reversal_wait``), so a class does not follow a load that swings across the knee.
The pool the class is on must have been measured in this window: its memory alone never moves it.
Every estimate says where its number comes from (which measurement, when, at which load bucket).
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from specguard.rules import policy as policy_mod
from specguard.rules.evidence import Evidence

MEASURED, MEMORY, WHATIF, PROFILE, EXTRAPOLATED, DEFINITION = (
    "measured",
    "memory",
    "what-if",
    "profile",
    "extrapolated",
    "definition",
)
LIVE = (MEASURED, MEMORY)


@dataclass(frozen=True)
class Estimate:
    """One pool's rc for the class, and which evidence it rests on."""

    pool: str
    rc: float
    basis: str
    samples: int = 0
    detail: str = ""
    """Where the number comes from: which measurement, when, at which load bucket."""
    lower: float | None = None  # the interval's bounds (None: no interval, so it moves nothing)
    upper: float | None = None
    spread: float | None = None  # log half-width without the baseline: a measurement's spec side
    # alone, or a what-if's ratio to the measurement it was made from (``made_from``)
    made_from: str | None = None

    def text(self) -> str:
        where = f": {self.detail}" if self.detail else ""
        if self.basis == DEFINITION:
            return f"{self.pool} {self.rc:.3f} ({self.basis}{where})"
        if self.lower is None or self.upper is None:
            return f"{self.pool} {self.rc:.3f} (no interval) ({self.basis}{where})"
        return f"{self.pool} {self.rc:.3f} [{self.lower:.3f}, {self.upper:.3f}] ({self.basis}{where})"


@dataclass(frozen=True)
class Choice:
    """The pool the evidence favours over the current one, with both estimates."""

    current: Estimate
    best: Estimate
    warm_start: bool

    margin: float = 0.0
    benefit: str = ""  # how the benefit's interval cleared the margin

    @property
    def reason(self) -> str:
        gain = 1.0 - self.best.rc / self.current.rc if self.current.rc > 0 else 0.0
        return (
            f"{self.best.text()} is {gain:.1%} cheaper per token than {self.current.text()}, {self.benefit}"
        )


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def min_samples(policy: policy_mod.Policy) -> int:
    """Requests a measurement (or the measurement a what-if comes from) needs to count as live."""
    return min((r.limits.min_samples for r in policy.rules if r.query is None), default=0)


def _bounds(values: Mapping[str, float]) -> tuple[float | None, float | None]:
    lower, upper = values.get("rc_lower"), values.get("rc_upper")
    if not (_finite(lower) and _finite(upper)):
        return None, None
    return lower, upper


def measured(evidence: Evidence, policy: policy_mod.Policy) -> dict[str, tuple[float, int]]:
    """Pools measured this window with enough samples: ``{pool: (rc, samples)}`` (any baseline)."""
    needed = min_samples(policy)
    out = {}
    for name, found in evidence.pools.items():
        rc = found.values.get("rc")
        if not found.predicted and found.inherited_from is None and found.samples >= needed and _finite(rc):
            out[name] = (float(rc), found.samples)  # type: ignore[arg-type]
    return out


def estimates(
    pool: str,
    evidence: Evidence,
    memory: Mapping[str, tuple[float, ...]],
    now: float,
    policy: policy_mod.Policy,
    load_bucket: str = "",
) -> dict[str, Estimate]:
    """Every pool's best estimate for a class currently on ``pool`` at ``load_bucket`` (see the
    module docstring); each says where its number comes from."""
    at_load = f" at load {load_bucket}" if load_bucket else ""
    out: dict[str, Estimate] = {}
    for name, (rc, samples) in measured(evidence, policy).items():
        found = evidence.pools[name]
        base = found.baseline_source
        detail = f"last {policy.window_seconds:.0f} s{at_load}, n={samples}" + (
            f", baseline {base}" if base else ""
        )
        spread = found.values.get("spec_spread")
        out[name] = Estimate(name, rc, MEASURED, samples, detail, *_bounds(found.values), spread)
    for name, (rc, at, *bounds) in memory.items():
        if name not in out and now - at < policy.memory_seconds and _finite(rc):
            lower, upper = bounds if len(bounds) == 2 and all(_finite(b) for b in bounds) else (None, None)
            detail = f"measured {now - at:.0f} s ago{at_load}"
            out[name] = Estimate(name, rc, MEMORY, detail=detail, lower=lower, upper=upper)
    current_k = policy.pools.get(pool, 0)
    late: dict[str, Estimate] = {}
    thin: dict[str, Estimate] = {}
    needed = min_samples(policy)
    for name, found in evidence.pools.items():
        rc = found.values.get("rc")
        if name in out or not found.predicted or not _finite(rc):
            continue
        exact = found.method == "histogram" and policy.pools.get(name, 0) <= current_k
        made = f" on {found.made_from}" if found.made_from else ""
        detail = f"from {found.samples} requests measured{made}{at_load}"
        basis = WHATIF if exact else EXTRAPOLATED
        # a what-if from fewer than min_samples requests stands only where the profile has nothing
        target = (out if found.samples >= needed else thin) if exact else late
        target[name] = Estimate(
            name,
            float(rc),  # type: ignore[arg-type]
            basis,
            found.samples,
            detail,
            *_bounds(found.values),
            found.values.get("ratio_spread"),
            found.made_from,
        )
    prior = evidence.prior if policy.prior == "profile" else {}
    here = out.get(pool)
    scale = 1.0
    if here is not None and here.basis in LIVE and _finite(prior.get(pool)):
        scale = here.rc / prior[pool]
    scaled = f", x{scale:.3f} for {pool}'s live/profile" if scale != 1.0 else ""
    for name, rc in prior.items():
        if name not in out and name in policy.pools and _finite(rc):
            bounds = evidence.prior_bounds.get(name) if policy.prior == "profile" else None
            lower, upper = (bounds[0] * scale, bounds[1] * scale) if bounds else (None, None)
            detail = f"calibration profile{at_load}{scaled}"
            out[name] = Estimate(name, rc * scale, PROFILE, detail=detail, lower=lower, upper=upper)
    for name, estimate in thin.items():
        out.setdefault(name, estimate)
    if policy.restore_on_prediction:
        for name, estimate in late.items():
            out.setdefault(name, estimate)
    if policy.nospec_pool:
        out[policy.nospec_pool] = Estimate(policy.nospec_pool, 1.0, DEFINITION, 0, "no speculation", 1.0, 1.0)
    return out


def choose(
    pool: str,
    evidence: Evidence,
    memory: Mapping[str, tuple[float, ...]],
    now: float,
    policy: policy_mod.Policy,
    came_from: str | None = None,
    load_bucket: str = "",
) -> Choice | None:
    """The cheaper pool the evidence favours for a speculating class on ``pool``, or None.

    ``came_from``: the pool of a move made on a prediction and not yet confirmed by measurement;
    the only pool a memory may send the class to.

    Only a class on a speculative pool is moved here (back from no speculation is the restore
    rule's job, with its stricter hysteresis). The current pool needs a live estimate, or, for
    the warm start, a profile one while nothing live is known about the class at all.
    """
    if not policy.best_pool or policy.pools.get(pool, 0) <= 0:
        return None
    found = estimates(pool, evidence, memory, now, policy, load_bucket)
    current = found.get(pool)
    if current is None:
        return None
    warm = current.basis == PROFILE and not any(e.basis in LIVE for e in found.values())
    # the pool the class is on needs this window's measurement: an older one (memory) may be from
    # other traffic than now, and a move must never rest on it ("spec-k4 1.040 (memory)" once
    # moved a class whose few requests this window measured 0.49)
    if current.basis != MEASURED and not warm:
        return None
    candidates = [
        e
        for e in found.values()
        if e.pool != pool
        and (not warm or e.basis in (PROFILE, DEFINITION))
        and (e.basis != MEMORY or e.pool == came_from)
    ]
    if not candidates or current.lower is None:
        return None
    # the cheapest estimate, if its benefit's interval clears the margin (an estimate without an
    # interval, or one that does not clear, blocks: a memory of a worse measurement stands)
    best = min(candidates, key=lambda e: (e.rc, -policy.pools.get(e.pool, 0), e.pool))
    benefit = clears(best, current, policy.best_pool_margin)
    if benefit is None:
        return None
    return Choice(current, best, warm, policy.best_pool_margin, benefit)


def clears(best: Estimate, current: Estimate, margin: float) -> str | None:
    """How the benefit of moving from ``current`` to ``best`` clears ``margin`` at its interval's
    worst end, or None when it does not. The benefit is the ratio ``best / current``:

    - to the no-spec pool (exactly 1.0): the current pool's lower bound must be past ``1 / (1 -
      margin)``;
    - to a what-if made from the current pool's measurement: the ratio's own interval (the same
      requests' acceptance and TPOT, jackknifed, and the target's step time; the baseline cancels);
    - between two measured speculative pools: the two spec sides' spreads combined (the shared
      baseline cancels);
    - otherwise (a memory, the profile): each estimate's own interval, the target's upper bound
      below the current lower bound (the shared baseline counted on both sides: stricter, never
      looser).
    """
    limit = 1.0 - margin
    if current.rc <= 0:
        return None
    if best.basis == DEFINITION:
        if current.lower is not None and best.rc < current.lower * limit:
            return f"beyond its interval: 1.0 < {current.lower:.3f} x (1 - best_pool_margin {margin:g})"
        return None
    ratio = best.rc / current.rc
    spread = None
    if best.made_from == current.pool and best.spread is not None and current.basis == MEASURED:
        spread = best.spread
    elif best.basis == MEASURED and current.basis == MEASURED and best.spread is not None:
        spread = math.hypot(best.spread, current.spread) if current.spread is not None else None
    if spread is not None:
        worst = ratio * math.exp(spread)
        if worst < limit:
            return f"beyond the ratio's interval: {ratio:.3f}, up to {worst:.3f} < 1 - margin {margin:g}"
        return None
    if best.upper is not None and current.lower is not None and best.upper < current.lower * limit:
        bound = f"{best.upper:.3f} < {current.lower:.3f} x (1 - best_pool_margin {margin:g})"
        return f"beyond both intervals: {bound}"
    return None


def reversal_wait(
    left_pool: str | None,
    reversal_times: tuple[float, ...],
    target: str,
    streak: int,
    now: float,
    policy: policy_mod.Policy,
) -> tuple[str | None, tuple[float, ...]]:
    """Whether a best-pool move to ``target`` must wait because it reverses the class's last move.

    Returns (why it waits, or None; the reversal times to keep, this one included when it may go).
    A move back to ``left_pool`` needs the cheaper estimate to have held for the stabilization
    window (the longest of the local rules'), doubled for every reversal in the last
    ``memory_seconds``: a load bucket that spans the knee makes the cheaper pool alternate as the
    load swings inside it, and the class must not follow every swing.
    """
    recent = tuple(t for t in reversal_times if now - t < policy.memory_seconds)
    if target != left_pool:
        return None, recent
    base = max((r.limits.stabilization_window_seconds for r in policy.rules if r.query is None), default=0.0)
    window = base * 2 ** len(recent)
    needed = max(policy.best_pool_consecutive_limit + 1, math.ceil(window / policy.interval_seconds - 1e-9))
    if streak >= needed:
        return None, (*recent, now)
    doubled = f", doubled for {len(recent)} reversal(s) in memory_seconds" if recent else ""
    return (
        f"back to {target}, the pool it left at its last move: consecutive evaluations ({streak}) < "
        f"{needed} (stabilization window {window:.0f} s{doubled})"
    ), recent


def ranking(
    pool: str,
    evidence: Evidence,
    memory: Mapping[str, tuple[float, ...]],
    now: float,
    policy: policy_mod.Policy,
) -> tuple[str, ...]:
    """The pools with an estimate for a class on ``pool``, cheapest first: the order in which the
    tap fails the class over when its pool is down (pools without an estimate come after)."""
    found = estimates(pool, evidence, memory, now, policy)
    ordered = sorted(found.values(), key=lambda e: (e.rc, -policy.pools.get(e.pool, 0), e.pool))
    return tuple(e.pool for e in ordered)


def remember(
    memory: Mapping[str, tuple[float, ...]], evidence: Evidence, now: float, policy: policy_mod.Policy
) -> dict[str, tuple[float, ...]]:
    """The class's memory after this evaluation: this window's measurements replace older ones,
    each kept as ``(rc, when, lower, upper)`` (bounds nan when it had none)."""
    out = {name: value for name, value in memory.items() if now - value[1] < policy.memory_seconds}
    for name, (rc, _) in measured(evidence, policy).items():
        lower, upper = _bounds(evidence.pools[name].values)
        out[name] = (rc, now, math.nan if lower is None else lower, math.nan if upper is None else upper)
    return out
