"""Equal capacity: one fleet of N engines shared by every pool a policy uses.

Every policy the replay compares gets the same N engines, whichever pools (K) it routes to. An
engine runs one pool's configuration at a time; an engine with no request in it can be given to
any pool at once (capacity follows traffic, as pools autoscaled on in-flight requests would), but
there are never more than N engines in all. So splitting traffic over more pools buys no capacity:
it can only cost some, since each pool's engines batch fewer requests.

Placement of a request for pool P, with the fleet-wide per-engine concurrency
``cap = ceil((requests in flight + 1) / N)``:

1. the fullest engine of P below ``cap`` (requests are packed, as the replay always did);
2. else an engine with no request (reconfigured to P if it ran another pool);
3. else the least loaded engine of P, over ``cap``; and as many engines as P lacks to stay within
   ``cap`` are drained from pools that can spare them (and still stay within ``cap``, with slack);
4. else (P has no engine) the request waits; an engine is drained for P (one another pool can
   spare, else the least loaded of the pool holding most, if it holds two or more: with N >= the
   number of pools one always does) and handed to P, with up to ``cap`` waiting requests, once empty.

A draining engine admits nothing new; an engine is reconfigured only when empty (the model leaves
out the restart a real engine needs to change K). Deterministic: ties go to the lowest index.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specguard.sim.config import SimConfig
from specguard.sim.engine import EngineCore, SimRequest


@dataclass(eq=False)
class Slot:
    """One engine of the fleet."""

    index: int
    pool: str | None = None
    engine: EngineCore | None = None
    load: int = 0  # requests placed on this engine and not finished
    draining_for: str | None = None  # the pool it goes to once empty ("" = nobody yet)
    busy: bool = False  # a step is in flight

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
    _busy: int = 0
    _since: float = 0.0


class Fleet:
    """N engine slots; ``place`` picks (or waits for) an engine, ``release`` frees a request's place."""

    def __init__(self, sim: SimConfig, pools: Sequence[str], size: int, *, seed: int):
        if size < 1:
            raise ValueError(f"fleet size ({size}) must be >= 1")
        self.sim = sim
        self.pools = tuple(pools)
        self.size = size
        self.seed = seed
        self.slots = [Slot(i) for i in range(size)]
        self.in_flight = 0
        self.waiting: dict[str, list[SimRequest]] = {}
        self.stats = FleetStats()
        self._cores: dict[tuple[int, str], EngineCore] = {}  # (slot index or -1, pool)

    # ---- queries --------------------------------------------------------------------------------
    def cap(self) -> int:
        return math.ceil((self.in_flight + 1) / self.size)

    def engines_of(self, pool: str) -> list[Slot]:
        return [s for s in self.slots if s.pool == pool and not s.draining]

    def _target(self, pool: str, cap: int) -> tuple[Slot | None, str]:
        mine = self.engines_of(pool)
        below = [s for s in mine if s.load < cap]
        if below:
            return max(below, key=lambda s: (s.load, -s.index)), "packed"
        free = [s for s in self.slots if s.load == 0 and not s.draining]
        if free:
            return free[0], "free"
        if mine:
            return min(mine, key=lambda s: (s.load, s.index)), "over"
        return None, "wait"

    def peek_load(self, pool: str) -> int:
        """The live concurrency of the engine a request for ``pool`` would join, itself included."""
        slot, _ = self._target(pool, self.cap())
        return (slot.load if slot is not None else 0) + 1

    # ---- placement ------------------------------------------------------------------------------
    def place(self, pool: str, request: SimRequest, now: float) -> Slot | None:
        """Put ``request`` on an engine of ``pool`` (returned), or queue it (None) until one is free."""
        cap = self.cap()
        slot, how = self._target(pool, cap)
        self.in_flight += 1
        if slot is None:
            self.waiting.setdefault(pool, []).append(request)
            self.stats.waited_requests += 1
            self._make_room(pool, cap)
            return None
        if how == "free":
            self._assign(slot, pool)
        elif how == "over":
            self._rebalance(pool, cap)
        self._add(slot, request, now)
        return slot

    def release(self, slot: Slot, now: float) -> list[SimRequest]:
        """A request on ``slot`` finished. Returns requests that moved onto ``slot`` (now reassigned)."""
        self.in_flight -= 1
        slot.load -= 1
        if slot.load:
            return []
        self._count_busy(now, -1)
        target = slot.draining_for
        slot.draining_for = None
        if target is None:
            target = next((p for p, queue in self.waiting.items() if queue), None)
        if target is None:
            return []
        self._assign(slot, target)
        cap = self.cap()
        queue = self.waiting.pop(target, [])
        moved, rest = queue[:cap], queue[cap:]
        for request in moved:
            self._add(slot, request, now)
        if rest:  # the others wait for the next engine, not pile onto this one
            self.waiting[target] = rest
            self._rebalance(target, cap)
        return moved

    def engine_for(self, pool: str) -> EngineCore:
        """An engine core of ``pool`` to build its requests with (draws depend on seed, pool, key)."""
        return self._engine(None, pool)

    # ---- internals ------------------------------------------------------------------------------
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

    def close(self, now: float) -> None:
        self._count_busy(now, 0)

    def _spare(self, pool: str, cap: int) -> Slot | None:
        """The least loaded engine ``pool`` can give up and keep its requests within ``cap`` (slack 1/4)."""
        mine = self.engines_of(pool)
        if len(mine) < 2:
            return None
        load = sum(s.load for s in mine)
        if (len(mine) - 1) * cap < load + max(1, cap // 4):
            return None
        return min(mine, key=lambda s: (s.load, -s.index))

    def _shortfall(self, pool: str, cap: int) -> int:
        """Engines ``pool`` needs beyond those it has or that are draining for it."""
        mine = self.engines_of(pool)
        load = sum(s.load for s in mine) + len(self.waiting.get(pool, ()))
        coming = sum(1 for s in self.slots if s.draining_for == pool)
        return math.ceil(load / cap) - len(mine) - coming

    def _rebalance(self, pool: str, cap: int) -> None:
        """``pool`` is over ``cap``: drain engines other pools can spare, as many as it lacks."""
        for _ in range(max(0, self._shortfall(pool, cap))):
            spare = [slot for other in self.pools if other != pool and (slot := self._spare(other, cap))]
            if not spare:
                return
            self._drain(min(spare, key=lambda s: (s.load, -s.index)), pool)

    def _make_room(self, pool: str, cap: int) -> None:
        """``pool`` has no engine: drain what others can spare, else the richest pool's least loaded."""
        if not any(s.draining_for == pool for s in self.slots):
            counts = {p: len(self.engines_of(p)) for p in self.pools if p != pool}
            richest = max(counts, key=lambda p: (counts[p], -self.pools.index(p)), default=None)
            spare = [slot for other in self.pools if other != pool and (slot := self._spare(other, cap))]
            if spare:
                self._drain(min(spare, key=lambda s: (s.load, -s.index)), pool)
            elif richest is not None and counts[richest] >= 2:
                self._drain(min(self.engines_of(richest), key=lambda s: (s.load, -s.index)), pool)
            else:
                return  # fewer engines than pools: the request waits until an engine empties by itself
        self._rebalance(pool, cap)

    def _drain(self, slot: Slot, for_pool: str) -> None:
        self.stats.drains += 1
        slot.draining_for = for_pool
