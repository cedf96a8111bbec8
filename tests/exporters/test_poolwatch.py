"""A pool's recent scrapes (``PoolWatch.history``): the model baseline's engine-page intervals."""

from __future__ import annotations

import asyncio

from specguard.exporters.config import PoolConfig
from specguard.exporters.poolwatch import PoolWatch, ScrapeLoop
from specguard.exporters.snapshot import EngineSnapshot


def test_history_keeps_recent_scrapes_and_forgets_them_across_an_engine_restart():
    now = [100.0]
    watch = PoolWatch(PoolConfig("nospec", "http://a"), clock=lambda: now[0])
    for value in (10.0, 20.0, 30.0):
        watch.observe(EngineSnapshot(engine="vllm", generation_tokens=value), 0.01)
        now[0] += 15
    assert [snap.generation_tokens for _, snap in watch.history(since=110.0)] == [20.0, 30.0]
    watch.observe(EngineSnapshot(engine="vllm", generation_tokens=5.0), 0.01)  # counter went back
    assert [snap.generation_tokens for _, snap in watch.history(since=0.0)] == [5.0]


async def test_concurrent_scrapes_take_turns_so_an_older_page_never_reads_as_a_reset():
    """The loop's first scrape and an on-demand one overlap; the slower, older page must not land
    after the newer one (it would count as a counter reset and add the counter's whole value)."""
    pages = [(0.2, 1000.0), (0.0, 1059.0)]  # (seconds the engine takes to answer, drafts on the page)

    async def fetch(pool, timeout):
        delay, drafts = pages.pop(0)
        await asyncio.sleep(delay)
        return EngineSnapshot(engine="vllm", drafts=drafts)

    watch = PoolWatch(PoolConfig("spec", "http://a"))
    loop = ScrapeLoop(watch, fetch, interval=3600, timeout=5)
    assert await asyncio.gather(loop.scrape_once(), loop.scrape_once()) == [True, True]
    assert watch.counter_resets == 0
    assert watch.view()["accumulated"]["drafts"] == 59.0
