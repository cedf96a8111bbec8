"""Equal capacity: one fleet of N engines shared by every pool a policy uses.

Every policy the replay compares gets the same N engines, whichever pools (K) it routes to. An
engine runs one pool's configuration at a time; an engine with no request in it can be given to
any pool at once (the model leaves out the restart a real engine needs to change K). There are
never more than N engines in all, so splitting traffic over more pools buys no capacity: it can
only cost some, since every pool in use needs an engine and each engine batches fewer requests.

The fleet allocates engines as an autoscaler on requests in flight would: every pool with requests
is due engines in proportion to them, rounded by largest remainder, at least one each
(``allocation``; the fluid model of ``lab.fluid`` assumes the same split). A request joins the least
loaded engine of its pool. A pool below its allocation takes an empty engine, else an engine of a
pool above its allocation is *drained* for it: it admits nothing new and changes hands once its
last request finishes (a quarter-engine of hysteresis keeps demand that swings by a request or two
from moving engines). A pool with no engine at all waits for one; its waiting requests then move
over, spread over the engines on their way. Deterministic: ties go to the lowest index.

A *fixed* fleet (``fixed={pool: engines}``, or a ``fixed`` shape) has exactly that many engines per
pool for the whole run, never moved (a Deployment of fixed replicas behind a Service): a request
joins the least loaded engine of its pool.

An *autoscaled* fleet (an ``autoscaled`` shape, ``lab.shapes``) starts each pool at one replica and
scales it on its requests in flight at every sync (``autoscale``, called by the replay every
``sync_s``): the HPA rule of ``lab.autoscale``, within the engine budget. A new replica starts
serving ``start_delay_s`` later (``activate``); one leaving takes no new request and goes once its
last one finished. Every pool keeps a ready replica, so no request waits for an engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specguard.lab import autoscale, shapes
from specguard.sim.config import SimConfig
from specguard.sim.engine import EngineCore, SimRequest


def quotas(demand: Mapping[str, float], engines: int) -> dict[str, float]:
    """Each pool's exact share of the engines: ``engines x its demand / all demand``."""
    total = sum(d for d in demand.values() if d > 0)
    return {p: engines * d / total for p, d in demand.items() if d > 0} if total else {}


def allocation(demand: Mapping[str, float], engines: int) -> dict[str, int]:
    """Engines per pool for ``demand`` (requests in flight): the quotas rounded by largest remainder,
    at least one engine for every pool with demand (with more pools than engines, the busiest)."""
    q = quotas(demand, engines)
    pools = sorted(q, key=lambda p: (-q[p], p))
    if len(pools) >= engines:
        return {p: int(i < engines) for i, p in enumerate(pools)}
    out = {p: max(1, math.floor(q[p])) for p in pools}
    while sum(out.values()) > engines:  # minimums pushed the total over: the most over-served gives
        over = max((p for p in pools if out[p] > 1), key=lambda p: (out[p] - q[p], p))
        out[over] -= 1
    for p in sorted(pools, key=lambda p: (-(q[p] - out[p]), -q[p], p))[: engines - sum(out.values())]:
        out[p] += 1
    return out


@dataclass(eq=False)
class Slot:
    """One engine of the fleet."""

    index: int
    pool: str | None = None
    engine: EngineCore | None = None
    load: int = 0  # requests placed on this engine and not finished
    draining_for: str | None = None  # the pool it goes to once empty
    busy: bool = False  # a step is in flight
    starting: bool = False  # autoscaled: started, not serving yet (loading the model)
    ready_at: float = 0.0
    leaving: bool = False  # autoscaled: scaled down, goes once empty

    @property
    def draining(self) -> bool:
        return self.draining_for is not None


@dataclass
class FleetStats:
    """Time integrals for the report: engines in use and reconfigurations."""

    busy_engine_seconds: float = 0.0
    reconfigurations: int = 0
    drains: int = 0
    waited_requests: int = 0
    max_busy: int = 0
    engine_seconds: float = 0.0  # engines allocated (serving, starting or leaving) over time
    replica_seconds: dict[str, float] = field(default_factory=dict)  # serving replicas per pool
    scale_ups: int = 0
    scale_downs: int = 0
    timeline: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # serving replicas
    _busy: int = 0
    _since: float = 0.0
    _alloc_since: float = 0.0


