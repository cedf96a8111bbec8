"""Fleet mode: the pools' replica counts from a PromQL count, carried by the plan to every router."""

from __future__ import annotations

import random

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specguard.exporters.config import PoolConfig
from specguard.exporters.routing import Router
from specguard.monitor import actuators, daemon, promql, replicas, state
from specguard.rules import policy as policy_mod

POOLS = {"spec-k4": 4, "nospec": 0}
POLICY = policy_mod.Policy(rules=(), alerts=policy_mod.AlertsPolicy(enabled=True), local=False).with_pools(
    POOLS, "spec-k4", "nospec"
)


class CountingPrometheus:
    def __init__(self):
        self.up = {"spec-k4": "3", "nospec": "1"}
        self.queries = []

    async def query(self, request):
        q = request.query["query"]
        self.queries.append(q)
        pool = next((p for p in self.up if f'pool="{p}"' in q), None)
        result = (
            [] if pool is None or self.up[pool] is None else [{"metric": {}, "value": [1, self.up[pool]]}]
        )
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})


@pytest.fixture
async def prometheus():
    fake = CountingPrometheus()
    app = web.Application()
    app.router.add_get("/api/v1/query", fake.query)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield fake, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def router():
    pools = [PoolConfig("spec-k4", "http://a", num_speculative_tokens=4), PoolConfig("nospec", "http://b")]
    return Router(pools, default_pool="spec-k4", nospec_pool="nospec", rng=random.Random(0))


async def test_replica_counts_go_from_promql_into_the_plan_and_every_router(prometheus, tmp_path):
    fake, url = prometheus
    counts = replicas.PromQLReplicas(promql.PromQL(url, timeout=5), POOLS, replicas.DEFAULT_QUERY)
    leader_router = router()
    store = state.PlanStore(tmp_path / "plan.json")
    guard = daemon.Guard(
        POLICY, actuators=[actuators.RouterActuator(leader_router)], store=store, replica_counts=counts
    )
    await guard.evaluate(0.0)
    assert 'count(specguard_engine_up{pool="spec-k4"} == 1)' in fake.queries
    assert guard.replicas == {"spec-k4": 3, "nospec": 1}
    assert leader_router.replicas() == {"spec-k4": 3, "nospec": 1}
    version = guard.version
    # a follower reads the stored plan (the ConfigMap holds the same JSON) and routes with the counts
    doc = store.load()
    assert doc.replicas == {"spec-k4": 3, "nospec": 1}
    follower = router()
    await actuators.RouterActuator(follower).apply(doc, [])
    assert follower.replicas() == {"spec-k4": 3, "nospec": 1}
    # unchanged counts: no new plan version; a pool with no replica up keeps its last count
    fake.up = {"spec-k4": None, "nospec": "1"}
    await guard.evaluate(30.0)
    assert guard.version == version and guard.replicas["spec-k4"] == 3
    fake.up = {"spec-k4": "4", "nospec": "1"}
    await guard.evaluate(60.0)
    assert guard.version == version + 1 and leader_router.replicas()["spec-k4"] == 4


def test_a_plan_with_bad_replica_counts_is_rejected_with_its_place():
    data = {"format": 1, "version": 1, "entries": [], "replicas": {"spec-k4": 0}}
    with pytest.raises(Exception, match="plan.json: replicas must map pool names"):
        state.decode(data, "plan.json")
    assert state.decode({**data, "replicas": {"spec-k4": 2}}, "plan.json").replicas == {"spec-k4": 2}


def test_replicas_query_needs_prometheus_and_knows_only_the_pool():
    with pytest.raises(Exception, match="replicas_query: needs guard.prometheus.url"):
        policy_mod.parse_text("guard:\n  prometheus: {replicas_query: 'count(up)'}\n")
    with pytest.raises(Exception, match="knows only"):
        policy_mod.parse_text(
            "guard:\n  prometheus: {url: 'http://p:9090', replicas_query: 'count(up{x=\"{{ window }}\"})'}\n"
        )
    ok = policy_mod.parse_text(
        f"guard:\n  prometheus: {{url: 'http://p:9090', replicas_query: '{replicas.DEFAULT_QUERY}'}}\n"
    )
    assert ok.replicas_query == replicas.DEFAULT_QUERY
