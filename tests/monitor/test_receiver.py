"""The Alertmanager receiver and operator API over real HTTP on loopback."""

from __future__ import annotations

import json
import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from specguard.monitor import receiver
from tests.monitor.test_daemon import CREATIVE, Clock, ScriptedSource, make_guard

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def payload(status="firing", fingerprint="fp-1", labels=None, **extra):
    alert = {
        "status": status,
        "labels": labels or {"alertname": "SpecGuardRelativeCostAboveOne", "task_type": "creative"},
        "annotations": {"summary": "rc above 1"},
        "startsAt": "2026-11-29T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint,
        "someFutureField": {"x": 1},
    }
    return {
        "version": "4",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "specguard",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager",
        "notification_reason": "new",
        "alerts": [alert],
        **extra,
    }


@pytest.fixture
async def api(tmp_path):
    clock = Clock()
    source = ScriptedSource({CREATIVE: 0.8})
    guard, router = make_guard(tmp_path, source, clock)
    guard.running = True
    api = receiver.Api(guard, token=TOKEN, max_body_bytes=4096)
    app = web.Application()
    app.router.add_routes(api.routes())
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield client, guard, router, clock
    finally:
        await client.close()


async def post(client, path, body, headers=AUTH):
    response = await client.post(path, data=json.dumps(body), headers=headers)
    return response.status, await response.json()


# --- authentication
@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="missing"),
        pytest.param({"Authorization": "Bearer wrong"}, id="wrong"),
        pytest.param({"Authorization": f"Basic {TOKEN}"}, id="wrong-scheme"),
    ],
)
async def test_alerts_need_the_token(api, headers, caplog):
    client, guard, *_ = api
    with caplog.at_level(logging.DEBUG):
        status, body = await post(client, "/api/v1/alerts", payload(), headers)
    assert status == 401 and body == {"error": "missing or wrong bearer token"}
    assert len(guard.alerts) == 0
    assert TOKEN not in caplog.text


async def test_no_token_configured_refuses_mutations(tmp_path):
    guard, _ = make_guard(tmp_path, ScriptedSource({}), Clock())
    api = receiver.Api(guard, token=None)
    assert api.authorize(None) == (
        403,
        "disabled: no token configured (set server.token_file or server.token_env)",
    )
    insecure = receiver.Api(guard, token=None, insecure=True)
    assert insecure.authorize(None, "127.0.0.1:8090") is None
    assert insecure.authorize(None, "[::1]:8090", "http://localhost:3000") is None
    # issue 21: a browser page (cross-origin simple request) or a rebound DNS name is refused
    denied = (403, "insecure_loopback: only requests to and from a loopback address")
    assert insecure.authorize(None, "127.0.0.1:8090", "https://evil.example") == denied
    assert insecure.authorize(None, "rebound.example:8090") == denied
    assert insecure.authorize(None, "127.0.0.1:8090", "null") == denied
    assert "s3cret" not in repr(receiver.Api(guard, token=TOKEN))


# --- bad payloads get 400 with the reason; Alertmanager does not retry them
@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param([1, 2], "payload must be a JSON object, got list", id="not-object"),
        pytest.param({"alerts": []}, "version: is required (Alertmanager webhook payload)", id="no-version"),
        pytest.param(
            {"version": "3", "alerts": []}, "version ('3') is not supported (expected '4')", id="v3"
        ),
        pytest.param({"version": "4"}, "alerts: must be a list", id="no-alerts"),
        pytest.param(
            payload(status="pending"),
            "alerts[0].status ('pending') must be 'firing' or 'resolved'",
            id="bad-status",
        ),
        pytest.param(
            payload(labels={"task_type": 3}),
            "alerts[0].labels: must be an object of strings",
            id="bad-labels",
        ),
    ],
)
async def test_bad_payload_is_400_with_the_reason(api, body, reason):
    client, guard, *_ = api
    status, answer = await post(client, "/api/v1/alerts", body)
    assert (status, answer) == (400, {"error": reason})
    assert guard.counters.webhook_alerts[("invalid", "rejected")] == 1


async def test_not_json_is_400(api):
    client, *_ = api
    response = await client.post("/api/v1/alerts", data=b"{nope", headers=AUTH)
    assert response.status == 400 and "body: not JSON" in (await response.json())["error"]


async def test_body_over_the_limit_is_413(api):
    client, *_ = api
    big = payload(padding="x" * 5000)
    response = await client.post("/api/v1/alerts", data=json.dumps(big), headers=AUTH)
    assert response.status == 413


