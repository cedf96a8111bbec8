"""The fleet planner: one plan for every class, charged the load it puts on each pool's replicas.

The per-class rule (``rules.bestpool``) moves a class to the pool whose RC is lowest for it and
does not see what the move does to that pool: a heavy class moved onto a one-replica no-spec pool
overloads it, and the RC of every class on a pool depends on the load the plan itself creates.
The planner decides all classes of a problem at once (one per load bucket, or every class of the
fleet now: ``together``, as ``rules.planfeed`` builds it), on a model of the fleet:

- **Demand.** Each class at a load bucket has its requests in flight ``n`` (Little's law: arrival
  rate x output tokens x TPOT, ``Demand.from_rate``). Clients are taken as closed loops that keep
  their concurrency: a class's output is ``n / TPOT`` tokens per second.
- **Step cost.** Pool ``p`` runs ``B = sum(n on p) / replicas`` requests per replica and a step
  takes ``T_p(B)``, the step-cost fit of ``rules.stepfit`` at the pool's K (linear in B).
- **RC moved to the plan's load.** A cell's RC was measured at the bucket's load ``L``; acceptance
  does not depend on load, so on pool ``p`` at load ``B`` a class's TPOT is
  ``rc x T_0(L) x T_p(B) / T_p(L)``: the step model carries it to the load the plan makes. The
  no-spec pool is ``T_0(B)`` exactly.
- **Objective.** Fleet output tokens per second, subject to a TPOT SLO per class (``slo_seconds``;
  default ``slo_factor`` (1.1) x the class's TPOT on never-speculate: every engine of the fleet
  without speculation, ``T_0(N / all replicas)``; the planner models mean TPOT, so a p99 SLO is
  read as the same factor on the mean). A class already above its SLO may not get worse.

**Uncertainty.** A move is made only when its benefit's lower bound is above zero (by ``MARGIN``
of the tokens/s now, so noise does not flap the plan). The search
maximises the benefit over the plan now, with every class that moves charged its target's RC at
the interval's upper end and credited its current pool's at the lower end (its worst case); a
class that stays is read at its point estimate, its pool's load moved by the plan. A class may
move to any pool whose cell has an interval, also one that is not cheaper for it alone (a light
class leaving a loaded pool for idle replicas), charged that way. The cells are
the cost model's: a cell whose live baseline is short reads the model baseline (the cost model's
chain live -> profile -> model) with that baseline's interval. A cell with no interval, or a
measurement on fewer than ``min_samples`` requests, is too thin: no class moves to it, and a class
whose current cell is thin stays put. Pinned, frozen or paused classes stay and count for load.

**Solver** (``rules.plansearch``): an assignment of classes to at most 4 pools (the size the guard
is built for: 60 classes x 3 loads x 4 pools) whose objective is a sum over pools of
``W_p / T_p(B_p)``. It is not linear (the step time divides), so an LP would need a linearisation
that loses exactly the load charge the planner exists for (and scipy is not a dependency); it is
NP-hard in general (a sum-of-ratios assignment). So: a first plan by local search (five starts,
single moves, pairs of moves, kicks), then an exact branch and bound on problems of at most 24
movable classes, within ``node_budget`` nodes (default 300 per problem). The plan says when it is
the best found but not proven optimal. ``bench/bench_planner.py`` measures the time.

**Probes and the holdout as a cost** (``information_share``): a share ``s`` of a class sent to a
pool the plan does not choose, to learn its RC, costs ``s x C`` tokens per second (``C``: what the
class loses per unit share there, at point estimates) and is worth the benefit the plan would gain
if the cell's favourable end were true (``U``). It is bought while it costs at most
``INFORMATION_PRICE`` of ``U``: ``s = min(cap, INFORMATION_PRICE x U / C)``, nothing when ``U`` is 0
(nothing the probe could learn changes the plan). The holdout is the no-spec pool's probe.

Pure: values in, a ``Plan`` out; no clock, no I/O.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from specguard.errors import InputError
from specguard.rules import bestpool, plansearch
from specguard.rules.bestpool import DEFINITION, MEASURED, Estimate
from specguard.rules.evidence import ClassKey
from specguard.rules.stepfit import StepFit

SLO_FACTOR = 1.1
MARGIN = 0.02
"""A plan replaces the one now only when it gains this share of the problem's tokens/s at its worst
case: every change costs (requests drain, the plan flaps with noise otherwise)."""
NODE_BUDGET = 300
INFORMATION_PRICE = 0.1
"""The share of a probe's possible gain it may cost (tokens per second)."""


