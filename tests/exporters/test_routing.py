"""Routing: plan lookup by class and the chosen pool's load, holdout and probe shares."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from specguard.errors import InputError
from specguard.exporters.config import PoolConfig
from specguard.exporters.health import PoolHealth
from specguard.exporters.routing import RouteChoice, Router

POOLS = (
    PoolConfig("spec-k4", "http://a", "vllm", 4),
    PoolConfig("spec-k2", "http://b", "vllm", 2),
    PoolConfig("nospec", "http://c", "vllm", 0),
)


def router(holdout=0.0, probe=0.0, seed=1):
    return Router(
        POOLS,
        default_pool="spec-k4",
        nospec_pool="nospec",
        holdout_share=holdout,
        probe_share=probe,
        rng=random.Random(seed),
    )


def low(_pool):
    return "low"


def test_missing_plan_key_goes_to_default_pool():
    r = router()
    assert r.choose("chat", "medium", low).pool == "spec-k4"
    r.set_plan({("chat", "medium", "low"): "spec-k2"})
    assert r.choose("chat", "medium", low).pool == "spec-k2"
    assert r.choose("chat", "high", low).pool == "spec-k4"


def test_plan_with_unknown_pool_is_rejected_whole():
    r = router()
    r.set_plan({("chat", "medium", "low"): "spec-k2"})
    with pytest.raises(InputError, match="ghost"):
        r.set_plan({("code", "greedy", "low"): "ghost", ("chat", "medium", "low"): "nospec"})
    assert r.plan() == {("chat", "medium", "low"): "spec-k2"}


def test_a_move_at_high_load_holds_although_the_target_pool_is_less_loaded():
    loads = {"spec-k4": "high", "spec-k2": "low", "nospec": "low"}
    r = router()
    # the guard moved chat at high load; spec-k2 is idle, so its own bucket has no entry
    r.set_plan({("chat", "medium", "high"): "spec-k2"})
    assert r.choose("chat", "medium", loads.get).pool == "spec-k2"
    r.set_plan({("creative", "high", "high"): "nospec"})
    assert r.choose("creative", "high", loads.get).pool == "nospec"
    assert r.choose("creative", "high", low).pool == "spec-k4"  # at low load the class stays


def test_an_explicit_entry_for_the_target_pools_load_overrides_the_move():
    loads = {"spec-k4": "high", "spec-k2": "low", "nospec": "low"}
    r = router()
    r.set_plan({("chat", "medium", "high"): "spec-k2", ("chat", "medium", "low"): "spec-k4"})
    assert r.choose("chat", "medium", loads.get).pool == "spec-k4"
    r.set_plan({("chat", "medium", "high"): "spec-k2", ("chat", "medium", "low"): "nospec"})
    assert r.choose("chat", "medium", loads.get).pool == "nospec"


def test_holdout_share_sends_a_few_percent_of_every_class_to_nospec():
    r = router(holdout=0.05)
    choices = [r.choose("code", "greedy", low) for _ in range(20000)]
    holdout = [c for c in choices if c.route == "holdout"]
    assert all(c.pool == "nospec" for c in holdout)
    assert 0.04 < len(holdout) / len(choices) < 0.06


def test_probe_share_keeps_a_disabled_class_on_speculation():
    r = router(holdout=0.05, probe=0.1)
    r.set_plan({("creative", "high", "low"): "nospec"})
    choices = [r.choose("creative", "high", low) for _ in range(20000)]
    probes = [c for c in choices if c.route == "probe"]
    assert all(c.pool == "spec-k4" for c in probes)
    assert 0.08 < len(probes) / len(choices) < 0.12
    assert not any(c.route == "holdout" for c in choices)  # already on the no-spec pool
    assert sum(c.pool == "nospec" for c in choices) == len(choices) - len(probes)


def test_per_class_probes_set_the_pool_and_the_share_by_expected_cost():
    """The guard's probe entries (``rules.probes``) replace the default probe pool
    and share for their classes; a class without one keeps probing ``probe_pool`` at ``probe_share``."""
    r = router(probe=0.05)
    off = {("chat", "medium", "low"): "nospec", ("creative", "high", "low"): "nospec"}
    r.set_plan(off)
    # chat: K=4 loses, K=2 pays -> probed on K=2 at the full share; creative: expected rc 2.0 -> 0.5%
    r.set_probes(
        {("chat", "medium", "low"): ("spec-k2", 0.05), ("creative", "high", "low"): ("spec-k4", 0.005)}
    )
    n = 40000
    chat = [r.choose("chat", "medium", low) for _ in range(n)]
    assert {c.pool for c in chat if c.route == "probe"} == {"spec-k2"}
    assert 0.04 < sum(c.route == "probe" for c in chat) / n < 0.06
    creative = [r.choose("creative", "high", low) for _ in range(n)]
    assert {c.pool for c in creative if c.route == "probe"} == {"spec-k4"}
    assert 0.003 < sum(c.route == "probe" for c in creative) / n < 0.007
    r.set_plan({**off, ("code", "greedy", "low"): "nospec"})  # no entry: the old behaviour
    code = [r.choose("code", "greedy", low) for _ in range(n)]
    assert {c.pool for c in code if c.route == "probe"} == {"spec-k4"}
    assert 0.04 < sum(c.route == "probe" for c in code) / n < 0.06


def test_a_probe_entry_is_looked_up_at_the_load_bucket_of_the_plan_entry():
    loads = {"spec-k4": "high", "spec-k2": "low", "nospec": "low"}
    r = router(probe=1.0)
    r.set_plan({("chat", "medium", "high"): "nospec"})
    r.set_probes({("chat", "medium", "high"): ("spec-k2", 1.0), ("chat", "medium", "low"): ("spec-k4", 1.0)})
    assert r.choose("chat", "medium", loads.get) == RouteChoice("spec-k2", "probe")


def test_probe_entries_naming_a_bad_pool_or_share_are_rejected_whole():
    r = router(probe=0.05)
    r.set_probes({("chat", "medium", "low"): ("spec-k2", 0.05)})
    for bad in (("nospec", 0.05), ("ghost", 0.05), ("spec-k2", 1.5)):
        with pytest.raises(InputError, match="chat/medium/low"):
            r.set_probes({("chat", "medium", "low"): bad})
    assert r.probes() == {("chat", "medium", "low"): ("spec-k2", 0.05)}


def test_deterministic_with_injected_rng():
    a, b = router(0.2, 0.2, seed=7), router(0.2, 0.2, seed=7)
    assert [a.choose("x", "y", low) for _ in range(200)] == [b.choose("x", "y", low) for _ in range(200)]


def test_unknown_default_pool_is_an_error():
    with pytest.raises(InputError):
        Router(POOLS, default_pool="ghost", nospec_pool=None)


# --- failover: a pool marked down gets no traffic; the plan itself stays


def down_router(*down, holdout=0.0, probe=0.0):
    health = PoolHealth([p.name for p in POOLS])
    r = Router(
        POOLS,
        default_pool="spec-k4",
        nospec_pool="nospec",
        holdout_share=holdout,
        probe_share=probe,
        rng=random.Random(1),
        health=health,
    )
    for pool in down:
        health.mark_down(pool, "connect failed: refused", "tap")
    return r, health


def test_traffic_planned_for_a_down_pool_goes_to_the_nearest_k_that_serves():
    r, health = down_router("spec-k4")
    choice = r.choose("chat", "medium", low)
    assert (choice.pool, choice.route, choice.planned) == ("spec-k2", "failover", "spec-k4")
    r.set_plan({("creative", "high", "low"): "nospec"})
    health.mark_down("nospec", "refused", "scrape")
    assert r.choose("creative", "high", low).pool == "spec-k2"  # serving beats the cost question
    assert r.plan() == {("creative", "high", "low"): "nospec"}  # an override, not a plan change
    health.mark_up("nospec", "scrape")  # it answers again: the override ends by itself
    assert r.choose("creative", "high", low) == RouteChoice("nospec", "plan")


def test_failover_follows_the_class_cost_order_when_the_guard_gave_one():
    r, _ = down_router("spec-k4")
    r.set_preferences({("chat", "medium", "low"): ("spec-k4", "nospec", "ghost", "spec-k2")})
    assert r.choose("chat", "medium", low).pool == "nospec"
    assert r.choose("code", "greedy", low).pool == "spec-k2"  # no order for this class: nearest K


def test_no_pool_serves_then_the_plan_is_tried_anyway():
    r, _ = down_router("spec-k4", "spec-k2", "nospec")
    assert r.choose("chat", "medium", low) == RouteChoice("spec-k4", "plan")


def test_holdout_and_probe_draws_skip_a_down_pool():
    r, _ = down_router("nospec", holdout=1.0)
    assert {r.choose("code", "greedy", low).route for _ in range(200)} == {"plan"}
    r, _ = down_router("spec-k4", probe=1.0)
    r.set_plan({("creative", "high", "low"): "nospec"})
    assert {r.choose("creative", "high", low).pool for _ in range(200)} == {"nospec"}
    r.set_probes({("creative", "high", "low"): ("spec-k2", 1.0)})  # its own probe pool serves
    assert {r.choose("creative", "high", low).pool for _ in range(200)} == {"spec-k2"}
    health = r.health
    health.mark_down("spec-k2", "refused", "tap")  # and when that one is down too: no probe
    assert {r.choose("creative", "high", low).pool for _ in range(200)} == {"nospec"}


def test_retry_after_a_failed_connect():
    r, health = down_router(holdout=1.0)
    holdout = r.choose("code", "greedy", low)
    assert holdout.route == "holdout"
    health.mark_down("nospec", "refused", "tap")
    # a holdout request whose connect failed goes back to its planned pool
    assert r.retry("code", "greedy", low, holdout, ["nospec"]) == RouteChoice("spec-k4", "plan")
    planned = RouteChoice("spec-k4", "plan")
    health.mark_down("spec-k4", "refused", "tap")
    assert r.retry("code", "greedy", low, planned, ["spec-k4"]) == RouteChoice(
        "spec-k2", "failover", "spec-k4"
    )
    assert r.retry("code", "greedy", low, planned, ["spec-k4", "spec-k2"]) is None


def matched(replicas=None, holdout=0.05, seed=3):
    pools = tuple(replace(p, replicas=(replicas or {}).get(p.name, 1)) for p in POOLS)
    return Router(
        pools,
        default_pool="spec-k4",
        nospec_pool="nospec",
        holdout_share=holdout,
        rng=random.Random(seed),
        holdout_mode="capacity_matched",
    )


def test_capacity_matched_holds_out_while_the_nospec_pool_is_less_loaded_per_replica():
    r = matched({"spec-k4": 3})
    in_flight = {"spec-k4": 30, "spec-k2": 0, "nospec": 8}

    def load_of(pool):
        return r.load(pool, in_flight[pool])

    # a 9th request on the no-spec replica vs an 11th on a speculative one: to the no-spec pool,
    # until it catches up
    assert r.choose("chat", "medium", low, load_of) == RouteChoice("nospec", "holdout")
    in_flight["nospec"] = 11
    assert r.choose("chat", "medium", low, load_of).pool == "spec-k4"
    r.set_plan({("creative", "high", "low"): "nospec"})  # planned there anyway: no holdout needed
    assert r.choose("creative", "high", low, load_of) == RouteChoice("nospec", "plan")


def test_capacity_matched_splits_sequential_traffic_by_replica_share():
    for replicas, share in (({}, 0.5), ({"spec-k4": 3}, 0.25)):
        r = matched(replicas)
        routes = [
            r.choose("chat", "medium", low, lambda pool, r=r: r.load(pool, 0)).route for _ in range(2000)
        ]
        assert routes.count("holdout") / 2000 == pytest.approx(share, abs=0.04)


def test_capacity_matched_is_off_with_no_holdout_share_or_no_load():
    r = matched(holdout=0.0)
    assert r.choose("chat", "medium", low, lambda pool: 1.0).pool == "spec-k4"
    assert matched().choose("chat", "medium", low).pool == "spec-k4"  # no load_of: no holdout


def test_replicas_and_holdout_mode_are_validated():
    r = router()
    r.set_replicas({"spec-k4": 4})
    assert r.replicas() == {"spec-k4": 4, "spec-k2": 1, "nospec": 1}
    assert r.load("spec-k4", 7) == 2.0  # 7 over 4 replicas: the 8th joins one with 1
    assert r.load("spec-k4", 8) == 3.0
    with pytest.raises(InputError, match="ghost"):
        r.set_replicas({"ghost": 2})
    with pytest.raises(InputError, match=">= 1"):
        r.set_replicas({"nospec": 0})
    with pytest.raises(InputError, match="capacity_matched"):
        r.set_holdout_mode("sometimes")


def test_a_spread_class_joins_the_pool_where_it_adds_least_time_at_the_loads_now():
    from specguard.exporters.routing import Spread

    r = router()
    step = {
        "spec-k4": lambda b: 0.020 + 0.002 * b,
        "spec-k2": lambda b: 0.018 + 0.001 * b,
        "nospec": lambda b: 0.015 + 0.0005 * b,
    }
    units = {("code", "greedy", "low"): {"spec-k4": 0.4, "nospec": 1.0}}  # K=2 has no usable cell
    r.set_spread(Spread(units, lambda pool, load: step[pool](load)))
    in_flight = {"spec-k4": 1.0, "spec-k2": 1.0, "nospec": 1.0}
    assert r.choose("code", "greedy", low, in_flight.get) == RouteChoice("spec-k4", "plan")
    # at 8 its own TPOT there (0.4 x 36 ms = 14.4 ms) beats nospec's 15.5 ms, but the 8 requests
    # there take 0.4 x (8 x 36 - 7 x 34) = 20 ms per token more with it: it joins nospec
    in_flight["spec-k4"] = 8.0
    assert r.choose("code", "greedy", low, in_flight.get) == RouteChoice("nospec", "spread", "spec-k4")
    in_flight["spec-k4"] = 4.0  # 0.4 x (4 x 28 - 3 x 26) = 13.6 ms
    assert r.choose("code", "greedy", low, in_flight.get) == RouteChoice("spec-k4", "plan")
    in_flight["spec-k4"] = 40.0
    assert r.choose("code", "greedy", low, in_flight.get) == RouteChoice("nospec", "spread", "spec-k4")
    in_flight["spec-k2"] = 0.0  # idle, but no evidence there: never spilled onto
    assert r.choose("code", "greedy", low, in_flight.get).pool == "nospec"
    # a class without units, or a pool read at a load bucket without them, keeps the plan
    assert r.choose("chat", "medium", low, in_flight.get).pool == "spec-k4"
    assert r.choose("code", "greedy", lambda pool: "high", in_flight.get).pool == "spec-k4"
    with pytest.raises(InputError, match="ghost"):
        r.set_spread(Spread({("code", "greedy", "low"): {"ghost": 1.0}}, lambda pool, load: 0.01))
