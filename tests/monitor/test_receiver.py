"""The Alertmanager receiver and operator API over real HTTP on loopback."""

from __future__ import annotations

import contextlib
import json
import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from specguard.monitor import receiver
from specguard.monitor.guard_metrics import GuardCollector
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


@contextlib.asynccontextmanager
async def serving(tmp_path, keys=()):
    """The API over a running guard (with ``keys`` as its configured classes), on loopback."""
    clock = Clock()
    guard, router = make_guard(tmp_path, ScriptedSource({CREATIVE: 0.8}), clock)
    guard.configured_keys = list(keys)
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


@pytest.fixture
async def api(tmp_path):
    async with serving(tmp_path) as served:
        yield served


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
    assert api.authorize(None) == (401, "missing or wrong bearer token")  # no credential: no caller
    assert api.authorize("Bearer anything")[0] == 401
    insecure = receiver.Api(guard, token=None, insecure=True)
    assert insecure.authorize(None, "127.0.0.1:8090") is None
    assert insecure.authorize(None, "[::1]:8090", "http://localhost:3000") is None
    # a browser page (cross-origin simple request) or a rebound DNS name is refused
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
    listed = await (await client.get("/api/v1/overrides", headers=AUTH)).json()
    assert {(o["load_bucket"], o["pin"]) for o in listed["overrides"]} == {
        ("low", "nospec"),
        ("high", "nospec"),
    }
    status, body = await post(client, "/api/v1/overrides", {"action": "unpin", "task_type": "creative"})
    actions = {(d["temperature_bucket"], d["load_bucket"]): d["action"] for d in body["decisions"]}
    assert status == 200 and actions == {
        ("high", "low"): "unpin",
        ("high", "high"): "unpin",
        ("greedy", "low"): "none",  # never pinned: nothing to do
        ("greedy", "high"): "none",
    }


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
    assert (await client.get("/status")).status == 401  # status is operator-only too
    status = await (await client.get("/status", headers=AUTH)).json()
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


# --- receiver defects found in production-style runs


@pytest.mark.parametrize("path", ["/api/v1/alerts", "/api/v1/overrides"])
async def test_a_body_nested_a_thousand_levels_deep_is_400_not_500(api, path):
    """A 2 KB body nested 1,000 levels deep once got a 500 (RecursionError)."""
    client, *_ = api
    for body in (b"[" * 1000 + b"]" * 1000, b'{"alerts":' + b"[" * 999 + b"]" * 999 + b"}"):
        assert len(body) <= 2048
        response = await client.post(path, data=body, headers=AUTH)
        assert response.status == 400, await response.text()
        assert "nested deeper than" in (await response.json())["error"]


@pytest.fixture
async def configured(tmp_path):
    """The API over a guard that knows its classes (task types, temperature and load buckets)."""
    keys = [
        (t, temp, load)
        for t in ("code", "creative")
        for temp in ("greedy", "high")
        for load in ("low", "high")
    ]
    async with serving(tmp_path, keys) as served:
        yield served


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(
            {**payload(), "alerts": [{**payload()["alerts"][0], "startsAt": "yesterday"}]},
            "alerts[0].startsAt ('yesterday') must be an RFC 3339 time",
            id="starts-at-yesterday",
        ),
        pytest.param(
            {**payload(), "alerts": [{**payload()["alerts"][0], "startsAt": 1700000000}]},
            "alerts[0].startsAt (1700000000) must be an RFC 3339 time",
            id="starts-at-number",
        ),
    ],
)
async def test_alerts_with_a_bad_time_are_400(configured, body, reason):
    client, guard, *_ = configured
    assert await post(client, "/api/v1/alerts", body) == (400, {"error": reason})
    assert len(guard.alerts) == 0


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param({"alertname": "X", "task_type": "poetry"}, id="unknown-task-type"),
        pytest.param(
            {"alertname": "X", "task_type": "code", "load_bucket": "huge"}, id="unknown-load-bucket"
        ),
    ],
)
async def test_alerts_naming_no_configured_class_are_not_stored(configured, labels):
    """Answered per alert, so the good alerts of the same batch still count (and Alertmanager does
    not resend the batch)."""
    client, guard, *_ = configured
    good = payload(fingerprint="fp-2", labels={"alertname": "X", "task_type": "code"})["alerts"][0]
    body = {**payload(labels=labels), "alerts": [payload(labels=labels)["alerts"][0], good]}
    status, answer = await post(client, "/api/v1/alerts", body)
    assert status == 200 and answer["outcomes"] == {"unknown_class": 1, "new": 1}
    assert [a.labels["task_type"] for a in guard.alerts.records()] == ["code"]
    good = payload(labels={"alertname": "X", "task_type": "code"})
    good["alerts"][0]["startsAt"] = "2026-11-29T10:00:00.123456789Z"  # Alertmanager's nanoseconds
    assert (await post(client, "/api/v1/alerts", good))[0] == 200


async def test_a_reason_that_is_not_a_string_is_400(api):
    client, guard, *_ = api
    body = {"action": "pause", "task_type": "creative", "reason": {"ticket": "INC-7"}}
    status, answer = await post(client, "/api/v1/overrides", body)
    assert (status, answer) == (400, {"error": "reason: must be a string or null, got an object"})
    assert guard.version == 0


async def test_unpinning_a_class_that_is_not_pinned_changes_nothing(api):
    client, guard, router, _ = api
    body = {"action": "unpin", "task_type": "creative", "temperature_bucket": "high"}
    status, answer = await post(client, "/api/v1/overrides", body)
    assert status == 200 and {d["action"] for d in answer["decisions"]} == {"none"}
    assert "not pinned: nothing to do" in answer["decisions"][0]["reason"]
    assert guard.version == 0 and not guard.counters.actions
    assert not (guard.store.path).exists()  # nothing to persist
    status, answer = await post(client, "/api/v1/overrides", {"action": "resume", "task_type": "creative"})
    assert {d["action"] for d in answer["decisions"]} == {"none"} and guard.version == 0


async def test_refused_requests_are_counted(api):
    client, guard, *_ = api
    registry = CollectorRegistry()
    registry.register(GuardCollector(guard.counters, guard.view))
    await post(client, "/api/v1/alerts", payload(), {})
    await post(client, "/api/v1/alerts", payload(), {"Authorization": "Bearer nope"})
    await post(client, "/api/v1/overrides", {"action": "pause", "task_type": "creative"}, {})
    value = registry.get_sample_value
    assert value("specguard_api_auth_failures_total", {"endpoint": "alerts", "code": "401"}) == 2
    assert value("specguard_api_auth_failures_total", {"endpoint": "overrides", "code": "401"}) == 1


async def test_received_alerts_survive_a_restart(api, tmp_path):
    """After a restart /status once showed no alerts while Alertmanager still held a
    firing one (and would not resend it for repeat_interval, 1 h)."""
    client, guard, _, clock = api
    assert (await post(client, "/api/v1/alerts", payload()))[0] == 200
    version = guard.version
    restarted, _ = make_guard(tmp_path, ScriptedSource({CREATIVE: 0.8}), clock)
    assert [(a["fingerprint"], a["status"]) for a in restarted.status()["alerts"]] == [("fp-1", "firing")]
    assert restarted.version == version  # alerts are kept with the plan, they do not change it
    # and they are still evidence: the class moves at the next evaluation, as it would have
    decisions = await restarted.evaluate()
    (decision,) = [d for d in decisions if d.key == CREATIVE]
    assert (decision.action, decision.to_pool) == ("off", "nospec")
