"""A client that stops reading a large stream is the client's problem, not the engine's.

The tap stops reading the engine while the client's send buffer is full (back-pressure), so the
engine's idle timer (``tap.upstream_timeout_seconds``) must not run meanwhile: a client pausing
longer than it once cut its own stream and was counted as an engine timeout. The client has
``tap.client_write_timeout_seconds`` to take bytes again; past it, its connection is closed and
counted as a client timeout (``specguard_client_timeouts_total{phase="response"}``).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from specguard.monitor.app import Monitor
from tests.reliability import relkit

EVENT = (
    b"data: "
    + json.dumps(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "x" * 4000}, "finish_reason": None}],
        }
    ).encode()
    + b"\n\n"
)
EVENTS = 4000  # 16 MB: more than the client's, the kernel's and the tap's buffers hold together


async def stream(request: web.Request) -> web.StreamResponse:
    await request.read()
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    for _ in range(EVENTS):  # as fast as the tap takes it: the engine is never quiet
        await out.write(EVENT)
    await out.write(b"data: [DONE]\n\n")
    await out.write_eof()
    return out


async def page(request: web.Request) -> web.Response:
    return web.Response(text="# nothing\n")


def engine_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_post("/generate", stream)  # a native path the config forwards untapped
    app.router.add_get("/metrics", page)
    return app


async def read_with_a_pause(url: str, pause: float, path: str) -> tuple[int, bool]:
    """Read one 64 KiB piece, stop reading for ``pause`` seconds, then read the rest: (bytes, whole?)."""
    received = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        body = relkit.chat_body(stream=True)
        async with session.post(url + path, json=body) as response:
            assert response.status == 200
            received += len(await response.content.read(65536))
            await asyncio.sleep(pause)
            tail = b""
            try:
                while True:
                    data = await response.content.read(1 << 20)
                    if not data:
                        break
                    received += len(data)
                    tail = (tail + data)[-32:]
            except aiohttp.ClientPayloadError:
                return received, False
    return received, tail.endswith(b"data: [DONE]\n\n")


async def start(engine_url: str, registry: CollectorRegistry, write_timeout: float) -> tuple[Monitor, str]:
    extra = (
        "tap: {holdout_share: 0, probe_share: 0, upstream_timeout_seconds: 0.5, "
        f"client_write_timeout_seconds: {write_timeout}, forward_paths: [{{path: /generate}}]}}\n"
    )
    monitor = Monitor(relkit.monitor_config({"nospec": engine_url}, extra=extra), registry=registry)
    return monitor, await monitor.start("127.0.0.1", 0)


PATHS = pytest.mark.parametrize("path", ["/v1/chat/completions", "/generate"], ids=["tapped", "forwarded"])


@PATHS
async def test_a_client_pausing_longer_than_the_upstream_timeout_gets_its_whole_stream(path):
    registry = CollectorRegistry()
    async with relkit.serving(engine_app()) as engine_url:
        monitor, url = await start(engine_url, registry, write_timeout=30)
        try:
            received, whole = await read_with_a_pause(url, 2.0, path)  # four upstream timeouts long
        finally:
            await monitor.stop()
    assert whole and received > EVENTS * len(EVENT), received
    assert monitor.stats.upstream_errors() == {}  # the engine never went quiet
    if path == "/v1/chat/completions":
        record = monitor.stats.records()[0]
        assert record.unattributed_reason != "upstream_error", record
    assert registry.get_sample_value("specguard_client_timeouts_total", {"phase": "response"}) == 0.0


@PATHS
async def test_a_client_that_stops_reading_for_good_is_cut_off_and_counted_as_the_clients(path):
    registry = CollectorRegistry()
    async with relkit.serving(engine_app()) as engine_url:
        monitor, url = await start(engine_url, registry, write_timeout=1.0)
        try:
            received, whole = await read_with_a_pause(url, 3.0, path)
            await asyncio.sleep(0.2)
        finally:
            await monitor.stop()
    assert not whole and received < EVENTS * len(EVENT)
    assert monitor.stats.upstream_errors() == {}  # not the engine's fault
    assert registry.get_sample_value("specguard_client_timeouts_total", {"phase": "response"}) == 1.0
    if path == "/v1/chat/completions":
        assert monitor.stats.records()[0].unattributed_reason == "client_disconnected"
