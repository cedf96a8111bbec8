"""Engine faults through the real tap: refused connections, hangs, 5xx, death mid-stream, restart.

For each fault: what the client saw (status, body, stream), what the tap recorded (errors by
kind, unattributed reason, in-flight back to zero), that the tap still serves afterwards, and
what the guard decided over the same statistics (no action: an engine fault is no evidence
about speculation, so no decision is made and nothing flaps).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import generate_latest

from specguard.lab import loadgen
from specguard.monitor import guard_wiring
from specguard.monitor.app import Monitor
from specguard.sim import cluster
from tests.reliability import relkit

TIME_SCALE = 0.02
GUARD = """
tap: {upstream_timeout_seconds: 0.5, connect_timeout_seconds: 0.5, holdout_share: 0, probe_share: 0,
      default_pool: flaky, nospec_pool: nospec}
guard: {interval_seconds: 3600, min_samples: 5, consecutive_failure_limit: 0, cooldown_seconds: 0}
server: {insecure_loopback: true}
"""


async def guard_round(monitor, cfg):
    """One evaluation of a guard built over the Monitor's statistics and router."""
    guard, _api = guard_wiring.build(monitor, cfg)
    return await guard.evaluate()


@contextlib.asynccontextmanager
async def flaky_beside_nospec(mode: str) -> AsyncIterator[tuple]:
    """A tap over a misbehaving ``flaky`` pool (the default) and a simulated no-spec pool:
    (upstream, simulator, config, monitor, tap URL)."""
    upstream = relkit.Misbehaving(mode)
    async with (
        relkit.serving(upstream.app()) as flaky_url,
        cluster.SimCluster.from_config(None, seed=0, time_scale=TIME_SCALE, pools=["nospec"]) as sim,
    ):
        cfg = relkit.monitor_config({"flaky": flaky_url, "nospec": sim.urls["nospec"]}, extra=GUARD)
        monitor = Monitor(cfg)
        url = await monitor.start("127.0.0.1", 0)
        try:
            yield upstream, sim, cfg, monitor, url
        finally:
            upstream.release.set()
            await monitor.stop()


def metric(monitor, name, labels):
    return monitor.registry.get_sample_value(name, labels)


# (mode, status the client sees, whether the body arrives whole, upstream error kind, unattributed reason)
FAULTS = [
    pytest.param("5xx", 500, True, "status_5xx", "error_status", id="answers-500"),
    pytest.param("hang", 504, True, "timeout", "upstream_error", id="hangs"),
    pytest.param("hang_mid_stream", 200, False, "timeout", "upstream_error", id="hangs-mid-stream"),
    pytest.param("die_mid_stream", 200, False, "broken", "upstream_error", id="dies-mid-stream"),
]


@pytest.mark.parametrize(("mode", "status", "whole", "kind", "reason"), FAULTS)
async def test_misbehaving_engine(mode, status, whole, kind, reason):
    async with flaky_beside_nospec(mode) as (upstream, sim, cfg, monitor, url):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            body = relkit.chat_body(stream=mode.endswith("stream"))
            seen: dict = {"events": 0, "broken": False}
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                seen["status"] = resp.status
                try:
                    async for line in resp.content:
                        seen["events"] += line.startswith(b"data:")
                except aiohttp.ClientPayloadError:
                    seen["broken"] = True
            # 1. what the client saw
            assert seen["status"] == status
            assert seen["broken"] is (not whole)
            if mode == "hang_mid_stream":
                assert seen["events"] == 1
            if mode == "die_mid_stream":
                assert seen["events"] == 2
            if not mode.endswith("stream"):  # a whole (non-streamed) answer: the body the client got
                async with session.post(f"{url}/v1/chat/completions", json=relkit.chat_body()) as resp:
                    answer = await resp.json()
            if mode == "5xx":  # the engine's own error body, unchanged
                assert resp.status == 500 and answer["error"]["message"] == "engine failed"
            elif mode == "hang":  # an OpenAI-shaped error naming the pool
                assert resp.status == 504 and answer["error"]["type"] == "upstream_timeout"
                assert "flaky" in answer["error"]["message"]
            # 2. the tap survived: the engine recovers, the same tap serves it again
            upstream.mode = "ok"
            async with session.post(f"{url}/v1/chat/completions", json=relkit.chat_body()) as resp:
                assert resp.status == 200 and (await resp.json())["choices"][0]["message"]["content"] == "ok"
        # 3. what the tap recorded
        errors = monitor.stats.upstream_errors()
        assert errors.get(("flaky", kind), 0) == (1 if mode.endswith("stream") else 2)
        assert set(errors) == {("flaky", kind)}
        assert monitor.tap.in_flight == {"flaky": 0, "nospec": 0}
        records = monitor.stats.records()
        assert len(records) == (2 if mode.endswith("stream") else 3)
        assert [r.unattributed_reason for r in records[:-1]] == [reason] * (len(records) - 1)
        value = metric(monitor, "specguard_upstream_errors_total", {"pool": "flaky", "kind": kind})
        assert value == errors[("flaky", kind)]
        # 4. what the guard decided: nothing (engine errors are no evidence), no flap
        decisions = await guard_round(monitor, cfg)
        assert [d for d in decisions if d.action != "none"] == []
        assert monitor.router.plan() == {}


