"""End to end in virtual time: the simulator's engine core, the tap's router and statistics, the
cost model and the guard with the shipped default policy (``monitor.replay``; no HTTP, no clock).

- a class whose true RC is above 1.0 is moved off speculation within the evidence window;
- nothing else moves, and recorded steady-state evidence driven through the state machine for
  30 simulated minutes produces no action at all;
- a class that recovers is restored, and not before the stabilisation window;
- a class that loses on the K=4 pool at high load is moved to the K=2 pool on the what-if.
"""

from __future__ import annotations

import pytest

from specguard.monitor import config, replay, replay_policies
from specguard.monitor import scenario as sc
from specguard.monitor.sim import config as sim_config
from specguard.rules import cost as cost_mod
from specguard.rules import evidence as evidence_mod
from specguard.rules import guard
from specguard.rules import policy as policy_mod
from specguard.rules import profile as profile_mod
from specguard.rules.cost_config import CostSettings

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
        records = self.stats.records(since=now - self.policy.window_seconds)
        costs = cost_mod.evaluate(records, self.pools, self.profile, now, self.settings)
        evidence = evidence_mod.evidence_from_costs(costs)
        self.evidence.append((now, evidence))
        changed = []
        for key in sorted(set(evidence) | set(self.states)):
            state = self.states.get(key) or guard.initial_state(key, self.policy)
            state, decision = guard.step(state, evidence.get(key, evidence_mod.Evidence()), now, self.policy)
            self.states[key] = state
            self.all_decisions.append(decision)
            if decision.changes_plan:
                changed.append(decision.to_json())
        if changed:
            self.router.set_plan(
                {k: s.pool for k, s in self.states.items() if s.pool != self.policy.default_pool}
            )
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


def run(scenario, *, profile=False, fleet=3):
    cfg = config.load_default()
    ex = cfg.exporter
    sim = sim_config.load()
    settings = (cfg.sections.get("cost") or CostSettings()).with_traffic(
        ex.classes.load_buckets, ex.tap.full_rollback_request_threshold
    )
    policy = RecordingPolicy(ex, POLICY, settings, seed=0, profile=sim_profile(sim) if profile else None)
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
    assert [d.action for d in acted] == ["off", "restore"]
    off, restore = acted
    assert off.at <= WINDOW
    first_good = min(
        d.at for d in policy.all_decisions if d.key == key and d.at > 240 and "recovering towards" in d.reason
    )
    assert restore.at >= first_good + STABILIZATION
    assert "rc (0." in restore.reason and "< restore_threshold (0.95)" in restore.reason
    assert policy.states[key].pool == "spec-k4"


def test_class_losing_on_k4_at_high_load_is_moved_to_the_k2_pool():
    scenario = sc.Scenario(
        "busy",
        (sc.Phase("busy", 180.0, (sc.ClassLoad("creative", 40, ((0.0, 1.0),)),)),),
        "creative, greedy, busy",
    )
    policy, _ = run(scenario, profile=True, fleet=1)
    acted = [d for d in policy.all_decisions if d.action != "none"]
    assert [(d.key, d.action, d.to_pool) for d in acted] == [
        (("creative", "greedy", "medium"), "shorten", "spec-k2")
    ]
    assert (
        acted[0].numbers["target_rc"]
        < POLICY.shorten_max_rc
        < acted[0].numbers["rules"]["relative-cost@spec-k4"]["value"]
    )
    assert policy.states[acted[0].key].pending.to_pool == "spec-k2"  # to be confirmed by measurement
