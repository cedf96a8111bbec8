"""The default setup against two real vLLM engines: the shipped default config (its load buckets,
its guard policy with its ``matched_on_demand`` holdout, no calibration profile) and 36 concurrent clients.
Within 5 minutes every load bucket carrying speculative traffic exports an RC on a live
baseline: where a bucket's live baseline is short the no-spec engine is filled to the
speculative engine's load, so the baseline there is live.

Real time (the engines cannot be sped up): the guard evaluates every 30 s as shipped; the test
stops as soon as the buckets are covered (about a minute on a 2-core machine).
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

import aiohttp
import pytest
from vllmkit import LOOP_PROMPT, NUM_SPECULATIVE_TOKENS

from specguard.lab import loadgen
from specguard.monitor import config, control_auth, guard_wiring
from specguard.monitor.app import Monitor

pytestmark = pytest.mark.vllm

CLIENTS = 36
DEADLINE_SECONDS = 300.0
ROUND_SECONDS = 15.0
MIX = [
    loadgen.RequestClass("code", 1, 0.0, max_tokens=32, prompt_tokens=len(LOOP_PROMPT) // 4, chat=False),
    loadgen.RequestClass("creative", 1, 1.0, max_tokens=32, prompt_tokens=20, chat=False),
]


def default_config(engines) -> config.SpecguardConfig:
    """The shipped config with its pools replaced by the two engines (spec-k2 has no engine here)."""
    cfg = config.load_default()
    ex = cfg.exporter
    urls = {"spec-k4": engines.spec.url, "nospec": engines.nospec.url}
    pools = tuple(replace(p, url=urls[p.name]) for p in ex.pools if p.name in urls)
    assert pools[0].num_speculative_tokens == NUM_SPECULATIVE_TOKENS
    ex = replace(ex, pools=pools, tap=replace(ex.tap, listen="127.0.0.1:0"))
    return replace(cfg, exporter=ex, file="<default-config>")


async def test_default_config_gives_rc_with_a_baseline_at_every_load_bucket_on_real_engines(vllm_engines):
    cfg = default_config(vllm_engines)
    monitor = Monitor(cfg, rng=random.Random(5))
    guard = guard_wiring.configure(monitor, cfg)
    url = await monitor.start("127.0.0.1", 0)
    # no credential configured: the operator token specguard makes at start reads /status
    token = control_auth.generated_token_path(monitor.control_port).read_text().strip()
    operator = {"Authorization": f"Bearer {token}"}
    covered: dict[str, set[str]] = {}
    try:
        start = time.monotonic()
        async with aiohttp.ClientSession() as session:
            while time.monotonic() - start < DEADLINE_SECONDS:
                results = await loadgen.run_load(
                    url, MIX, CLIENTS, duration_s=ROUND_SECONDS, stream=True, seed=3
                )
                assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
                traffic = {r.load_bucket for r in monitor.stats.records() if r.pool == "spec-k4"}
                async with session.get(f"{monitor.control_url}/status", headers=operator) as response:
                    status = await response.json()
                evaluated = status["last_evaluation"]
                rows = [
                    c
                    for c in guard_costs(monitor)
                    if c.n_spec and c.rc is not None and c.evaluated_at == evaluated
                ]
                covered = {b: {c.baseline_source for c in rows if c.load_bucket == b} for b in traffic}
                if traffic and all("live" in sources for sources in covered.values()):
                    break  # (a model baseline first, the live one once nospec was filled to that load)
            elapsed = time.monotonic() - start
            async with session.get(f"{url}/metrics") as response:
                metrics = await response.text()
    finally:
        await monitor.stop()
    assert covered and all("live" in sources for sources in covered.values()), covered
    assert elapsed <= DEADLINE_SECONDS
    assert "medium" in covered  # 36 clients over one speculative and one no-spec engine: 18 each
    assert "specguard_relative_cost_baseline_info{" in metrics and 'source="live"' in metrics
    nospec = {r.load_bucket for r in monitor.stats.records() if r.pool == "nospec"}
    assert set(covered) <= nospec  # the baseline is live: the no-spec engine ran at those loads
    assert guard.policy.holdout == "matched_on_demand"


def guard_costs(monitor):
    from specguard.monitor.cost_metrics import CostCollector

    collector = next(c for c in monitor.registry._collector_to_names if isinstance(c, CostCollector))
    return collector.costs
