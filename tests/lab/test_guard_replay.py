"""End to end in virtual time: the simulator's engine core, the tap's router and statistics, the
cost model and the guard with the shipped default policy (``monitor.replay``; no HTTP, no clock).

- a class whose true RC is above 1.0 is moved off speculation within the evidence window;
- nothing else moves, and recorded steady-state evidence driven through the state machine for
  30 simulated minutes produces no action at all;
- a class that recovers is restored (to K=2, measured by its probes there), and not
  before the stabilisation window;
- a class that loses on the K=4 pool at high load is moved to the K=2 pool on the what-if;
- with the demo's calibration profile as prior, classes start on the profile's cheapest pool at the
  first evaluation (warm start); without it, the same moves wait for live evidence, and the
  best-pool rule still moves chat to the K=2 pool where RC < 1 on K=4 but K=2 is cheaper.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard.lab import demo, replay, replay_policies
from specguard.lab import scenario as sc
from specguard.monitor import config
from specguard.rules import evidence as evidence_mod
from specguard.rules import guard
from specguard.rules import policy as policy_mod
from specguard.rules import profile as profile_mod
from specguard.rules.cost_config import CostSettings
from specguard.sim import config as sim_config

POLICY = policy_mod.load_default()
WINDOW = POLICY.window_seconds
STABILIZATION = POLICY.rules[0].limits.stabilization_window_seconds


class RecordingPolicy(replay_policies.SpecguardPolicy):
    """The product's replay policy, also keeping every tick's evidence and decision."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.evidence: list[tuple[float, dict]] = []
        self.all_decisions: list[guard.Decision] = []

    def tick(self, now):
        self.clock.now = now
        self.evaluations += 1
        _, evidence = self.collect(now)  # the product's evidence: cost model, profile prior, holdout shares
        self.evidence.append((now, evidence))
        changed = []
        for key in sorted(set(evidence) | set(self.states)):
            state = self.states.get(key) or guard.initial_state(key, self.policy)
            state, decision = guard.step(state, evidence.get(key, evidence_mod.Evidence()), now, self.policy)
            self.states[key] = state
            self.all_decisions.append(decision)
            if decision.changes_plan:
                changed.append(decision.to_json())
        self.route(evidence, now, bool(changed))  # the product's probes and plan
        return changed


def sim_profile(sim):
    """A calibration profile of the simulated pools (what `specguard sweep` would measure)."""
    pools = []
    for pool in sim.pools:
        k = pool.num_speculative_tokens
        levels = tuple(
            profile_mod.ProfileLevel(
                b, sim.cost.step_seconds(b, 0), 1000, step_seconds=sim.cost.step_seconds(b, k)
            )
            for b in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
        )
        pools.append(profile_mod.ProfilePool(pool.name, k, levels))
    return profile_mod.Profile(tuple(pools), source="sim-model")


def run(scenario, *, profile=False, fleet=3, policy=POLICY):
    cfg = config.load_default()
    ex = cfg.exporter
    sim = sim_config.load()
    settings = (cfg.sections.get("cost") or CostSettings()).with_traffic(
        ex.classes.load_buckets, ex.tap.full_rollback_request_threshold
    )
    if profile is True:
        profile = sim_profile(sim)
    policy = RecordingPolicy(ex, policy, settings, seed=0, profile=profile or None)
    buckets = replay.Buckets.from_classes(ex.classes)
    try:
        result = replay.Replay(sim, scenario, policy, buckets, seed=0, fleet=fleet).run()
    except TypeError:  # a replay without the fleet model
        result = replay.Replay(sim, scenario, policy, buckets, seed=0).run()
    return policy, result


@pytest.fixture(scope="module")
def stationary():
    loads = (
        sc.ClassLoad("code", 2, ((0.0, 1.0),)),
        sc.ClassLoad("extraction", 2, ((0.0, 1.0),)),
        sc.ClassLoad("chat", 2, ((0.7, 1.0),)),
        sc.ClassLoad("creative", 2, ((1.0, 1.0),)),
    )
    scenario = sc.Scenario("stationary", (sc.Phase("steady", 600.0, loads),), "constant low load")
    return run(scenario)


