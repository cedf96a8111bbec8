"""Choose the pool for one request from the current plan, with holdout and probe shares.

The plan comes from a higher layer as a plain mapping ``{(task_type, temperature_bucket,
load_bucket): pool}``; a missing key means the default pool. Two small shares keep the
evidence flowing both ways:

- *holdout*: some of every class goes to the no-spec pool, so each load bucket has a live
  non-speculative baseline on this stack. Either a share (``holdout_share``, or per load bucket
  from ``set_holdout_shares``), or *capacity matched*: a request planned on a speculative pool goes
  to the no-spec pool while that pool's in-flight requests per replica are below the planned
  pool's (at a tie, with probability r0 / (r0 + rp), the no-spec pool's share of the two pools'
  replicas), so the no-spec replicas run at the same per-replica load as the speculative ones and
  take their share of the replica capacity; or *matched on demand*: capacity matched in the load
  buckets ``set_holdout_shares`` names as ``matched`` (their live baseline is short), shares
  elsewhere. ``holdout_share: 0`` turns holdout off in every mode;
- *probe*: a class the plan routes away from speculation keeps a small share on a
  speculative pool, so re-enabling is decided on evidence, not on a timer. The guard hands
  over, per (class, load bucket) off speculation, which pool and what share (``set_probes``:
  ``rules.probes``, by expected cost); a class without an entry is probed on ``probe_pool`` at
  ``probe_share``.

A pool that is down (``exporters.health``) gets neither: its holdout and probe draws are
skipped, and what the plan sends to it goes to the best healthy pool instead (route
``failover``): first in the class's cost order when the guard has handed one over
(``set_preferences``), then the pool whose K is nearest the planned pool's. Serving beats
measuring and beats the cost question; the plan itself is left as it is.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from specguard.errors import InputError
from specguard.exporters.config import PoolConfig
from specguard.exporters.health import PoolHealth

PlanKey = tuple[str, str, str]
HOLDOUT_SHARE = "share"
HOLDOUT_CAPACITY_MATCHED = "capacity_matched"
HOLDOUT_MATCHED_ON_DEMAND = "matched_on_demand"
HOLDOUT_MODES = (HOLDOUT_SHARE, HOLDOUT_CAPACITY_MATCHED, HOLDOUT_MATCHED_ON_DEMAND)


ROUTE_PLAN = "plan"
ROUTE_HOLDOUT = "holdout"
ROUTE_PROBE = "probe"
ROUTE_FAILOVER = "failover"
ROUTE_SPREAD = "spread"


@dataclass(frozen=True)
class Spread:
    """Per class and load bucket (a plan key): the pools a request of it may join, each with its
    TPOT per second of that pool's step (``unit``: RC carried to the pool's step, measured at that
    load bucket), and each pool's step time at a load per replica. A request of such a class joins
    the pool where the time it adds is lowest at the loads now, each pool read at the load bucket
    the request would join it in: a class heavier than its pool's replicas spills onto the others.

    The time a request adds is its own TPOT there and what it adds to the TPOT of the requests
    already on the replica (``marginal``): joining by its own TPOT alone fills a speculative pool
    past the load where its step slows everyone there (measured: the robustness matrix)."""

    units: Mapping[PlanKey, Mapping[str, float]]
    step: Callable[[str, float], float]

    def marginal(self, pool: str, unit: float, load: float) -> float:
        """Seconds per token the replica's requests spend in all, added by one joining at ``load``
        (itself included): ``unit x (L x T(L) - (L - 1) x T(L - 1))``, the requests already there
        taken at the joining one's unit."""
        if load <= 1:
            return unit * self.step(pool, load)
        return unit * (load * self.step(pool, load) - (load - 1) * self.step(pool, load - 1))


@dataclass(frozen=True)
class RouteChoice:
    pool: str
    route: str  # "plan" (plan entry or default pool), "holdout", "probe", "spread" or "failover"
    planned: str = ""  # for "failover" and "spread": the pool the plan chose


