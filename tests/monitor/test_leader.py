"""One decider at a time: the lock on the plan store (two local deciders; a holder that dies) and
the Kubernetes Lease through the official client's leader election, against the loopback API
stand-in (tests/monitor/kubekit.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time

import aiohttp
import pytest
from aiohttp import web

from specguard.errors import ConfigError
from specguard.exporters.routing import Router
from specguard.monitor import actuators, config, daemon, guard_wiring, leader, receiver
from specguard.monitor import state as state_mod
from specguard.monitor.actuators import RouterActuator
from specguard.monitor.app import Monitor
from tests.exporters import servekit
from tests.monitor.guardkit import CODE, CREATIVE, POOLS, ScriptedSource
from tests.monitor.kubekit import FakeKubeApi
from tests.monitor.test_daemon import POLICY, Clock


async def wait_for(predicate, seconds=15.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


# -- the lock on the plan store ------------------------------------------------------------------
async def test_file_lock_one_holder_and_takeover_on_release(tmp_path):
    path = tmp_path / "plan.json.lock"
    first = leader.FileLock(path, identity="decider-a", retry_seconds=0.1)
    second = leader.FileLock(path, identity="decider-b", retry_seconds=0.1)
    await first.start()
    await second.start()
    try:
        assert first.is_leader and not second.is_leader
        assert second.holder == "decider-a"  # read from the lock file
        await first.stop()
        assert await wait_for(lambda: second.is_leader, 5)
        assert path.read_text() == "decider-b\n"
    finally:
        await second.stop()
        await first.stop()


async def test_file_lock_that_cannot_be_created_never_stops_the_guard(tmp_path, caplog):
    (tmp_path / "not-a-dir").write_text("")
    lock = leader.FileLock(tmp_path / "not-a-dir" / "plan.json.lock", identity="only")
    await lock.start()
    assert lock.is_leader and lock.holder == "only"
    assert "deciding without it" in caplog.text
    await lock.stop()


HOLDER = """
import sys, time
from specguard.monitor import leader
lock = leader.FileLock(sys.argv[1], identity="doomed")
assert lock.try_acquire()
print("held", flush=True)
time.sleep(120)
"""


async def test_file_lock_is_taken_over_when_its_holder_is_killed(tmp_path):
    path = tmp_path / "plan.json.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        standby = leader.FileLock(path, identity="standby", retry_seconds=0.1)
        await standby.start()
        await asyncio.sleep(0.3)
        assert not standby.is_leader and standby.holder == "doomed"
        holder.kill()  # SIGKILL: no cleanup of its own; the kernel drops the lock
        holder.wait(10)
        assert await wait_for(lambda: standby.is_leader, 5)
        await standby.stop()
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()


def local_decider(tmp_path, name, source, clock):
    """A decider sharing ``tmp_path/plan.json`` with the others (elector: the lock on it)."""
    store = state_mod.PlanStore(tmp_path / "plan.json")
    router = Router(POOLS, default_pool="spec-k4", nospec_pool="nospec")

    async def read_store():
        return store.load_readonly()

    guard = daemon.Guard(
        POLICY,
        sources=[source],
        actuators=[RouterActuator(router)],
        store=store,
        clock=clock,
        temperature_buckets=["greedy", "high"],
        load_buckets=["low", "high"],
        elector=leader.FileLock(tmp_path / "plan.json.lock", identity=name, retry_seconds=0.1),
        takeover=read_store,
    )
    return guard, router


async def test_two_local_deciders_only_one_writes_and_the_other_resumes_its_plan(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4, CODE: 0.6})
    first, first_router = local_decider(tmp_path, "a", source, clock)
    second, second_router = local_decider(tmp_path, "b", source, clock)
    await first.start_elector()
    await second.start_elector()
    try:
        for _ in range(2):
            assert await second.evaluate() == []  # standby: no evaluation, no write
            await first.evaluate()
            clock.now += 10
        assert first.is_leader and not second.is_leader
        assert first_router.plan()[CREATIVE] == "nospec" and second_router.plan() == {}
        assert second.version == 0 and first.version == 1
        assert second.view().leader is False and first.view().leader is True
        stored = (tmp_path / "plan.json").read_text()
        # the leader dies: the standby takes the lock and the plan over, and changes nothing
        await first.stop()
        assert await wait_for(lambda: second.elector.is_leader, 5)
        decisions = await second.evaluate()
        assert second.version == 1 and second_router.plan() == first_router.plan()
        assert [d for d in decisions if d.action != "none"] == []
        assert json.loads((tmp_path / "plan.json").read_text())["entries"] == json.loads(stored)["entries"]
    finally:
        await second.stop()
        await first.stop()


async def test_a_standby_refuses_operator_overrides(tmp_path):
    clock, source = Clock(), ScriptedSource({})
    first, _ = local_decider(tmp_path, "a", source, clock)
    second, _ = local_decider(tmp_path, "b", source, clock)
    await first.start_elector()
    await second.start_elector()
    try:
        try:
            await second.override("pause", "code", "greedy", "low")
        except daemon.NotLeader as exc:
            assert "not the leader (leader: a)" in str(exc)
        else:
            raise AssertionError("a standby took an override")
        assert [d.action for d in await first.override("pause", "code", "greedy", "low")] == ["pause"]
        # over HTTP: 503, so a client tries the leader
        api = receiver.Api(second, token="tok")
        app = web.Application()
        app.router.add_routes(api.routes())
        runner, url = await servekit.serve(app)
        try:
            async with aiohttp.ClientSession(headers={"Authorization": "Bearer tok"}) as session:
                body = {"action": "pause", "task_type": "code"}
                async with session.post(url + "/api/v1/overrides", json=body) as response:
                    assert response.status == 503 and "not the leader" in (await response.json())["error"]
        finally:
            await runner.cleanup()
    finally:
        await first.stop()
        await second.stop()


# -- the Kubernetes Lease --------------------------------------------------------------------------
FAST = {"lease_duration": 2.5, "renew_deadline": 2, "retry_period": 1, "timeout": 2}


def lease(url, identity):
    client = lambda: actuators.api_client(api_server=url)  # noqa: E731
    return leader.Lease("specguard-guard", "serving", api_client=client, identity=identity, **FAST)


@contextlib.asynccontextmanager
async def two_candidates():
    """The API stand-in and two Lease candidates; guard-a leads, guard-b has started."""
    kube = FakeKubeApi()
    runner, url = await servekit.serve(kube.app())
    first, second = lease(url, "guard-a"), lease(url, "guard-b")
    try:
        await first.start()
        assert await wait_for(lambda: first.is_leader)
        await second.start()
        yield kube, first, second
    finally:
        await first.stop()
        await second.stop()
        await runner.cleanup()


async def test_lease_one_leader_and_handover_on_stop():
    async with two_candidates() as (kube, first, second):
        await asyncio.sleep(1.5)
        assert not second.is_leader and second.holder == "guard-a"
        assert kube.holder() == "guard-a" and kube.lease_writes[0] == ("create", "guard-a")
        started = time.monotonic()
        await first.stop()  # a clean stop hands the Lease back: no wait for it to expire
        assert ("replace", None) in kube.lease_writes
        assert await wait_for(lambda: second.is_leader)
        assert time.monotonic() - started < FAST["lease_duration"]
        assert kube.holder() == "guard-b" and not first.is_leader


async def test_lease_of_a_dead_leader_is_taken_after_it_expires():
    async with two_candidates() as (kube, first, second):
        first._stopping.set()  # dies: stops renewing, hands nothing back
        first._leading.clear()
        assert await wait_for(lambda: second.is_leader, FAST["lease_duration"] + 5)
        assert kube.holder() == "guard-b"


async def test_lease_holder_stops_deciding_when_it_cannot_renew():
    kube = FakeKubeApi()
    runner, url = await servekit.serve(kube.app())
    only = lease(url, "guard-a")
    try:
        await only.start()
        assert await wait_for(lambda: only.is_leader)
        kube.down = True  # the API server is unreachable: renewals fail
        started = time.monotonic()
        assert await wait_for(lambda: not only.is_leader, FAST["renew_deadline"] + 3)
        assert time.monotonic() - started <= FAST["renew_deadline"] + 1.5
        kube.down = False  # back: the Lease is still ours, taken again at once
        assert await wait_for(lambda: only.is_leader, 5)
    finally:
        await only.stop()
        await runner.cleanup()


async def test_lease_deciders_only_the_leader_writes_the_configmap(tmp_path):
    kube = FakeKubeApi()
    runner, url = await servekit.serve(kube.app())
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4, CODE: 0.6})

    def decider(name):
        cm = actuators.ConfigMapActuator("serving", "routing", api_server=url, timeout=5)
        router = Router(POOLS, default_pool="spec-k4", nospec_pool="nospec")
        guard = daemon.Guard(
            POLICY,
            sources=[source],
            actuators=[RouterActuator(router), cm],
            store=state_mod.PlanStore(tmp_path / name / "plan.json"),  # each its own disk
            clock=clock,
            temperature_buckets=["greedy", "high"],
            load_buckets=["low", "high"],
            elector=lease(url, name),
            takeover=cm.read_plan,
        )
        return guard, router

    (first, first_router), (second, second_router) = decider("guard-a"), decider("guard-b")
    try:
        await first.start()
        assert await wait_for(lambda: first.elector.is_leader)
        await second.start()
        for _ in range(2):
            assert await second.evaluate() == []
            await first.evaluate()
            clock.now += 10
        patches = len(kube.patches)
        assert patches >= 1 and first_router.plan()[CREATIVE] == "nospec"
        assert state_mod.decode(json.loads(kube.data["plan.json"]), "cm").version == 1
        await first.stop()
        assert await wait_for(lambda: second.elector.is_leader)
        # the new leader has no plan file of its own: it resumes from the ConfigMap, unchanged
        decisions = await second.evaluate()
        assert second.version == 1 and second_router.plan()[CREATIVE] == "nospec"
        assert second_router.plan().get(CODE, "spec-k4") == "spec-k4"  # stored entries: changed classes
        assert [d for d in decisions if d.action != "none"] == [] and len(kube.patches) == patches
    finally:
        await first.stop()
        await second.stop()
        await runner.cleanup()


ELECTION_BASE = """
pools: [{name: spec-k4, url: "http://127.0.0.1:1", num_speculative_tokens: 4},
        {name: nospec, url: "http://127.0.0.1:2", num_speculative_tokens: 0}]
