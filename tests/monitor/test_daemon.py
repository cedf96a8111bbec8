"""The guard daemon on a fake clock: evidence in, plan + audit + actuators + metrics out."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from specguard.errors import SourceError
from specguard.exporters.routing import Router
from specguard.monitor import audit as audit_mod
from specguard.monitor import daemon
from specguard.monitor import state as state_mod
from specguard.monitor.actuators import RouterActuator
from specguard.monitor.guard_metrics import GuardCollector
from specguard.rules import policy as policy_mod
from specguard.rules.evidence import Evidence, PoolEvidence
from tests.monitor.guardkit import CODE, CREATIVE, POOLS, ScriptedSource

LIMITS = policy_mod.Limits(
    consecutive_failure_limit=1,
    failure_limit=-1,
    consecutive_success_limit=2,
    consecutive_error_limit=2,
    stabilization_window_seconds=60,
    min_samples=10,
    interval_seconds=10,
)
POLICY = policy_mod.Policy(
    rules=(policy_mod.Rule("relative-cost", "rc", threshold=1.0, restore_threshold=0.95, limits=LIMITS),),
    cooldown_seconds=0,
    alerts=policy_mod.AlertsPolicy(limits=replace(LIMITS, consecutive_failure_limit=0, min_samples=0)),
    version="test",
).with_pools({p.name: p.num_speculative_tokens for p in POOLS}, "spec-k4", "nospec")


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def make_guard(tmp_path, source, clock, policy=POLICY):
    """A guard acting on a router (whose replicas the planner reads), with a plan file and audit log."""
    router = Router(POOLS, default_pool="spec-k4", nospec_pool="nospec")
    guard = daemon.Guard(
        policy,
        sources=[source],
        actuators=[RouterActuator(router)],
        store=state_mod.PlanStore(tmp_path / "plan.json"),
        audit=audit_mod.AuditLog(tmp_path / "audit.jsonl"),
        clock=clock,
        temperature_buckets=["greedy", "high"],
        load_buckets=["low", "high"],
        pool_replicas=router.replicas,
    )
    return guard, router


async def run_rounds(guard, clock, rounds, step=10.0):
    decisions = []
    for _ in range(rounds):
        decisions += await guard.evaluate()
        clock.now += step
    return decisions


async def test_bad_class_goes_off_and_everything_records_it(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4, CODE: 0.6})
    guard, router = make_guard(tmp_path, source, clock)
    registry = CollectorRegistry()
    registry.register(GuardCollector(guard.counters, guard.view))
    await run_rounds(guard, clock, 2)
    assert router.plan()[CREATIVE] == "nospec" and router.plan()[CODE] == "spec-k4"
    labels = dict(zip(("task_type", "temperature_bucket", "load_bucket"), CREATIVE, strict=True))
    assert registry.get_sample_value("specguard_speculation_enabled", labels) == 0.0
    assert registry.get_sample_value("specguard_num_speculative_tokens", labels) == 0.0
    action = {
        "task_type": "creative",
        "temperature_bucket": "high",
        "action": "off",
        "reason": "relative-cost",
    }
    assert registry.get_sample_value("specguard_actions_total", action) == 1.0
    assert registry.get_sample_value("specguard_evaluations_total", {"result": "hold"}) == 1.0
    assert registry.get_sample_value("specguard_evaluations_total", {"result": "act"}) == 1.0
    assert registry.get_sample_value("specguard_evaluations_total", {"result": "ok"}) == 2.0
    assert registry.get_sample_value("specguard_last_evaluation_timestamp_seconds") == 1010.0
    assert registry.get_sample_value("specguard_config_info", {"version": "test"}) == 1.0
    records, _ = audit_mod.read(tmp_path / "audit.jsonl")
    assert [(r["class"], r["load_bucket"], r["from"], r["to"], r["action"]) for r in records] == [
        ("creative/high", "low", "spec-k4", "nospec", "off")
    ]
    assert records[0]["numbers"]["rules"]["relative-cost@spec-k4"]["value"] == 1.4
    # the action counter carries the decision's own time (a decision before the first scrape keeps it)
    assert registry.get_sample_value("specguard_actions_created", action) == records[0]["time"]
    assert "rc_lower (1.400) > threshold (1.0)" in records[0]["reason"]


async def test_restart_keeps_the_plan(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4})
    guard, _ = make_guard(tmp_path, source, clock)
    await run_rounds(guard, clock, 2)
    await guard.override("pin", "code", "greedy", "low", pool="spec-k2", reason="canary")
    restarted, router = make_guard(tmp_path, source, clock)
    assert router.plan() == {}
    await restarted._actuate([])  # what start() does first
    assert router.plan()[CREATIVE] == "nospec" and router.plan()[CODE] == "spec-k2"
    assert restarted.states[CODE].pin == "spec-k2" and restarted.version == guard.version
    assert [d["action"] for d in restarted.status()["decisions"]] == ["off", "pin"]  # from the audit log


async def test_recovering_class_is_restored_after_the_stabilisation_window(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4})
    guard, router = make_guard(tmp_path, source, clock)
    await run_rounds(guard, clock, 2)
    assert router.plan()[CREATIVE] == "nospec"
    source.rcs[CREATIVE] = 0.8
    decisions = await run_rounds(guard, clock, 10)
    restore = [d for d in decisions if d.action == "restore"]
    assert len(restore) == 1 and restore[0].at == 1080.0  # first good at 1020, window 60 s
    assert router.plan()[CREATIVE] == "spec-k4"


async def test_source_errors_freeze_the_safe_state_and_never_flap(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4, CODE: 0.6})
    policy = replace(POLICY, safe_state="nospec")
    guard, router = make_guard(tmp_path, source, clock, policy)
    await run_rounds(guard, clock, 1)
    source.down = True
    decisions = await run_rounds(guard, clock, 6)
    freezes = [d for d in decisions if d.action == "freeze"]
    assert {d.key for d in freezes} == {CREATIVE, CODE}
    assert all("consecutive_errors (3) > consecutive_error_limit (2)" in d.reason for d in freezes)
    assert router.plan()[CODE] == "nospec" and guard.view().frozen
    source.down = False
    decisions = await run_rounds(guard, clock, 1)
    assert {d.action for d in decisions} == {"unfreeze"} and not guard.view().frozen
    assert router.plan()[CODE] == "nospec"  # back on only through the restore rules


async def test_actuator_failure_is_counted_and_retried(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4})
    guard, router = make_guard(tmp_path, source, clock)

    class Flaky:
        name = "flaky"
        calls = 0

        async def apply(self, plan, decisions):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise SourceError("boom")

    guard.actuators.append(Flaky())
    await run_rounds(guard, clock, 3)
    assert guard.counters.actuation_errors["flaky"] == 1
    assert Flaky.calls == 2  # failed on the change, re-applied on the next round, then up to date


async def test_plan_write_failure_keeps_routing(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4})
    guard, router = make_guard(tmp_path, source, clock)
    guard.store.path = tmp_path / "plan.json" / "not-a-dir"  # every save fails
    (tmp_path / "plan.json").write_text("{}")
    await run_rounds(guard, clock, 2)
    assert router.plan()[CREATIVE] == "nospec"
    assert guard.counters.plan_write_errors == 1


async def test_scheduler_runs_named_job_with_one_instance(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 0.5})
    policy = replace(POLICY, rules=(replace(POLICY.rules[0], limits=replace(LIMITS, interval_seconds=1)),))
    guard, _ = make_guard(tmp_path, source, clock, policy)
    await guard.start()
    try:
        job = guard._scheduler.get_job("guard-evaluation")
        assert (job.name, job.coalesce, job.max_instances, job.misfire_grace_time) == (
            "guard evaluation",
            True,
            1,
            1,
        )
        for _ in range(100):
            if guard.last_evaluation is not None:
                break
            await asyncio.sleep(0.05)
        assert guard.last_evaluation == clock.now
        assert guard.status()["running"] is True
    finally:
        await guard.stop()
    assert guard.status()["running"] is False


async def test_fleet_replica_follows_the_stored_plan(tmp_path):
    leader_clock, source = Clock(), ScriptedSource({CREATIVE: 1.4})
    leader, _ = make_guard(tmp_path / "leader", source, leader_clock)
    await run_rounds(leader, leader_clock, 2)

    class Stored:
        async def read_plan(self):
            return leader.document()

    router = Router(POOLS, default_pool="spec-k4", nospec_pool="nospec")
    replica = daemon.Guard(POLICY, actuators=[RouterActuator(router)], follow=Stored(), clock=Clock())
    assert await replica.evaluate() == []
    assert router.plan()[CREATIVE] == "nospec" and replica.version == leader.version
    assert replica.status()["mode"] == "follow"


async def test_dry_run_is_audited_and_exported_but_never_routed(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4})
    guard, router = make_guard(tmp_path, source, clock, replace(POLICY, dry_run=True))
    await run_rounds(guard, clock, 2)
    assert router.plan().get(CREATIVE, "spec-k4") == "spec-k4"
    assert guard.counters.actions[("creative", "high", "off", "dry_run:relative-cost")] == 1
    records, _ = audit_mod.read(tmp_path / "audit.jsonl")
    assert [(r["action"], r["to"], r["dry_run"]) for r in records] == [("off", "nospec", True)]
    assert records[0]["reason"].startswith("dry-run: ")


class WindowStub:
    """The tap's window as LocalSource reads it: ``records(since=...)``."""

    def __init__(self, records):
        self._records = records

    def records(self, since=None):
        return [r for r in self._records if since is None or r.started_at >= since]


