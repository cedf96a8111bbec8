"""Actuators against real HTTP on loopback: a stand-in Kubernetes API (the official client talks
to it; tests/monitor/kubekit.py) with optimistic concurrency, and a webhook receiver."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specguard.errors import SourceError
from specguard.monitor import actuators
from specguard.monitor import state as state_mod
from specguard.rules.guard import ClassState, Decision, Phase
from tests.monitor.kubekit import FakeKubeApi

POOLS = {"spec-k4": 4, "nospec": 0}
KEY = ("creative", "high", "low")


def plan(version=1, pool="nospec"):
    return state_mod.PlanDocument(version, 10.0, {KEY: ClassState(key=KEY, pool=pool)}, POOLS)


async def serve(app):
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def configmap_actuator(server, **kwargs):
    url = str(server.make_url("")).rstrip("/")
    return actuators.ConfigMapActuator("serving", "routing", api_server=url, timeout=5, **kwargs)


async def test_configmap_conflict_is_reread_and_retried_never_overwritten():
    kube = FakeKubeApi(interfering_writes=2)
    server = await serve(kube.app())
    try:
        actuator = configmap_actuator(server)
        await actuator.apply(plan(), [])
        assert kube.conflicts == 2 and actuator.conflicts == 2
        assert len(kube.patches) == 3
        # every patch carried the version it had read; only our key was sent
        assert [set(body["data"]) for _, body in kube.patches] == [{"plan.json"}] * 3
        assert kube.data["other"] == "kept" and kube.data["human"] == "edit 9"  # the other writes survive
        stored = json.loads(kube.data["plan.json"])
        assert stored["version"] == 1 and stored["entries"][0]["pool"] == "nospec"
        followed = await actuator.read_plan()
        assert followed.routing() == {KEY: "nospec"}
    finally:
        await server.close()


async def test_configmap_gives_up_after_the_retry_budget():
    kube = FakeKubeApi(interfering_writes=10)
    server = await serve(kube.app())
    try:
        actuator = configmap_actuator(server, conflict_retries=2)
        with pytest.raises(SourceError, match="still conflicting after 2 retries"):
            await actuator.apply(plan(), [])
        assert "plan.json" not in kube.data
    finally:
        await server.close()


async def test_configmap_unchanged_plan_is_not_written_again():
    kube = FakeKubeApi()
    server = await serve(kube.app())
    try:
        actuator = configmap_actuator(server)
        await actuator.apply(plan(), [])
        await actuator.apply(plan(), [])
        assert len(kube.patches) == 1
    finally:
        await server.close()


async def test_configmap_unreachable_is_a_source_error():
    server = await serve(web.Application())
    url = str(server.make_url("")).rstrip("/")
    await server.close()
    actuator = actuators.ConfigMapActuator("serving", "routing", api_server=url, timeout=2)
    with pytest.raises(SourceError, match="configmap serving/routing: read failed"):
        await actuator.apply(plan(), [])


def decision(action="off"):
    return Decision(KEY, 10.0, Phase.ACT, action, "spec-k4", "nospec", "rc (1.3) > threshold (1.0)")


async def test_webhook_posts_each_decision_and_retries_5xx():
    received = []
    failures = [503]

    async def hook(request):
        if failures:
            return web.Response(status=failures.pop())
        received.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    server = await serve(app)
    try:
        sleeps = []

        async def sleep(seconds):
            sleeps.append(seconds)

        actuator = actuators.WebhookActuator(str(server.make_url("/hook")), retries=2, sleep=sleep)
        await actuator.apply(plan(), [decision(), decision("none")])
        assert [r["decision"]["action"] for r in received] == ["off"]
        assert received[0]["plan_version"] == 1 and received[0]["decision"]["to"] == "nospec"
        assert sleeps == [0.5]
    finally:
        await server.close()


async def test_webhook_keeps_undelivered_decisions_for_the_next_round():
    up = False
    received = []

    async def hook(request):
        if not up:
            return web.Response(status=500)
        received.append(await request.json())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    server = await serve(app)
    try:

        async def sleep(seconds):
            return None

        actuator = actuators.WebhookActuator(str(server.make_url("/hook")), retries=1, sleep=sleep)
        with pytest.raises(SourceError, match="HTTP 500"):
            await actuator.apply(plan(), [decision()])
        up = True
        await actuator.apply(plan(2), [decision("restore")])
        assert [r["decision"]["action"] for r in received] == ["off", "restore"]
    finally:
        await server.close()


async def test_router_actuator_rejects_unknown_pools():
    class Router:
        def set_plan(self, plan):
            raise ValueError("plan names pools that are not configured: gone")

    with pytest.raises(SourceError, match="router refused the plan"):
        await actuators.RouterActuator(Router()).apply(plan(), [])


async def test_configmap_replicas_never_clobber_each_others_classes():
    kube = FakeKubeApi()
    server = await serve(kube.app())
    other = ("code", "greedy", "high")
    try:
        first, second = configmap_actuator(server), configmap_actuator(server)
        await first.apply(plan(1), [decision()])  # replica 1: creative -> nospec
        doc2 = state_mod.PlanDocument(1, 11.0, {other: ClassState(key=other, pool="nospec")}, POOLS)
        decided = Decision(other, 11.0, Phase.ACT, "off", "spec-k4", "nospec", "rc (1.2) > threshold (1.0)")
        await second.apply(doc2, [decided])  # replica 2 knows nothing about creative
        await second.apply(doc2, [])  # a re-sync without decisions changes nothing
        stored = state_mod.decode(json.loads(kube.data["plan.json"]), "cm")
        assert stored.routing() == {KEY: "nospec", other: "nospec"} and stored.version == 2
        assert len(kube.patches) == 2
    finally:
        await server.close()