def test_losing_class_goes_off_within_the_evidence_window(stationary):
    policy, result = stationary
    acted = [d for d in policy.all_decisions if d.action != "none"]
    assert [(d.key[0], d.action, d.from_pool, d.to_pool) for d in acted] == [
        ("creative", "off", "spec-k4", "nospec")
    ]
    assert acted[0].at <= WINDOW
    assert "rc_lower" in acted[0].reason and acted[0].numbers["rules"]["relative-cost@spec-k4"]["value"] > 1.0
    assert policy.router.plan()[acted[0].key] == "nospec"


def test_recorded_steady_evidence_for_30_minutes_moves_nothing(stationary):
    policy, _ = stationary
    steady = [ev for at, ev in policy.evidence if at >= WINDOW]  # the last 300 s, after settling
    assert len(steady) >= 8
    states = dict(policy.states)
    interval = POLICY.interval_seconds
    now = policy.evidence[-1][0]
    actions = []
    for tick in range(int(1800 / interval)):
        now += interval
        evidence = steady[tick % len(steady)]
        for key in sorted(set(evidence) | set(states)):
            states[key], decision = guard.step(
                states[key] if key in states else guard.initial_state(key, policy.policy),
                evidence.get(key, evidence_mod.Evidence()),
                now,
                policy.policy,
            )
            if decision.action != "none":
                actions.append(decision)
    assert actions == []
    assert {s.pool for k, s in states.items() if k[0] == "creative"} == {"nospec"}
    assert {s.pool for k, s in states.items() if k[0] != "creative"} == {"spec-k4"}


def test_recovering_class_is_restored_after_the_stabilisation_window():
    # code sampled at 0.9 loses on K=4; at 0.55 (same temperature bucket) it pays again
    scenario = sc.Scenario(
        "recover",
        (
            sc.Phase("bad", 240.0, (sc.ClassLoad("code", 4, ((0.9, 1.0),)),)),
            sc.Phase("good", 660.0, (sc.ClassLoad("code", 4, ((0.55, 1.0),)),)),
        ),
        "code's temperature falls back inside one bucket",
    )
    policy, _ = run(
        scenario, profile=True
    )  # one task type: little holdout traffic, the profile is the baseline
    key = ("code", "medium", "low")
    acted = [d for d in policy.all_decisions if d.action != "none" and d.key == key]
    # at 0.55 the K=2 pool is truly ~10% cheaper than K=4 (0.75 vs 0.84); once off, the class is
    # probed on K=2 (its expected cheapest pool, rules.probes), so it is restored straight to K=2 on
    # a measurement there (before the probes were wired in: on K=2's what-if from its K=4 probes,
    # pending, then confirmed)
    assert [(d.action, d.to_pool) for d in acted] == [("off", "nospec"), ("restore", "spec-k2")]
    off, restore = acted
    assert "measured on spec-k2" in restore.reason
    assert off.at <= WINDOW
    first_good = min(
        d.at for d in policy.all_decisions if d.key == key and d.at > 240 and "recovering towards" in d.reason
    )
    assert restore.at >= first_good + STABILIZATION
    assert "rc_upper (0." in restore.reason and "< restore_threshold (0.95)" in restore.reason
    assert policy.states[key].pool == "spec-k2"


