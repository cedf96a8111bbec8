"""Faults around the guard: Prometheus down or slow, Alertmanager duplicates and disorder, the
Kubernetes API conflicting or failing, the audit disk full, and the clock jumping.

Each test runs the real daemon (``monitor.daemon.Guard``) with its real plan store, audit log
and router on a fake clock, and checks: what the guard decided, that every decision that
changed the plan reached the router, the audit log and every actuator eventually (no decision
lost), and that no class moved back and forth (no flap).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import uuid
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from specguard.errors import SourceError
from specguard.exporters.routing import Router
from specguard.monitor import actuators, daemon, receiver
from specguard.monitor import audit as audit_mod
from specguard.monitor import state as state_mod
from specguard.monitor.guard_metrics import GuardCollector
from specguard.monitor.promql import PromQL
from specguard.rules import policy as policy_mod
from tests.monitor.guardkit import CODE, CREATIVE, POOLS, ScriptedSource
from tests.reliability import relkit

LIMITS = policy_mod.Limits(
    consecutive_failure_limit=1,
    failure_limit=-1,
    consecutive_success_limit=3,
    consecutive_error_limit=2,
    stabilization_window_seconds=120,
    min_samples=10,
    interval_seconds=10,
)
RULE = policy_mod.Rule("relative-cost", "rc", threshold=1.0, restore_threshold=0.95, limits=LIMITS)
PROM_RULE = policy_mod.Rule(
    "relative-cost",
    measure=None,
    query='specguard_rc{task_type="{{ task_type }}",pool="{{ pool }}",window="{{ window }}"}',
    threshold=1.0,
    restore_threshold=0.95,
    limits=replace(LIMITS, min_samples=0),
)


def policy(rule=RULE, **extra):
    settings = {
        "cooldown_seconds": 0,
        "shorten": False,
        "alerts": policy_mod.AlertsPolicy(limits=replace(LIMITS, consecutive_failure_limit=0, min_samples=0)),
        "version": "reliability",
        **extra,
    }
    base = policy_mod.Policy(rules=(rule,), **settings)
    return base.with_pools({p.name: p.num_speculative_tokens for p in POOLS}, "spec-k4", "nospec")


def make_guard(tmp_path, sources, clock, pol=None, *, acts=(), audit_path=None, plan_path=None, keys=()):
    router = Router(POOLS, default_pool="spec-k4", nospec_pool="nospec")
    guard = daemon.Guard(
        pol or policy(),
        sources=sources,
        actuators=[actuators.RouterActuator(router), *acts],
        store=state_mod.PlanStore(plan_path or tmp_path / "plan.json"),
        audit=audit_mod.AuditLog(audit_path or tmp_path / "audit.jsonl"),
        clock=clock,
        keys=keys,
        temperature_buckets=["greedy", "high"],
        load_buckets=["low"],
    )
    return guard, router


def plan_moves(records):
    """(class, from, to) of the audit records that changed a pool."""
    decisions = [r for r in records if "event" not in r]  # webhook lines say who sent what
    return [(r["class"], r["from"], r["to"]) for r in decisions if r["from"] != r["to"]]


def flaps(records):
    """Classes that went somewhere and came back within the records."""
    seen: dict[str, list[str]] = {}
    for cls, _from, to in plan_moves(records):
        seen.setdefault(cls, []).append(to)
    return {cls: moves for cls, moves in seen.items() if len(moves) > 1}


# ------------------------------------------------------------------ Prometheus unreachable / slow
class FakePrometheus:
    """``/api/v1/query`` answering rc per task type; ``mode``: ok | slow | 500 | garbage."""

    def __init__(self, rcs):
        self.rcs = rcs
        self.mode = "ok"
        self.queries = 0
        self.release = asyncio.Event()

    async def query(self, request: web.Request) -> web.Response:
        self.queries += 1
        params = dict(request.query)
        if request.method == "POST":
            params.update(await request.post())
        if self.mode == "slow":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), 60)
        if self.mode == "500":
            return web.json_response({"status": "error", "error": "overloaded"}, status=500)
        if self.mode == "garbage":
            return web.Response(text="<html>proxy error</html>", content_type="text/html")
        task = params["query"].split('task_type="')[1].split('"')[0]
        value = [1.0, str(self.rcs[task])]
        data = {"resultType": "vector", "result": [{"metric": {}, "value": value}]}
        return web.json_response({"status": "success", "data": data})

    def app(self):
        app = web.Application()
        app.router.add_route("*", "/api/v1/query", self.query)
        return app


# generous: an answering fake Prometheus must never time out on a loaded 2-core CI machine
SLOW_MACHINE_TIMEOUT = 2.0


async def test_prometheus_unreachable_slow_and_broken(tmp_path):
    """Errors freeze the last plan (never a flap), recovery unfreezes, no decision is lost."""
    prom = FakePrometheus({"creative": 1.4, "code": 0.6})
    clock = relkit.Clock()
    pol = policy(PROM_RULE, local=False)
    async with relkit.serving(prom.app()) as url:
        source = daemon.PromQLSource(PromQL(url, timeout=SLOW_MACHINE_TIMEOUT), pol)
        guard, router = make_guard(tmp_path, [source], clock, pol, keys=[CREATIVE, CODE])
        registry = CollectorRegistry()
        registry.register(GuardCollector(guard.counters, guard.view))
        phases = []

        async def rounds(n, mode):
            prom.mode = mode
            for _ in range(n):
                decisions = await guard.evaluate()
                phases.append((mode, {d.key: (d.phase.value, d.action) for d in decisions}))
                clock.now += 10

        try:
            await rounds(2, "ok")  # creative goes off on the 2nd bad evaluation
            assert router.plan() == {CREATIVE: "nospec", CODE: "spec-k4"}
            await rounds(1, "slow")
            await rounds(1, "500")
            await rounds(2, "garbage")  # 4 errors in a row > limit 2: frozen in the last plan
            frozen = registry.get_sample_value("specguard_guard_frozen")
            assert router.plan() == {CREATIVE: "nospec", CODE: "spec-k4"}
        finally:
            prom.release.set()
    # Prometheus gone for good: connection refused
    source._promql = PromQL(f"http://127.0.0.1:{relkit.closed_port()}", timeout=0.3)
    await rounds(2, "down")
    assert router.plan() == {CREATIVE: "nospec", CODE: "spec-k4"}
    async with relkit.serving(prom.app()) as url:
        source._promql = PromQL(url, timeout=SLOW_MACHINE_TIMEOUT)
        await rounds(2, "ok")

    assert frozen == 1.0 and registry.get_sample_value("specguard_guard_frozen") == 0.0
    errors = [p for mode, p in phases if mode != "ok" for p in p.values()]
    assert {phase for phase, _ in errors} == {"error"}
    actions = [
        (mode, key, action) for mode, p in phases for key, (_, action) in p.items() if action != "none"
    ]
    assert actions == [
        ("ok", CREATIVE, "off"),
        ("garbage", CODE, "freeze"),
        ("garbage", CREATIVE, "freeze"),
        ("ok", CODE, "unfreeze"),
        ("ok", CREATIVE, "unfreeze"),
    ]
    records, torn = audit_mod.read(tmp_path / "audit.jsonl")
    assert torn == [] and plan_moves(records) == [("creative/high", "spec-k4", "nospec")]
    assert [r["action"] for r in records] == ["off", "freeze", "freeze", "unfreeze", "unfreeze"]
    assert router.plan() == {CREATIVE: "nospec", CODE: "spec-k4"}
    saved = state_mod.PlanStore(tmp_path / "plan.json").load()
    assert saved is not None and saved.version == guard.version == max(r["plan_version"] for r in records)
    assert registry.get_sample_value("specguard_evaluations_total", {"result": "error"}) == 12.0


async def test_hanging_prometheus_fails_the_round_after_the_first_timeouts(tmp_path):
    """Once Prometheus timed out, PromQLSource fails the rest of the round at once: the check
    runs after a query got its slot (4 at a time), so queries queued behind the first timeouts
    are not sent and do not each wait a full timeout ((queries / 4) x timeout per round)."""
    prom = FakePrometheus({f"t{i}": 0.5 for i in range(20)})
    prom.mode = "slow"
    pol = policy(PROM_RULE, local=False)
    keys = [(f"t{i}", "high", "low") for i in range(20)]
    try:
        async with relkit.serving(prom.app()) as url:
            source = daemon.PromQLSource(PromQL(url, timeout=0.2), pol)  # 4 at a time
            found = await source.collect(0.0, keys)
            prom.release.set()
    finally:
        prom.release.set()
    assert all(ev.pools and all(p.errors for p in ev.pools.values()) for ev in found.values())
    assert prom.queries <= 8, f"{prom.queries} queries sent to a Prometheus that had stopped answering"


# ------------------------------------------------------------------ Alertmanager delivery semantics
def am_payload(status, fingerprint="fp-creative", starts="2026-11-29T10:00:00Z"):
    alert = {
        "status": status,
        "labels": {"alertname": "SpecGuardRelativeCostAboveOne", "task_type": "creative"},
        "annotations": {},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-29T10:05:00Z",
        "generatorURL": "",
        "fingerprint": fingerprint,
    }
    return {"version": "4", "status": status, "receiver": "specguard", "alerts": [alert]}


@contextlib.asynccontextmanager
async def receiver_for(guard):
    guard.running = True
    api = receiver.Api(guard, token="t0k", max_body_bytes=1 << 16)
    app = web.Application()
    app.router.add_routes(api.routes())
    async with relkit.serving(app) as url, aiohttp.ClientSession() as session:

        async def post(body):
            headers = {"Authorization": "Bearer t0k"}
            async with session.post(f"{url}/api/v1/alerts", json=body, headers=headers) as response:
                return response.status, await response.json()

        yield post


async def test_alertmanager_duplicates_and_ha_pairs_act_once(tmp_path):
    clock = relkit.Clock()
    guard, router = make_guard(tmp_path, [ScriptedSource({CREATIVE: 0.8, CODE: 0.6})], clock)
    async with receiver_for(guard) as post:
        outcomes = []
        for _ in range(3):  # one evaluation interval: both HA replicas send, and repeat
            for _replica in range(2):
                status, body = await post(am_payload("firing"))
                assert status == 200
                outcomes.append(body["outcomes"])
        decisions = await guard.evaluate()
        clock.now += 10
        for _ in range(4):  # repeat_interval resends while firing: nothing new happens
            await post(am_payload("firing"))
            decisions += await guard.evaluate()
            clock.now += 10
    assert outcomes[0] == {"new": 1} and all(o == {"duplicate": 1} for o in outcomes[1:])
    acted = [(d.key, d.action) for d in decisions if d.action != "none"]
    assert acted == [(CREATIVE, "off")]
    assert router.plan()[CREATIVE] == "nospec"
    records = audit_mod.decisions(audit_mod.read(tmp_path / "audit.jsonl")[0])
    assert plan_moves(records) == [("creative/high", "spec-k4", "nospec")]
    assert guard.counters.webhook_alerts[("firing", "duplicate")] == 9


async def test_alertmanager_resolved_before_firing_changes_nothing(tmp_path):
    """A resolved notice for an alert never seen firing is no reason to act, and no flap."""
    clock = relkit.Clock()
    guard, router = make_guard(tmp_path, [ScriptedSource({CREATIVE: 0.8, CODE: 0.6})], clock)
    async with receiver_for(guard) as post:
        status, body = await post(am_payload("resolved"))
        assert status == 200 and body["outcomes"] == {"new": 1}
        decisions = []
        for _ in range(5):
            decisions += await guard.evaluate()
            clock.now += 10
    assert [d for d in decisions if d.action != "none"] == []
    assert set(router.plan().values()) == {"spec-k4"}
    assert audit_mod.decisions(audit_mod.read(tmp_path / "audit.jsonl")[0]) == []


async def test_alertmanager_out_of_order_new_episode_after_resolve(tmp_path):
    """Fire, resolve, then a new episode (a later startsAt): each notice lands in order of episodes."""
    clock = relkit.Clock()
    guard, router = make_guard(tmp_path, [ScriptedSource({CREATIVE: 0.8})], clock)
    async with receiver_for(guard) as post:
        await post(am_payload("firing"))
        await guard.evaluate()
        assert router.plan()[CREATIVE] == "nospec"
        clock.now += 10
        await post(am_payload("resolved"))
        await post(am_payload("resolved"))  # duplicate resolve
        for _ in range(20):  # restore only after 3 good evaluations and 120 s of stability
            await guard.evaluate()
            clock.now += 10
        assert router.plan()[CREATIVE] == "spec-k4"
        await post(am_payload("firing", starts="2026-11-29T11:00:00Z"))  # a new episode
        await guard.evaluate()
    records = audit_mod.decisions(audit_mod.read(tmp_path / "audit.jsonl")[0])
    assert [r["action"] for r in records] == ["off", "restore", "off"]
    assert router.plan()[CREATIVE] == "nospec"


async def test_stale_firing_after_resolve_is_ignored(tmp_path):
    """Alertmanager retries a failed 'firing' delivery after it already delivered 'resolved'
    for the same alert (same fingerprint, same startsAt): the late firing is stale and must not
    turn the class off again (a flap). Only a firing with a newer startsAt re-opens it."""
    clock = relkit.Clock()
    guard, router = make_guard(tmp_path, [ScriptedSource({CREATIVE: 0.8})], clock)
    async with receiver_for(guard) as post:
        await post(am_payload("resolved"))  # the resolve overtook the firing notice
        await post(am_payload("firing"))  # the firing (same episode) arrives late
        for _ in range(3):
            await guard.evaluate()
            clock.now += 10
    records = audit_mod.decisions(audit_mod.read(tmp_path / "audit.jsonl")[0])
    assert [r["action"] for r in records] == []


# ------------------------------------------------------------------ Kubernetes API: conflicts, errors
class FakeKube:
    """GET/PATCH of one ConfigMap with resourceVersion checks; scripted failures per PATCH."""

    def __init__(self):
        self.version = 1
        self.data = {"unrelated": "kept"}
        self.script: list[int] = []  # statuses to answer the next PATCHes with (409 = someone wrote)
        self.calls: list[str] = []

    def obj(self):
        meta = {"name": "routing", "namespace": "serving", "resourceVersion": str(self.version)}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(self.data)}

    async def get(self, request):
        self.calls.append("GET")
        if self.script and self.script[0] == -500:  # the API server fails reads too
            self.script.pop(0)
            return web.json_response({"kind": "Status", "code": 500, "reason": "InternalError"}, status=500)
        return web.json_response(self.obj())

    async def patch(self, request):
        self.calls.append("PATCH")
        body = await request.json()
        if self.script:
            status = self.script.pop(0)
            if status == 409:  # a concurrent writer got in first
                self.version += 1
                self.data["other"] = f"edit {self.version}"
            else:
                status_body = {"kind": "Status", "code": status, "reason": "Failure"}
                return web.json_response(status_body, status=status)
        if body.get("metadata", {}).get("resourceVersion") != str(self.version):
            status_body = {"kind": "Status", "code": 409, "reason": "Conflict"}
            return web.json_response(status_body, status=409)
        self.version += 1
        self.data.update(body.get("data", {}))
        return web.json_response(self.obj())

    def app(self):
        app = web.Application()
        path = "/api/v1/namespaces/{namespace}/configmaps/{name}"
        app.router.add_get(path, self.get)
        app.router.add_patch(path, self.patch)
        return app


async def test_configmap_conflicts_and_api_errors_lose_no_decision(tmp_path):
    kube = FakeKube()
    clock = relkit.Clock()
    source = ScriptedSource({CREATIVE: 1.4, CODE: 0.6})
    async with relkit.serving(kube.app()) as url:
        cm = actuators.ConfigMapActuator(
            "serving", "routing", timeout=SLOW_MACHINE_TIMEOUT * 5, conflict_retries=3, api_server=url
        )
        guard, router = make_guard(tmp_path, [source], clock, acts=[cm])
        kube.script = [409, 409]  # two conflicting writers: re-read and re-applied
        await guard.evaluate()
        clock.now += 10
        kube.script = [500, 403, 500]  # API errors for three evaluations: decision kept, retried
        await guard.evaluate()  # creative goes off here
        assert router.plan()[CREATIVE] == "nospec"  # routing goes on whatever the API says
        clock.now += 10
        await guard.evaluate()
        clock.now += 10
        kube.script = [-500]  # the read fails as well
        await guard.evaluate()
        clock.now += 10
        assert guard.counters.actuation_errors["configmap"] == 3
        await guard.evaluate()  # the API server is fine again: the current plan is written
        clock.now += 10
        await guard.evaluate()
    assert cm.conflicts == 2
    assert kube.data["unrelated"] == "kept" and kube.data["other"] == "edit 3"
    stored = state_mod.decode(json.loads(kube.data["plan.json"]), "configmap")
    assert stored.version == guard.version == 1
    assert stored.routing() == router.plan() == {CREATIVE: "nospec", CODE: "spec-k4"}
    records = audit_mod.decisions(audit_mod.read(tmp_path / "audit.jsonl")[0])
    assert plan_moves(records) == [("creative/high", "spec-k4", "nospec")]


# ------------------------------------------------------------------ audit log disk full
@contextlib.contextmanager
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs when we may mount one (root), else /dev/full; yields a directory or None."""
    mount = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, check=False
    )
    try:
        yield mount if done.returncode == 0 else None
    finally:
        if done.returncode == 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