async def test_local_source_warm_starts_from_the_profile_and_sets_holdout_shares(tmp_path):
    from specguard.rules.cost_config import CostSettings
    from tests.rules.test_holdout import record
    from tests.rules.test_prior import profile

    clock = Clock(1000.0)
    rows = [replace(record("nospec", "plan"), started_at=990.0, task_type="creative") for _ in range(60)]
    rows += [replace(record("spec-k4", "plan"), started_at=990.0, task_type="code") for _ in range(200)]
    rows += [replace(record("spec-k4", "plan"), started_at=995.0) for _ in range(3)]  # chat's first three
    shares = []
    settings = CostSettings().with_traffic([("low", 8), ("medium", 24), ("high", None)])
    policy = replace(POLICY, prior="profile", holdout="on_demand")
    source = daemon.LocalSource(
        WindowStub(rows),
        POOLS,
        settings,
        profile=profile(),
        window_seconds=300,
        policy=policy,
        on_holdout=shares.append,
        max_holdout_share=0.05,
    )
    guard, router = make_guard(tmp_path, source, clock, policy=policy)
    decisions = await guard.evaluate()
    # 60 planned no-spec requests cover the baseline (1.5 x 30)
    assert [held.shares for held in shares] == [{"low": 0.0}]
    # chat has three requests so far (no live evidence yet): the profile's K=2 is ~5-10% cheaper
    # than K=4 in every bucket, the ones its load has not reached included
    warm = {d.key: (d.action, d.cause, d.to_pool) for d in decisions if d.action != "none"}
    assert warm[("chat", "medium", "low")] == ("shorten", "profile", "spec-k2")
    assert router.plan()[("chat", "medium", "high")] == "spec-k2"
    # a reload to `prior: none` and `holdout: fixed` is honoured on the next collection
    source.policy = replace(policy, prior="none", holdout="fixed")
    assert all(not ev.prior for ev in (await source.collect(clock.now, [])).values())
    assert shares[-1].shares == {}  # the router is back on the tap's share everywhere