def test_class_losing_on_k4_at_high_load_is_moved_to_the_k2_pool():
    scenario = sc.Scenario(
        "busy",
        (sc.Phase("busy", 180.0, (sc.ClassLoad("creative", 120, ((0.0, 1.0),)),)),),
        "creative, greedy, busy",
    )
    policy, _ = run(scenario, profile=True, fleet=3)  # about 40 per engine
    acted = [d for d in policy.all_decisions if d.action != "none"]
    # the holdout takes one of the three engines (equal capacity), so K=4 runs at more than one load
    # bucket; in each the class leaves K=4: to K=2 where its what-if is good, else off
    assert {(d.key[2], d.action, d.to_pool) for d in acted} <= {
        (bucket, action, pool)
        for bucket in ("low", "medium", "high")
        for action, pool in (("shorten", "spec-k2"), ("off", "nospec"))
    }
    medium = [d for d in acted if d.key == ("creative", "greedy", "medium")]
    assert [(d.action, d.to_pool) for d in medium] == [("shorten", "spec-k2")]
    assert (
        medium[0].numbers["target_rc"]
        < POLICY.shorten_max_rc
        < medium[0].numbers["rules"]["relative-cost@spec-k4"]["value"]
    )
    assert policy.states[medium[0].key].pending.to_pool == "spec-k2"  # to be confirmed by measurement


MIXED = sc.Scenario(
    "mixed-low",
    (
        sc.Phase(
            "steady",
            300.0,
            (
                sc.ClassLoad("code", 2, ((0.0, 1.0),)),
                sc.ClassLoad("chat", 2, ((0.7, 1.0),)),
                sc.ClassLoad("creative", 2, ((1.0, 1.0),)),
            ),
        ),
    ),
    "three classes at low load",
)


@pytest.fixture(scope="module")
def calibrated():
    """MIXED on the demo's half-size GPU (``demo.smaller_gpu``, load buckets halved), the shipped
    timers, and a calibration profile swept with its own mix and seed (``demo.calibrate``)."""
    cfg = config.load_default()
    setup = demo.DemoSetup(
        sim=demo.smaller_gpu(sim_config.load(), 2),
        exporter=demo.smaller_buckets(cfg.exporter, 2),
        policy=POLICY,
        scenario=MIXED,
        seed=0,
        timer_scale=1,
        gpu_scale=2,
        fleet=3,  # about two requests per engine: chat's K=2 what-if is clear of the margin
    )
    setup.settings = demo.cost_settings(setup.exporter)
    return setup, demo.calibrate(setup)  # a virtual `specguard sweep` with its own mix and seed


@pytest.fixture(scope="module")
def warm_and_cold(calibrated):
    """The same traffic with the demo's calibration profile as prior, and with ``prior: none``."""
    setup, profile = calibrated
    warm, _ = demo.run_specguard(setup, profile)
    cold_setup = demo.DemoSetup(**{**vars(setup), "policy": replace(POLICY, prior="none")})
    cold, _ = demo.run_specguard(cold_setup, profile)
    return warm, cold


BUCKET = {"code": "greedy", "chat": "medium", "creative": "high"}  # MIXED's temperature buckets


def _moves(result, task_type, load_bucket="low"):
    """The plan changes of the class MIXED sends (the profile also plans classes it never sends)."""
    return [
        (d["time"], d["action"], d["cause"], d["to"])
        for d in result.decisions
        if (d["task_type"], d["temperature_bucket"], d["load_bucket"])
        == (task_type, BUCKET[task_type], load_bucket)
    ]


def test_warm_start_plans_from_the_profile_at_the_first_evaluation(warm_and_cold):
    """The first evaluation runs at t=0, before the first request (as the daemon's at start)."""
    warm, _ = warm_and_cold
    assert _moves(warm, "creative")[0] == (0.0, "off", "profile", "nospec")
    # buckets no request has reached yet are planned too: the sweep's plan for higher load
    assert _moves(warm, "creative", "high") == [(0.0, "off", "profile", "nospec")]
    assert _moves(warm, "chat", "high") == [(0.0, "shorten", "profile", "spec-k2")]
    assert _moves(warm, "code", "high") == [(0.0, "shorten", "profile", "spec-k2")]
    assert _moves(warm, "code") == []  # K=4 is the cheapest pool for greedy code at low load
    # chat at low load: the sweep saw K=2 7% cheaper (0.672 [0.651, 0.694] against K=4's 0.725
    # [0.669, 0.786], from 4-7 requests a level): inside both intervals, so no move on the profile's
    # points; live evidence decides there
    assert _moves(warm, "chat") == []