async def test_audit_disk_full_keeps_routing_and_says_so(tmp_path):
    with tiny_disk(tmp_path) as disk:
        if disk is not None:  # fill the filesystem, leaving the audit log nowhere to go
            audit_path = disk / "audit.jsonl"
            plan_path = disk / "plan.json"
            with contextlib.suppress(OSError), open(disk / "ballast", "wb") as handle:
                while True:
                    handle.write(b"\0" * 4096)
                    handle.flush()
        else:
            audit_path = plan_path = "/dev/full"  # every write: ENOSPC
        clock = relkit.Clock()
        source = ScriptedSource({CREATIVE: 1.4, CODE: 0.6})
        guard, router = make_guard(tmp_path, [source], clock, audit_path=audit_path, plan_path=plan_path)
        registry = CollectorRegistry()
        registry.register(GuardCollector(guard.counters, guard.view))
        decisions = []
        for _ in range(4):
            decisions += await guard.evaluate()
            clock.now += 10
        assert router.plan() == {CREATIVE: "nospec", CODE: "spec-k4"}  # routing went on
        # every later evaluation retried the audit line (3 failed writes); the plan waits behind it
        assert registry.get_sample_value("specguard_audit_write_errors_total") == 3.0
        assert registry.get_sample_value("specguard_plan_write_errors_total") == 1.0
        status = guard.status(10)
        assert status["audit_write_errors"] == 3
        assert [d["action"] for d in status["decisions"]] == ["off"]  # kept in memory, shown in /status
        if disk is not None:  # space comes back: the next evaluation writes what was refused
            (disk / "ballast").unlink()
            await guard.evaluate()  # no new decision: the retry alone
            records, torn = audit_mod.read(audit_path)
            assert [(r["class"], r["action"]) for r in records] == [("creative/high", "off")]
            assert torn == [] and state_mod.PlanStore(plan_path).load().routing() == router.plan()
            source.rcs[CODE] = 1.5
            for _ in range(3):
                clock.now += 10
                await guard.evaluate()
            records, torn = audit_mod.read(audit_path)
            assert [r["class"] for r in records] == ["creative/high", "code/greedy"] and torn == []
            assert state_mod.PlanStore(plan_path).load().routing() == router.plan()
    acted = [(d.key, d.action) for d in decisions if d.action != "none"]
    assert acted == [(CREATIVE, "off")]


