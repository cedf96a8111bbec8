"""Which pools are serving: passive health from the tap's own connects, active from the scrape.

A pool is marked down as soon as a connect to it fails (connection refused, no route, connect
timeout), whether the tap's forward of a request (passive) or a scrape of its page (active)
found it. It is marked up again by the first answer of any kind: an HTTP status from a
request or a scrape, even an error page, means the engine is listening again. A slow answer
(a read timeout) is no verdict either way. The scrape loop re-checks a pool that is down every
``scrape.down_interval_seconds``, so a pool that comes back is used again within seconds with
no traffic needed to find out.

Being down is a routing override, not a plan change: the router sends the traffic planned for
a down pool to the best healthy one (``exporters.routing``), the plan stays as the guard made
it, and the override ends by itself when the pool answers.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

log = logging.getLogger("specguard.health")


@dataclass(frozen=True)
class PoolState:
    """One pool's health: serving or not, since when, and what found out."""

    healthy: bool = True
    since: float | None = None
    """Unix time of the last change (None: serving since start)."""
    reason: str | None = None
    """Why it is down (the connect error), None while it serves."""
    source: str | None = None
    """What made the last change: ``tap`` (a forwarded request) or ``scrape``."""


class PoolHealth:
    """Pool name -> ``PoolState``; written by the tap and the scrape loops, read by the router."""

    def __init__(self, pools: Iterable[str], *, clock: Callable[[], float] = time.time):
        self._clock = clock
        self._states = {name: PoolState() for name in pools}
        self.failovers: Counter[tuple[str, str]] = Counter()  # (planned pool, serving pool)
        self.listeners: list[Callable[[str, bool], None]] = []  # called (pool, healthy) on a change

    def healthy(self, pool: str) -> bool:
        state = self._states.get(pool)
        return state is None or state.healthy

    def state(self, pool: str) -> PoolState:
        return self._states.get(pool, PoolState())

    def mark_down(self, pool: str, reason: str, source: str) -> bool:
        """Record a failed connect; True when this took the pool out of service."""
        state = self._states.get(pool)
        if state is None or not state.healthy:
            return False
        self._states[pool] = PoolState(False, self._clock(), reason, source)
        log.warning(
            "pool %s marked down (%s: %s); its traffic goes to the best healthy pool until it answers",
            pool,
            source,
            reason,
        )
        self._notify(pool, False)
        return True

    def mark_up(self, pool: str, source: str) -> bool:
        """Record an answer; True when this put the pool back in service."""
        state = self._states.get(pool)
        if state is None or state.healthy:
            return False
        now = self._clock()
        self._states[pool] = PoolState(True, now, None, source)
        down_for = now - state.since if state.since is not None else 0.0
        log.warning("pool %s answers again (%s) after %.1f s down: back in service", pool, source, down_for)
        self._notify(pool, True)
        return True

    def count_failover(self, pool: str, to_pool: str) -> None:
        self.failovers[(pool, to_pool)] += 1

    def _notify(self, pool: str, healthy: bool) -> None:
        for listener in list(self.listeners):
            try:
                listener(pool, healthy)
            except Exception:  # a listener's bug must not break the request that found out
                log.exception("health listener failed for pool %s", pool)

    def view(self) -> dict[str, PoolState]:
        return dict(self._states)

    def status(self) -> list[dict[str, object]]:
        """Per pool: healthy or not, since when, why, and the requests it handed to other pools."""
        out = []
        for name, state in self._states.items():
            served = {to: n for (pool, to), n in sorted(self.failovers.items()) if pool == name}
            out.append(
                {
                    "pool": name,
                    "healthy": state.healthy,
                    "since": state.since,
                    "reason": state.reason,
                    "source": state.source,
                    "failover_requests": served,
                }
            )
        return out
