"""Fleet shapes (``lab.shapes``): fixed pools never move; autoscaled pools follow an HPA rule with a
start delay and a scale-down stabilisation window, within a budget (``lab.fleet``, ``lab.autoscale``)."""

from __future__ import annotations

import pytest

from specguard.errors import ConfigError
from specguard.lab import autoscale, replay, scenario, shapes
from specguard.lab import fleet as fleet_mod
from specguard.lab import replay_policies as rp
from specguard.monitor import config as monitor_config
from specguard.sim import config as sim_config

SIM = sim_config.load()
POOLS = ["spec-k4", "spec-k2", "nospec"]


def request(f: fleet_mod.Fleet, pool: str, n: int):
    return f.engine_for(pool).new_request(task="chat", temperature=0.7, key=f"{pool}/{n}", ignore_eos=True)


def test_named_and_listed_fixed_fleets_and_one_pool_of_all_their_engines():
    shape = shapes.build("fixed", POOLS)
    assert shape.replicas == {"spec-k4": 2, "spec-k2": 1, "nospec": 1} and shape.size == 4
    assert shapes.build("fixed", POOLS, replicas="3xK4+1xnospec").pools == ("spec-k4", "nospec")
    assert shapes.build("fixed", POOLS, replicas="spec-k4=6,nospec=2").size == 8
    assert shape.single("nospec").replicas == {"nospec": 4}  # never-speculate gets every engine
    auto = shapes.build("autoscaled", POOLS)
    assert auto.replicas == dict.fromkeys(POOLS, 1) and auto.engines == 8
    assert auto.single("spec-k4").replicas == {"spec-k4": 3}  # the same floor and budget as one pool
    with pytest.raises(ConfigError, match="not configured"):
        shapes.build("fixed", POOLS, replicas="spec-k8=2")
    with pytest.raises(ConfigError, match="POOL=COUNT"):
        shapes.build("fixed", POOLS, replicas="spec-k4:2")
    with pytest.raises(ConfigError, match="--fleet"):
        shapes.build("autoscaled", POOLS, engines=2)


def test_a_fixed_fleet_never_moves_an_engine():
    f = fleet_mod.Fleet(SIM, POOLS, 0, seed=0, shape=shapes.build("fixed", POOLS))
    for i in range(40):
        f.place("spec-k4", request(f, "spec-k4", i), float(i))
    assert [s.pool for s in f.slots] == ["spec-k4", "spec-k4", "spec-k2", "nospec"]
    assert [s.load for s in f.slots] == [20, 20, 0, 0] and f.stats.reconfigurations == 0


def test_the_hpa_rule_tolerance_scale_up_cap_and_stabilisation_window():
    hpa = autoscale.Recommender(16, 300)
    assert hpa.raw("a", 17, 1) == 1  # within 10% of the target: no change
    assert hpa.desired("a", 200, 1, 0.0) == 5  # at most max(100%, 4 pods) more per sync
    assert hpa.desired("a", 200, 5, 15.0) == 10  # 100% of 5
    assert hpa.desired("a", 16, 10, 30.0) == 10  # a dip: the window's highest recommendation holds
    assert hpa.desired("a", 16, 10, 316.0) == 1  # the window has passed


def test_an_autoscaled_pool_waits_for_its_new_replicas_and_keeps_the_budget():
    shape = shapes.FleetShape(shapes.AUTOSCALED, dict.fromkeys(POOLS, 1), 5, target_in_flight=16)
    f = fleet_mod.Fleet(SIM, POOLS, 0, seed=0, shape=shape)
    placed = [f.place("spec-k4", request(f, "spec-k4", i), 0.0) for i in range(60)]
    ready = f.autoscale(15.0)  # 60 in flight: 4 wanted, the budget of 5 leaves room for 2
    assert ready == [135.0, 135.0] and f.replicas() == dict.fromkeys(POOLS, 1)
    f.place("spec-k4", request(f, "spec-k4", 99), 100.0)
    assert len(f.engines_of("spec-k4")) == 1  # starting replicas take no request yet
    f.activate(135.0)
    assert f.replicas()["spec-k4"] == 3 and f.place("spec-k4", request(f, "spec-k4", 100), 135.0).index != 0
    for slot in placed:  # the load goes; the window keeps the replicas for 300 s
        f.release(slot, 140.0)
    f.autoscale(150.0)
    assert f.replicas()["spec-k4"] == 3
    f.autoscale(451.0)
    assert sum(1 for s in f.slots if s.pool == "spec-k4" and not s.leaving) == 1
    assert f.stats.scale_ups == 2 and f.stats.scale_downs == 2
    assert sum(1 for s in f.slots if s.pool is not None) <= 5


def test_an_autoscaled_replay_serves_on_new_replicas_only_after_the_start_delay():
    cfg = monitor_config.load_default()
    buckets = replay.Buckets.from_classes(cfg.exporter.classes)
    loads = (scenario.ClassLoad("chat", 64, ((0.7, 1.0),)),)
    scen = scenario.Scenario("step", (scenario.Phase("busy", 200.0, loads),))
    shape = shapes.FleetShape(shapes.AUTOSCALED, {"spec-k4": 1}, 4, target_in_flight=16)
    result = replay.Replay(SIM, scen, rp.StaticPolicy("k4", "spec-k4"), buckets, seed=0, shape=shape).run()
    timeline = result.fleet_stats.timeline
    assert timeline[0] == (0.0, {"spec-k4": 1})
    assert timeline[1] == (135.0, {"spec-k4": 4})  # the first sync at 15 s, plus the 120 s start delay
    assert result.mean_engines == pytest.approx((4 * 200 - 3 * 15) / 200)  # allocated from 15 s on


def test_a_replica_scaled_down_leaves_when_its_last_request_is_done():
    """Load falls after a scale-up: past the stabilisation window the extra replicas leave, those
    still serving once their last request finished (the step that finished it starts no other)."""
    cfg = monitor_config.load_default()
    buckets = replay.Buckets.from_classes(cfg.exporter.classes)
    busy, quiet = (scenario.ClassLoad("chat", n, ((0.7, 1.0),)) for n in (64, 2))
    scen = scenario.Scenario(
        "down", (scenario.Phase("busy", 200.0, (busy,)), scenario.Phase("quiet", 400.0, (quiet,)))
    )
    shape = shapes.FleetShape(shapes.AUTOSCALED, {"spec-k4": 1}, 4, target_in_flight=16, stabilization_s=60)
    result = replay.Replay(SIM, scen, rp.StaticPolicy("k4", "spec-k4"), buckets, seed=0, shape=shape).run()
    counts = [c["spec-k4"] for _, c in result.fleet_stats.timeline]
    assert max(counts) == 4 and counts[-1] == 1 and result.fleet_stats.scale_downs == 3
    assert len(result.finished) > 0 and all(f.output_tokens > 0 for f in result.finished)