tap: {default_pool: spec-k4, nospec_pool: nospec}
"""


def test_election_config_errors_say_what_the_client_library_would_exit_on():
    timings = "lease_duration_seconds: 5, renew_deadline_seconds: 5, retry_period_seconds: 5"
    text = ELECTION_BASE + f"actuators: {{leader_election: {{mode: lease, {timings}}}}}\n"
    with pytest.raises(ConfigError) as caught:
        config.parse_text(text, "f.yaml")
    message = str(caught.value)
    assert "actuators.leader_election: mode lease needs actuators.configmap" in message
    assert "leader_election.lease_duration_seconds: (5) must be > renew_deadline_seconds (5)" in message
    assert "renew_deadline_seconds: (5) must be > 1.2 x retry_period_seconds (5)" in message
    with pytest.raises(ConfigError, match="mode lock needs actuators.plan_file"):
        config.parse_text(ELECTION_BASE + "actuators: {leader_election: {mode: lock}}\n", "f.yaml")


def test_election_auto_picks_the_lease_with_a_configmap_and_the_lock_with_a_plan_file(tmp_path):
    cm = "configmap: {namespace: serving, name: routing, api_server: 'http://127.0.0.1:9'}"
    picks = {}
    for name, acts in {
        "lease": f"{{{cm}, plan_file: '{tmp_path / 'a.json'}'}}",
        "lock": f"{{plan_file: '{tmp_path / 'b.json'}'}}",
        "none": "{}",
        "follower": f"{{follow: true, {cm}}}",
    }.items():
        cfg = config.parse_text(ELECTION_BASE + f"actuators: {acts}\n", "f.yaml")
        guard, _ = guard_wiring.build(Monitor(cfg), cfg)
        picks[name] = (guard.elector.name, guard.takeover is not None)
    assert picks == {
        "lease": ("lease", True),
        "lock": ("lock", True),
        "none": ("none", False),
        "follower": ("none", False),
    }


async def test_a_guard_embedded_without_start_joins_the_election_at_its_first_evaluation(tmp_path):
    """Embedding: ``guard_wiring.build`` without ``start()`` (tests, notebooks) still decides."""
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4, CODE: 0.6})
    guard, router = local_decider(tmp_path, "a", source, clock)
    try:
        for _ in range(2):
            await guard.evaluate()
            clock.now += 10
        assert guard.is_leader and router.plan()[CREATIVE] == "nospec"
    finally:
        await guard.stop()