async def test_an_engine_loading_its_model_is_down_until_it_serves():
    """An engine that listens but answers 503 (llama.cpp's "Loading model" after a restart) is
    down, found by its scrape or by a request, and back once it serves. A request it answered 503
    was not served, so it goes to the no-spec pool; with no other pool the client gets the
    engine's own 503, byte for byte."""
    async with flaky_beside_nospec("loading") as (upstream, sim, cfg, monitor, url):
        loop = next(loop for loop in monitor.loops if loop.watch.pool.name == "flaky")
        body = relkit.chat_body(sim.config.model_name)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:

            async def ask(stream: bool = False) -> int:
                async with session.post(
                    f"{url}/v1/chat/completions", json={**body, "stream": stream}
                ) as resp:
                    await resp.read()
                    return resp.status

            # 1. its scrape found it: down with the reason, its traffic served elsewhere
            assert not await loop.scrape_once()
            state = monitor.health.state("flaky")
            assert not state.healthy and state.source == "scrape" and "HTTP 503" in (state.reason or "")
            assert metric(monitor, "specguard_pool_healthy", {"pool": "flaky"}) == 0.0
            assert await ask() == 200 and await ask(stream=True) == 200
            assert [(r.pool, r.route) for r in monitor.stats.records()] == [("nospec", "failover")] * 2
            assert upstream.requests == 0
            # 2. loaded: the next scrape puts it back
            upstream.mode = "ok"
            await loop.scrape_once()  # (an empty page, but an answer)
            assert monitor.health.healthy("flaky")
            assert await ask() == 200 and monitor.stats.records()[-1].pool == "flaky"
            # 3. restarted, loading again: the request it refused is served by the no-spec pool
            upstream.mode = "loading"
            assert await ask(stream=True) == 200
            last = monitor.stats.records()[-1]
            assert (last.pool, last.route, last.status) == ("nospec", "failover", 200)
            assert upstream.requests == 2
            state = monitor.health.state("flaky")
            assert not state.healthy and state.source == "tap" and "503" in (state.reason or "")
            # 4. no other pool serving: the engine's own answer
            await sim.stop()
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                assert resp.status == 503
                assert await resp.json() == relkit.Misbehaving.LOADING
        assert monitor.tap.in_flight == {"flaky": 0, "nospec": 0}