# ------------------------------------------------------------------ clock jumps
@pytest.mark.parametrize(
    "jump",
    [
        pytest.param(-7200.0, id="back-2h"),
        pytest.param(86400.0, id="forward-1d"),
        pytest.param(-1e6, id="back-11d"),
    ],
)
async def test_clock_jump_causes_no_flap(tmp_path, jump):
    """Bad evidence, then a jump of the wall clock mid-stream, then good evidence.

    A forward jump must not count as the stabilization window (restore still needs 3 good
    evaluations in a row), a backward jump must not re-open cooldowns or restore early.
    """
    clock = relkit.Clock()
    source = ScriptedSource({CREATIVE: 1.4})
    pol = policy(cooldown_seconds=60, max_actions_per_hour=2)
    guard, router = make_guard(tmp_path, [source], clock, pol)
    timeline = []
    for step in range(30):
        if step == 4:
            source.rcs[CREATIVE] = 0.5  # speculation pays again
        if step == 5:
            clock.now += jump
        for d in await guard.evaluate():
            if d.action != "none":
                timeline.append((step, d.action))
        clock.now += 10
    actions = [a for _, a in timeline]
    assert actions[0] == "off" and timeline[0][0] == 1
    assert actions.count("off") == 1 and actions.count("restore") <= 1
    # a restore needs three good evaluations in a row after the change (steps 4, 5, 6 at the earliest)
    assert all(step >= 6 for step, a in timeline if a == "restore")
    records = audit_mod.decisions(audit_mod.read(tmp_path / "audit.jsonl")[0])
    assert len(records) == len(timeline) and not [c for c, m in flaps(records).items() if len(m) > 2]
    assert router.plan()[CREATIVE] in ("nospec", "spec-k4")


