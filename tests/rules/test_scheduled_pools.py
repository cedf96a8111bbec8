"""Routed pools that also run an in-engine K schedule: each is priced at the K its schedule picks at
the load, not at the K it was launched with (``Policy.k_at``, the spread, the step fit, the prior,
the cost model's what-if, the lab's fluid model)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cost_synth import make_records

from specguard import schedules
from specguard.exporters.config import PoolConfig
from specguard.lab import demo, fluid
from specguard.monitor import config as monitor_config
from specguard.monitor import guard_wiring
from specguard.rules import cost, kschedule, prior, spread, stepfit
from specguard.rules import policy as policy_mod
from specguard.rules import profile as profile_mod
from specguard.rules.cost_config import CostSettings
from specguard.rules.evidence import Evidence, PoolEvidence
from specguard.sim import config as sim_config
from tests.rules.test_guard import POLICY, st
from tests.rules.test_planfeed import SETTINGS, rec, window
from tests.rules.test_prior import BUCKETS, CHAT, profile

SCHEDULE = schedules.vllm([[1, 4, 4], [5, 12, 2], [13, 256, 0]], 4)
SCHEDULED = POLICY.with_pools(dict(POLICY.pools), "spec-k4", "nospec", {"spec-k4": SCHEDULE})


def test_a_scheduled_pool_runs_its_schedules_k_at_the_load():
    assert [SCHEDULED.k_at("spec-k4", load) for load in (0.2, 3, 4.4, 8, 12, 13, 100)] == [
        4,
        4,
        4,
        2,
        2,
        0,
        0,
    ]
    assert [POLICY.k_at("spec-k4", load) for load in (1, 100)] == [4, 4]  # launched without one
    assert SCHEDULED.k_at("spec-k2", 100) == 2 and SCHEDULED.k_at("nospec", 1) == 0


def test_the_step_fit_reads_a_scheduled_pools_requests_at_the_k_they_ran_at():
    def drafted(record, rounds, drafts):
        return replace(record, spec=replace(record.spec, rounds=rounds, draft_tokens=drafts))

    records = [
        drafted(rec("spec-k4", "code", "low", 0.0, 1.0, 3, rounds=40), 40, 160),  # K = 4
        drafted(rec("spec-k4", "code", "high", 0.0, 2.0, 8, rounds=50), 50, 100),  # K = 2
        rec("spec-k4", "code", "high", 0.0, 3.0, 20),  # verified no draft: the schedule's K = 0
    ]
    records[2] = replace(records[2], spec=replace(records[0].spec, rounds=0, draft_tokens=0))
    aware = stepfit.observations_from_records(records, POLICY.pools, SETTINGS, {"spec-k4"})
    assert sorted((o.k, o.step_seconds) for o in aware) == [(0, 3.0 / 100), (2, 2.0 / 50), (4, 1.0 / 40)]
    unaware = stepfit.observations_from_records(records, POLICY.pools, SETTINGS)
    assert sorted(o.k for o in unaware) == [4, 4]  # every request at the launch K; K = 0 dropped


def cell(pool, rc):
    return PoolEvidence(pool, {"rc": rc, "rc_lower": rc - 0.05, "rc_upper": rc + 0.05}, samples=50)


def test_the_spread_prices_a_scheduled_pool_at_its_schedules_k_and_as_no_spec_where_it_is_off():
    found = spread.model(window(), POLICY, SETTINGS, None)
    assert isinstance(found, spread.Model)
    code = ("code", "greedy", "high")
    evidence = {code: Evidence(pools={"spec-k4": cell("spec-k4", 0.7)})}
    for load, k in ((3.0, 4), (8.0, 2), (20.0, 0)):
        moved = replace(found, loads={**found.loads, "high": load})
        units = spread.units({code: st("spec-k4")}, evidence, 100.0, SCHEDULED, moved)
        step = spread.stepper(moved, SCHEDULED)
        assert step("spec-k4", load) == moved.step(k, load)
        if k == 0:
            assert units[code]["spec-k4"] == 1.0  # the schedule turns speculation off at this load
        else:
            assert units[code]["spec-k4"] == pytest.approx(0.7 * moved.step(0, load) / moved.step(k, load))
        fixed = spread.units({code: st("spec-k4")}, evidence, 100.0, POLICY, moved)
        assert fixed[code]["spec-k4"] == pytest.approx(0.7 * moved.step(0, load) / moved.step(4, load))


def test_the_prior_of_a_scheduled_pool_is_the_profiles_k_of_each_bucket():
    pools = {"spec-k4": 4, "nospec": 0}
    schedule = schedules.vllm([[1, 4, 4], [5, 16, 2], [17, 256, 0]], 4)
    out = prior.prior_rcs(profile(), pools, BUCKETS, k_schedules={"spec-k4": schedule})
    # low (0, 8]: representative 4.5 -> batch 4 -> K = 4; medium (8, 24]: 16.5 -> 16 -> K = 2; high: off
    at_k4 = prior.prior_rcs(profile(), pools, BUCKETS)
    at_k2 = prior.prior_rcs(profile(), {"spec-k4": 2, "nospec": 0}, BUCKETS)  # matched by K: spec-k2's
    assert out[("chat", "medium", "low")]["spec-k4"] == at_k4[("chat", "medium", "low")]["spec-k4"]
    assert out[("chat", "medium", "medium")]["spec-k4"] == at_k2[("chat", "medium", "medium")]["spec-k4"]
    assert at_k2[("chat", "medium", "medium")]["spec-k4"].rc == pytest.approx(0.0089 / 0.014)
    high = out[("chat", "medium", "high")]["spec-k4"]
    assert (high.rc, high.lower, high.upper) == (1.0, 1.0, 1.0)
    unaware = prior.prior_rcs(profile(), pools, BUCKETS)
    assert unaware[("chat", "medium", "high")]["spec-k4"].rc == pytest.approx(CHAT[32][0] / 0.020)
    settings = CostSettings().with_traffic([("low", 8), ("medium", 24), ("high", None)])
    policy = policy_mod.Policy(rules=(), pools=pools, k_schedules={"spec-k4": schedule})
    assert prior.for_policy(profile(), policy, settings) == out


def test_a_what_if_onto_a_scheduled_pool_predicts_at_the_k_it_runs_at_that_load():
    rng = np.random.default_rng(5)
    settings = CostSettings(min_samples=30, baseline_min_samples=30).with_traffic(
        [("low", 4), ("high", None)]
    )
    schedule = schedules.vllm([[1, 4, 2], [5, 256, 0]], 4)
    pools = [
        PoolConfig("spec-k4", "http://a:1", num_speculative_tokens=4),
        PoolConfig("sched", "http://b:1", num_speculative_tokens=4, k_schedule=schedule),
        PoolConfig("nospec", "http://c:1"),
    ]
    records = []
    for bucket, batch in (("low", 2.0), ("high", 6.0)):
        records += make_records(
            rng, 60, pool="spec-k4", k=4, a=0.6, batch=batch, task_type="chat", load_bucket=bucket
        )
        records += make_records(rng, 60, pool="nospec", k=0, batch=batch, load_bucket=bucket)
    records += make_records(rng, 60, pool="sched", k=2, a=0.9, batch=2.0, task_type="code", load_bucket="low")
    chat = {
        c.load_bucket: c for c in cost.evaluate(records, pools, None, 0.0, settings) if c.task_type == "chat"
    }
    (low,) = [p for p in chat["low"].predictions if p.pool == "sched"]
    assert low.num_speculative_tokens == 2 and low.step_source == "live" and low.rc is not None
    assert [p.pool for p in chat["high"].predictions] == []  # off at that load: nothing to predict
    plain = [replace(p, k_schedule=None) for p in pools]
    (unaware,) = [c for c in cost.evaluate(records, plain, None, 0.0, settings) if c.task_type == "chat"][:1]
    assert {p.num_speculative_tokens for p in unaware.predictions} == {4}


def test_the_lab_launches_each_pool_with_its_schedule_and_its_model_runs_it():
    cfg = monitor_config.load_default()
    setup = demo.DemoSetup(sim=sim_config.load(), exporter=cfg.exporter, policy=POLICY, scenario=None)  # type: ignore[arg-type]
    ks = {p.name: p.num_speculative_tokens for p in cfg.exporter.pools}
    name = next(n for n, k in ks.items() if k == 4)
    launched = demo.with_k_schedules(setup, {name: SCHEDULE})
    assert {p.name: p.k_schedule for p in launched.exporter.pools if p.k_schedule} == {name: SCHEDULE}
    assert {p.name: p.k_schedule for p in launched.sim.pools if p.k_schedule} == {name: SCHEDULE}
    model = fluid.Model(launched.sim, 4)
    assert [model.k_for(name, c) for c in (1, 6, 30)] == [4, 2, 0]
    assert model.k_for("nospec", 30) == 0 and fluid.Model(setup.sim, 4).k_for(name, 30) == 4
    two = next(n for n, k in ks.items() if k == 2)
    with pytest.raises(ValueError, match=f"of K at least its schedule's for {two}"):
        demo.with_k_schedules(setup, {two: SCHEDULE})  # K = 4 drafts on a pool launched at 2
    with pytest.raises(ValueError, match="nospec"):
        demo.with_k_schedules(setup, {"nospec": SCHEDULE})


def test_a_routed_pools_schedule_keeps_its_k_while_that_pays_and_then_the_cheapest():
    """``kschedule.recommend(keep=K)``: the router sends each class to the K that suits it, so a
    pool's schedule only turns K down where the mix's RC on its own K reaches 1.0."""
    rcs = {  # the mix's RC by K and concurrency (TPOT over the no-spec pool's)
        4: {1: 0.80, 4: 0.90, 16: 1.10, 64: 1.60},
        2: {1: 0.70, 4: 0.80, 16: 0.95, 64: 1.20},
    }

    def pool(name, k):
        levels = tuple(
            profile_mod.ProfileLevel(c, 0.01 * (rcs[k][c] if k else 1.0), 100) for c in (1, 4, 16, 64)
        )
        return profile_mod.ProfilePool(name, k, levels)

    swept = profile_mod.Profile((pool("spec-k4", 4), pool("spec-k2", 2), pool("nospec", 0)))
    mix = kschedule.recommend(swept)
    assert [(r.k, r.levels) for r in mix.ranges] == [(2, (1, 4, 16)), (0, (64,))]  # K = 2 is cheaper
    kept = kschedule.recommend(swept, keep=4)
    assert [(r.k, r.levels) for r in kept.ranges] == [(4, (1, 4)), (2, (16,)), (0, (64,))]
    assert kept.vllm.k_at(1) == 4 and kept.vllm.k_at(16) == 2 and kept.vllm.k_at(64) == 0
    assert kschedule.recommend(swept, keep=2).ranges == mix.ranges  # the mix's own K is 2 already


def test_the_guard_reads_each_pools_schedule_from_the_config_and_keeps_it_on_reload(tmp_path):
    path = tmp_path / "specguard.yaml"
    path.write_text(
        "pools:\n"
        "  - {name: spec-k4, url: 'http://127.0.0.1:9001', num_speculative_tokens: 4,\n"
        "     num_speculative_tokens_per_batch_size: [[1, 8, 4], [9, 256, 0]]}\n"
        "  - {name: nospec, url: 'http://127.0.0.1:9002'}\n"
        "tap: {default_pool: spec-k4, nospec_pool: nospec}\n"
        "guard: {}\n"
    )
    cfg = monitor_config.load(str(path))
    schedule = cfg.exporter.pool("spec-k4").k_schedule
    assert schedule is not None
    pools = {p.name: p.num_speculative_tokens for p in cfg.exporter.pools}
    reloader = guard_wiring.PolicyReloader(
        path, pools, "spec-k4", "nospec", k_schedules={"spec-k4": schedule}
    )
    path.write_text(path.read_text().replace("guard: {}", "guard: {cooldown_seconds: 61}"))
    reloaded = reloader()
    assert reloaded is not None and reloaded.k_at("spec-k4", 20) == 0 and reloaded.k_at("spec-k4", 2) == 4