async def test_local_source_plans_a_class_the_profile_knows_before_its_first_request(tmp_path):
    """No learning delay: the first evaluation plans every class the profile covers, so the
    router sends a class's first request to the profile's pool (before, only after the evaluation
    following its first finished requests)."""
    from specguard.rules.cost_config import CostSettings
    from tests.rules.test_prior import profile

    clock = Clock(1000.0)
    settings = CostSettings().with_traffic([("low", 8), ("medium", 24), ("high", None)])
    policy = replace(POLICY, prior="profile")
    source = daemon.LocalSource(
        WindowStub([]), POOLS, settings, profile=profile(), window_seconds=300, policy=policy
    )
    guard, router = make_guard(tmp_path, source, clock, policy=policy)
    decisions = await guard.evaluate()
    warm = {d.key: (d.action, d.cause) for d in decisions if d.changes_plan}
    assert warm == {("chat", "medium", b): ("shorten", "profile") for b in ("low", "medium", "high")}
    assert router.choose("chat", "medium", lambda pool: "low").pool == "spec-k2"
    decisions = await run_rounds(guard, clock, 3)  # no requests: nothing moves it again
    assert not [d for d in decisions if d.changes_plan]


async def test_with_a_profile_the_first_evaluation_runs_at_start_before_any_request(tmp_path):
    """The warm start is in force from the first request: the daemon evaluates at once when its
    source has a calibration prior (the replay ticks at t=0 alike); without one, after 5 s."""
    from specguard.rules.cost_config import CostSettings
    from tests.rules.test_prior import profile

    settings = CostSettings().with_traffic([("low", 8), ("medium", 24), ("high", None)])
    delays = {}
    for prior in ("profile", "none"):
        policy = replace(POLICY, prior=prior)
        source = daemon.LocalSource(
            WindowStub([]), POOLS, settings, profile=profile(), window_seconds=300, policy=policy
        )
        guard, router = make_guard(tmp_path / prior, source, Clock(1000.0), policy=policy)
        delays[prior] = guard._first_evaluation_delay()
        if prior == "profile":
            await guard.start()
            try:
                for _ in range(40):  # 2 s, well before the 5 s a source without a prior waits
                    if guard.last_evaluation is not None:
                        break
                    await asyncio.sleep(0.05)
            finally:
                await guard.stop()
            assert router.choose("chat", "medium", lambda pool: "low").pool == "spec-k2"
    assert delays == {"profile": 0.0, "none": 5.0}


