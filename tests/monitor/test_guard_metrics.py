"""The guard's families per role: the plan's cells only from the process that decides the plan
(standalone, or the fleet's leading decider); a follower says which plan it holds by its version
and exports nothing that would only repeat its decider's state."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from specguard.monitor.guard_metrics import GuardCollector, GuardCounters, GuardView

PLAN = {
    ("creative", "high", "low"): "nospec",
    ("code", "greedy", "low"): "spec-k4",
}
POOLS = {"spec-k4": 4, "nospec": 0}
CELLS = ("specguard_plan_info", "specguard_speculation_enabled", "specguard_num_speculative_tokens")
DECIDER_STATE = ("specguard_evaluations_total", "specguard_guard_frozen", "specguard_consecutive_errors")


def samples(view: GuardView) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(GuardCollector(GuardCounters(), lambda: view))
    out: dict[str, list] = {}
    for family in registry.collect():
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def view(leader: bool | None) -> GuardView:
    return GuardView(
        plan=PLAN,
        pools=POOLS,
        last_evaluation=100.0,
        frozen=True,
        consecutive_errors=2,
        config_version="abc",
        audit_write_errors=0,
        plan_version=7,
        plan_age_seconds=3.0 if leader is None else None,
        leader=leader,
    )


def test_the_deciding_process_exports_every_cell_of_its_plan():
    got = samples(view(leader=True))
    info = {(s["task_type"], s["temperature_bucket"], s["load_bucket"]): s["pool"] for s, _ in got[CELLS[0]]}
    assert info == PLAN
    enabled = {s["task_type"]: v for s, v in got["specguard_speculation_enabled"]}
    tokens = {s["task_type"]: v for s, v in got["specguard_num_speculative_tokens"]}
    assert enabled == {"creative": 0.0, "code": 1.0} and tokens == {"creative": 0.0, "code": 4.0}
    assert got["specguard_plan_version"] == [({}, 7.0)]
    assert got["specguard_guard_frozen"] == [({}, 1.0)] and got["specguard_consecutive_errors"] == [({}, 2.0)]
    assert len(got["specguard_evaluations_total"]) == 4


@pytest.mark.parametrize(
    ("leader", "what"),
    [
        pytest.param(None, "follower", id="follower"),
        pytest.param(False, "standby", id="standby-decider"),
    ],
)
def test_a_follower_or_a_standby_exports_its_plan_version_and_no_cell(leader, what):
    got = samples(view(leader))
    assert not any(name in got for name in CELLS), (what, sorted(got))
    assert got["specguard_plan_version"] == [({}, 7.0)]  # what SpecGuardPlanStale compares


def test_a_follower_repeats_none_of_its_deciders_state_and_keeps_its_own():
    follower, standby = samples(view(None)), samples(view(False))
    assert not any(name in follower for name in DECIDER_STATE), sorted(follower)
    assert all(name in standby for name in DECIDER_STATE)  # a decider still reports its own
    assert follower["specguard_plan_age_seconds"] == [({}, 3.0)]
    assert follower["specguard_last_evaluation_timestamp_seconds"] == [({}, 100.0)]  # its rounds
    assert "specguard_guard_leader" not in follower and standby["specguard_guard_leader"] == [({}, 0.0)]
