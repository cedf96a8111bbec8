"""Spread a class over the pools where it runs cheapest at the loads now (``guard.spread``).

A plan sends a class whole to one pool, so on fixed pools a class heavier than that pool's replicas
runs on them alone while the other pools idle. With the spread (the default), each request of a
class joins the pool where it adds least time at the loads now (``routing.Spread.marginal``: its
own TPOT ``unit_p x T_p(B)`` there and what it adds to the requests already on the replica), among
the class's pool now and every pool whose cell may carry a move (``planner.usable``: an interval,
enough samples), each read at the load bucket the request would join it in:

- ``unit_p = rc_p x T_0(L) / T_p(L)``: the class's RC on ``p`` measured at the bucket's load ``L``,
  carried to ``p``'s own step (the no-spec pool's unit is 1);
- ``T_p``: the step-cost fit (``rules.stepfit``) on the window's records and the profile's levels
  near the loads the fleet runs at (``planfeed.step_fit``), at the K the pool runs at that load:
  a pool launched with an in-engine schedule runs its schedule's K there (``Policy.k_at``), and
  where that K is 0 it is a no-spec pool for the request (unit 1).

A greedy rule, re-read at every request, so a pool that fills up stops drawing; charging what a
request adds to the others keeps a speculative pool from filling past the load where its step
slows everyone there. Pinned, frozen and paused classes are not spread.

A refit can fail where the last one stood (a window short of the (pool, load) cells the fit's
coefficients need, or a fit ``planfeed.step_fit`` refuses). Dropping the spread then sends every
class whole to its plan's pool, which on fixed pools overloads one of them for as long as the refit
keeps failing, so ``Held`` keeps the last fit that stood for up to a window, while the loads stay
within those it was fitted on (read with the loads of the window now), and says why. Pure but for
``Held``: values in, units out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from specguard.exporters.records import RequestRecord
from specguard.rules import bestpool, planfeed, planner, stepfit
from specguard.rules import policy as policy_mod
from specguard.rules import profile as profile_mod
from specguard.rules.classstate import ClassState
from specguard.rules.cost_config import CostSettings
from specguard.rules.evidence import ClassKey, Evidence


@dataclass(frozen=True)
class Model:
    """What the units are read with: the step-cost fit and each load bucket's load per replica."""

    fit: stepfit.StepFit
    loads: Mapping[str, float]
    held: str = ""  # why this window's own fit failed, when the fit is the last one that stood

    def step(self, k: int, load: float) -> float:
        return max(1e-9, self.fit.predict(load, k))


def model(
    records: Sequence[RequestRecord],
    policy: policy_mod.Policy,
    settings: CostSettings,
    profile: profile_mod.Profile | None,
) -> Model | str:
    """The step-cost fit and bucket loads of the window, or why there is none (no spread then)."""
    fit = planfeed.step_fit(records, policy, settings, profile, planfeed.highest_load(records))
    if isinstance(fit, str):
        return fit
    return Model(fit, planfeed.bucket_loads(records, settings))


@dataclass
class Held:
    """The spread's model across evaluations: this window's fit, or, while a refit fails, the last
    fit that stood, for up to the policy's ``window_seconds`` after it was made and only while no
    request of the window ran at a higher load per replica than the requests it was fitted on (a
    fit read past its loads misprices the pools the load has moved to)."""

    last: tuple[float, stepfit.StepFit, float] | None = field(default=None, repr=False)

    def model(
        self,
        records: Sequence[RequestRecord],
        policy: policy_mod.Policy,
        settings: CostSettings,
        profile: profile_mod.Profile | None,
        now: float,
    ) -> Model | str:
        found = model(records, policy, settings, profile)
        highest = planfeed.highest_load(records)
        if isinstance(found, Model):
            self.last = (now, found.fit, highest)
            return found
        if self.last is None or now - self.last[0] > policy.window_seconds or highest > self.last[2]:
            return found
        held = f"{found}; holding the fit of {now - self.last[0]:.0f} s ago"
        return Model(self.last[1], planfeed.bucket_loads(records, settings), held=held)


def stepper(found: Model, policy: policy_mod.Policy) -> Callable[[str, float], float]:
    """Each pool's step time at a load per replica, at the K it runs there (a scheduled pool's
    schedule picks it): what ``routing.Spread`` reads."""
    return lambda pool, load: found.step(policy.k_at(pool, load), load)


def units(
    states: Mapping[ClassKey, ClassState],
    evidence: Mapping[ClassKey, Evidence],
    now: float,
    policy: policy_mod.Policy,
    found: Model,
) -> dict[ClassKey, dict[str, float]]:
    """Per class and load bucket, the pools a request of it may join and its unit on each; a class
    with one such pool is left out (nothing to spread over)."""
    needed = bestpool.min_samples(policy)
    out: dict[ClassKey, dict[str, float]] = {}
    for key, seen in evidence.items():
        load = found.loads.get(key[2])
        state = states.get(key)
        if load is None or not load > 0:
            continue
        if state is not None and (state.pin is not None or state.frozen or state.paused):
            continue
        here = (state.pool if state is not None else "") or policy.default_pool or ""
        memory = state.memory if state is not None else {}
        cells = bestpool.estimates(here, seen, memory, now, policy, key[2])
        base = found.step(0, load)
        out_key: dict[str, float] = {}
        for pool in policy.pools:
            k = policy.k_at(pool, load)
            if k == 0:  # no speculation, or a schedule that turns it off at this load
                out_key[pool] = 1.0
            elif planner.usable(cells.get(pool), needed):
                out_key[pool] = cells[pool].rc * base / found.step(k, load)
        if len(out_key) > 1:
            out[key] = out_key
    return out