async def test_dry_run_changes_nothing_but_the_record(tmp_path):
    """Dry-run offs once counted against max_actions_per_hour and the cooldown, bumped
    plan_version and were persisted, so the first real move after dry-run was blocked for an hour."""
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4})
    capped = replace(POLICY, dry_run=True, max_actions_per_hour=2, cooldown_seconds=600)
    guard, router = make_guard(tmp_path, source, clock, capped)
    decisions = await run_rounds(guard, clock, 6)
    dry = [d for d in decisions if d.action == "off"]
    assert len(dry) == 3 and all(d.dry_run for d in dry)  # one per breach (2 bad evaluations each)
    assert guard.version == 0 and not (tmp_path / "plan.json").exists()
    state = guard.states[CREATIVE]
    assert (state.pool, state.last_action_at, state.action_times) == ("spec-k4", None, ())
    records, _ = audit_mod.read(tmp_path / "audit.jsonl")
    assert [(r["action"], r["dry_run"], r["plan_version"]) for r in records] == [("off", True, 0)] * 3
    # the operator turns dry-run off: the next breach moves the class, no cap or cooldown in the way
    await guard.set_policy(replace(capped, dry_run=False))
    decisions = await run_rounds(guard, clock, 2)
    (off,) = [d for d in decisions if d.action == "off"]
    assert not off.dry_run and router.plan()[CREATIVE] == "nospec" and guard.version == 1
    # and a restart in between would not have mattered: nothing of the dry run was stored
    restarted, _ = make_guard(tmp_path, source, clock, capped)
    assert restarted.states[CREATIVE].action_times == (clock.now - 10,)


