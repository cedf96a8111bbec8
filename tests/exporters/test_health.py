"""Pool health: marked down by a failed connect (tap or scrape), up by any answer, re-checked fast."""

from __future__ import annotations

import asyncio
import functools
import logging

import pytest

from specguard.errors import SourceError, UnreachableError
from specguard.exporters.config import PoolConfig
from specguard.exporters.health import EjectPolicy, PoolHealth
from specguard.exporters.poolwatch import PoolWatch, ScrapeLoop
from specguard.exporters.snapshot import EngineSnapshot

POOL = PoolConfig("nospec", "http://127.0.0.1:1", "vllm", 0)


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_down_then_up_with_the_reason_and_one_notification_each(caplog):
    clock = Clock()
    health = PoolHealth(["spec", "nospec"], clock=clock)
    changes = []
    health.listeners.append(lambda pool, healthy: changes.append((pool, healthy)))
    with caplog.at_level(logging.WARNING, "specguard.health"):
        assert health.mark_down("nospec", "connect failed: refused", "tap")
        assert not health.mark_down("nospec", "again", "scrape")  # already down: no news
        clock.now = 112.5
        assert health.mark_up("nospec", "scrape")
        assert not health.mark_up("nospec", "tap")
    assert changes == [("nospec", False), ("nospec", True)]
    assert "pool nospec marked down (tap: connect failed: refused)" in caplog.text
    assert "after 12.5 s down" in caplog.text
    assert not health.mark_down("ghost", "x", "tap") and health.healthy("ghost")


def test_a_dead_pool_is_down_either_way_and_serves_again_as_soon_as_it_answers():
    """A killed engine's requests in flight break after (or before) its first failed connect:
    the resets eject nothing once it is down, and an ejection they caused before is dropped by the
    failed connect, so the restarted engine serves at its first answer, not after an interval."""
    for resets_first in (False, True):
        health = PoolHealth(["spec", "nospec"], eject=EjectPolicy(consecutive=3, seconds=30))
        changes: list[bool] = []
        health.listeners.append(functools.partial(lambda seen, pool, healthy: seen.append(healthy), changes))
        if resets_first:
            assert [health.answered("nospec", True, "reset") for _ in range(3)] == [False, False, True]
        assert health.mark_down("nospec", "connect failed: refused", "tap")
        assert not any(health.answered("nospec", True, "reset") for _ in range(5))
        assert not health.healthy("nospec")
        assert health.mark_up("nospec", "scrape") and health.healthy("nospec")
        assert changes[-1] is True and health.state("nospec").until is None


def test_status_lists_every_pool_with_its_failovers():
    health = PoolHealth(["spec", "nospec"], clock=Clock())
    health.mark_down("nospec", "refused", "tap")
    health.count_failover("nospec", "spec")
    health.count_failover("nospec", "spec")
    assert health.status() == [
        {
            "pool": "spec",
            "healthy": True,
            "since": None,
            "reason": None,
            "source": None,
            "ejected_until": None,
            "ejections": 0,
            "failover_requests": {},
        },
        {
            "pool": "nospec",
            "healthy": False,
            "since": 100.0,
            "reason": "refused",
            "source": "tap",
            "ejected_until": None,
            "ejections": 0,
            "failover_requests": {"spec": 2},
        },
    ]


class Fetch:
    """A scrape whose outcome the test sets; counts the calls."""

    def __init__(self):
        self.calls = 0
        self.outcome: BaseException | None = None

    async def __call__(self, pool, timeout):
        self.calls += 1
        if self.outcome is not None:
            raise self.outcome
        return EngineSnapshot(engine="vllm")


@pytest.mark.parametrize(
    ("error", "healthy"),
    [
        pytest.param(
            UnreachableError("http://x/metrics: unreachable: connection refused"), False, id="refused"
        ),
        pytest.param(ConnectionRefusedError(111, "refused"), False, id="refused-raw"),
        pytest.param(SourceError("http://x/metrics: HTTP 404 Not Found"), True, id="answers-404"),
        pytest.param(TimeoutError(), None, id="slow: no verdict"),
    ],
)
async def test_a_scrape_marks_the_pool_by_whether_anything_answered(error, healthy):
    health = PoolHealth(["nospec"])
    fetch = Fetch()
    loop = ScrapeLoop(PoolWatch(POOL), fetch, interval=60, timeout=0.5, health=health)
    fetch.outcome = error
    assert not await loop.scrape_once()
    expected = True if healthy is None else healthy
    assert health.healthy("nospec") is expected
    if healthy is None:  # a slow page does not bring a down pool back either
        health.mark_down("nospec", "refused", "tap")
        await loop.scrape_once()
        assert not health.healthy("nospec")
    fetch.outcome = None
    assert await loop.scrape_once()
    assert health.healthy("nospec")


async def test_a_pool_the_tap_marks_down_is_rechecked_on_the_short_interval():
    health = PoolHealth(["nospec"])
    fetch = Fetch()
    loop = ScrapeLoop(PoolWatch(POOL), fetch, interval=3600, timeout=0.5, health=health, down_interval=0.05)
    loop.start()
    try:
        while fetch.calls < 1:
            await asyncio.sleep(0.01)
        fetch.outcome = UnreachableError("refused")
        health.mark_down("nospec", "connect failed: refused", "tap")  # what the tap does
        while fetch.calls < 4:  # re-checked every 0.05 s, not once an hour
            await asyncio.sleep(0.01)
        assert not health.healthy("nospec")
        fetch.outcome = None  # the engine is back
        while not health.healthy("nospec"):
            await asyncio.sleep(0.01)
        calls = fetch.calls
        await asyncio.sleep(0.3)
        assert fetch.calls == calls  # serving again: back on the long interval
    finally:
        await asyncio.wait_for(loop.stop(), 5)


async def test_a_cancelled_scrape_is_never_swallowed():
    """Python 3.11's ``asyncio.wait_for`` drops a cancellation that lands as the scrape completes
    (the task then scrapes on for ever and whoever cancelled it waits for ever); every scrape is
    now bounded by ``asyncio.timeout``, which never does. Cancelled at many points of the cycle."""

    async def fetch(pool, timeout):
        await asyncio.sleep(0)  # one trip through the loop, as a page rejected at once takes
        raise UnreachableError("refused")

    loop = ScrapeLoop(PoolWatch(POOL), fetch, interval=3600, timeout=0.5)
    for i in range(300):

        async def scrapes():
            while True:
                await loop.scrape_once()

        task = asyncio.create_task(scrapes())
        for _ in range(i % 7):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2)
        assert done, f"cancelled scrape task {i} never stopped"