class Fleet:
    """N engine slots; ``place`` picks (or waits for) an engine, ``release`` frees a request's place."""

    def __init__(
        self,
        sim: SimConfig,
        pools: Sequence[str],
        size: int,
        *,
        seed: int,
        fixed: Mapping[str, int] | None = None,
        shape: shapes.FleetShape | None = None,
    ):
        self.shape = shape
        self.autoscaled = shape is not None and shape.kind == shapes.AUTOSCALED
        if shape is not None and shape.kind == shapes.FIXED:
            fixed = shape.replicas
        elif shape is not None:
            size = shape.engines
        if self.autoscaled:
            assert shape is not None
            missing = sorted(set(pools) - set(shape.replicas))
            if missing:
                raise ValueError(f"an autoscaled fleet needs a replica for every pool: {', '.join(missing)}")
            self.recommender = autoscale.Recommender(
                shape.target_in_flight, shape.stabilization_s, dict(shape.replicas)
            )
            # the shipped HPA on specguard's desired replicas: an External metric, AverageValue 1
            self.on_desired = autoscale.Recommender(1.0, shape.stabilization_s, dict(shape.replicas))
        if fixed is not None:
            missing = sorted(set(pools) - {p for p, n in fixed.items() if n >= 1})
            if missing:
                raise ValueError(f"a fixed fleet needs an engine for every pool: {', '.join(missing)}")
            size = sum(fixed[p] for p in pools)
        if size < 1:
            raise ValueError(f"fleet size ({size}) must be >= 1")
        self.sim = sim
        self.pools = tuple(pools)
        self.size = size
        self.seed = seed
        self.fixed = fixed is not None
        self.slots = [Slot(i) for i in range(size)]
        self.in_flight = 0
        self.waiting: dict[str, list[SimRequest]] = {}
        self.stats = FleetStats()
        self._cores: dict[tuple[int, str], EngineCore] = {}  # (slot index or -1, pool)
        start = fixed if fixed is not None else (shape.replicas if self.autoscaled and shape else None)
        if start is not None:
            slots = iter(self.slots)
            for pool in self.pools:
                for _ in range(start[pool]):
                    self._assign(next(slots), pool)
        self._mark(0.0)

    # ---- queries --------------------------------------------------------------------------------
    def engines_of(self, pool: str) -> list[Slot]:
        """The engines of ``pool`` a request may join (serving; not draining, starting or leaving)."""
        return [
            s for s in self.slots if s.pool == pool and not s.draining and not s.starting and not s.leaving
        ]

    def replicas(self) -> dict[str, int]:
        """Serving replicas per pool."""
        out: dict[str, int] = {}
        for s in self.slots:
            if s.pool is not None and not s.starting and not s.leaving and not s.draining:
                out[s.pool] = out.get(s.pool, 0) + 1
        return out

    def demand(self, extra: str | None = None) -> dict[str, int]:
        """Requests in flight per pool (on its engines, draining ones included, and waiting)."""
        out: dict[str, int] = {}
        for s in self.slots:
            if s.pool is not None and s.load:
                out[s.pool] = out.get(s.pool, 0) + s.load
        for pool, queue in self.waiting.items():
            out[pool] = out.get(pool, 0) + len(queue)
        if extra is not None:
            out[extra] = out.get(extra, 0) + 1
        return out

    def _free(self) -> list[Slot]:
        """Empty engines another pool may take: unassigned, or of a pool with no request in flight
        (an empty engine of a busy pool is where that pool's next request goes)."""
        busy = self.demand()
        return [s for s in self.slots if s.load == 0 and not s.draining and not busy.get(s.pool or "", 0)]

    def peek_load(self, pool: str) -> int:
        """The live concurrency of the engine a request for ``pool`` would join, itself included."""
        mine = self.engines_of(pool)
        return (min(s.load for s in mine) if mine else 0) + 1

    # ---- placement ------------------------------------------------------------------------------
    def place(self, pool: str, request: SimRequest, now: float) -> Slot | None:
        """Put ``request`` on an engine of ``pool`` (returned), or queue it (None) until one is free."""
        self.in_flight += 1
        if self.fixed or self.autoscaled:
            slot = min(self.engines_of(pool), key=lambda s: (s.load, s.index))
            self._add(slot, request, now)
            return slot
        demand = self.demand(extra=pool)
        target = allocation(demand, self.size)
        mine = self.engines_of(pool)
        if not mine or len(mine) < target.get(pool, 0):
            free = [s for s in self._free() if s.pool != pool]
            if free:
                self._assign(free[0], pool)
                mine = self.engines_of(pool)
        self._rebalance(pool, demand, target)
        mine = self.engines_of(pool)
        if not mine:
            self.waiting.setdefault(pool, []).append(request)
            self.stats.waited_requests += 1
            return None
        slot = min(mine, key=lambda s: (s.load, s.index))
        self._add(slot, request, now)
        return slot

    def release(self, slot: Slot, now: float) -> list[SimRequest]:
        """A request on ``slot`` finished. Returns requests that moved onto ``slot`` (now reassigned)."""
        self.in_flight -= 1
        slot.load -= 1
        if slot.load:
            return []
        self._count_busy(now, -1)
        if slot.leaving:  # scaled down: the engine goes now that it is empty
            self._mark(now)
            slot.pool, slot.engine, slot.leaving = None, None, False
            self._mark(now)
            return []
        if self.fixed or self.autoscaled:
            return []
        target = slot.draining_for
        slot.draining_for = None
        if target is None:
            target = next((p for p, queue in self.waiting.items() if queue), None)
        if target is None:
            return []
        self._assign(slot, target)
        queue = self.waiting.pop(target, [])
        coming = sum(1 for s in self.slots if s.draining_for == target)
        take = math.ceil(len(queue) / (coming + 1))  # spread over the engines still on their way
        moved, rest = queue[:take], queue[take:]
        for request in moved:
            self._add(slot, request, now)
        if rest:  # the others wait for the engines still draining for this pool
            self.waiting[target] = rest
        return moved

    def engine_for(self, pool: str) -> EngineCore:
        """An engine core of ``pool`` to build its requests with (draws depend on seed, pool, key)."""
        return self._engine(None, pool)

    def close(self, now: float) -> None:
        self._count_busy(now, 0)
        self._mark(now)
        if not self.autoscaled:  # every engine belongs to the fleet for the whole run
            self.stats.engine_seconds = self.size * now

    # ---- autoscaling ----------------------------------------------------------------------------
    def autoscale(self, now: float, desired: Mapping[str, int] | None = None) -> list[float]:
        """One HPA sync: scale every pool toward its desired replicas within the budget; returns the
        times the replicas started now begin serving (call ``activate`` then).

        ``desired``: the guard's replicas per pool (``specguard_pool_desired_replicas``), which the
        HPA then scales on (``deploy/kubernetes/autoscaling``) instead of requests in flight; a pool
        the guard gives no number for keeps its replicas (an HPA without its metric holds)."""
        assert self.shape is not None
        demand = self.demand()
        wants = {}
        for pool in self.pools:
            mine = [s for s in self.slots if s.pool == pool and not s.leaving]
            if desired is None:
                want = self.recommender.desired(pool, demand.get(pool, 0), len(mine), now)
            elif pool in desired:
                want = self.on_desired.desired(pool, desired[pool], len(mine), now)
            else:
                want = len(mine)
            wants[pool] = (want, mine)
        ready_times = []
        self._mark(now)
        for pool, (want, mine) in sorted(wants.items(), key=lambda kv: (len(kv[1][1]) - kv[1][0], kv[0])):
            if want < len(mine):
                self._scale_down(mine, len(mine) - want, now)
            for _ in range(want - len(mine)):
                free = next((s for s in self.slots if s.pool is None), None)
                if free is None:  # the budget is spent
                    break
                self._assign(free, pool)
                free.starting, free.ready_at = True, now + self.shape.start_delay_s
                self.stats.scale_ups += 1
                ready_times.append(free.ready_at)
        self._mark(now)
        return ready_times

    def activate(self, now: float) -> None:
        """Replicas whose start delay has passed begin to serve."""
        self._mark(now)
        for s in self.slots:
            if s.starting and s.ready_at <= now + 1e-9:
                s.starting = False
        self._mark(now)

    def _scale_down(self, mine: list[Slot], count: int, now: float) -> None:
        """Remove ``count`` replicas: starting ones first (newest first), then the least loaded."""
        order = sorted(mine, key=lambda s: (not s.starting, s.load, -s.index))
        for slot in order[:count]:
            self.stats.scale_downs += 1
            if slot.load == 0:
                slot.pool, slot.engine, slot.starting = None, None, False
            else:
                slot.leaving = True

    def _mark(self, now: float) -> None:
        """Integrate allocated engines and serving replicas up to ``now``; record a changed count."""
        s = self.stats
        dt = now - s._alloc_since
        if dt > 0:
            allocated = sum(1 for x in self.slots if x.pool is not None)
            s.engine_seconds += allocated * dt
            for pool, n in (s.timeline[-1][1] if s.timeline else {}).items():
                s.replica_seconds[pool] = s.replica_seconds.get(pool, 0.0) + n * dt
        s._alloc_since = max(s._alloc_since, now)
        current = self.replicas()
        if not s.timeline or s.timeline[-1][1] != current:
            if s.timeline and s.timeline[-1][0] == now:
                s.timeline[-1] = (now, current)
            else:
                s.timeline.append((now, current))

    # ---- internals ------------------------------------------------------------------------------
    def _rebalance(self, pool: str, demand: Mapping[str, int], target: Mapping[str, int]) -> None:
        """Drain engines of pools above their allocation for ``pool``, while it is below its own.

        A move must bring the two pools' shortfalls (quota minus engines) at least a quarter of an
        engine closer, so demand that swings by a request or two moves no engine; a pool with no
        engine at all gets one regardless (from the pool holding most, if nobody is above target).
        """
        q = quotas(demand, self.size)
        counts = {p: len(self.engines_of(p)) for p in self.pools}
        coming = sum(1 for s in self.slots if s.draining_for == pool)
        while counts.get(pool, 0) + coming < target.get(pool, 0) or counts.get(pool, 0) + coming == 0:
            have = counts.get(pool, 0) + coming
            short = q.get(pool, 0.0) - have
            donors = [
                p
                for p in self.pools
                if p != pool
                and counts[p] >= 2
                and counts[p] > target.get(p, 0)
                and (have == 0 or short - (q.get(p, 0.0) - (counts[p] - 1)) > 0.25)
            ]
            if not donors and have == 0:
                donors = [p for p in self.pools if p != pool and counts[p] >= 2]
            if not donors:
                return
            donor = max(donors, key=lambda p: (counts[p] - q.get(p, 0.0), counts[p], p))
            slot = min(self.engines_of(donor), key=lambda s: (s.load, -s.index))
            counts[donor] -= 1
            if slot.load == 0:  # empty already: it changes hands now
                self._assign(slot, pool)
                counts[pool] = counts.get(pool, 0) + 1
                continue
            self.stats.drains += 1
            slot.draining_for = pool
            coming += 1

    def _engine(self, slot: Slot | None, pool: str) -> EngineCore:
        key = (-1 if slot is None else slot.index, pool)
        core = self._cores.get(key)
        if core is None:
            core = self._cores[key] = EngineCore(self.sim, self.sim.pool(pool), seed=self.seed)
        return core

    def _assign(self, slot: Slot, pool: str) -> None:
        if slot.pool != pool:
            if slot.pool is not None:
                self.stats.reconfigurations += 1
            slot.pool = pool
            slot.engine = self._engine(slot, pool)

    def _add(self, slot: Slot, request: SimRequest, now: float) -> None:
        if slot.load == 0:
            self._count_busy(now, +1)
        slot.load += 1
        assert slot.engine is not None
        slot.engine.add(request)

    def _count_busy(self, now: float, delta: int) -> None:
        s = self.stats
        s.busy_engine_seconds += s._busy * (now - s._since)
        s._since = now
        s._busy += delta
        s.max_busy = max(s.max_busy, s._busy)