@dataclass(frozen=True)
class Demand:
    """One class at one load bucket: requests in flight, and its own SLO (mean TPOT, seconds)."""

    in_flight: float
    slo_seconds: float | None = None

    @classmethod
    def from_rate(
        cls, rate: float, output_tokens: float, tpot_seconds: float, slo_seconds: float | None = None
    ) -> Demand:
        """Little's law: requests per second x decode seconds per request."""
        return cls(max(0.0, rate * output_tokens * tpot_seconds), slo_seconds)


@dataclass(frozen=True)
class Pool:
    """A pool the plan may use: its K and the replicas it has now."""

    name: str
    k: int
    replicas: int


@dataclass(frozen=True)
class PlanInput:
    """Everything the planner reads (``cells``: per class, each pool's RC estimate at its bucket)."""

    pools: tuple[Pool, ...]
    step: StepFit
    loads: Mapping[str, float]  # load bucket -> requests in flight per replica its cells were measured at
    demand: Mapping[ClassKey, Demand]
    current: Mapping[ClassKey, str]
    cells: Mapping[ClassKey, Mapping[str, Estimate]]
    fixed: frozenset[ClassKey] = frozenset()  # pinned, frozen or paused: stay, counted for load
    slo_factor: float = SLO_FACTOR
    min_samples: int = 0
    node_budget: int = NODE_BUDGET
    margin: float = MARGIN
    together: str | None = None
    """One problem for every class whatever its load bucket, under this label (its load in ``loads``):
    the classes share the fleet now, each at the load bucket its pool is in."""
    measured_at: Mapping[tuple[ClassKey, str], float] = field(default_factory=dict)
    """Load per replica a cell was measured at, where not its bucket's (``loads``)."""
    scenarios: tuple[tuple[float, Mapping[ClassKey, Demand]], ...] = ()
    """A load swinging faster than the evaluation interval (``rules.swing``): the time share and
    demand of its high load, then of its low load; ``demand`` is their mean."""


@dataclass(frozen=True)
class Plan:
    """Every class's pool, and why (``move ...``, ``stays ...``)."""

    pools: Mapping[ClassKey, str]
    reasons: Mapping[ClassKey, str]
    benefit_lower: float  # tokens/s over the plan now, every mover at its worst case
    tokens: float  # tokens/s of the plan, point estimates
    tokens_now: float  # tokens/s of the plan now, point estimates
    exact: Mapping[str, bool] = field(default_factory=dict)  # load bucket -> optimality proven
    nodes: int = 0

    @property
    def moves(self) -> dict[ClassKey, str]:
        return {k: p for k, p in self.pools.items() if self.reasons[k].startswith("move")}


def usable(estimate: Estimate | None, min_samples: int) -> bool:
    """Whether a cell may carry a move: a finite interval, not a thin measurement."""
    if estimate is None or estimate.basis == DEFINITION:
        return estimate is not None
    ok = all(positive(v) for v in (estimate.rc, estimate.lower, estimate.upper))
    return ok and not (estimate.basis == MEASURED and estimate.samples < min_samples)


# ---------------------------------------------------------------- the model


MIN_STEP_SECONDS = 1e-6
"""The least step time at no load: a fit through the origin (a non-negative fit's intercept can be 0)
would price an idle pool's step at 0 s, and the plan's rates divide by it."""