async def test_backward_clock_jump_does_not_blind_the_guard(tmp_path):
    """After the wall clock steps back 2 h (NTP), bad evidence must still be acted on.

    A last evaluation in the future means the clock stepped back: the rule is due now, instead
    of "no rule due" until the clock catches up (2 h here, days for a bigger step).
    """
    clock = relkit.Clock()
    source = ScriptedSource({CREATIVE: 0.5})
    guard, router = make_guard(tmp_path, [source], clock, policy())
    for _ in range(3):
        await guard.evaluate()
        clock.now += 10
    clock.now -= 7200  # the wall clock steps back
    source.rcs[CREATIVE] = 1.6  # and now speculation clearly loses
    reasons = []
    for _ in range(6):  # one minute of evaluations
        for d in await guard.evaluate():
            reasons.append(d.reason)
        clock.now += 10
    assert router.plan()[CREATIVE] == "nospec", reasons[-1]


async def test_forward_clock_jump_does_not_shorten_the_stabilization_window(tmp_path):
    """A forward jump of the wall clock must not stand in for stabilization_window_seconds (120 s).

    The window wants real elapsed time (HPA/KEP-853 semantics): each good evaluation credits at
    most 2 x interval_seconds, so +1 day between two evaluations 10 s apart counts as 20 s; the
    class is restored once enough good evaluations have been made, not blocked for good.
    """
    clock = relkit.Clock()
    source = ScriptedSource({CREATIVE: 1.4})
    guard, router = make_guard(tmp_path, [source], clock, policy())
    for step in range(8):
        if step == 3:
            source.rcs[CREATIVE] = 0.5
        if step == 4:
            clock.now += 86400
        await guard.evaluate()
        clock.now += 10
    # 5 good evaluations, 50 s of real time: < 120 s stabilization window
    assert router.plan()[CREATIVE] == "nospec"
    for _ in range(3):  # the 7th good evaluation: 6 gaps x 20 s credited = 120 s
        await guard.evaluate()
        clock.now += 10
    assert router.plan()[CREATIVE] == "spec-k4"


