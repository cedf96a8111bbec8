"""PromQL rules through prometheus-api-client against a stand-in Prometheus on loopback."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specguard.errors import SourceError
from specguard.monitor import daemon, promql
from specguard.rules import guard
from specguard.rules import policy as policy_mod
from specguard.rules.evidence import Evidence

RULE = policy_mod.Rule(
    "fleet-rc",
    measure=None,
    query='max(specguard_relative_cost_per_token_lower_ratio{task_type="{{ task_type }}",'
    'temperature_bucket="{{ temperature_bucket }}",load_bucket="{{ load_bucket }}",'
    'pool="{{ pool }}"}[{{ window }}])',
    threshold=1.0,
    restore_threshold=0.95,
    limits=policy_mod.Limits(consecutive_failure_limit=0, failure_limit=-1, consecutive_error_limit=1),
)
POLICY = policy_mod.Policy(
    rules=(RULE,), alerts=policy_mod.AlertsPolicy(enabled=False), local=False, cooldown_seconds=0
).with_pools({"spec-k4": 4, "nospec": 0}, "spec-k4", "nospec")
KEYS = [("creative", "high", "low"), ("code", "greedy", "low"), ("chat", "medium", "low")]


def vector(value):
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, value]}]},
    }


class FakePrometheus:
    def __init__(self):
        self.queries = []
        self.down = False

    async def query(self, request):
        q = request.query["query"]
        self.queries.append(q)
        if self.down:
            return web.Response(status=503, text="unavailable")
        if 'task_type="creative"' in q:
            return web.json_response(vector("1.31"))
        if 'task_type="code"' in q:
            return web.json_response(vector("NaN"))
        empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
        return web.json_response(empty)

    def app(self):
        app = web.Application()
        app.router.add_get("/api/v1/query", self.query)
        return app


@pytest.fixture
async def prometheus():
    fake = FakePrometheus()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield fake, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_templated_queries_drive_the_state_machine(prometheus):
    fake, url = prometheus
    source = daemon.PromQLSource(promql.PromQL(url, timeout=5), POLICY)
    evidence = await source.collect(0.0, KEYS)
    expected = 'task_type="creative",temperature_bucket="high",load_bucket="low",pool="spec-k4"}[5m])'
    assert len(fake.queries) == 3 and any(expected in q for q in fake.queries)
    assert evidence[KEYS[0]].pools["spec-k4"].values == {"fleet-rc": 1.31}
    assert KEYS[1] not in {k for k, e in evidence.items() if e.pools}  # NaN: no data
    states = {k: guard.initial_state(k, POLICY) for k in KEYS}
    results = {}
    for key in KEYS:
        states[key], decision = guard.step(states[key], evidence.get(key, Evidence()), 100.0, POLICY)
        results[key] = (decision.phase.value, decision.action)
    assert results == {KEYS[0]: ("act", "off"), KEYS[1]: ("hold", "none"), KEYS[2]: ("hold", "none")}


async def test_prometheus_down_is_an_error_not_no_data(prometheus):
    fake, url = prometheus
    fake.down = True
    source = daemon.PromQLSource(promql.PromQL(url, timeout=5), POLICY)
    evidence = await source.collect(0.0, KEYS[:1])
    errors = evidence[KEYS[0]].pools["spec-k4"].errors
    assert "rejected the query" in errors["fleet-rc"]
    state, decision = guard.step(guard.initial_state(KEYS[0], POLICY), evidence[KEYS[0]], 100.0, POLICY)
    assert (decision.phase.value, decision.action) == ("error", "none")
    _, decision = guard.step(state, evidence[KEYS[0]], 130.0, POLICY)
    assert decision.action == "freeze"


async def test_unreachable_prometheus_fails_fast_for_the_whole_round():
    server = TestServer(web.Application(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    await server.close()
    source = daemon.PromQLSource(promql.PromQL(url, timeout=2), POLICY)
    evidence = await source.collect(0.0, KEYS)
    assert all("unreachable" in e.pools["spec-k4"].errors["fleet-rc"] for e in evidence.values())


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ([], None),
        ([{"metric": {}, "value": [1, "NaN"]}], None),
        ([{"metric": {}, "value": [1, "0.5"]}], 0.5),
        ([1, "2.5"], 2.5),  # a scalar result
    ],
)
def test_parse_result(result, expected):
    assert promql.parse_result(result) == expected


def test_several_series_is_an_error():
    with pytest.raises(SourceError, match="query returned 2 series; it must select exactly one"):
        promql.parse_result([{"value": [1, "1"]}, {"value": [1, "2"]}])