def line(step: StepFit, k: int, replicas: int) -> tuple[float, float]:
    """``T_p = a + b x N`` for N requests in flight on a pool of ``replicas`` (never falling with load)."""
    a = step.predict(0.0, k)
    return max(a, MIN_STEP_SECONDS), max(0.0, step.predict(1.0, k) - a) / max(1, replicas)


def _definition(pool: str) -> Estimate:
    return Estimate(pool, 1.0, DEFINITION, 0, "no speculation", 1.0, 1.0)


@dataclass(frozen=True)
class _Bucket:
    """One problem as numbers, and what the plan's reasons need."""

    keys: tuple[ClassKey, ...]
    problem: plansearch.Problem
    units: tuple[dict[int, float], ...]  # point-estimate unit per pool (TPOT = unit x T_p)
    why: tuple[str, ...]  # why a class may not move ("" when it may)


def _model(inp: PlanInput, bucket: str, keys: list[ClassKey]) -> _Bucket:
    names = [p.name for p in inp.pools]
    index = {n: i for i, n in enumerate(names)}
    lines = [line(inp.step, p.k, p.replicas) for p in inp.pools]
    load = inp.loads.get(bucket)
    if load is None or not load > 0:
        raise InputError(f"planner: load bucket {bucket!r} has no representative load (got {load!r})")
    base = inp.step.predict(load, 0)
    keys = sorted(keys, key=lambda k: (-inp.demand[k].in_flight, k))
    total = sum(inp.demand[k].in_flight for k in keys)
    never = inp.step.predict(total / max(1, sum(p.replicas for p in inp.pools)), 0)
    if not (base > 0 and never > 0):
        raise InputError(f"planner: the step-cost fit predicts no positive step time at load {bucket!r}")
    now = [0.0] * len(names)
    for key in keys:
        if inp.current.get(key) not in index:
            where = inp.current.get(key)
            raise InputError(f"planner: class {'/'.join(key)} is on {where!r}, not one of {', '.join(names)}")
        now[index[inp.current[key]]] += inp.demand[key].in_flight
    ratio = functools.cache(lambda at, k: _ratio(inp.step, at, k))  # every class shares the few loads and Ks
    n, options, caps, units, whys = [], [], [], [], []
    for key in keys:
        i = index[inp.current[key]]
        cells = cells_of(inp, key)
        shifts = [ratio(_measured_at(inp, key, pool, load), pool.k) for pool in inp.pools]
        point = {j: e.rc * shifts[j] for j, e in enumerate(cells.values()) if e and positive(e.rc)}
        own = cells[names[i]]
        demand = inp.demand[key].in_flight
        why = ""
        if key in inp.fixed:
            why = "stays: pinned, frozen or paused"
        elif demand <= 0:
            why = "stays: no requests in flight at this load"
        elif not usable(own, inp.min_samples):
            why = "stays: the evidence on its own pool is too thin for any move"
        point.setdefault(i, shifts[i])  # nothing known there: charged as its pool's step, its load counted
        stay = (i, point[i], 0.0)
        opts = [stay]
        if not why:
            forgone = demand / (point[i] * (lines[i][0] + lines[i][1] * now[i]))
            penalty = forgone * (own.rc / own.lower - 1.0) if own.lower else 0.0  # type: ignore[union-attr]
            for j, e in enumerate(cells.values()):
                # any pool with evidence enough, charged its worst case: a move for the fleet's
                # sake (off a loaded pool, onto idle replicas) is the plan's to make
                if j != i and usable(e, inp.min_samples):
                    opts.append((j, e.upper * shifts[j], penalty))  # type: ignore[union-attr]
            if len(opts) == 1:
                why = "stays: no other pool has evidence enough to move it to"
        slo = inp.demand[key].slo_seconds or inp.slo_factor * never
        here = point[i] * (lines[i][0] + lines[i][1] * now[i])
        n.append(demand)
        options.append(tuple(opts))
        caps.append(max(slo, here * (1 + 1e-9)))  # above its SLO now: may stay, not get worse
        units.append(point)
        whys.append(why)
    problem = plansearch.Problem(
        tuple(n), tuple(options), tuple(caps), tuple(a for a, _ in lines), tuple(b for _, b in lines)
    )
    return _Bucket(tuple(keys), problem, tuple(units), tuple(whys))


