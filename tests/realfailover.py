"""A real engine SIGKILLed during load, shared by the vLLM and llama.cpp tiers: the run through the
tap and what must hold of it.

A third engine (``victim``: the same model, no speculation) has a class planned onto it and is
killed while load runs through the tap, then started again on the same port. Only the requests
in flight on it may fail; nothing sent after it was marked down fails; the class is served by the
real no-spec engine meanwhile and goes back to the victim once it answers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from specguard.lab import failover, loadgen
from specguard.monitor import config
from specguard.monitor.app import Monitor

DOWN_INTERVAL = 0.5  # seconds between probes of a pool marked down


async def kill_during_load(
    engine: str,
    spec_url: str,
    nospec_url: str,
    k: int,
    victim,
    mix: Sequence[loadgen.RequestClass],
    concurrency: int,
    **timing,
):
    """The failover outcome and the tap's records of one kill of ``victim`` (restarted first)."""
    await victim.restart()
    try:
        cfg = config.parse_text(
            f"""
pools:
  - {{name: spec, url: "{spec_url}", engine: {engine}, num_speculative_tokens: {k}}}
  - {{name: nospec, url: "{nospec_url}", engine: {engine}, num_speculative_tokens: 0}}
  - {{name: victim, url: "{victim.url}", engine: {engine}, num_speculative_tokens: 0}}
tap: {{holdout_share: 0.1, probe_share: 0, default_pool: spec, nospec_pool: nospec}}
scrape: {{interval_seconds: 3600, timeout_seconds: 2, down_interval_seconds: {DOWN_INTERVAL}}}
""",
            "failover.yaml",
        )
        monitor = Monitor(cfg, rng=random.Random(5))
        monitor.router.set_plan({("creative", "high", load): "victim" for load in ("low", "medium", "high")})
        url = await monitor.start("127.0.0.1", 0)
        try:
            outcome = await failover.kill_during_load(
                monitor, url, victim, list(mix), concurrency=concurrency, back_timeout_s=60, **timing
            )
        finally:
            await monitor.stop()
    finally:
        victim.stop()
    return outcome, monitor.stats.records()


def assert_failed_over(outcome, records, concurrency: int, down_s: float = 3) -> None:
    """The tap learns of a dead pool from the requests sent to it: it is marked down within the
    time it stays dead (``down_s``, or the experiment's ``max_down_s``) only if requests come."""
    assert outcome.failed <= concurrency, outcome.errors  # at most the requests in flight on it
    assert outcome.failed_after_failover == 0, outcome.errors
    assert outcome.time_to_failover_s is not None and outcome.time_to_failover_s < down_s, outcome
    assert outcome.time_back_s is not None and outcome.time_back_s <= 10 * DOWN_INTERVAL
    assert outcome.failover_requests > 0
    assert outcome.served_by.get("victim", 0) > 0 and outcome.served_by.get("nospec", 0) > 0
    moved = [r for r in records if r.route == "failover"]
    assert moved and {(r.task_type, r.pool) for r in moved} == {("creative", "nospec")}  # nearest K: 0