async def test_engine_refuses_then_restarts_with_reset_counters():
    """A real simulated engine goes away (connections refused) and comes back with counters at 0.

    While it is gone the tap marks it down and serves its traffic from the no-spec pool (the
    requests whose connect failed are sent again there), the scrape says ``up 0`` without
    crashing; once it answers a scrape it is back in service, and the engine counters
    accumulated by the scrape equal the tap's own per-class sums across both lives of the
    engine (reset-safe), with one counter reset counted.
    """
    mix = [loadgen.RequestClass("code", temperature=0.0, max_tokens=24)]
    first = cluster.SimCluster.from_config(None, seed=0, time_scale=TIME_SCALE, pools=["spec-k4"])
    async with cluster.SimCluster.from_config(
        None, seed=0, time_scale=TIME_SCALE, pools=["nospec"]
    ) as nospec:
        await first.start()
        second = None
        try:
            port = int(first.urls["spec-k4"].rsplit(":", 1)[1])
            extra = (
                "tap: {holdout_share: 0, probe_share: 0, default_pool: spec-k4, connect_timeout_seconds: 1}\n"
            )
            extra += "guard: {interval_seconds: 3600, min_samples: 5}\nserver: {insecure_loopback: true}\n"
            urls = {"spec-k4": first.urls["spec-k4"], "nospec": nospec.urls["nospec"]}
            cfg = relkit.monitor_config(urls, extra=extra)
            monitor = Monitor(cfg)
            url = await monitor.start("127.0.0.1", 0)
            loop = monitor.loops[0]
            try:
                assert await loop.scrape_once(), loop.watch.last_error
                before = await loadgen.run_load(url, mix, 8, requests=40, stream=True, seed=1)
                assert [r.status for r in before] == [200] * 40
                assert await loop.scrape_once()

                await first.stop()  # the engine dies: connection refused
                down = await loadgen.run_load(url, mix, 4, requests=8, stream=True, seed=2)
                assert {r.status for r in down} == {200}  # failed over to the no-spec pool
                assert {r.pool for r in monitor.stats.records()[-8:]} == {"nospec"}
                assert not await loop.scrape_once()
                assert metric(monitor, "specguard_engine_up", {"pool": "spec-k4"}) == 0.0
                assert metric(monitor, "specguard_pool_healthy", {"pool": "spec-k4"}) == 0.0
                failed_over = {"pool": "spec-k4", "to_pool": "nospec"}
                assert metric(monitor, "specguard_failover_requests_total", failed_over) == 8
                decisions = await guard_round(monitor, cfg)
                assert [d for d in decisions if d.action != "none"] == []
                assert set(monitor.router.plan().values()) <= {"spec-k4"}  # an override, not a plan change

                second = cluster.SimCluster.from_config(
                    None, seed=7, time_scale=TIME_SCALE, pools=["spec-k4"], port_base=port
                )
                await second.start()  # same address, counters start from zero
                assert await loop.scrape_once(), loop.watch.last_error  # it answers: back in service
                assert metric(monitor, "specguard_pool_healthy", {"pool": "spec-k4"}) == 1.0
                after = await loadgen.run_load(url, mix, 4, requests=10, stream=True, seed=3)
                assert {r.pool for r in monitor.stats.records()[-10:]} == {"spec-k4"}
                assert [r.status for r in after] == [200] * 10
                assert await loop.scrape_once(), loop.watch.last_error
            finally:
                await monitor.stop()
        finally:
            await first.stop()
            if second is not None:
                await second.stop()

    # the requests already on their way when the first connect failed (at most the 4 workers)
    assert set(monitor.stats.upstream_errors()) == {("spec-k4", "connect")}
    assert 1 <= monitor.stats.upstream_errors()[("spec-k4", "connect")] <= 4
    watch = monitor.watches["spec-k4"]
    assert watch.counter_resets == 1
    mine = [t for key, t in monitor.stats.totals().items() if key[0] == "spec-k4"]
    assert sum(t.output_tokens for t in mine) == watch.accumulated["generation_tokens"] > 0
    assert sum(t.verify_rounds for t in mine) == watch.accumulated["drafts"] > 0
    text = generate_latest(monitor.registry).decode()
    assert 'specguard_engine_counter_resets_total{pool="spec-k4"} 1.0' in text
    assert monitor.tap.in_flight == {"spec-k4": 0, "nospec": 0}


async def test_hung_engine_does_not_block_other_pools():
    """While one pool hangs, requests routed to a healthy pool are served at once."""
    upstream = relkit.Misbehaving("hang")
    async with (
        relkit.serving(upstream.app()) as flaky_url,
        cluster.SimCluster.from_config(None, seed=0, time_scale=TIME_SCALE, pools=["nospec"]) as sim,
    ):
        extra = GUARD.replace("upstream_timeout_seconds: 0.5", "upstream_timeout_seconds: 30")
        cfg = relkit.monitor_config({"flaky": flaky_url, "nospec": sim.urls["nospec"]}, extra=extra)
        monitor = Monitor(cfg)
        monitor.router.set_plan({("code", "greedy", load): "nospec" for load in ("low", "medium", "high")})
        url = await monitor.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                hung = [
                    asyncio.create_task(session.post(f"{url}/v1/chat/completions", json=relkit.chat_body()))
                    for _ in range(8)
                ]
                while upstream.requests < 8:
                    await asyncio.sleep(0.01)
                assert monitor.tap.in_flight["flaky"] == 8
                served = await loadgen.run_load(
                    url, [loadgen.RequestClass("code", max_tokens=8)], 4, requests=12, seed=4
                )
                assert [r.status for r in served] == [200] * 12
                assert all(not t.done() for t in hung)
                upstream.release.set()  # the engine answers (500) at last
                for task in hung:
                    response = await task
                    assert response.status == 500
                    response.release()
        finally:
            upstream.release.set()
            await monitor.stop()
    assert monitor.tap.in_flight == {"flaky": 0, "nospec": 0}