def cells_of(inp: PlanInput, key: ClassKey) -> dict[str, Estimate | None]:
    """Each pool's estimate for the class (a no-spec pool's is 1.0 by definition)."""
    given = inp.cells.get(key, {})
    return {p.name: _definition(p.name) if p.k == 0 else given.get(p.name) for p in inp.pools}


def _option_on(problem: plansearch.Problem, c: int, pools: set[int]) -> int:
    """The class's first option on one of ``pools`` (its pool now when it has none)."""
    return next((o for o, (j, _, _) in enumerate(problem.options[c]) if j in pools), 0)


def shift(inp: PlanInput, key: ClassKey, pool: Pool, load: float) -> float:
    """``T_0(L) / T_p(L)`` at the load ``L`` the cell was measured at: rc there -> the unit of ``T_p(B)``."""
    return _ratio(inp.step, _measured_at(inp, key, pool, load), pool.k)


def _measured_at(inp: PlanInput, key: ClassKey, pool: Pool, load: float) -> float:
    """The load the class's cell on ``pool`` was measured at; ``load`` when not given."""
    return inp.measured_at.get((key, pool.name), load)


def _ratio(fit: StepFit, at: float, k: int) -> float:
    """``T_0 / T_k`` at load ``at``."""
    base, step = fit.predict(at, 0), fit.predict(at, k)
    if not (base > 0 and step > 0):
        raise InputError(f"planner: the step-cost fit predicts no positive step time at load {at:g}")
    return base / step


def positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _tokens(problem: plansearch.Problem, units, pools: list[int]) -> tuple[float, list[float]]:
    """Tokens per second and each class's TPOT of a plan (pool index per class), at point estimates."""
    loads = [0.0] * len(problem.a)
    for c, j in enumerate(pools):
        loads[j] += problem.n[c]
    tpot = [units[c][j] * (problem.a[j] + problem.b[j] * loads[j]) for c, j in enumerate(pools)]
    return sum(n / t for n, t in zip(problem.n, tpot, strict=True) if n > 0), tpot


# ---------------------------------------------------------------- the plan


def plan(inp: PlanInput) -> Plan:
    """The fleet's plan: every class's pool and why (see the module docstring)."""
    names = [p.name for p in inp.pools]
    if len(set(names)) != len(names) or any(p.replicas < 1 for p in inp.pools):
        raise InputError(f"planner: pools must be distinct with at least one replica each ({names})")
    nospec = {i for i, p in enumerate(inp.pools) if p.k == 0}
    by_bucket = _groups(inp)
    pools: dict[ClassKey, str] = {}
    reasons: dict[ClassKey, str] = {}
    exact: dict[str, bool] = {}
    benefit = tokens = tokens_now = 0.0
    nodes = 0
    for bucket, keys in sorted(by_bucket.items()):
        model = _model(inp, bucket, keys)
        problem = model.problem
        safe = [_option_on(problem, c, nospec) for c in range(len(keys))]  # never-speculate on these pools
        result = plansearch.solve(problem, inp.node_budget, (safe,))
        stay_value = plansearch.value(problem, [0] * len(keys))
        gain = result.value - (stay_value or 0.0)
        chosen = [problem.options[c][o][0] for c, o in enumerate(result.choice)]
        now = [problem.options[c][0][0] for c in range(len(keys))]
        had, _ = _tokens(problem, model.units, now)
        if gain <= inp.margin * had:  # no plan beats the one now by the margin at its worst case
            chosen, gain = now, 0.0
        got, tpot = _tokens(problem, model.units, chosen)
        benefit, tokens, tokens_now = benefit + gain, tokens + got, tokens_now + had
        nodes += result.nodes
        exact[bucket] = result.exact
        proof = "" if result.exact else " (the best plan found, not proven optimal)"
        for c, key in enumerate(model.keys):
            pools[key] = names[chosen[c]]
            slo = problem.cap[c]
            at = f"TPOT {tpot[c] * 1000:.2f} ms (SLO {slo * 1000:.2f} ms)"
            if chosen[c] != now[c]:
                reasons[key] = (
                    f"move {names[now[c]]} -> {names[chosen[c]]}: the fleet plan gains at least "
                    f"{gain:.1f} tokens/s at load {bucket}{proof}; {at}"
                )
            elif model.why[c]:
                reasons[key] = f"{model.why[c]}; {at}"
            else:
                reasons[key] = (
                    f"stays on {names[now[c]]}: no plan that moves it gains {inp.margin:.0%} at its worst "
                    f"case{proof}; {at}"
                )
    return Plan(pools, reasons, benefit, tokens, tokens_now, exact, nodes)


