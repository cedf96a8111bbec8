"""A pool's recent scrapes (``PoolWatch.history``): the model baseline's engine-page intervals."""

from __future__ import annotations

from specguard.exporters.config import PoolConfig
from specguard.exporters.poolwatch import PoolWatch
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