async def test_dry_run_says_once_it_would_freeze_and_never_freezes(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 0.8})
    guard, _ = make_guard(tmp_path, source, clock, replace(POLICY, dry_run=True))
    await run_rounds(guard, clock, 1)
    source.down = True
    decisions = [d for d in await run_rounds(guard, clock, 6) if d.key == CREATIVE]
    assert [d.action for d in decisions] == ["none", "none", "freeze", "none", "none", "none"]
    assert decisions[2].dry_run and "would be frozen" in decisions[3].reason
    assert not guard.states[CREATIVE].frozen and guard.version == 0
    source.down = False
    assert [d.action for d in await guard.evaluate() if d.key == CREATIVE] == ["none"]  # no unfreeze


class RollbackSource:
    """Good rc, but most requests of the class roll back every draft."""

    def __init__(self, ratio):
        self.ratio = ratio

    async def collect(self, now, keys):
        values = {"rc": 0.8, "full_rollback_request_ratio": self.ratio}
        return {CREATIVE: Evidence(pools={"spec-k4": PoolEvidence("spec-k4", values, samples=425)})}


async def test_a_report_only_rule_is_seen_in_status_log_and_counter_but_never_acts(tmp_path, caplog):
    """The report-only full-rollback rule once saw 424 of 425 requests above its
    threshold, and nothing appeared in /status, the log or the actions counter."""
    report_only = policy_mod.Rule(
        "full-rollback-requests",
        "full_rollback_request_ratio",
        threshold=0.5,
        restore_threshold=0.4,
        limits=LIMITS,
        dry_run=True,
    )
    clock, source = Clock(), RollbackSource(424 / 425)
    guard, router = make_guard(tmp_path, source, clock, replace(POLICY, rules=(*POLICY.rules, report_only)))
    registry = CollectorRegistry()
    registry.register(GuardCollector(guard.counters, guard.view))
    with caplog.at_level(logging.INFO, "specguard.guard"):
        await run_rounds(guard, clock, 5)
    row = next(
        c for c in guard.status()["classes"] if (c["task_type"], c["load_bucket"]) == ("creative", "low")
    )
    assert list(row["reports"]) == ["full-rollback-requests"]
    assert "full_rollback_request_ratio (0.998) > threshold (0.5)" in row["reports"]["full-rollback-requests"]
    assert "(report only)" in row["reports"]["full-rollback-requests"]
    labels = {
        "task_type": "creative",
        "temperature_bucket": "high",
        "action": "report",
        "reason": "report_only:full-rollback-requests",
    }
    assert registry.get_sample_value("specguard_actions_total", labels) == 1.0  # once per breach
    assert caplog.text.count("report: full-rollback-requests on spec-k4") == 1
    assert router.plan().get(CREATIVE, "spec-k4") == "spec-k4" and guard.version == 0  # never acted on
    source.ratio = 0.1
    with caplog.at_level(logging.INFO, "specguard.guard"):
        await run_rounds(guard, clock, 1)
    assert "full-rollback-requests is no longer breached" in caplog.text


async def test_scheduler_runs_do_not_fill_the_log(tmp_path, caplog):
    """90% of `specguard run`'s lines were once APScheduler's "Running job ..." and
    "... executed successfully" at the default level."""
    clock, source = Clock(), ScriptedSource({CREATIVE: 0.5})
    policy = replace(POLICY, rules=(replace(POLICY.rules[0], limits=replace(LIMITS, interval_seconds=1)),))
    guard, _ = make_guard(tmp_path, source, clock, policy)
    logging.getLogger("apscheduler.executors.guard").setLevel(logging.NOTSET)
    # levels set explicitly: an earlier test in the run may have left a logger at WARNING
    with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="specguard.guard"):
        await guard.start()
        try:
            for _ in range(100):
                if guard.last_evaluation is not None:
                    break
                await asyncio.sleep(0.05)
        finally:
            await guard.stop()
    assert guard.last_evaluation is not None
    noise = [r for r in caplog.records if r.name.startswith("apscheduler") and r.levelno < logging.WARNING]
    assert [
        r.getMessage() for r in noise if "Running job" in r.getMessage() or "executed" in r.getMessage()
    ] == []
    assert any("guard evaluation every" in r.getMessage() for r in caplog.records)  # ours still there