def _groups(inp: PlanInput) -> dict[str, list[ClassKey]]:
    """The problems: one per load bucket, or one for every class (``together``)."""
    out: dict[str, list[ClassKey]] = {}
    for key in sorted(inp.demand):
        out.setdefault(inp.together or key[2], []).append(key)
    return out


def tokens_of(inp: PlanInput, assignment: Mapping[ClassKey, str]) -> tuple[float, dict[ClassKey, float]]:
    """Tokens per second of any plan on the planner's model (point estimates) and each class's TPOT."""
    total, out, _ = _evaluate(inp, assignment)
    return total, out


def slo_breaks(inp: PlanInput, assignment: Mapping[ClassKey, str]) -> list[ClassKey]:
    """The classes any plan puts above their SLO (and above their TPOT now) on the planner's model."""
    _, tpot, caps = _evaluate(inp, assignment)
    return [k for k, t in tpot.items() if t > caps[k] * (1 + 1e-9)]


def _evaluate(
    inp: PlanInput, assignment: Mapping[ClassKey, str]
) -> tuple[float, dict[ClassKey, float], dict[ClassKey, float]]:
    index = {p.name: i for i, p in enumerate(inp.pools)}
    total, out, caps = 0.0, {}, {}
    for bucket, keys in sorted(_groups(inp).items()):
        model = _model(inp, bucket, keys)
        got, tpot = _tokens(model.problem, model.units, [index[assignment[k]] for k in model.keys])
        total += got
        out.update(zip(model.keys, tpot, strict=True))
        caps.update(zip(model.keys, model.problem.cap, strict=True))
    return total, out, caps


def per_class(inp: PlanInput, margin: float = 0.0) -> dict[ClassKey, str]:
    """The per-class rule on the same cells, for comparison: each class to its cheapest pool when the
    benefit clears ``margin`` at its interval's worst end (``bestpool.clears``), loads not charged."""
    out = {}
    for key in sorted(inp.demand):
        here = inp.current[key]
        cells = cells_of(inp, key)
        own = cells.get(here)
        out[key] = here
        if key in inp.fixed or not usable(own, inp.min_samples):
            continue
        targets = [e for name, e in cells.items() if name != here and usable(e, inp.min_samples)]
        if targets:
            best = min(targets, key=lambda e: (e.rc, e.pool))
            if bestpool.clears(best, own, margin) is not None:  # type: ignore[arg-type]
                out[key] = best.pool
    return out


def information_share(upside: float, cost_per_share: float, cap: float) -> float:
    """The share of a class to send where the plan does not, to learn its RC (a probe, or the holdout
    on the no-spec pool): bought while it costs at most ``INFORMATION_PRICE`` of what it could find.

    ``upside``: tokens/s the plan would gain if the cell's favourable end were true; ``cost_per_share``:
    tokens/s the class loses per unit share sent there (point estimates); ``cap``: the most allowed
    (``tap.probe_share``, ``tap.holdout_share``)."""
    if upside <= 0 or cap <= 0:
        return 0.0
    if cost_per_share <= 0:
        return cap  # no cost at its point estimate: as much as allowed
    return min(cap, INFORMATION_PRICE * upside / cost_per_share)