async def test_transient_failure_is_503_so_alertmanager_retries(api):
    client, guard, *_ = api
    guard.running = False
    status, body = await post(client, "/api/v1/alerts", payload())
    assert status == 503 and "retry" in body["error"]


# --- idempotence, resolution, and the same state machine
async def test_repeats_are_idempotent_and_resolved_updates(api):
    client, guard, *_ = api
    assert await post(client, "/api/v1/alerts", payload()) == (200, {"accepted": 1, "outcomes": {"new": 1}})
    assert await post(client, "/api/v1/alerts", payload()) == (
        200,
        {"accepted": 1, "outcomes": {"duplicate": 1}},
    )
    status, body = await post(client, "/api/v1/alerts", payload(status="resolved"))
    assert body["outcomes"] == {"updated": 1} and len(guard.alerts) == 1
    status, body = await post(
        client, "/api/v1/alerts", payload(labels={"alertname": "Other"}, fingerprint="fp-2")
    )
    assert body["outcomes"] == {"ignored": 1}
    assert guard.counters.webhook_alerts[("firing", "duplicate")] == 1


async def test_alert_drives_the_state_machine_not_a_toggle(api):
    client, guard, router, clock = api
    await guard.evaluate()  # local evidence is good: rc 0.8
    clock.now += 10
    assert router.plan().get(CREATIVE, "spec-k4") == "spec-k4"
    await post(client, "/api/v1/alerts", payload())
    assert router.plan().get(CREATIVE, "spec-k4") == "spec-k4"  # nothing moves until an evaluation
    decisions = await guard.evaluate()
    (decision,) = [d for d in decisions if d.key == CREATIVE]
    assert (decision.action, decision.to_pool) == ("off", "nospec")
    assert "alert SpecGuardRelativeCostAboveOne firing" in decision.reason
    assert router.plan()[CREATIVE] == "nospec"


# --- operator overrides
async def test_pin_and_unpin_a_class(api):
    client, guard, router, _ = api
    status, body = await post(
        client,
        "/api/v1/overrides",
        {
            "action": "pin",
            "task_type": "creative",
            "temperature_bucket": "high",
            "pool": "nospec",
            "reason": "INC-7",
        },
    )
    assert status == 200 and {d["load_bucket"] for d in body["decisions"]} == {"low", "high"}
    assert router.plan()[CREATIVE] == "nospec"
    listed = await (await client.get("/api/v1/overrides")).json()
    assert {(o["load_bucket"], o["pin"]) for o in listed["overrides"]} == {
        ("low", "nospec"),
        ("high", "nospec"),
    }
    status, body = await post(client, "/api/v1/overrides", {"action": "unpin", "task_type": "creative"})
    assert status == 200 and all(d["action"] == "unpin" for d in body["decisions"])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            {"action": "pin", "task_type": "creative", "pool": "gone"},
            "pool ('gone') must be a configured pool",
        ),
        ({"action": "toggle", "task_type": "creative"}, "action ('toggle') must be one of pin, unpin"),
        ({"task_type": "creative"}, "action: is required"),
        ({"action": "pause", "task_type": "creative", "colour": "red"}, "unknown field(s): colour"),
    ],
)
async def test_bad_override_is_400(api, body, reason):
    client, *_ = api
    status, answer = await post(client, "/api/v1/overrides", body)
    assert status == 400 and reason in answer["error"]


async def test_override_needs_the_token(api):
    client, *_ = api
    status, _ = await post(client, "/api/v1/overrides", {"action": "pause", "task_type": "creative"}, {})
    assert status == 401


async def test_status_and_healthz(api):
    client, guard, _, clock = api
    await guard.evaluate()
    status = await (await client.get("/status")).json()
    assert status["plan_version"] == 0 and status["classes"][0]["task_type"] == "creative"
    assert status["classes"][0]["speculation_enabled"] is True
    assert status["last_evaluation"] == clock.now
    health = await (await client.get("/healthz")).json()
    assert health == {"status": "ok", "guard_running": True}


async def test_disabled_receiver_answers_404_and_is_never_proxied(tmp_path):
    guard, _ = make_guard(tmp_path, ScriptedSource({}), Clock())
    guard.running = True
    api = receiver.Api(guard, token=TOKEN, alerts_enabled=False)
    app = web.Application()
    app.router.add_routes(api.routes())
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        status, body = await post(client, "/api/v1/alerts", payload())
        assert status == 404 and "alertmanager.enabled: false" in body["error"]
    finally:
        await client.close()
