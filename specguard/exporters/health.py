"""Which pools are serving: passive health from the tap's own connects, active from the scrape.

A pool is marked down as soon as a connect to it fails (connection refused, no route, connect
timeout) or it answers 503 Service Unavailable (it listens but does not serve: llama.cpp's
"Loading model" while a restarted server loads), whether the tap's forward of a request
(passive) or a scrape of its page (active) found it. It is marked up again by the first other
answer: any other HTTP status from a request or a scrape, even an error page, means the engine
is listening and serving again. A slow answer (a read timeout) is no verdict either way. The
scrape loop re-checks a pool that is down every ``scrape.down_interval_seconds``, so a pool that
comes back is used again within seconds with no traffic needed to find out.

A pool that answers but fails (``Ejector``: so many 5xx answers or resets in a row, as Envoy's
outlier detection counts them) is *ejected*: out of service for an interval whatever its scrape
or its next answer says, since an engine whose API fails may well still serve its /metrics page.
The interval doubles each time the pool is ejected again, up to a cap, and is back to the first
after the pool has served a whole cap's length. The last serving pool is never ejected: with
nowhere else to go, a failing pool is still the best try (Envoy's panic mode). Nor is a pool
that is down: its requests in flight break because it is gone, and it serves again at its first
answer.

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
    """What made the last change: ``tap`` (a forwarded request), ``scrape`` or ``ejection``."""
    until: float | None = None
    """While ejected: Unix time the ejection ends (None: not ejected)."""


@dataclass(frozen=True)
class EjectPolicy:
    """Envoy-style consecutive-failure ejection: ``consecutive`` 5xx/resets in a row eject a pool
    for ``seconds``, doubled on each repeat up to ``max_seconds``."""

    consecutive: int = 5
    seconds: float = 30.0
    max_seconds: float = 300.0


class PoolHealth:
    """Pool name -> ``PoolState``; written by the tap and the scrape loops, read by the router."""

    def __init__(
        self,
        pools: Iterable[str],
        *,
        clock: Callable[[], float] = time.time,
        eject: EjectPolicy | None = None,
    ):
        self._clock = clock
        self._states = {name: PoolState() for name in pools}
        self.failovers: Counter[tuple[str, str]] = Counter()  # (planned pool, serving pool)
        self.listeners: list[Callable[[str, bool], None]] = []  # called (pool, healthy) on a change
        self.policy = eject or EjectPolicy()
        self._ejected: dict[str, PoolState] = {}  # pool -> its ejection (reason, since, until)
        self._failures: Counter[str] = Counter()  # consecutive 5xx answers or resets
        self._times: Counter[str] = Counter()  # ejections in a row (the interval's doubling)
        self._back_at: dict[str, float] = {}  # when the last ejection ended
        self.ejections: Counter[str] = Counter()  # every ejection, for the counter

    def healthy(self, pool: str) -> bool:
        state = self._states.get(pool)
        return (state is None or state.healthy) and not self._is_ejected(pool)

    def state(self, pool: str) -> PoolState:
        if self._is_ejected(pool):
            return self._ejected[pool]
        return self._states.get(pool, PoolState())

    # -- outlier ejection --------------------------------------------------------------------
    def _is_ejected(self, pool: str) -> bool:
        ejection = self._ejected.get(pool)
        if ejection is None:
            return False
        now = self._clock()
        if ejection.until is not None and now < ejection.until:
            return True
        del self._ejected[pool]  # the interval is over: re-admitted
        self._back_at[pool] = now
        self._failures[pool] = 0
        log.warning("pool %s re-admitted after its ejection (%s)", pool, ejection.reason)
        if self._states.get(pool, PoolState()).healthy:
            self._notify(pool, True)
        return False

    def answered(self, pool: str, failed: bool, what: str = "5xx") -> bool:
        """Record a pool's answer to a forwarded request: ``failed`` for a 5xx or a reset
        (``what`` says which), else a success that ends the run. True when this ejected it."""
        state = self._states.get(pool)
        if state is None or not state.healthy:  # down: the resets of a dead engine's requests in flight
            return False  # must not eject it too, or it would stay out once it is back
        if not failed:
            self._failures[pool] = 0
            return False
        self._failures[pool] += 1
        if self._failures[pool] < self.policy.consecutive or self._is_ejected(pool):
            return False
        others = [p for p in self._states if p != pool and self.healthy(p)]
        if not others:  # the last serving pool: still the best try, never ejected
            return False
        now = self._clock()
        back = self._back_at.get(pool)
        if back is not None and now - back >= self.policy.max_seconds:
            self._times[pool] = 0  # served a whole cap's length since: the interval starts over
        seconds = min(self.policy.max_seconds, self.policy.seconds * 2 ** self._times[pool])
        self._times[pool] += 1
        self.ejections[pool] += 1
        count, self._failures[pool] = self._failures[pool], 0
        reason = f"ejected for {seconds:g} s: {count} {what} in a row"
        self._ejected[pool] = PoolState(False, now, reason, "ejection", now + seconds)
        log.warning("pool %s %s; its traffic goes to %s meanwhile", pool, reason, ", ".join(others))
        self._notify(pool, False)
        return True

    def mark_down(self, pool: str, reason: str, source: str) -> bool:
        """Record a failed connect; True when this took the pool out of service."""
        state = self._states.get(pool)
        if state is None or not state.healthy:
            return False
        # a pool that cannot be connected to is down, not an outlier: it serves again as soon as it
        # answers (a killed engine's in-flight resets must not keep a restarted one out)
        self._ejected.pop(pool, None)
        self._failures[pool] = 0
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
        return {name: self.state(name) for name in self._states}

    def status(self) -> list[dict[str, object]]:
        """Per pool: healthy or not, since when, why, and the requests it handed to other pools."""
        out = []
        for name, state in self.view().items():
            served = {to: n for (pool, to), n in sorted(self.failovers.items()) if pool == name}
            out.append(
                {
                    "pool": name,
                    "healthy": state.healthy,
                    "since": state.since,
                    "reason": state.reason,
                    "source": state.source,
                    "ejected_until": state.until,
                    "ejections": self.ejections.get(name, 0),
                    "failover_requests": served,
                }
            )
        return out
