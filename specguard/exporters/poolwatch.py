"""Each pool's engine /metrics page, scraped on a named, stoppable loop.

``PoolWatch`` keeps what the collector exports per pool: up/down, scrape duration, the last
snapshot, and the engine's own counters accumulated as deltas since start (reset-safe,
series by series, the way Prometheus ``increase()`` does) for the cross-check against the
tap's per-class sums. The scrape is also the active half of the pool health check
(``exporters.health``): a scrape that cannot connect marks the pool down, any answer marks it
up, and a pool that is down is scraped every ``down_interval`` seconds until it answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable

import aiohttp

from specguard import untrusted
from specguard.errors import InputError, NotReadyError, SpecguardError, UnreachableError
from specguard.exporters import promtext
from specguard.exporters.config import PoolConfig
from specguard.exporters.health import PoolHealth
from specguard.exporters.snapshot import EngineSnapshot

log = logging.getLogger("specguard.scrape")

# EngineSnapshot counter fields accumulated for the cross-check
ACCUMULATED = ("drafts", "draft_tokens", "accepted_tokens", "generation_tokens")
HISTORY = 128  # recent snapshots kept per pool (the model baseline's engine-page intervals)

Fetch = Callable[[PoolConfig, float], Awaitable[EngineSnapshot]]


class PoolWatch:
    """Scrape results of one pool; ``observe``/``fail`` write, the collector reads."""

    def __init__(self, pool: PoolConfig, *, clock: Callable[[], float] = time.time):
        self.pool = pool
        self._clock = clock
        self._lock = threading.Lock()
        self.up = False
        self.scrapes = 0
        self.duration_seconds: float | None = None
        self.last_success: float | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.rejected: dict[str, int] = {}  # pages refused (too large, malformed...) by reason
        self.snapshot: EngineSnapshot | None = None
        self.counter_resets = 0
        self.non_finite = 0  # NaN or infinite samples dropped from its pages
        self.accumulated: dict[str, float] = {name: 0.0 for name in ACCUMULATED}
        self._previous: dict[str, dict[object, float]] = {}
        self._baseline = False  # a successful scrape happened: later series count from zero
        self._history: deque[tuple[float, EngineSnapshot]] = deque(maxlen=HISTORY)

    def observe(self, snapshot: EngineSnapshot, duration: float) -> None:
        """A successful scrape: add each counter's increase since the previous one."""
        with self._lock:
            reset = False
            self.non_finite += snapshot.non_finite
            for name in ACCUMULATED:
                current = _series(snapshot, name)
                if current is None:
                    continue
                before = self._previous.get(name)
                if before is None and self._baseline:
                    before = {}  # the family appeared after the first scrape: it started at zero
                if before is not None:
                    for key, value in current.items():
                        old = before.get(key)
                        if not math.isfinite(value) or (old is not None and not math.isfinite(old)):
                            continue  # (dropped from scraped pages already; a snapshot built elsewhere)
                        if old is None:  # a labelled series appears at its first increment
                            self.accumulated[name] += value
                        elif value >= old:
                            self.accumulated[name] += value - old
                        else:
                            reset = True
                            self.accumulated[name] += value
                self._previous[name] = {k: v for k, v in current.items() if math.isfinite(v)}
            self.counter_resets += int(reset)
            if reset:
                self._history.clear()  # an interval across an engine restart means nothing
            self._history.append((self._clock(), snapshot))
            self._baseline = True
            self.snapshot = snapshot
            self.up = True
            self.scrapes += 1
            self.duration_seconds = duration
            self.last_success = self._clock()

    def fail(self, error: str, duration: float, *, rejected: str | None = None) -> None:
        """A failed scrape; ``rejected`` names why the page itself was refused (see promtext)."""
        with self._lock:
            if rejected is not None:
                self.rejected[rejected] = self.rejected.get(rejected, 0) + 1
            self.up = False
            self.scrapes += 1
            self.duration_seconds = duration
            self.last_error = error
            self.last_error_at = self._clock()

    def history(self, since: float) -> list[tuple[float, EngineSnapshot]]:
        """The successful scrapes since ``since`` (wall clock), oldest first, none across a reset."""
        with self._lock:
            return [(at, snap) for at, snap in self._history if at >= since]

    def view(self) -> dict[str, object]:
        """A consistent copy for the collector."""
        with self._lock:
            return {
                "up": self.up,
                "scrapes": self.scrapes,
                "duration": self.duration_seconds,
                "resets": self.counter_resets,
                "accumulated": dict(self.accumulated),
                "has": {n: n in self._previous for n in ACCUMULATED},
                "last_error_at": self.last_error_at,
                "last_success": self.last_success,
                "rejected": dict(self.rejected),
                "non_finite": self.non_finite,
            }