class Router:
    def __init__(
        self,
        pools: Sequence[PoolConfig],
        *,
        default_pool: str,
        nospec_pool: str | None,
        holdout_share: float = 0.0,
        probe_share: float = 0.0,
        rng: random.Random | None = None,
        health: PoolHealth | None = None,
        holdout_mode: str = HOLDOUT_SHARE,
    ):
        self._pools = {p.name: p for p in pools}
        if default_pool not in self._pools:
            raise InputError(f"default pool {default_pool!r} is not configured")
        if nospec_pool is not None and nospec_pool not in self._pools:
            raise InputError(f"no-spec pool {nospec_pool!r} is not configured")
        self.default_pool = default_pool
        self.nospec_pool = nospec_pool
        self.holdout_share = holdout_share
        self.probe_share = probe_share
        self._rng = rng or random.Random()
        self._plan: dict[PlanKey, str] = {}
        self._holdout_by_load: dict[str, float] = {}
        self._holdout_by_class: dict[tuple[str, str], float] = {}
        self._matched_buckets: frozenset[str] = frozenset()
        self.health = health  # None: every pool is taken as serving (no failover)
        self._preferences: dict[PlanKey, tuple[str, ...]] = {}
        self._probes: dict[PlanKey, tuple[str, float]] = {}
        self._spread: Spread | None = None
        self._replicas = {p.name: max(1, int(p.replicas)) for p in pools}
        self.holdout_mode = HOLDOUT_SHARE
        self.set_holdout_mode(holdout_mode)
        spec = [p.name for p in pools if p.speculative]
        # probe target: the default pool when it speculates, else the first speculative pool
        self.probe_pool = (
            default_pool if self._pools[default_pool].speculative else (spec[0] if spec else None)
        )

    def set_plan(self, plan: Mapping[PlanKey, str]) -> None:
        """Replace the plan atomically; a plan naming an unknown pool is rejected whole."""
        unknown = sorted({pool for pool in plan.values() if pool not in self._pools})
        if unknown:
            raise InputError(f"plan names pools that are not configured: {', '.join(unknown)}")
        self._plan = dict(plan)

    def plan(self) -> dict[PlanKey, str]:
        return dict(self._plan)

    def set_holdout_shares(self, shares: Mapping[str, float], matched: Iterable[str] = ()) -> None:
        """Per load bucket holdout shares replacing ``holdout_share`` (e.g. where the baseline is
        covered), and the load buckets capacity matched in ``matched_on_demand`` mode."""
        bad = sorted(name for name, share in shares.items() if not 0.0 <= share <= 1.0)
        if bad:
            raise InputError(f"holdout shares must be between 0 and 1: {', '.join(bad)}")
        self._holdout_by_load = dict(shares)
        self._matched_buckets = frozenset(matched)

    def holdout_shares(self) -> dict[str, float]:
        return dict(self._holdout_by_load)

    def set_class_holdouts(self, shares: Mapping[tuple[str, str], float]) -> None:
        """Per class (task type, temperature bucket), the least share held out wherever it runs
        (the fleet planner's price of learning its no-spec TPOT), replacing the previous set whole;
        a share outside [0, 1] rejects the set whole."""
        bad = sorted(
            f"{'/'.join(key)}: {share!r}" for key, share in shares.items() if not 0.0 <= share <= 1.0
        )
        if bad:
            raise InputError(f"holdout shares must be between 0 and 1: {'; '.join(bad)}")
        self._holdout_by_class = {key: float(share) for key, share in shares.items()}

    def class_holdouts(self) -> dict[tuple[str, str], float]:
        return dict(self._holdout_by_class)

    def matched_buckets(self) -> frozenset[str]:
        return self._matched_buckets

    def holdout_report(self) -> dict[str, object]:
        """The holdout in force (for /status): mode, the tap's share, shares per load bucket and the
        load buckets being refilled by capacity matching."""
        refilling = self._matched_buckets if self.holdout_mode == HOLDOUT_MATCHED_ON_DEMAND else frozenset()
        return {
            "mode": self.holdout_mode,
            "share": self.holdout_share,
            "shares": dict(sorted(self._holdout_by_load.items())),
            "class_shares": {"/".join(k): v for k, v in sorted(self._holdout_by_class.items())},
            "refilling": sorted(refilling),
        }

    def set_preferences(self, preferences: Mapping[PlanKey, Sequence[str]]) -> None:
        """Per class, its pools cheapest first (the guard's estimates): the failover order."""
        self._preferences = {
            key: tuple(p for p in pools if p in self._pools) for key, pools in preferences.items()
        }

    def set_probes(self, probes: Mapping[PlanKey, tuple[str, float]]) -> None:
        """Per class off speculation, its probe pool and share (replacing the previous set whole);
        a set naming an unknown or non-speculative pool, or a share outside [0, 1], is rejected whole."""
        bad = sorted(
            f"{'/'.join(key)}: {pool} at {share!r}"
            for key, (pool, share) in probes.items()
            if pool not in self._pools or not self._pools[pool].speculative or not 0.0 <= share <= 1.0
        )
        if bad:
            raise InputError(f"probes need a speculative pool and a share in [0, 1]: {'; '.join(bad)}")
        self._probes = {key: (pool, float(share)) for key, (pool, share) in probes.items()}

    def probes(self) -> dict[PlanKey, tuple[str, float]]:
        return dict(self._probes)

    def set_spread(self, spread: Spread | None) -> None:
        """The classes spread over pools by their TPOT at the loads now (None: the plan alone)."""
        if spread is not None:
            unknown = sorted({p for units in spread.units.values() for p in units if p not in self._pools})
            if unknown:
                raise InputError(f"spread names pools that are not configured: {', '.join(unknown)}")
        self._spread = spread

    def _spread_to(
        self, task_type: str, temperature_bucket: str, target: str, load_bucket_of, load_of
    ) -> str:
        """The pool where the request adds least time at the loads now (``Spread.marginal``), each
        read at the load bucket the request would join it in (``target`` on a tie, or where its
        own cell is unknown)."""
        spread = self._spread
        if spread is None or load_of is None:
            return target

        def added(pool: str) -> float | None:
            unit = spread.units.get((task_type, temperature_bucket, load_bucket_of(pool)), {}).get(pool)
            return None if unit is None else spread.marginal(pool, unit, load_of(pool))

        cost = added(target)
        if cost is None:
            return target
        best = target
        for pool in self._pools:
            if pool != target and self.serving(pool):
                here = added(pool)
                if here is not None and here < cost:
                    best, cost = pool, here
        return best

    def probe_for(
        self, task_type: str, temperature_bucket: str, load_bucket_of: Callable[[str], str], target: str
    ) -> tuple[str | None, float]:
        """The probe pool and share of a class planned on ``target`` (off speculation): its entry at
        the load bucket its plan was looked up at (the default pool's, then ``target``'s), else the
        default probe pool at ``probe_share``."""
        for pool in dict.fromkeys((self.default_pool, target)):
            found = self._probes.get((task_type, temperature_bucket, load_bucket_of(pool)))
            if found is not None:
                return found
        return self.probe_pool, self.probe_share

    def serving(self, pool: str) -> bool:
        return self.health is None or self.health.healthy(pool)

    def fallback(
        self,
        task_type: str,
        temperature_bucket: str,
        load_bucket: str,
        planned: str,
        exclude: Sequence[str] = (),
    ) -> str | None:
        """The best serving pool for traffic planned for ``planned``; None when none serves.

        The class's cost order first, then by distance of K from the planned pool's (the lower
        K first on a tie, then configuration order).
        """
        k = self._pools[planned].num_speculative_tokens if planned in self._pools else 0
        nearest = sorted(
            self._pools,
            key=lambda name: (
                abs(self._pools[name].num_speculative_tokens - k),
                self._pools[name].num_speculative_tokens,
            ),
        )
        order = (*self._preferences.get((task_type, temperature_bucket, load_bucket), ()), *nearest)
        for pool in order:
            if pool != planned and pool not in exclude and self.serving(pool):
                return pool
        return None

    def retry(
        self,
        task_type: str,
        temperature_bucket: str,
        load_bucket_of: Callable[[str], str],
        failed: RouteChoice,
        tried: Sequence[str],
    ) -> RouteChoice | None:
        """Where a request goes after a connect to every pool in ``tried`` failed; None: nowhere.

        A holdout or probe request goes back to its class's planned pool if that one serves
        (measuring gives way to serving); anything else to the best serving pool not yet tried,
        and with none serving to the planned pool if it was not tried.
        """
        planned = failed.planned or self.planned(task_type, temperature_bucket, load_bucket_of)
        if planned not in tried and self.serving(planned):
            return RouteChoice(planned, ROUTE_PLAN)
        pool = self.fallback(task_type, temperature_bucket, load_bucket_of(planned), planned, tried)
        if pool is not None:
            return RouteChoice(pool, ROUTE_FAILOVER, planned)
        if planned not in tried:  # none serving: the plan's pool is the best try (it may be back)
            return RouteChoice(planned, ROUTE_PLAN)
        return None

    def set_holdout_mode(self, mode: str) -> None:
        """``share`` (the holdout share, per load bucket where set), ``capacity_matched`` or
        ``matched_on_demand``."""
        if mode not in HOLDOUT_MODES:
            raise InputError(f"holdout mode ({mode!r}) must be one of {', '.join(HOLDOUT_MODES)}")
        self.holdout_mode = mode

    def set_replicas(self, replicas: Mapping[str, int]) -> None:
        """Replica counts of some pools (fleet mode: from the plan or a PromQL count); others keep theirs."""
        unknown = sorted(name for name in replicas if name not in self._pools)
        if unknown:
            raise InputError(f"replicas for pools that are not configured: {', '.join(unknown)}")
        bad = sorted(name for name, n in replicas.items() if not (isinstance(n, int) and n >= 1))
        if bad:
            raise InputError(f"replicas must be whole numbers >= 1: {', '.join(bad)}")
        self._replicas.update(replicas)

    def replicas(self) -> dict[str, int]:
        return dict(self._replicas)

    def load(self, pool: str, in_flight: int) -> float:
        """The load a request joining ``pool`` (``in_flight`` there now) runs at: the in-flight
        requests of the replica it joins, itself included, the pool's requests spread evenly."""
        return float(in_flight // self._replicas[pool] + 1)

    def planned(self, task_type: str, temperature_bucket: str, load_bucket_of: Callable[[str], str]) -> str:
        """Plan lookup; the load bucket is that of the pool the request would go to.

        Starts from the default pool's load; if the plan sends the class elsewhere, the
        lookup is repeated once with that pool's load and kept if it agrees.
        """
        first = self._plan.get((task_type, temperature_bucket, load_bucket_of(self.default_pool)))
        target = first or self.default_pool
        if target != self.default_pool:
            # Absent entry: keep the move. The target is usually less loaded than the default pool,
            # so its bucket has no plan entry; only an explicit entry that disagrees overrides.
            second = self._plan.get((task_type, temperature_bucket, load_bucket_of(target)), target)
            if second != target:
                return self.default_pool if second == self.default_pool else second
        return target

    def choose(
        self,
        task_type: str,
        temperature_bucket: str,
        load_bucket_of: Callable[[str], str],
        load_of: Callable[[str], float] | None = None,
    ) -> RouteChoice:
        """Pool for one request. ``load_bucket_of(pool)`` gives the pool's live load bucket and
        ``load_of(pool)`` its in-flight requests per replica if the request joined it (needed by
        capacity-matched holdout; without it that mode holds nothing out)."""
        planned = self.planned(task_type, temperature_bucket, load_bucket_of)
        target = self._spread_to(task_type, temperature_bucket, planned, load_bucket_of, load_of)
        if target != planned:
            return RouteChoice(target, ROUTE_SPREAD, planned)
        if self.holdout_mode == HOLDOUT_CAPACITY_MATCHED or (
            self.holdout_mode == HOLDOUT_MATCHED_ON_DEMAND
            and self._matched_buckets
            and load_bucket_of(target) in self._matched_buckets
        ):
            draw = self._rng.random()
            if (
                load_of is not None
                and self.holdout_share > 0  # holdout_share 0 turns every holdout off
                and self.nospec_pool is not None
                and self._pools[target].speculative
                and self.serving(self.nospec_pool)
            ):
                nospec, planned = load_of(self.nospec_pool), load_of(target)
                r0, rp = self._replicas[self.nospec_pool], self._replicas[target]
                # less loaded per replica: hold out; equally loaded: by the capacity share (so
                # one request at a time still splits r0 : rp)
                if nospec < planned or (nospec == planned and draw < r0 / (r0 + rp)):
                    return RouteChoice(self.nospec_pool, ROUTE_HOLDOUT)
            return self._probe(target, draw, task_type, temperature_bucket, load_bucket_of)
        draw = self._rng.random()
        holdout = self.holdout_share
        if self._holdout_by_load and target != self.nospec_pool:
            holdout = self._holdout_by_load.get(load_bucket_of(target), holdout)
        if self.holdout_share > 0:  # holdout_share 0 turns every holdout off
            holdout = max(holdout, self._holdout_by_class.get((task_type, temperature_bucket), 0.0))
        if (
            self.nospec_pool is not None
            and target != self.nospec_pool
            and draw < holdout
            and self.serving(self.nospec_pool)
        ):
            return RouteChoice(self.nospec_pool, ROUTE_HOLDOUT)
        return self._probe(target, draw, task_type, temperature_bucket, load_bucket_of)

    def _probe(
        self,
        target: str,
        draw: float,
        task_type: str,
        temperature_bucket: str,
        load_bucket_of: Callable[[str], str],
    ) -> RouteChoice:
        """``target``, or the class's probe pool for a class planned off speculation (``draw`` below
        its probe share; a probe pool that is down gets none); a serving pool in its place when
        ``target`` is down (failover)."""
        if not self._pools[target].speculative:
            pool, share = self.probe_for(task_type, temperature_bucket, load_bucket_of, target)
            if pool is not None and pool != target and draw < share and self.serving(pool):
                return RouteChoice(pool, ROUTE_PROBE)
        if not self.serving(target):
            pool = self.fallback(task_type, temperature_bucket, load_bucket_of(target), target)
            if pool is not None:  # (none serving: try the plan's pool, it may be back)
                return RouteChoice(pool, ROUTE_FAILOVER, target)
        return RouteChoice(target, ROUTE_PLAN)
