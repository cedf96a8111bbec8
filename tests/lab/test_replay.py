"""The virtual-time replay: equal capacity (lab.fleet) and scenario phases as written."""

from __future__ import annotations

from collections import Counter

from specguard.lab import replay
from specguard.lab import replay_policies as rp
from specguard.lab import scenario as sc
from specguard.monitor import config as monitor_config
from specguard.sim import config as sim_config

SIM = sim_config.load()
BUCKETS = replay.Buckets.from_classes(monitor_config.load_default().exporter.classes)


def replayed(scenario: sc.Scenario, policy, fleet: int = 3, **kwargs) -> replay.ReplayResult:
    return replay.Replay(SIM, scenario, policy, BUCKETS, seed=0, fleet=fleet, **kwargs).run()


def test_two_loads_of_one_task_type_in_a_phase_are_both_replayed():
    """A replay once kept only the last load of a task type in a phase."""
    phase = sc.Phase(
        "mixed",
        40.0,
        (sc.ClassLoad("code", 2, ((0.0, 1.0),)), sc.ClassLoad("code", 3, ((1.0, 1.0),))),
    )
    result = replayed(sc.Scenario("two-loads", (phase,)), rp.StaticPolicy("k4", "spec-k4"))
    first_requests = Counter(f.temperature for f in result.finished if f.started == 0.0)
    assert first_requests == {0.0: 2, 1.0: 3}  # 5 closed-loop clients, each load's own temperature
    assert {f.temperature for f in result.finished} == {0.0, 1.0}


def test_splitting_traffic_over_identical_pools_buys_no_capacity():
    """Each pool once had its own ``fleet`` engines, so a copy of spec-k4 gave +9% throughput."""
    sim = sim_config.load()
    copy = sim_config.PoolConfig("spec-k4-copy", 4, sim.pool("spec-k4").max_num_seqs)
    sim = sim_config.SimConfig(**{**vars(sim), "pools": (*sim.pools, copy)})
    loads = tuple(
        sc.ClassLoad(task, 12, ((0.0, 1.0),)) for task in ("code", "extraction", "chat", "creative")
    )
    scenario = sc.Scenario("busy", (sc.Phase("busy", 60.0, loads),))
    split = {("code", "greedy"): "spec-k4-copy", ("extraction", "greedy"): "spec-k4-copy"}
    runs = {}
    for name, plan in (("one pool", {}), ("split", split)):
        policy = rp.StaticPolicy(name, "spec-k4", plan)
        runs[name] = replay.Replay(sim, scenario, policy, BUCKETS, seed=0, fleet=3).run()
    tput = {name: sum(r.tokens.values()) for name, r in runs.items()}
    assert tput["split"] <= tput["one pool"] * 1.005
    for result in runs.values():
        assert result.engines == 3 and result.fleet_stats.max_busy <= 3
        assert 2.9 <= result.mean_engines_busy <= 3.0 + 1e-9
