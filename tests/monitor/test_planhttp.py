"""The HTTP plan source over real loopback HTTP: the decider's ``GET /api/v1/plan`` (ETag, 304,
503 off the leader) and followers that poll it, persist what they follow, keep routing by it
while the decider is away, and export how old their plan is."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from specguard.errors import ConfigError, SourceError
from specguard.exporters.routing import Router
from specguard.monitor import config, daemon, guard_wiring, leader, planhttp
from specguard.monitor import state as state_mod
from specguard.monitor.actuators import RouterActuator
from specguard.monitor.app import Monitor
from specguard.monitor.guard_metrics import GuardCollector
from tests.exporters import servekit
from tests.monitor.guardkit import CREATIVE, POOLS, ScriptedSource
from tests.monitor.test_daemon import POLICY, Clock, make_guard, run_rounds


async def serve_decider(guard):
    app = web.Application()
    app.router.add_routes(planhttp.PlanEndpoint(guard).routes())
    return await servekit.serve(app)


async def get(url, **headers):
    async with aiohttp.ClientSession() as session:
        async with session.get(url + planhttp.PATH, headers=headers) as response:
            return response.status, response.headers.copy(), await response.read()


async def test_plan_endpoint_serves_the_plan_with_an_etag_and_304_when_unchanged(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4})
    guard, _ = make_guard(tmp_path, source, clock)
    runner, url = await serve_decider(guard)
    try:
        status, headers, body = await get(url)
        assert status == 200 and headers[planhttp.VERSION_HEADER] == "0"
        assert state_mod.decode(json.loads(body), "plan").version == 0
        etag = headers["ETag"]
        assert (await get(url, **{"If-None-Match": etag}))[0] == 304
        clock.now += 5  # the time of rendering is not part of the ETag
        assert (await get(url, **{"If-None-Match": f'"x", W/{etag}'}))[0] == 304
        await run_rounds(guard, clock, 2)  # creative goes off: version 1
        status, headers, body = await get(url, **{"If-None-Match": etag})
        assert status == 200 and headers[planhttp.VERSION_HEADER] == "1" and headers["ETag"] != etag
        doc = state_mod.decode(json.loads(body), "plan")
        assert doc.routing()[CREATIVE] == "nospec"
    finally:
        await runner.cleanup()


async def test_only_the_leader_serves_the_plan(tmp_path):
    clock = Clock()
    lock = tmp_path / "plan.json.lock"
    holder = leader.FileLock(lock, identity="decider-a")
    assert holder.try_acquire()

    async def nothing():
        return None

    standby = daemon.Guard(
        POLICY, clock=clock, elector=leader.FileLock(lock, identity="decider-b"), takeover=nothing
    )
    follower = daemon.Guard(POLICY, clock=clock, follow=planhttp.HttpPlanSource(["http://127.0.0.1:9"]))
    await standby.start_elector()  # finds the lock held: a standby
    for guard, message in ((standby, "not the leader (leader: decider-a)"), (follower, "follows a plan")):
        runner, url = await serve_decider(guard)
        try:
            status, headers, body = await get(url)
            assert status == 503 and message in body.decode() and headers["Retry-After"] == "1"
        finally:
            await runner.cleanup()
    await standby.elector.stop()
    await holder.stop()


async def broken(request):
    return web.Response(body=b"<html>bad gateway</html>", status=502)


async def test_source_tries_each_decider_and_reports_all_failures(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4})
    guard, _ = make_guard(tmp_path, source, clock)
    runner, url = await serve_decider(guard)
    bad = web.Application()
    bad.router.add_get(planhttp.PATH, broken)
    bad_runner, bad_url = await servekit.serve(bad)
    follower = planhttp.HttpPlanSource([bad_url, url + "/"], timeout=2)
    try:
        doc = await follower.read_plan()
        assert doc.version == 0 and follower.answered_by == url + planhttp.PATH
        assert await follower.read_plan() is None  # 304: unchanged
        await runner.cleanup()
        with pytest.raises(SourceError) as caught:
            await follower.read_plan()
        assert f"{bad_url}{planhttp.PATH}: HTTP 502 <html>bad gateway</html>" in str(caught.value)
        assert f"{url}{planhttp.PATH}: unreachable" in str(caught.value)
    finally:
        await follower.close()
        await bad_runner.cleanup()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b"{not json", "not a specguard plan", id="not-json"),
        pytest.param(b'{"entries": [{"pool": "x"}]}', "entries[0].task_type", id="bad-entry"),
        pytest.param(b"[" * 2000 + b"]" * 2000, "nested deeper than 64 levels", id="deep"),
        pytest.param(b"\xff\xfe", "not a specguard plan", id="not-utf8"),
        pytest.param(b"[" * 10 + b"]" * 10 + b" " * 9000, "plan body larger than 8192 bytes", id="too-large"),
    ],
)
async def test_a_bad_plan_is_a_source_error_never_adopted(body, expected):
    async def handler(request):
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get(planhttp.PATH, handler)
    runner, url = await servekit.serve(app)
    follower = planhttp.HttpPlanSource([url], max_bytes=8192)
    try:
        with pytest.raises(SourceError, match=expected.replace("[", r"\[")):
            await follower.read_plan()
        assert follower.etag is None
    finally:
        await follower.close()
        await runner.cleanup()


def follower_guard(tmp_path, url, clock):
    router = Router(POOLS, default_pool="spec-k4", nospec_pool="nospec")
    guard = daemon.Guard(
        POLICY,
        actuators=[RouterActuator(router)],
        store=state_mod.PlanStore(tmp_path / "follower" / "plan.json"),
        clock=clock,
        follow=planhttp.HttpPlanSource([url], timeout=1),
    )
    return guard, router


async def test_follower_keeps_and_persists_the_last_plan_and_exports_its_age(tmp_path):
    clock, source = Clock(), ScriptedSource({CREATIVE: 1.4})
    decider, _ = make_guard(tmp_path, source, clock)
    await run_rounds(decider, clock, 2)
    runner, url = await serve_decider(decider)
    follower, router = follower_guard(tmp_path, url, clock)
    registry, decided = CollectorRegistry(), CollectorRegistry()
    registry.register(GuardCollector(follower.counters, follower.view))
    decided.register(GuardCollector(decider.counters, decider.view))
    try:
        written = clock.now
        assert await follower.evaluate() == []
        assert router.plan()[CREATIVE] == "nospec" and follower.version == 1
        assert registry.get_sample_value("specguard_plan_age_seconds") == 0.0
        assert registry.get_sample_value("specguard_plan_version") == 1.0
        assert registry.get_sample_value("specguard_guard_leader") is None  # a follower does not lead
        # the plan's cells come from the decider alone; the follower says by its version which it holds
        cell = dict(zip(("task_type", "temperature_bucket", "load_bucket"), CREATIVE, strict=True))
        assert decided.get_sample_value("specguard_plan_info", {**cell, "pool": "nospec"}) == 1.0
        assert decided.get_sample_value("specguard_plan_version") == 1.0
        exported = {s.name for family in registry.collect() for s in family.samples}
        assert not exported & {"specguard_plan_info", "specguard_speculation_enabled"}, exported
        clock.now += 30
        await follower.evaluate()  # 304: unchanged, and confirmed again
        assert registry.get_sample_value("specguard_plan_age_seconds") == 0.0
        await runner.cleanup()
        # the decider is gone: the follower routes by its last plan, which grows old
        confirmed = clock.now
        for _ in range(3):
            clock.now += 30
            await follower.evaluate()
        assert router.plan()[CREATIVE] == "nospec" and follower.version == 1
        assert registry.get_sample_value("specguard_plan_age_seconds") == clock.now - confirmed == 90
        assert follower.counters.actuation_errors["follow"] == 3
    finally:
        await runner.cleanup()
        await follower.stop()
    # ... and after its own restart too, from its plan file, before any decider answers
    restarted, restarted_router = follower_guard(tmp_path, url, clock)
    await restarted._actuate([])  # what start() does first
    assert restarted_router.plan()[CREATIVE] == "nospec" and restarted.version == 1
    assert restarted.status()["mode"] == "follow"
    # at the latest confirmed when it wrote its plan file (a 304 later confirmed it, unwritten)
    assert restarted.status()["plan_age_seconds"] == clock.now - written == 120


BASE = """
pools: [{name: spec-k4, url: "http://127.0.0.1:1", num_speculative_tokens: 4},
        {name: nospec, url: "http://127.0.0.1:2", num_speculative_tokens: 0}]
