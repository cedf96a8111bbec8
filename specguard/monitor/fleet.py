"""The guard's two fleet roles, mixed into ``daemon.Guard``: follower and (one) leader.

*Follower* (``actuators.follow``): every interval it reads the plan from its source (the
ConfigMap, or the decider's ``GET /api/v1/plan``), adopts a new version, persists it to its own
plan file and routes by it. When the source is unreachable it keeps routing by the last plan it
had (also across its own restarts, from that file) and ``plan_age`` grows: seconds since the
source last confirmed the plan. It still measures: its cost model exports RC per class, which the
fleet's recording rules combine across replicas for the decider.

*Leader*: a decider decides only while its elector (``monitor.leader``) says it leads. On
becoming leader it first reads the shared plan (the ConfigMap, or the plan file another decider
wrote) and takes it over when it is newer than its own, so a standby that takes over, or a
restarted decider, resumes from the last plan instead of changing it. It never writes as standby.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from specguard.errors import InputError, SourceError
from specguard.monitor import leader
from specguard.monitor import state as state_mod
from specguard.monitor.sources import LocalSource

log = logging.getLogger("specguard.guard")


class NotLeader(SourceError):
    """This decider is a standby: operator changes go to the leader (HTTP 503)."""


Takeover = Callable[[], Awaitable["state_mod.PlanDocument | None"]]


class FleetRoles:
    """Follower and leader behaviour of ``daemon.Guard`` (which provides the attributes used here)."""

    follow: Any
    sources: list[Any]
    store: Any
    counters: Any
    version: int
    clock: Callable[[], float]
    adopted_updated_at: float | None
    _applied: dict[str, int]
    # and _adopt(doc), _persist(), async _actuate(decisions)

    def _init_fleet(self, elector: Any, takeover: Takeover | None) -> None:
        self.elector = elector if elector is not None else leader.Single()
        self.takeover = takeover
        self._leading = False
        self._elector_started = False
        self.plan_confirmed_at: float | None = None
        if self.follow is not None:
            # a plan from our own file (``_load``) was confirmed at the latest when we wrote it
            stored = self.adopted_updated_at
            self.plan_confirmed_at = self.clock() if stored is None else min(stored, self.clock())

    # -- views ---------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """True when this process decides: not a follower, and leading (or no election)."""
        # with no election (no takeover to do) a decider always decides; else once it took over
        return self.follow is None and self.elector.is_leader and (self._leading or self.takeover is None)

    @property
    def leader_holder(self) -> str | None:
        return self.elector.holder

    def plan_age(self, now: float) -> float | None:
        """A follower's seconds since its source last confirmed its plan; None for a decider."""
        if self.follow is None or self.plan_confirmed_at is None:
            return None
        return max(0.0, now - self.plan_confirmed_at)

    # -- follower ------------------------------------------------------------------------------
    async def _follow(self, now: float) -> None:
        await self._measure(now)
        try:
            doc = await self.follow.read_plan()
        except (SourceError, InputError, TimeoutError) as exc:
            self.counters.actuation_errors["follow"] += 1
            log.error("reading the plan failed: %s; keeping plan version %d", exc, self.version)
            return
        self.plan_confirmed_at = now
        if doc is None or (doc.version == self.version and doc.states == self.states):
            return  # unchanged
        if doc.version <= self.version:  # replayed, rolled back or forged: only a newer plan is taken
            self.counters.plans_ignored += 1
            if getattr(self, "_ignored_version", None) == doc.version:
                return  # said once per version
            self._ignored_version = doc.version
            log.warning(
                "plan version %d from %s is not newer than ours (%d): ignored",
                doc.version,
                getattr(self.follow, "answered_by", None) or self.follow.name,
                self.version,
            )
            return
        log.info("following plan version %d (was %d)", doc.version, self.version)
        self._adopt(doc)
        self._persist()
        await self._actuate([])

    async def _measure(self, now: float) -> None:
        """Run the local cost model (it exports RC per class) without deciding anything."""
        for source in self.sources:
            if not isinstance(source, LocalSource):
                continue
            try:
                await source.collect(now, [])
            except Exception:  # measuring must never stop a follower from following
                log.exception("cost model evaluation failed")

    # -- leader --------------------------------------------------------------------------------
    async def start_elector(self) -> None:
        """Join the election once (``start``, or the first evaluation of a guard embedded unstarted)."""
        if not self._elector_started:
            self._elector_started = True
            await self.elector.start()

    async def _lead(self) -> bool:
        """Whether this round decides; on becoming leader, take the shared plan over first."""
        await self.start_elector()
        if not self.elector.is_leader:
            if self._leading:
                log.warning("no longer the leader (holder: %s): standing by", self.elector.holder)
            self._leading = False
            return False
        if not self._leading:
            if self.takeover is None:
                self._leading = True  # no election: nothing to take over
            elif not await self._take_over():
                return False
        return True

    async def _take_over(self) -> bool:
        """Adopt the shared plan when it is newer than ours; False (retry next round) when unreadable."""
        doc = None
        if self.takeover is not None:
            try:
                doc = await self.takeover()
            except (SourceError, InputError, OSError, TimeoutError) as exc:
                self.counters.actuation_errors["takeover"] += 1
                why = str(exc) or type(exc).__name__
                log.error("leader: cannot read the shared plan (%s); not deciding until it can", why)
                return False
        if doc is not None and doc.version > self.version:
            log.info("leader: taking over plan version %d (had %d)", doc.version, self.version)
            self._adopt(doc)
            self._persist()
        else:
            log.info("leader: deciding from plan version %d", self.version)
        self._applied.clear()
        self._leading = True
        await self._actuate([])
        return True
