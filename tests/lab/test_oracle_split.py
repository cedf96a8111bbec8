"""The oracle on pools that keep their engines (fixed, autoscaled): a class may be split over pools
in shares of one engine's worth, the split is replayed exactly, and the oracle is the best replay of
every hindsight plan, so no other row can beat it.

Why the split: on fixed pools one busy class sent whole to one pool runs on that pool's replicas
only (2 of 4 engines for K=4), where spread over every pool it runs on all four; a plan that routes
each class whole lost to specguard (whose holdout and probes spread a class) by up to 70%.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from specguard.lab import fluid, hindsight, replay, rows, scenario, shapes
from specguard.lab import replay_policies as rp
from specguard.monitor import config as monitor_config
from specguard.rules import policy as policy_mod
from specguard.rules.cost_config import CostSettings
from specguard.sim import config as sim_config

SIM = sim_config.load()
POOLS = ("spec-k4", "spec-k2", "nospec")
CHAT = ("chat", "medium")


def case(kind: str, clients: int, seconds: float = 60.0) -> hindsight.Case:
    cfg = monitor_config.load_default()
    loads = (scenario.ClassLoad("chat", clients, ((0.7, 1.0),)),)
    scen = scenario.Scenario("busy", (scenario.Phase("busy", seconds, loads),))
    shape = shapes.build(kind, list(POOLS))
    return hindsight.Case(
        sim=SIM,
        scenario=scen,
        buckets=replay.Buckets.from_classes(cfg.exporter.classes),
        pools=shape.pools,
        default_pool="spec-k4",
        nospec_pool="nospec",
        fleet=shape.size,
        shape=shape,
    )


def test_a_split_class_sends_each_pool_its_share_exactly():
    """A smooth weighted round robin: every 4 requests, 3 to K=4 and 1 to no-spec, never 2 in a row
    to no-spec."""
    policy = rp.StaticPolicy("split", "spec-k4", {CHAT: (("nospec", 0.25), ("spec-k4", 0.75))})
    picks = [policy.choose(*CHAT, None)[0] for _ in range(400)]
    assert Counter(picks) == {"spec-k4": 300, "nospec": 100}
    assert all(Counter(picks[i : i + 4])["nospec"] == 1 for i in range(0, 400, 4))
    assert policy.choose("code", "greedy", None) == ("spec-k4", "plan")  # not in the plan: the default


def test_the_oracles_moves_shift_one_engines_worth_of_a_class():
    assert fluid.Model.moves("spec-k4", POOLS, None) == ["spec-k2", "nospec"]  # fluid: whole classes
    moves = fluid.Model.moves("spec-k4", POOLS, 0.25)
    assert {"spec-k2", "nospec"} <= set(moves)
    assert (("spec-k2", 0.25), ("spec-k4", 0.75)) in moves and (("nospec", 0.25), ("spec-k4", 0.75)) in moves
    half = (("nospec", 0.5), ("spec-k4", 0.5))
    assert (("nospec", 0.25), ("spec-k4", 0.75)) in fluid.Model.moves(half, POOLS, 0.25)
    assert fluid.assignment({"spec-k4": 1.0, "nospec": 0.0}) == "spec-k4"  # a whole share is the pool


def test_on_fixed_pools_a_busy_class_spread_over_every_engine_beats_any_one_pool():
    """Modelled and replayed: 96 chat clients on the 2 K=4 replicas alone, or spread over all four
    engines (the split the oracle may plan, and the best-static-split candidate starts from)."""
    c = case("fixed", 96)
    model = c.model()
    traffic = hindsight.traffic(c.scenario.phases[0], c.buckets)
    spread = hindsight.spread(c)
    assert spread[CHAT] == (("nospec", 0.25), ("spec-k2", 0.25), ("spec-k4", 0.5))
    whole = {pool: model.evaluate(traffic, {CHAT: pool}, c.default_pool).throughput for pool in c.pools}
    split = model.evaluate(traffic, spread, c.default_pool).throughput
    assert split > 1.2 * max(whole.values())
    best, value = model.best_plan(traffic, c.pools, c.default_pool, quantum=c.quantum)
    assert not isinstance(best[CHAT], str) and value >= split  # the search finds a split
    replayed = {
        name: sum(hindsight.run(c, name, [(0.0, plan)]).tokens.values())
        for name, plan in (("k4", {CHAT: "spec-k4"}), ("spread", spread))
    }
    assert replayed["spread"] > 1.2 * replayed["k4"]


@pytest.mark.parametrize("kind", ["fixed", "autoscaled"])
def test_the_oracle_is_the_best_replay_of_every_plan_so_no_row_beats_it(kind):
    c = case(kind, 48, seconds=40.0)
    assert c.quantum == pytest.approx(1 / c.fleet_shape.size)
    out, winner = rows.rows(c)
    oracle = out["oracle"]["throughput_tokens_per_second"]
    for name, row in out.items():
        assert row["throughput_tokens_per_second"] <= oracle, name
    assert winner.summary["throughput_tokens_per_second"] == oracle
    assert out["oracle"]["routing_plan_tokens_per_second"] <= oracle
    phases = out["oracle"]["routing_plan_phases"]  # the same plan, per phase: they add up to it
    assert [p["name"] for p in phases] == [p.name for p in c.scenario.phases]
    total = sum(
        p["throughput_tokens_per_second"] * ph.duration_s
        for p, ph in zip(phases, c.scenario.phases, strict=True)
    )
    assert total / c.scenario.duration_s == pytest.approx(
        out["oracle"]["routing_plan_tokens_per_second"], rel=0.02
    )
    assert "best_per_phase" not in out  # a pool cannot become another between phases here


def test_specguards_own_routing_replayed_is_its_run_and_a_candidate_of_the_oracle():
    """On an autoscaled fleet the replicas follow the plan, and the per-slice search does not look
    ahead to them: in one matrix run specguard's routing beat every plan the search found by 1.8%.
    So the oracle also replays each specguard run's routing request by request: that replay is the
    run itself (the same request keys get the same pools, so the same tokens), and with it among
    the candidates the oracle bounds specguard by construction."""
    c = case("autoscaled", 48, seconds=40.0)
    cfg = monitor_config.load_default()
    settings = (cfg.sections.get("cost") or CostSettings()).with_traffic(
        cfg.exporter.classes.load_buckets, cfg.exporter.tap.full_rollback_request_threshold
    )
    guard = rp.SpecguardPolicy(cfg.exporter, policy_mod.load_default(), settings, seed=c.seed)
    ran = hindsight.run_policy(c, guard)
    routes = Counter(route for _, route in guard.choices.values())
    assert len(guard.choices) >= len(ran.finished) > 0 and routes["plan"] > 0, routes
    again = hindsight.run_choices(c, "specguard", guard.choices)
    assert again.tokens == ran.tokens and [f.route for f in again.finished] == [f.route for f in ran.finished]
    other = hindsight.run_choices(c, "specguard", guard.choices, engine_seed=c.seed + 7919)
    assert other.tokens != ran.tokens and sum(other.tokens.values()) > 0  # another draw still replays
    out, winner = rows.rows(c, realised={"specguard": guard.choices})
    assert out["oracle"]["throughput_tokens_per_second"] >= sum(ran.tokens.values()) / c.scenario.duration_s


def test_an_autoscaled_fleet_scales_on_the_guards_desired_replicas_and_the_oracle_replays_them():
    """``guard.scaling`` in the lab: the fleet's HPA scales each pool on the replicas the guard asks
    for (as ``deploy/kubernetes/autoscaling`` does on ``specguard_pool_desired_replicas``) instead of
    requests in flight; the run keeps what it asked at each sync, so the oracle's replay of its
    routing runs on the same replicas and is the run itself."""
    c = case("autoscaled", 96, seconds=180.0)  # replicas asked for serve after the 120 s start delay
    cfg = monitor_config.load_default()
    settings = (cfg.sections.get("cost") or CostSettings()).with_traffic(
        cfg.exporter.classes.load_buckets, cfg.exporter.tap.full_rollback_request_threshold
    )
    shape = c.fleet_shape
    scaling = policy_mod.Scaling(shape.target_in_flight, shape.start_delay_s, max_replicas=shape.engines)
    policy = dataclasses.replace(policy_mod.load_default(), decider="planner", scaling=scaling)
    guard = rp.SpecguardPolicy(cfg.exporter, policy, settings, seed=c.seed)
    ran = hindsight.run_policy(c, guard)
    sizes = guard.choices.sizes
    assert set(sizes) == {t * shape.sync_s for t in range(1, 12)}  # every HPA sync of the 180 s
    asked = [s for s in sizes.values() if s]
    assert asked and all(set(s) == set(POOLS) for s in asked), sizes
    assert max(sum(s.values()) for s in asked) > len(POOLS)  # it asked for more than the floor
    assert ran.fleet_stats.scale_ups > 0
    again = hindsight.run_choices(c, "specguard", guard.choices)
    assert again.tokens == ran.tokens  # the replay scales as the run did
    unsized = rp.Choices(guard.choices)  # the same routes on the in-flight HPA's replicas
    other = hindsight.run_choices(c, "specguard", unsized)
    assert other.tokens != ran.tokens
    unguarded = hindsight.run_policy(c, rp.SpecguardPolicy(cfg.exporter, policy_mod.load_default(), settings))
    assert unguarded.fleet_stats.scale_ups != ran.fleet_stats.scale_ups or unguarded.tokens != ran.tokens
