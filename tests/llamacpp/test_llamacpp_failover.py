"""A real llama-server SIGKILLed during load: its traffic fails over, and comes back when it does.

A third server (``victim``: the same model, no speculation) is started for this test alone, a
class is planned onto it, and it is killed (SIGKILL to its process group) while load runs through
the tap, then started again on the same port. Only the requests in flight on it may fail; nothing
sent after it was marked down fails; the class is served by the real no-spec server meanwhile and
goes back to the victim once it answers.
"""

from __future__ import annotations

import asyncio
import os
import random

import llamacppkit as kit
import pytest

from specguard.lab import failover, loadgen
from specguard.monitor import config
from specguard.monitor.app import Monitor

pytestmark = pytest.mark.llamacpp

CONCURRENCY = 4
DOWN_INTERVAL = 0.5
MIX = [
    loadgen.RequestClass("creative", temperature=1.0, max_tokens=16, prompt_tokens=20, prompts="task"),
    loadgen.RequestClass("code", temperature=0.0, max_tokens=16, prompt_tokens=40, prompts="task"),
]


class LlamacppVictim:
    """A no-speculation llama-server of this test's own, on a fixed port, killed with SIGKILL."""

    pool = "victim"

    def __init__(self, logdir):
        self.logdir = logdir
        self.port = kit.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: kit.Server | None = None
        self.starts = 0

    async def restart(self) -> None:
        self.starts += 1
        cpu = sorted(os.sched_getaffinity(0))[-1]
        self.server = kit.start(f"victim-{self.starts}", self.logdir, cpu, 0, port=self.port)
        await asyncio.to_thread(kit.wait_healthy, self.server)

    async def kill(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(kit.kill, self.server)

    def stop(self) -> None:
        if self.server is not None:
            kit.stop(self.server)


async def test_a_real_server_killed_during_load_fails_over_and_comes_back(llamacpp_servers, tmp_path):
    servers = llamacpp_servers
    victim = LlamacppVictim(tmp_path)
    await victim.restart()
    try:
        cfg = config.parse_text(
            f"""
pools:
  - {{name: spec, url: "{servers.spec.url}", engine: llamacpp, num_speculative_tokens: {kit.K}}}
  - {{name: nospec, url: "{servers.nospec.url}", engine: llamacpp, num_speculative_tokens: 0}}
  - {{name: victim, url: "{victim.url}", engine: llamacpp, num_speculative_tokens: 0}}
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
                monitor,
                url,
                victim,
                MIX,
                concurrency=CONCURRENCY,
                before_s=4,
                down_s=3,
                after_s=4,
                back_timeout_s=60,
            )
        finally:
            await monitor.stop()
    finally:
        victim.stop()
    print("real llama.cpp failover outcome:", outcome.to_json())  # shown with -s

    assert outcome.failed <= CONCURRENCY, outcome.errors  # at most the requests in flight on it
    assert outcome.failed_after_failover == 0, outcome.errors
    assert outcome.time_to_failover_s is not None and outcome.time_to_failover_s < 3  # (down_s)
    assert outcome.time_back_s is not None and outcome.time_back_s <= 10 * DOWN_INTERVAL
    assert outcome.failover_requests > 0
    assert outcome.served_by.get("victim", 0) > 0 and outcome.served_by.get("nospec", 0) > 0
    moved = [r for r in monitor.stats.records() if r.route == "failover"]
    assert moved and {(r.task_type, r.pool) for r in moved} == {("creative", "nospec")}  # nearest K: 0