tap: {default_pool: spec-k4, nospec_pool: nospec}
"""


@pytest.mark.parametrize(
    ("actuators", "message"),
    [
        pytest.param(
            '{follow: true, plan_http: {urls: ["ftp://d"]}}',
            "actuators.plan_http.urls[0]: ('ftp://d') must be an http(s) URL",
            id="bad-url",
        ),
        pytest.param(
            "{follow: true, plan_http: {urls: []}}",
            "actuators.plan_http.urls: must name at least one decider",
            id="no-url",
        ),
        pytest.param(
            '{plan_http: {urls: ["http://d:8090"]}}',
            "actuators.plan_http: is where a follower reads the plan: set follow: true",
            id="decider-with-plan-http",
        ),
        pytest.param(
            '{follow: true, plan_http: {urls: ["http://d:8090"]}, configmap: {namespace: n, name: m}}',
            "actuators.follow: follow: true needs one plan source",
            id="two-sources",
        ),
        pytest.param(
            '{follow: true, plan_http: {urls: ["http://d:8090"], timeout_seconds: 0}}',
            "actuators.plan_http.timeout_seconds: (0.0) must be >= 0.1",
            id="zero-timeout",
        ),
    ],
)
def test_plan_http_config_errors_name_the_key(actuators, message):
    with pytest.raises(ConfigError) as caught:
        config.parse_text(BASE + f"actuators: {actuators}\n", "f.yaml")
    assert message in str(caught.value)


def test_plan_http_config_builds_a_follower():
    from specguard.monitor import config

    cfg = config.parse_text(
        BASE + 'actuators: {follow: true, plan_http: {urls: ["http://d:8090/"]}}\n', "f.yaml"
    )
    guard, _ = guard_wiring.build(Monitor(cfg), cfg)
    assert isinstance(guard.follow, planhttp.HttpPlanSource)
    assert guard.follow.urls == ["http://d:8090" + planhttp.PATH] and guard.status()["leader"] is None
