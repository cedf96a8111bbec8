"""A pool SIGKILLed during load: its traffic fails over within a request, comes back by itself.

The no-spec pool runs as its own ``specguard simulate`` process and is killed with SIGKILL while
a class planned onto it (creative/high) and a holdout share of every other class
are in flight; it is started again on the same port a few seconds later. Checked: only requests
already in flight on the dead pool fail; nothing sent after it was marked down fails; the plan
is unchanged while ``/status``, the metrics and the health say what happened; the pool gets its
traffic back once it answers, without anyone touching the plan.
"""

from __future__ import annotations

import random

from prometheus_client import generate_latest

from specguard.lab import failover, loadgen
from specguard.monitor import config, guard_wiring
from specguard.monitor.app import Monitor
from specguard.sim import cluster

TIME_SCALE = 0.05
DOWN_INTERVAL = 0.2
CONCURRENCY = 8
MIX = [
    loadgen.RequestClass("creative", temperature=1.0, max_tokens=24),
    loadgen.RequestClass("code", temperature=0.0, max_tokens=24),
]


def monitor_config(spec_url: str, nospec_url: str):
    return config.parse_text(
        f"""
pools:
  - {{name: spec-k4, url: "{spec_url}", engine: vllm, num_speculative_tokens: 4}}
  - {{name: nospec, url: "{nospec_url}", engine: vllm, num_speculative_tokens: 0}}
tap: {{holdout_share: 0.2, probe_share: 0.2, default_pool: spec-k4, nospec_pool: nospec,
      connect_timeout_seconds: 2}}
scrape: {{interval_seconds: 3600, timeout_seconds: 1, down_interval_seconds: {DOWN_INTERVAL}}}
guard: {{interval_seconds: 3600}}
server: {{insecure_loopback: true}}
""",
        "failover.yaml",
    )


async def test_a_pool_killed_during_load_fails_over_and_comes_back():
    victim = failover.SimVictim("nospec", time_scale=TIME_SCALE)
    await victim.start()
    try:
        async with cluster.SimCluster.from_config(
            None, seed=0, time_scale=TIME_SCALE, pools=["spec-k4"]
        ) as sim:
            cfg = monitor_config(sim.urls["spec-k4"], victim.url)
            monitor = Monitor(cfg, rng=random.Random(3))
            guard, _ = guard_wiring.build(monitor, cfg)
            url = await monitor.start("127.0.0.1", 0)
            await guard.evaluate()  # every configured class gets its state (and a /status row)
            await guard.override("pin", "creative", "high", pool="nospec", reason="planned onto nospec")
            plan = monitor.router.plan()
            statuses = []
            monitor.health.listeners.append(lambda pool, healthy: statuses.append(guard.status()))
            try:
                outcome = await failover.kill_during_load(
                    monitor,
                    url,
                    victim,
                    MIX,
                    concurrency=CONCURRENCY,
                    before_s=1.5,
                    down_s=2,
                    after_s=1.5,
                    max_down_s=10,  # (and the load stays on until the pool served again)
                )
                text = generate_latest(monitor.registry).decode()
            finally:
                await monitor.stop()
    finally:
        await victim.stop()
    print("failover outcome:", outcome.to_json())  # shown with -s

    # 1. at most the requests in flight on the dead pool failed; none sent after it was marked down
    assert outcome.requests > 100
    assert outcome.failed <= CONCURRENCY, outcome.errors
    assert outcome.failed_after_failover == 0, outcome.errors
    # 2. marked down while it was dead (by the first failed connect), back once it answered
    assert outcome.time_to_failover_s is not None and outcome.time_to_failover_s < 2
    assert outcome.time_back_s is not None and outcome.time_back_s <= 10 * DOWN_INTERVAL
    assert outcome.failover_requests > 0
    assert outcome.served_by["nospec"] > 0 and outcome.served_by["spec-k4"] > 0
    # 3. nothing was sent to the dead pool while it was down: no holdout, no plan, no probe
    records = monitor.stats.records()
    # the victim's first change is down (by its in-flight requests' resets, which may eject it
    # first, or by a failed connect), its first change after that back up
    victim = [status["pools"][1] for status in statuses]
    down = next(i for i, row in enumerate(victim) if not row["healthy"])
    up = next(i for i in range(down, len(victim)) if victim[i]["healthy"])
    down_at, up_at = victim[down]["since"], victim[up]["since"]
    during = [r for r in records if down_at < r.started_at < up_at]
    assert during and {r.pool for r in during} == {"spec-k4"}
    assert {r.route for r in during} <= {"plan", "failover", "probe"}
    assert [r for r in records if r.started_at > up_at and r.pool == "nospec"]  # traffic is back
    # 4. the plan never changed; /status and the metrics showed the override while it lasted
    assert monitor.router.plan() == plan and plan[("creative", "high", "low")] == "nospec"
    down_status, up_status = statuses[up - 1], statuses[up]  # its last word while down; back
    assert [p["healthy"] for p in down_status["pools"]] == [True, False]
    # its reason: the tap's failed connect or the health scrape's, whichever saw the dead pool last
    reason = down_status["pools"][1]["reason"]
    assert reason.startswith("connect failed") or ": unreachable: connection refused" in reason, reason
    failing_over = {
        (c["task_type"], c["temperature_bucket"]) for c in down_status["classes"] if c["failover"]
    }
    assert failing_over == {("creative", "high")}
    assert all(p["healthy"] for p in up_status["pools"])
    assert not any(c["failover"] for c in up_status["classes"])
    assert 'specguard_pool_healthy{pool="nospec"} 1.0' in text
    assert (
        f'specguard_failover_requests_total{{pool="nospec",to_pool="spec-k4"}} {outcome.failover_requests}.0'
        in text
    )
