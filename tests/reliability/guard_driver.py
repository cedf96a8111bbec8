"""A guard that writes its plan and audit log as fast as it can, to be killed with SIGKILL.

    python -m tests.reliability.guard_driver PLAN AUDIT [CLASSES]

Every evaluation flips the evidence of every class (bad, good, bad...) under a policy with no
limits, cooldown or cap, so each round changes the plan of every class: one audit batch and one
plan write per round. Prints ``ready <plan version>`` after loading, then ``round <version>``
per round. Stops by itself after 60 s if nobody kills it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import replace

from specguard.exporters.config import PoolConfig
from specguard.exporters.routing import Router
from specguard.monitor import actuators, daemon
from specguard.monitor import audit as audit_mod
from specguard.monitor import state as state_mod
from specguard.rules import policy as policy_mod
from specguard.rules.evidence import Evidence, PoolEvidence

POOLS = [
    PoolConfig("spec-k4", "http://127.0.0.1:1", num_speculative_tokens=4),
    PoolConfig("nospec", "http://127.0.0.1:3", num_speculative_tokens=0),
]
LIMITS = policy_mod.Limits(
    consecutive_failure_limit=0,
    failure_limit=-1,
    consecutive_success_limit=1,
    consecutive_error_limit=2,
    stabilization_window_seconds=0,
    min_samples=1,
    interval_seconds=1,
)
POLICY = policy_mod.Policy(
    rules=(policy_mod.Rule("relative-cost", "rc", threshold=1.0, restore_threshold=0.95, limits=LIMITS),),
    cooldown_seconds=0,
    max_actions_per_hour=-1,
    shorten=False,
    alerts=policy_mod.AlertsPolicy(enabled=False, limits=replace(LIMITS)),
    version="driver",
).with_pools({p.name: p.num_speculative_tokens for p in POOLS}, "spec-k4", "nospec")


class Flipping:
    def __init__(self, keys):
        self.keys = keys

    async def collect(self, now, keys):
        # the class's current pool decides: on spec-k4 it looks bad, on nospec it looks good again
        # (certain measurements: the interval is the point, which the rules read as their bounds)
        def pool(rc: float) -> PoolEvidence:
            return PoolEvidence("spec-k4", {"rc": rc, "rc_lower": rc, "rc_upper": rc}, samples=50)

        return {key: Evidence(pools={"spec-k4": pool(1.5 if self.bad(key) else 0.5)}) for key in self.keys}

    bad = None  # set by main


async def main(plan: str, audit: str, classes: int) -> None:
    keys = [(f"task{i:03d}", "high", "low") for i in range(classes)]
    source = Flipping(keys)
    router = Router(POOLS, default_pool="spec-k4", nospec_pool="nospec")
    guard = daemon.Guard(
        POLICY,
        sources=[source],
        actuators=[actuators.RouterActuator(router)],
        store=state_mod.PlanStore(plan),
        audit=audit_mod.AuditLog(audit),
        keys=keys,
        temperature_buckets=["high"],
        load_buckets=["low"],
        clock=lambda: now,
    )
    source.bad = lambda key: guard.states.get(key) is None or guard.states[key].pool == "spec-k4"
    now = 1_000_000.0 + guard.version * 10
    print(f"ready {guard.version} torn={guard.audit.torn_lines}", flush=True)
    stop = time.monotonic() + 60
    while time.monotonic() < stop:
        await guard.evaluate(now)
        print(f"round {guard.version}", flush=True)
        now += 10


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 200))
