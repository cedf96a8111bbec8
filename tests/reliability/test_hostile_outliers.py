"""Engines that answer but fail: outlier ejection and failover (as Envoy's outlier detection).

A pool that answers 500 to everything, or takes the connection and resets it, must not take the
traffic planned for it down with it while a no-spec pool serves: after
``tap.eject_consecutive_5xx`` failures in a row it is ejected (``specguard_pool_healthy`` 0,
``specguard_pool_ejections_total``), its traffic fails over, and it is re-admitted after
``tap.eject_seconds`` (doubled on the next ejection).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from specguard.monitor import config
from specguard.monitor.app import Monitor
from tests.reliability import relkit

TAP = (
    "tap: {holdout_share: 0, probe_share: 0, default_pool: spec, eject_consecutive_5xx: 3, eject_seconds: 10}"
)


class Counting:
    """An engine that answers 200 (``status`` 500 for the failing one), counting requests."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        if request.path == "/metrics":  # its page is fine: a scrape alone would call it healthy
            return web.Response(text="# nothing\n", content_type="text/plain")
        self.requests += 1
        if self.status >= 500:
            return web.json_response({"error": {"message": "internal error"}}, status=self.status)
        return web.json_response(relkit.COMPLETION)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


@contextlib.asynccontextmanager
async def resetting() -> AsyncIterator[tuple[str, list[int]]]:
    """An engine that accepts, reads the request head, then resets the connection (RST)."""
    seen: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"POST"):  # (the scrape loop's page reads are not counted)
                seen.append(1)
        writer.transport.abort()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen
    finally:
        server.close()
        await server.wait_closed()


def cfg(spec_url: str, nospec_url: str):
    return config.parse_text(
        "pools:\n"
        f'  - {{name: spec, url: "{spec_url}", engine: vllm, num_speculative_tokens: 4}}\n'
        f'  - {{name: nospec, url: "{nospec_url}", engine: vllm, num_speculative_tokens: 0}}\n'
        f"{TAP}\nscrape: {{interval_seconds: 3600, timeout_seconds: 1}}\n",
        "outliers.yaml",
    )


async def statuses(url: str, count: int) -> list[int]:
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        for _ in range(count):
            async with session.post(url + "/v1/chat/completions", json=relkit.chat_body()) as response:
                await response.read()
                out.append(response.status)
    return out


async def test_a_pool_answering_500_is_ejected_its_traffic_fails_over_and_it_comes_back_later():
    failing, healthy = Counting(500), Counting()
    clock = relkit.Clock()
    registry = CollectorRegistry()
    async with relkit.serving(failing.app()) as spec_url, relkit.serving(healthy.app()) as nospec_url:
        monitor = Monitor(cfg(spec_url, nospec_url), registry=registry, clock=clock)
        url = await monitor.start("127.0.0.1", 0)
        try:
            await monitor.loops[0].scrape_once()  # its /metrics answers: no verdict on its API
            # three 500s relayed as the engine sent them, then the pool is out: the rest is served
            assert await statuses(url, 10) == [500] * 3 + [200] * 7
            assert failing.requests == 3 and healthy.requests == 7
            value = registry.get_sample_value
            assert value("specguard_pool_healthy", {"pool": "spec"}) == 0.0
            assert value("specguard_pool_ejections_total", {"pool": "spec"}) == 1.0
            assert value("specguard_failover_requests_total", {"pool": "spec", "to_pool": "nospec"}) == 7
            await monitor.loops[0].scrape_once()  # a good scrape does not end an ejection
            assert monitor.health.healthy("spec") is False
            state = monitor.health.state("spec")
            assert state.until - state.since == 10.0 and "3 5xx" in (state.reason or "")
            # re-admitted after the interval; failing again, it is ejected for twice as long
            clock.now += 10.0
            assert value("specguard_pool_healthy", {"pool": "spec"}) == 1.0
            assert await statuses(url, 5) == [500] * 3 + [200] * 2
            state = monitor.health.state("spec")
            assert state.until - state.since == 20.0
            assert value("specguard_pool_ejections_total", {"pool": "spec"}) == 2.0
            # the engine recovers: re-admitted after the interval and served again
            failing.status = 200
            clock.now += 20.0
            assert await statuses(url, 3) == [200] * 3 and failing.requests == 9
        finally:
            await monitor.stop()


async def test_a_pool_that_resets_after_connect_is_ejected_and_no_client_sees_the_reset():
    healthy = Counting()
    registry = CollectorRegistry()
    async with resetting() as (spec_url, seen), relkit.serving(healthy.app()) as nospec_url:
        monitor = Monitor(cfg(spec_url, nospec_url), registry=registry)
        url = await monitor.start("127.0.0.1", 0)
        try:
            # each reset request goes to the healthy pool at once: the client never sees it
            assert await statuses(url, 8) == [200] * 8
            resets = len(seen)
            assert 3 <= resets <= 6  # three requests, each sent at most twice (once more on a new connection)
            assert healthy.requests == 8
            assert await statuses(url, 4) == [200] * 4
            assert len(seen) == resets  # ejected: nothing more is routed there while nospec serves
            value = registry.get_sample_value
            assert value("specguard_pool_healthy", {"pool": "spec"}) == 0.0
            assert value("specguard_pool_ejections_total", {"pool": "spec"}) == 1.0
        finally:
            await monitor.stop()


async def test_the_last_serving_pool_is_never_ejected():
    failing = Counting(500)
    registry = CollectorRegistry()
    async with relkit.serving(failing.app()) as only_url:
        text = f'pools:\n  - {{name: nospec, url: "{only_url}"}}\ntap: {{eject_consecutive_5xx: 2}}\n'
        monitor = Monitor(config.parse_text(text, "one.yaml"), registry=registry)
        url = await monitor.start("127.0.0.1", 0)
        try:
            assert await statuses(url, 4) == [500] * 4  # nowhere else to go: still the best try
            assert registry.get_sample_value("specguard_pool_healthy", {"pool": "nospec"}) == 1.0
            assert registry.get_sample_value("specguard_pool_ejections_total", {"pool": "nospec"}) == 0.0
        finally:
            await monitor.stop()