async def test_a_run_missed_on_a_busy_loop_is_counted_not_printed_in_apschedulers_words(tmp_path, caplog):
    from apscheduler.events import EVENT_JOB_MISSED, JobEvent

    clock, source = Clock(), ScriptedSource({CREATIVE: 0.5})
    guard, _ = make_guard(tmp_path, source, clock, POLICY)
    for name in ("apscheduler", "apscheduler.scheduler", "apscheduler.executors.guard"):
        logging.getLogger(name).setLevel(logging.NOTSET)  # as in a fresh `specguard run`
    with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="specguard.guard"):
        await guard.start()
        try:
            # what APScheduler logs when a busy event loop delays a run past its grace time
            logging.getLogger("apscheduler.scheduler").warning(
                'Run time of job "guard evaluation" was missed by 0:00:01.5'
            )
            guard._on_job_event(JobEvent(EVENT_JOB_MISSED, "guard-evaluation", "default"))
        finally:
            await guard.stop()
    assert guard.missed_runs == 1
    words = [r.getMessage() for r in caplog.records if r.name.startswith("apscheduler")]
    assert words == [], words  # not "Adding job tentatively", "Scheduler started" or "was missed"
    assert not any("scheduler event" in r.getMessage() for r in caplog.records)
    assert any("guard evaluation every" in r.getMessage() for r in caplog.records)


class TwoPoolSource:
    """creative: K=4 measured at rc 2.0 and K=2's exact what-if at ``k2`` (from the same requests)."""

    def __init__(self, k2):
        self.k2 = k2

    async def collect(self, now, keys):
        k4 = PoolEvidence("spec-k4", {"rc": 2.0, "rc_lower": 1.9, "rc_upper": 2.1}, samples=100)
        bounds = {"rc_lower": self.k2 * 0.95, "rc_upper": self.k2 * 1.05}  # the measurement's, carried over
        k2 = PoolEvidence(
            "spec-k2", {"rc": self.k2, **bounds}, samples=100, predicted=True, method="histogram"
        )
        return {CREATIVE: Evidence(pools={"spec-k4": k4, "spec-k2": k2})}


async def test_a_class_off_speculation_is_probed_by_expected_cost(tmp_path):
    """Once off, the class's probes go to its expected cheapest speculative pool, at
    a share with share x (rc - 1) <= 0.5%; the router takes them each evaluation, /status shows them."""
    clock, source = Clock(), TwoPoolSource(k2=1.5)
    router = Router(POOLS, default_pool="spec-k4", nospec_pool="nospec", probe_share=0.05)
    guard = daemon.Guard(
        replace(POLICY, restore_on_prediction=False),
        sources=[source],
        actuators=[RouterActuator(router)],
        clock=clock,
        set_probes=router.set_probes,
        probe_share=router.probe_share,
    )
    await run_rounds(guard, clock, 2)
    assert router.plan()[CREATIVE] == "nospec"
    await run_rounds(guard, clock, 1)
    assert router.probes() == {CREATIVE: ("spec-k2", 0.01)}  # 0.005 / (1.5 - 1)
    row = next(c for c in guard.status()["classes"] if c["task_type"] == "creative")
    assert row["probe"] == {"pool": "spec-k2", "share": 0.01, "expected_rc": 1.5, "basis": "what-if"}
    source.k2 = 3.0  # both lose: the cheaper of the two (K=4 at 2.0), at 0.5% / (2.0 - 1)
    await run_rounds(guard, clock, 1)
    assert router.probes() == {CREATIVE: ("spec-k4", pytest.approx(0.005))}
    source.k2 = 0.8  # it pays on K=2: restored there (on the measurement that follows), and no probe
    await run_rounds(guard, clock, 12)
    assert router.plan()[CREATIVE] != "nospec" and router.probes() == {}
    assert all(c["probe"] is None for c in guard.status()["classes"])