def test_without_the_prior_the_same_moves_wait_for_live_evidence(warm_and_cold):
    warm, cold = warm_and_cold
    creative = _moves(cold, "creative")
    assert creative[0][1:] == ("off", "relative-cost", "nospec")
    assert creative[0][0] > _moves(warm, "creative")[0][0]
    assert _moves(cold, "creative", "high") == []  # nothing is known about a load never seen
    # rc < 1 on K=4 and K=2's what-if some 7% cheaper, but its ratio's interval reaches past the 3%
    # margin: no move on the point. The spread sends some chat requests to K=2 (where they add least
    # time), so a move may follow on K=2's own measurements once the ratio's interval clears
    for d in cold.decisions:
        if (d["task_type"], d["temperature_bucket"]) == ("chat", "medium") and d["cause"] == "best_pool":
            target = d["reason"].split(" cheaper per token than ")[0]
            assert "(measured:" in target and "beyond the ratio's interval" in d["reason"], d["reason"]


def test_a_class_off_speculation_is_probed_where_it_is_expected_cheapest():
    """Code sampled at 0.9 loses on K=4 (true rc about 1.1) and pays on K=2 (about
    0.95). Once off, its probes leave K=4 for K=2 (the exact what-if from its K=4 probes), at the full
    share (the expected rc is below 1); before, every probe stayed on K=4."""
    scenario = sc.Scenario(
        "k4-loses", (sc.Phase("steady", 480.0, (sc.ClassLoad("code", 4, ((0.9, 1.0),)),)),), "code at 0.9"
    )
    policy, result = run(scenario, profile=True)
    key = ("code", "medium", "low")
    off = next(d for d in policy.all_decisions if d.key == key and d.action == "off")
    probed = [
        f for f in result.finished if f.route == "probe" and f.started > off.at + POLICY.interval_seconds
    ]
    assert probed and {f.pool for f in probed} == {"spec-k2"}, {f.pool for f in probed}
    pool, share = policy.router.probes()[key]
    assert pool == "spec-k2" and share == policy.router.probe_share


def test_a_class_arriving_in_a_crowd_starts_on_the_profile_pool_not_the_default(calibrated):
    """No learning delay: with a profile, every class it knows is planned at the first
    evaluation (at start), seen or not, so a crowd of creative writing at temperature 1 (loses on every
    speculative pool) that arrives at 60 s runs on the no-spec pool from its first request. Before,
    its first requests ran on K=4 until the evaluation after the first of them finished."""
    code = sc.ClassLoad("code", 2, ((0.0, 1.0),))
    crowd = sc.Scenario(
        "crowd",
        (
            sc.Phase("before", 60.0, (code,)),
            sc.Phase("crowd", 30.0, (code, sc.ClassLoad("creative", 12, ((1.0, 1.0),)))),
        ),
        "a class no request sent before arrives in a crowd",
    )
    setup, profile = calibrated
    setup = demo.DemoSetup(**{**vars(setup), "scenario": crowd})
    warm, _ = demo.run_specguard(setup, profile)
    planned = [f for f in warm.finished if f.task_type == "creative" and f.route == "plan"]
    assert len(planned) > 12 and {f.pool for f in planned} == {"nospec"}, sorted({f.pool for f in planned})
    first = min(d["time"] for d in warm.decisions if d["task_type"] == "creative")
    assert first == 0.0  # planned at start, before any creative request was sent
    # without the profile the same crowd starts on the default pool (what the guard learns live)
    cold, _ = demo.run_specguard(setup, None)
    creative = [f for f in cold.finished if f.task_type == "creative" and f.route == "plan"]
    assert min(creative, key=lambda f: f.started).pool == "spec-k4"
