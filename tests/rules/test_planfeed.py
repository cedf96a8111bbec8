"""What the planner reads (``rules.planfeed``) and how the guard takes its plan (``guard.decider``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard.exporters.records import RequestRecord, SpecStats
from specguard.rules import guard, planfeed, planner, swing
from specguard.rules.classstate import HOLD_RATE
from specguard.rules.cost_config import CostSettings
from specguard.rules.evidence import Evidence, PoolEvidence
from tests.rules.test_guard import KEY, POLICY, st

SETTINGS = CostSettings().with_traffic([("low", 4), ("high", None)])
PLANNER = replace(POLICY, decider="planner")


def rec(pool, task, bucket, start, decode, load, ttft=0.0, rounds=None, tokens=101):
    spec = SpecStats("vllm", rounds=rounds, accepted_tokens=tokens - 1 - rounds) if rounds else None
    return RequestRecord(
        pool=pool,
        task_type=task,
        temperature_bucket="greedy",
        load_bucket=bucket,
        route="plan",
        started_at=start,
        status=200,
        streamed=True,
        output_tokens=tokens,
        ttft_seconds=ttft,
        decode_seconds=decode,
        load=load,
        spec=spec,
    )


def test_demand_is_little_law_over_the_span():
    records = [
        rec("nospec", "chat", "low", start=90.0, decode=10.0, load=2),  # decodes 90-100: all inside
        rec("nospec", "chat", "low", start=70.0, ttft=5.0, decode=20.0, load=2),  # 75-95: 15 s inside
        rec("nospec", "code", "high", start=50.0, decode=10.0, load=8),  # 50-60: before the span
    ]
    found = planfeed.demand(records, now=100.0, span=20.0)
    assert found == {("chat", "greedy", "low"): pytest.approx((10.0 + 15.0) / 20.0)}


def test_bucket_loads_measured_else_representative():
    records = [rec("nospec", "chat", "low", 0.0, 1.0, load=2), rec("nospec", "chat", "low", 0.0, 3.0, load=4)]
    loads = planfeed.bucket_loads(records, SETTINGS)
    assert loads["low"] == pytest.approx((2 * 1 + 4 * 3) / 4)
    assert loads["high"] == 5.0  # open bucket above 4: its representative concurrency


def window(now=100.0):
    """Three classes decoding on three pools at two loads each; step times from K and load."""
    out = []
    for i in range(40):
        start = now - 60 + i
        for task, pool, k, bucket, load in (
            ("code", "spec-k4", 4, "high", 8),
            ("chat", "spec-k2", 2, "low", 3),
            ("chat", "nospec", 0, "low", 2),
            ("qa", "spec-k4", 4, "low", 3),
            ("qa", "nospec", 0, "high", 6),
        ):
            step = 0.02 + 0.001 * load * (1 + 0.3 * k)
            rounds = 40 if k else None
            steps = rounds if k else 100
            out.append(rec(pool, task, bucket, start, step * steps, load, rounds=rounds))
    return out


def test_build_one_problem_one_pool_per_class_from_its_busiest_bucket():
    states = {
        ("code", "greedy", "high"): st("spec-k4"),
        ("chat", "greedy", "low"): st("spec-k2", pin="spec-k2"),
        ("qa", "greedy", "low"): st("spec-k4"),
        ("qa", "greedy", "high"): st("nospec"),
    }
    measured = {"rc": 0.9, "rc_lower": 0.8, "rc_upper": 1.0}
    evidence = {
        ("code", "greedy", "high"): Evidence(pools={"spec-k4": PoolEvidence("spec-k4", measured, samples=40)})
    }
    records = window()
    inp = planfeed.build(
        records, states, evidence, 100.0, POLICY, SETTINGS, {"spec-k4": 2, "spec-k2": 1, "nospec": 1}
    )
    assert isinstance(inp, planner.PlanInput)
    assert inp.together == planfeed.NOW
    code, chat, qa = (("code", "greedy", "now"), ("chat", "greedy", "now"), ("qa", "greedy", "now"))
    assert set(inp.demand) == {code, chat, qa}
    flights = planfeed.demand(records, 100.0, 2 * POLICY.interval_seconds)
    assert inp.demand[qa].in_flight == pytest.approx(
        flights[("qa", "greedy", "low")] + flights[("qa", "greedy", "high")]
    )
    busiest = max((("qa", "greedy", b) for b in ("low", "high")), key=lambda k: flights[k])
    assert inp.current[qa] == states[busiest].pool  # the pool of its busiest bucket
    assert inp.current[chat] == "spec-k2" and inp.fixed == {chat}  # pinned: stays, counted for load
    assert {p.name: p.replicas for p in inp.pools} == {"spec-k4": 2, "spec-k2": 1, "nospec": 1}
    assert inp.cells[code]["spec-k4"].rc == 0.9 and inp.cells[code]["nospec"].rc == 1.0
    high = planfeed.bucket_loads(records, SETTINGS)["high"]  # code at 8, qa at 6 a replica
    assert 6 < high < 8 and inp.measured_at[(code, "spec-k4")] == high
    plan = planner.plan(inp)
    assert set(plan.pools) == set(inp.demand)
    assert plan.pools[chat] == "spec-k2"


def test_build_says_why_when_there_is_no_step_fit():
    found = planfeed.build([], {}, {}, 100.0, POLICY, SETTINGS, {})
    assert isinstance(found, str) and "no step-cost fit" in found


def test_the_guard_takes_the_planners_move_through_its_gates():
    evidence = Evidence(
        pools={"spec-k4": PoolEvidence("spec-k4", {"rc": 0.8, "rc_lower": 0.8, "rc_upper": 0.8}, samples=50)}
    )
    planned = ("nospec", "move spec-k4 -> nospec: the fleet plan gains at least 5.0 tokens/s")
    state, decision = guard.step(st("spec-k4"), evidence, 1000.0, PLANNER, planned)
    assert (decision.action, decision.to_pool, decision.cause) == ("off", "nospec", "planner")
    assert state.pool == "nospec" and decision.reason.startswith("planner: move")
    # the cooldown still holds the next one back
    _, held = guard.step(state, evidence, 1010.0, PLANNER, ("spec-k4", "back"))
    assert held.hold == HOLD_RATE
    # dry-run: said, not done
    _, dry = guard.step(st("spec-k4"), evidence, 1000.0, replace(PLANNER, dry_run=True), planned)
    assert dry.dry_run and dry.action == "off"
    # the default decider ignores a plan
    _, ignored = guard.step(st("spec-k4"), evidence, 1000.0, POLICY, planned)
    assert ignored.action == "none"
    assert KEY == st().key


def test_a_class_the_plan_does_not_cover_gets_the_profiles_warm_start_and_nothing_else():
    prior = Evidence(
        prior={"spec-k4": 1.4, "spec-k2": 0.7}, prior_bounds={"spec-k4": (1.3, 1.5), "spec-k2": (0.6, 0.8)}
    )
    _, warm = guard.step(st("spec-k4"), prior, 1000.0, PLANNER, None)
    assert (warm.action, warm.to_pool, warm.cause) == ("shorten", "spec-k2", "profile")
    # live evidence that would move it under the per-class rule: not in planner mode
    live = Evidence(
        pools={
            "spec-k4": PoolEvidence("spec-k4", {"rc": 0.9, "rc_lower": 0.9, "rc_upper": 0.9}, samples=50),
            "spec-k2": PoolEvidence("spec-k2", {"rc": 0.5, "rc_lower": 0.5, "rc_upper": 0.5}, samples=50),
        }
    )
    state = st("spec-k4", consecutive_favoured=5, favoured="spec-k2")
    _, per_class = guard.step(state, live, 1000.0, POLICY)
    assert per_class.action == "shorten"
    _, planning = guard.step(state, live, 1000.0, PLANNER, None)
    assert planning.action == "none"


def test_build_sees_a_load_swinging_faster_than_the_interval_and_a_steady_one_not():
    """The steady window has no swing; the same window with a class decoding 20 requests at a time
    in every other pair of slices of the swing's span (and 2 between) carries both loads to the
    planner."""
    states = {("code", "greedy", "high"): st("spec-k4")}
    replicas = {"spec-k4": 2, "spec-k2": 1, "nospec": 1}
    steady = planfeed.build(window(), states, {}, 100.0, POLICY, SETTINGS, replicas)
    assert isinstance(steady, planner.PlanInput) and steady.scenarios == ()
    width = POLICY.interval_seconds / swing.SLICES
    count = swing.INTERVALS * swing.SLICES
    swinging = []
    for i in range(count):
        for _ in range(20 if i // 2 % 2 == 0 else 2):
            swinging.append(rec("spec-k4", "code", "high", 100.0 - (count - i) * width, width, load=8))
    inp = planfeed.build(window() + swinging, states, {}, 100.0, POLICY, SETTINGS, replicas)
    assert isinstance(inp, planner.PlanInput)
    (share, high), (rest, low) = inp.scenarios
    high_slices = sum(i // 2 % 2 == 0 for i in range(count - 1))  # the newest left out
    assert share == pytest.approx(high_slices / (count - 1)) and rest == pytest.approx(1 - share)
    code = ("code", "greedy", "now")
    assert high[code].in_flight - low[code].in_flight == pytest.approx(18.0, abs=0.5)  # and the steady part
    assert inp.demand[code].in_flight > low[code].in_flight
    decided = planfeed.decide(inp)
    assert decided.plan is not None and "swinging" in decided.plan.reasons[code]