class SpreadSource:
    """code at low load: K=4 measured at rc 0.6 (an interval, enough samples); and the window's
    step-cost fit, as ``LocalSource.spread_model`` gives it."""

    async def collect(self, now, keys):
        k4 = PoolEvidence("spec-k4", {"rc": 0.6, "rc_lower": 0.55, "rc_upper": 0.65}, samples=100)
        return {CODE: Evidence(pools={"spec-k4": k4})}

    def spread_model(self, now):
        from specguard.rules import spread
        from tests.rules.test_planfeed import SETTINGS, window

        return spread.model(window(), POLICY, SETTINGS, None)


@pytest.mark.parametrize("on", [True, False])
async def test_guard_spread_hands_the_router_each_class_pools_and_status_shows_them(on):
    clock, router = Clock(), Router(POOLS, default_pool="spec-k4", nospec_pool="nospec")
    guard = daemon.Guard(
        replace(POLICY, spread=on), sources=[SpreadSource()], clock=clock, set_spread=router.set_spread
    )
    await run_rounds(guard, clock, 1)
    row = next(c for c in guard.status()["classes"] if c["task_type"] == "code")
    loads = {"spec-k4": 40.0, "spec-k2": 1.0, "nospec": 1.0}  # K=4 crowded, the others idle
    choice = router.choose("code", "greedy", lambda pool: "low", loads.get)
    if not on:
        assert row["spread"] is None and choice.pool == "spec-k4" and guard.status()["spread_fit"] is None
        return
    assert guard.status()["spread_fit"].startswith("T_step = ")
    assert (
        set(row["spread"]) == {"spec-k4", "nospec"} and row["spread"]["nospec"] == 1.0
    )  # no evidence on K=2
    assert (choice.pool, choice.route, choice.planned) == ("nospec", "spread", "spec-k4")
    loads["spec-k4"] = 1.0  # idle again: K=4 is cheaper for it
    assert router.choose("code", "greedy", lambda pool: "low", loads.get).pool == "spec-k4"


class PlanSource:
    """The window of tests/rules/test_planfeed (three classes on three pools) and code at high load
    measured at rc 2.5 on K=4 (an interval, enough samples), as ``LocalSource.plan`` reads them."""

    def __init__(self):
        self.replicas = None

    async def collect(self, now, keys):
        rc = {"rc": 2.5, "rc_lower": 2.4, "rc_upper": 2.6}
        return {CODE_HIGH: Evidence(pools={"spec-k4": PoolEvidence("spec-k4", rc, samples=100)})}

    def plan(self, states, evidence, now, replicas):
        from specguard.rules import planfeed
        from tests.rules.test_planfeed import SETTINGS, window

        self.replicas = dict(replicas)
        return planfeed.decide(
            planfeed.build(window(now), states, evidence, now, PLANNER, SETTINGS, replicas)
        )


CODE_HIGH = ("code", "greedy", "high")
PLANNER = replace(POLICY, decider="planner")


