"""Desired replicas per pool, from the fleet plan (``guard.scaling``, ``guard.decider: planner``).

An in-flight autoscaler sizes every pool alike (``target_in_flight`` requests per replica), but a
speculative pool only pays below the load where its step cost overtakes what speculation saves:
RC rises with load. So each pool is sized for the classes the plan puts on it:

- **Demand** ``W_p``: the requests in flight of the classes planned on ``p`` (``planner.Demand``).
- **Target per replica** ``t_p``: on the no-spec pool, ``target_in_flight``; on a speculative pool,
  the lowest *crossover* of its classes, capped at ``target_in_flight``. A class's crossover is the
  highest load per replica ``B`` at which it still runs cheaper there than without speculation,
  ``unit x T_k(B) <= T_0(B)`` with ``unit = rc x T_0(L) / T_k(L)`` (its RC measured at load ``L``,
  carried by the step-cost fit, as the planner does). A class that never pays there (pinned) sets
  no target: no replica count would make it pay.
- **The start delay**: a new replica serves ``start_delay_seconds`` after it is asked for, so a pool
  scales up only for demand that has lasted that long: each class counts the lowest of its demand
  over the last start delay, on the pool the plan puts it on now. Demand that has lasted a start
  delay is expected to last about as long again (a burst's remaining life grows with its age); a
  shorter one would be over, or nearly, before the replica serves. It is the class's demand that
  must have lasted, not the pool's: a class the plan moves brings the demand it has had to its new
  pool (a pool's own history would read the move as a burst and never size for it). Scaling down
  follows the demand now (the HPA's own stabilisation window then holds replicas through a dip).
  ``sustain_seconds`` sets how long demand must have lasted (default: the start delay; 0: at once):
  waiting it out costs the time it waits on a load that does last (``docs/planner.md`` measures it).

``desired_p = clamp(ceil(W_p / t_p), min_replicas, max_replicas)``: exported as
``specguard_pool_desired_replicas{pool}`` for an HPA or KEDA to scale each pool's Deployment on
(``deploy/kubernetes/autoscaling``). Values in, numbers out; the history of demand
is the caller's (``Sizer``).
"""

from __future__ import annotations

import math
from collections import deque

from specguard.rules import planner
from specguard.rules.evidence import ClassKey
from specguard.rules.policy import Scaling
from specguard.rules.stepfit import StepFit

BISECTIONS = 40


def crossover(unit: float, k: int, step: StepFit, cap: float) -> float:
    """The highest load per replica in ``[0, cap]`` at which ``unit x T_k(B) <= T_0(B)``; 0 when the
    class does not pay there even alone, ``cap`` when it pays at every load up to it."""

    def pays(load: float) -> bool:
        return unit * step.predict(load, k) <= step.predict(load, 0)

    low, high = min(1.0, cap), cap  # one request a replica: the lightest load a pool runs at
    if not pays(low):
        return 0.0
    if pays(high):
        return high
    for _ in range(BISECTIONS):
        mid = (low + high) / 2
        low, high = (mid, high) if pays(mid) else (low, mid)
    return low


def targets(inp: planner.PlanInput, plan: planner.Plan, scaling: Scaling) -> dict[str, float]:
    """Requests in flight per replica each pool is sized at, for the classes the plan puts on it."""
    out: dict[str, float] = {}
    for pool in inp.pools:
        target = scaling.target_in_flight
        for key, name in plan.pools.items():
            cell = inp.cells.get(key, {}).get(pool.name)
            if name != pool.name or pool.k == 0 or cell is None or not inp.demand[key].in_flight > 0:
                continue
            unit = cell.rc * planner.shift(inp, key, pool, inp.loads.get(key[2], 1.0))
            pays = crossover(unit, pool.k, inp.step, scaling.target_in_flight)
            if pays > 0:
                target = min(target, pays)
        out[pool.name] = max(target, 1e-9)
    return out


class Sizer:
    """Desired replicas per pool at each evaluation, with each class's demand over the start delay."""

    def __init__(self, scaling: Scaling):
        self.scaling = scaling
        self._history: dict[ClassKey, deque[tuple[float, float]]] = {}

    def lasted(self, inp: planner.PlanInput, now: float) -> dict[ClassKey, float]:
        """Each class's requests in flight that have lasted ``sustain`` (the start delay by default),
        or since it was first seen."""
        out = {}
        for key in set(self._history) - set(inp.demand):  # a class gone is new again when it returns
            del self._history[key]
        for key, found in inp.demand.items():
            history = self._history.setdefault(key, deque())
            history.append((now, found.in_flight))
            while history and history[0][0] < now - self.scaling.sustain:
                history.popleft()
            out[key] = min(w for _, w in history)
        return out

    def desired(self, inp: planner.PlanInput, plan: planner.Plan, now: float) -> dict[str, int]:
        scaling = self.scaling
        per_replica = targets(inp, plan, scaling)
        load = dict.fromkeys(per_replica, 0.0)
        for key, flight in self.lasted(inp, now).items():
            load[plan.pools[key]] += flight
        out = {}
        for pool, flight in load.items():
            wanted = max(scaling.min_replicas, math.ceil(flight / per_replica[pool] - 1e-9))
            out[pool] = min(wanted, scaling.max_replicas) if scaling.max_replicas else wanted
        return out
