"""Probes and the holdout priced by the fleet plan: each share is what its information is worth.

With ``guard.decider: planner`` a share of a class sent where the plan does not put it is a cost
the plan pays for what it may learn (``planner.information_share``). Per planned class, on the
plan's loads (each pool's requests in flight as the plan puts them, its step line):

- ``U``, the upside: the class's tokens per second gained on pool ``q`` if the comparison's
  favourable end were true, ``q``'s RC at its interval's lower end and the RC on its own pool at
  the upper end, the class's whole load moved onto ``q``;
- ``C``, the cost of a unit share there, at point estimates (a small share moves no load);
- the share ``min(cap, INFORMATION_PRICE x U / C)``: nothing when nothing there could beat the
  plan, the cap when a unit share costs nothing at its point estimate or the cell has no interval
  (what is not known at all is worth the most).

The router probes a class off speculation on one speculative pool (``tap.probe_share`` the cap):
the one whose share is largest. A class on a speculative pool is held out to the no-spec pool for
at least its share (``tap.holdout_share`` the cap): the holdout is the no-spec pool's probe. A
class the plan leaves out (no requests in decode now) keeps the expected-cost probe of
``rules.probes``.

Pure: a plan and its input in, shares out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from specguard.rules import planner, probes
from specguard.rules.bestpool import Estimate
from specguard.rules.evidence import ClassKey

UNKNOWN = "planned: no interval there"


@dataclass(frozen=True)
class Worth:
    """One class's share on one pool the plan does not put it on, and what it was priced at."""

    pool: str
    share: float
    upside: float  # tokens/s, the favourable end
    cost: float  # tokens/s per unit share, point estimates
    expected_rc: float | None

    @property
    def basis(self) -> str:
        if self.expected_rc is None:
            return UNKNOWN
        return f"planned: up to {self.upside:.1f} tokens/s to learn, {self.cost:.1f} tokens/s per unit share"


@dataclass(frozen=True)
class Shares:
    """Per planned class (task type, temperature bucket): its probe off speculation, or its holdout."""

    probes: Mapping[tuple[str, str], Worth]
    holdouts: Mapping[tuple[str, str], Worth]


def shares(inp: planner.PlanInput, plan: planner.Plan, probe_cap: float, holdout_cap: float) -> Shares:
    """What each class's information is worth on the plan (see the module docstring)."""
    lines = {p.name: planner.line(inp.step, p.k, p.replicas) for p in inp.pools}
    loads = dict.fromkeys(lines, 0.0)
    for key, pool in plan.pools.items():
        loads[pool] += inp.demand[key].in_flight if key in inp.demand else 0.0
    speculative = {p.name for p in inp.pools if p.k > 0}
    probes: dict[tuple[str, str], Worth] = {}
    holdouts: dict[tuple[str, str], Worth] = {}
    for key, here in sorted(plan.pools.items()):
        n = inp.demand[key].in_flight if key in inp.demand else 0.0
        if n <= 0 or key in inp.fixed:
            continue
        worth = _worth(inp, key, here, n, lines, loads)
        if here in speculative:
            found = [w for w in worth if w.pool not in speculative]
            cap, out = holdout_cap, holdouts
        else:
            found = [w for w in worth if w.pool in speculative]
            cap, out = probe_cap, probes
        priced = [_capped(w, cap) for w in found]
        if priced:
            out[key[:2]] = max(priced, key=lambda w: (w.share, w.upside, -(w.expected_rc or 0.0), w.pool))
    return Shares(probes, holdouts)


def _worth(
    inp: planner.PlanInput,
    key: ClassKey,
    here: str,
    n: float,
    lines: Mapping[str, tuple[float, float]],
    loads: Mapping[str, float],
) -> list[Worth]:
    """The class's upside and unit cost on every pool it is not planned on (share uncapped)."""
    load = inp.loads[inp.together or key[2]]
    pools = {p.name: p for p in inp.pools}
    cells = planner.cells_of(inp, key)

    def step(pool: str, extra: float) -> float:
        a, b = lines[pool]
        return a + b * (loads[pool] + extra)

    own = cells.get(here)
    shift_here = planner.shift(inp, key, pools[here], load)
    rc_here = own.rc if _known(own) else 1.0
    upper_here = own.upper if _known(own) and planner.positive(own.upper) else rc_here  # type: ignore[union-attr]
    tokens_here = n / (rc_here * shift_here * step(here, 0.0))
    worst_here = n / (upper_here * shift_here * step(here, 0.0))
    out = []
    for name, cell in cells.items():
        if name == here:
            continue
        if not (_known(cell) and planner.positive(cell.lower)):  # type: ignore[union-attr]
            out.append(Worth(name, math.inf, math.inf, 0.0, None))
            continue
        assert cell is not None and cell.lower is not None
        shift = planner.shift(inp, key, pools[name], load)
        upside = n / (cell.lower * shift * step(name, n)) - worst_here
        cost = tokens_here - n / (cell.rc * shift * step(name, 0.0))
        out.append(Worth(name, math.nan, max(0.0, upside), cost, cell.rc))
    return out


def _capped(worth: Worth, cap: float) -> Worth:
    if worth.expected_rc is None:
        return replace(worth, share=max(cap, 0.0))
    return replace(worth, share=planner.information_share(worth.upside, worth.cost, cap))


def _known(cell: Estimate | None) -> bool:
    return cell is not None and planner.positive(cell.rc)


def merged(expected: Mapping[ClassKey, probes.Probe], planned: Shares | None) -> dict[ClassKey, probes.Probe]:
    """The router's probes: the plan's price for each class it planned off speculation, the
    expected-cost probe (``rules.probes``) for the rest."""
    out = dict(expected)
    for key in expected:
        worth = planned.probes.get(key[:2]) if planned is not None else None
        if worth is not None:
            out[key] = probes.Probe(worth.pool, worth.share, worth.expected_rc, worth.basis)
    return out


def class_holdouts(planned: Shares | None) -> dict[tuple[str, str], float]:
    """The router's least holdout share per class (``Router.set_class_holdouts``): none without a plan."""
    return {cls: worth.share for cls, worth in planned.holdouts.items()} if planned is not None else {}
