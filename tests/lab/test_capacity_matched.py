"""Capacity-matched holdout in a simulator fleet: the no-spec replica runs at the speculative load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard.lab import replay, scenario
from specguard.lab import replay_policies as rp
from specguard.monitor import config as monitor_config
from specguard.rules import policy as policy_mod
from specguard.rules.cost_config import CostSettings
from specguard.sim import config as sim_config


def fleet(holdout: str, seconds: float = 180.0) -> tuple[dict[str, list[float]], rp.SpecguardPolicy]:
    """1 no-spec and 3 speculative (K=4) replicas, 80 closed-loop clients of every task type, the
    shipped guard policy (timers x1/3) with ``holdout``; returns each engine's mean load."""
    cfg = monitor_config.load_default()
    pools = tuple(
        replace(p, replicas=3) if p.name == "spec-k4" else p
        for p in cfg.exporter.pools
        if p.name != "spec-k2"
    )
    exporter = replace(cfg.exporter, pools=pools)
    policy = replace(policy_mod.load_default(), holdout=holdout)
    settings = CostSettings().with_traffic(
        exporter.classes.load_buckets, exporter.tap.full_rollback_request_threshold
    )
    guard = rp.SpecguardPolicy(exporter, rp.scaled_policy(policy, 1 / 3), settings, seed=3)
    loads = scenario._loads(24, 16, 24, 16)
    scen = scenario.Scenario(
        "fleet", (scenario.Phase("warm", 60, loads), scenario.Phase("steady", seconds, loads))
    )
    run = replay.Replay(
        sim_config.load(),
        scen,
        guard,
        replay.Buckets.from_classes(exporter.classes),
        seed=3,
        pools=["spec-k4", "nospec"],
        replicas={"spec-k4": 3, "nospec": 1},
        fixed=True,
    )
    run.run()
    return run.mean_loads(), guard


def test_capacity_matched_runs_the_nospec_replica_at_the_speculative_replicas_load():
    loads, guard = fleet("capacity_matched")
    spec = sum(loads["spec-k4"]) / 3
    nospec = loads["nospec"][0]
    assert spec > 16  # medium load: 80 clients over 4 replicas
    assert nospec == pytest.approx(spec, rel=0.15), loads
    # so the live baseline exists at every load bucket the speculative replicas ran at
    records = guard.stats.records()
    nospec_buckets = {r.load_bucket for r in records if r.pool == "nospec"}
    assert "medium" in nospec_buckets
    assert {r.load_bucket for r in records if r.pool == "spec-k4"} <= nospec_buckets
    costs = [c for c in guard.last_costs if c.load_bucket == "medium" and c.n_spec]
    assert costs and {c.baseline_source for c in costs} == {"live"}