def _series(snapshot: EngineSnapshot, name: str) -> dict[object, float] | None:
    """Series values behind one counter field (the field total when no series are recorded)."""
    series = snapshot.series.get(name) if snapshot.series else None
    if series:
        return dict(series)
    value = getattr(snapshot, name)
    return None if value is None else {"": float(value)}


class ScrapeLoop:
    """Scrapes one pool every ``interval`` seconds until stopped; never raises out of the loop."""

    def __init__(
        self,
        watch: PoolWatch,
        fetch: Fetch,
        *,
        interval: float,
        timeout: float,
        on_snapshot: Callable[[PoolConfig, EngineSnapshot], None] | None = None,
        monotonic: Callable[[], float] = time.perf_counter,
        health: PoolHealth | None = None,
        down_interval: float | None = None,
    ):
        self.watch = watch
        self.name = f"scrape:{watch.pool.name}"
        self._fetch = fetch
        self.interval = interval
        self.timeout = timeout
        self._on_snapshot = on_snapshot
        self._mono = monotonic
        self.health = health
        self.down_interval = min(interval, down_interval) if down_interval else interval
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()  # set by stop() and when the tap marks the pool down
        # One scrape at a time: two pages fetched concurrently can be observed in the other order,
        # and an older page after a newer one reads as a counter reset (its whole value counted).
        self._one_at_a_time = asyncio.Lock()
        if health is not None:
            health.listeners.append(self._on_health)

    async def scrape_once(self) -> bool:
        """One scrape now; True when the pool answered with a page the adapters understood.

        A failure is logged as a warning when the pool goes down, then at debug level while it
        stays down (``specguard_engine_up`` says it anyway); recovery is logged once. Concurrent
        callers (the loop, a caller scraping on demand) take turns.
        """
        async with self._one_at_a_time:
            return await self._scrape()

    async def _scrape(self) -> bool:
        pool = self.watch.pool
        first = self.watch.scrapes == 0
        was_up = self.watch.up
        start = self._mono()
        rejected = None
        answered: bool | None = True  # for the health check: None = no verdict (a slow answer)
        try:
            async with asyncio.timeout(self.timeout):
                snapshot = await self._fetch(pool, self.timeout)
        except asyncio.CancelledError:
            raise
        except (UnreachableError, NotReadyError, aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
            error, answered = str(exc) or type(exc).__name__, False
        except TimeoutError:
            error = f"{pool.display_url}{pool.metrics_path}: timed out after {self.timeout}s"
            answered = None
        except InputError as exc:  # the engine answered, but with a page that is refused
            error, rejected = str(exc), promtext.reject_reason(exc)
        except SpecguardError as exc:
            error = str(exc)
        except Exception as exc:  # a bad page or a socket error must not stop the loop
            error = f"{type(exc).__name__}: {exc}"
        else:
            self.watch.observe(snapshot, self._mono() - start)
            if not was_up and not first:
                log.info("%s: engine answers again", self.name)
            if self._on_snapshot is not None:
                self._on_snapshot(pool, snapshot)
            self._health(True, "")
            return True
        self._health(answered, error)
        self.watch.fail(error, self._mono() - start, rejected=rejected)
        level = logging.WARNING if (was_up or first) else logging.DEBUG
        if rejected is not None:
            log.log(level, "%s: page rejected (%s): %s", self.name, rejected, untrusted.printable(error, 300))
        else:
            log.log(level, "%s: %s", self.name, untrusted.printable(error, 300))
        return False

    def _health(self, answered: bool | None, error: str) -> None:
        if self.health is None or answered is None:
            return
        if answered:
            self.health.mark_up(self.watch.pool.name, "scrape")
        else:
            self.health.mark_down(self.watch.pool.name, error, "scrape")

    def _on_health(self, pool: str, healthy: bool) -> None:
        if pool == self.watch.pool.name and not healthy:
            self._wake.set()  # re-check on the short interval from now, not after the long one

    def _pause(self) -> float:
        healthy = self.health is None or self.health.healthy(self.watch.pool.name)
        return self.interval if healthy else self.down_interval

    async def _sleep(self) -> None:
        """Wait for the next scrape: the interval, or the down interval while the pool is down."""
        deadline = self._mono() + self._pause()
        while not self._stop.is_set():
            left = deadline - self._mono()
            if left <= 0:
                return
            try:
                async with asyncio.timeout(left):
                    await self._wake.wait()
            except TimeoutError:
                return
            self._wake.clear()
            deadline = min(deadline, self._mono() + self._pause())

    async def _run(self) -> None:
        log.info("%s: started (every %ss)", self.name, self.interval)
        while not self._stop.is_set():
            await self.scrape_once()
            await self._sleep()
        log.info("%s: stopped", self.name)

    def start(self) -> None:
        if self._task is None:
            self._stop.clear()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._stop.set()
        self._wake.set()
        task, self._task = self._task, None
        try:
            async with asyncio.timeout(self.timeout + 1.0):
                await task
        except TimeoutError:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