async def test_guard_planner_moves_what_the_fleet_plan_moves_and_status_shows_the_plan(tmp_path):
    clock, source = Clock(), PlanSource()
    guard, router = make_guard(tmp_path, source, clock, PLANNER)
    (decision,) = [d for d in await run_rounds(guard, clock, 1) if d.changes_plan]
    assert (decision.key, decision.to_pool, decision.cause) == (CODE_HIGH, "nospec", "planner")
    assert router.plan()[CODE_HIGH] == "nospec"
    assert source.replicas == router.replicas()  # the planner is charged the router's replicas
    status = guard.status()["planner"]
    assert status["moves"] == {"code/greedy": "nospec"} and status["plan"]["code/greedy"] == "nospec"
    assert status["tokens_per_second"] > status["tokens_per_second_now"] and status["benefit_lower"] > 0
    # the per-class decider never plans, and says nothing of a plan
    per_class = daemon.Guard(POLICY, sources=[PlanSource()], clock=Clock())
    await run_rounds(per_class, per_class.clock, 1)
    assert per_class.status()["planner"] is None and per_class.last_plan is None


async def test_guard_planner_without_a_local_window_plans_nothing_and_says_why():
    guard = daemon.Guard(PLANNER, sources=[ScriptedSource({CODE: 2.5})], clock=Clock())
    decisions = await run_rounds(guard, guard.clock, 3)
    # the watch rules still act (rc 2.5 > 1); no plan, and no best-pool choice in planner mode
    assert [d.cause for d in decisions if d.changes_plan] == ["relative-cost"]
    assert guard.status()["planner"] == {
        "plan": None,
        "reason": "no local window (the planner reads the tap's own requests)",
        "desired_replicas": None,
    }


@pytest.mark.parametrize("scaling", [None, policy_mod.Scaling(target_in_flight=0.02, start_delay_seconds=0)])
async def test_guard_scaling_exports_each_pools_desired_replicas(tmp_path, scaling):
    from specguard.rules import desired, planfeed
    from tests.rules.test_planfeed import SETTINGS, window

    clock, source = Clock(), PlanSource()
    policy = replace(PLANNER, scaling=scaling)
    guard, router = make_guard(tmp_path, source, clock, policy)
    registry = CollectorRegistry()
    registry.register(GuardCollector(guard.counters, guard.view))
    now = clock.now
    await run_rounds(guard, clock, 1)
    exported = {
        p.name: registry.get_sample_value("specguard_pool_desired_replicas", {"pool": p.name}) for p in POOLS
    }
    if scaling is None:
        assert set(exported.values()) == {None} and guard.status()["planner"]["desired_replicas"] is None
        return
    # what rules.desired makes of the plan the guard made (the same window, evidence and replicas)
    evidence = {CODE_HIGH: (await source.collect(now, []))[CODE_HIGH]}
    found = planfeed.decide(
        planfeed.build(window(now), {}, evidence, now, policy, SETTINGS, router.replicas())
    )
    want = desired.Sizer(scaling).desired(found.input, found.plan, now)
    assert exported == {pool: float(n) for pool, n in want.items()}
    assert all(n >= 1 for n in want.values()) and max(want.values()) > 1  # a small target: some pool grows
    assert guard.status()["planner"]["desired_replicas"] == want


class BrokenPlanSource(PlanSource):
    def plan(self, states, evidence, now, replicas):
        raise ZeroDivisionError("a bug")

    def spread_model(self, now):
        raise ZeroDivisionError("another bug")


async def test_a_failing_planner_or_spread_leaves_the_watch_rules_acting(tmp_path):
    clock = Clock()
    guard, router = make_guard(tmp_path, BrokenPlanSource(), clock, replace(PLANNER, spread=True))
    guard.set_spread = router.set_spread
    decisions = await run_rounds(guard, clock, 2)
    # code at rc 2.5: the relative-cost rule moves it off speculation, as without a planner
    assert [(d.key, d.to_pool, d.cause) for d in decisions if d.changes_plan] == [
        (CODE_HIGH, "nospec", "relative-cost")
    ]
    assert guard.status()["planner"]["reason"] == "planner failed: ZeroDivisionError: a bug"
    assert guard.spread == {} and router.choose("code", "greedy", lambda pool: "high").pool == "nospec"
    assert guard.status()["spread_fit"] == "none: failed (see the log)"