async def test_source_bug_is_an_error_evaluation_not_a_crash(tmp_path):
    """An evidence source raising anything at all: the round is an error, the guard goes on."""

    class Broken:
        async def collect(self, now, keys):
            raise ZeroDivisionError("bug")

    class Hanging:
        async def collect(self, now, keys):
            await asyncio.sleep(3600)

    clock = relkit.Clock()
    guard, router = make_guard(tmp_path, [Broken()], clock, keys=[CREATIVE])
    guard.evaluation_timeout = 0.2
    guard.states[CREATIVE] = daemon.guard.initial_state(CREATIVE, guard.policy)
    decisions = await guard.evaluate()
    assert {d.phase.value for d in decisions} == {"error"}
    guard.sources = [Hanging()]
    clock.now += 10
    decisions = await guard.evaluate()
    assert {d.phase.value for d in decisions} == {"error"}
    assert "timed out" in decisions[0].reason
    with pytest.raises(SourceError):
        await PromQL(f"http://127.0.0.1:{relkit.closed_port()}", timeout=0.2).scalar("up")


async def test_tap_keeps_serving_while_prometheus_hangs(tmp_path):
    """An evaluation stuck on a slow Prometheus never holds up the traffic through the tap."""
    from specguard.lab import loadgen
    from specguard.monitor import config, guard_wiring
    from specguard.monitor.app import Monitor
    from specguard.sim import cluster

    prom = FakePrometheus({"code": 0.5, "chat": 0.5, "creative": 0.5, "extraction": 0.5, "other": 0.5})
    prom.mode = "slow"
    async with (
        relkit.serving(prom.app()) as prom_url,
        cluster.SimCluster.from_config(None, seed=0, time_scale=0.02, pools=["spec-k4", "nospec"]) as sim,
    ):
        pools = "\n".join(
            f'  - {{name: {n}, url: "{u}", engine: vllm, num_speculative_tokens: {relkit.K[n]}}}'
            for n, u in sim.urls.items()
        )
        text = f"""pools:
{pools}
scrape: {{interval_seconds: 3600}}
tap: {{holdout_share: 0, probe_share: 0}}
classes:
  task_types: [code]
  temperature_buckets: [{{name: any, max: null}}]
  load_buckets: [{{name: all, max: null}}]
guard:
  interval_seconds: 3600
  local: false
  prometheus: {{url: "{prom_url}", timeout_seconds: 30}}
  rules:
    - {{name: rc, query: 'specguard_rc{{task_type="{{{{ task_type }}}}"}}', threshold: 1.0}}
server: {{insecure_loopback: true}}
"""
        cfg = config.parse_text(text, "reliability.yaml")
        monitor = Monitor(cfg)
        guard, _api = guard_wiring.build(monitor, cfg)
        url = await monitor.start("127.0.0.1", 0)
        try:
            evaluation = asyncio.create_task(guard.evaluate())
            while prom.queries == 0:
                await asyncio.sleep(0.01)
            mix = [loadgen.RequestClass("code", max_tokens=8), loadgen.RequestClass("chat", temperature=0.7)]
            served = await loadgen.run_load(url, mix, 8, requests=40, stream=True, seed=5)
            assert [r.status for r in served] == [200] * 40
            assert not evaluation.done()  # still waiting on Prometheus while all 40 were served
            prom.mode = "ok"
            prom.release.set()  # Prometheus answers at last: the evaluation completes normally
            decisions = await evaluation
        finally:
            prom.release.set()
            await monitor.stop()
    assert {d.key for d in decisions} == {("code", "any", "all"), ("other", "any", "all")}
    assert {d.phase.value for d in decisions} <= {"ok", "hold"}
    assert {d.action for d in decisions} == {"none"}
