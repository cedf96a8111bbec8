"""bodypush: an upstream body handed to a callback from the read callback, with flow control."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from specguard.exporters import bodypush
from specguard.exporters.readwatch import ReadWatch
from tests.exporters.servekit import serve


@pytest.fixture
async def upstream():
    async def stream(request: web.Request) -> web.StreamResponse:
        size, count = int(request.query.get("size", 9)), int(request.query["chunks"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(count):
            await asyncio.sleep(float(request.query.get("gap", 0)))
            await resp.write(bytes([65 + i % 26]) * size)
        if request.query.get("break"):
            request.transport.close()  # mid-body: no terminating chunk
            return resp
        await asyncio.sleep(float(request.query.get("stall", 0)))
        await resp.write_eof()
        return resp

    async def empty(request: web.Request) -> web.Response:
        return web.Response(body=b"", content_type="text/event-stream")

    app = web.Application()
    app.router.add_get("/", stream)
    app.router.add_get("/empty", empty)
    runner, url = await serve(app)
    async with aiohttp.ClientSession() as session:
        yield session, url + "/"
    await runner.cleanup()


async def no_drain() -> None:
    raise AssertionError("drain() called although on_data never said the receiver was full")


def expected(chunks: int, size: int = 9) -> bytes:
    return b"".join(bytes([65 + i % 26]) * size for i in range(chunks))


async def test_delivers_the_body_in_order_including_what_was_buffered_before(upstream):
    session, url = upstream
    got: list[bytes] = []
    async with session.get(url, params={"chunks": 40, "gap": 0.002}) as resp:
        await asyncio.sleep(0.03)  # some chunks are in the reader's buffer already
        assert resp.content._buffer, "the test needs data buffered before the push starts"
        await bodypush.deliver(resp, lambda data: got.append(data) or False, no_drain)
        assert resp.content.is_eof()
    assert b"".join(got) == expected(40)
    assert len(got) > 1  # later chunks came one read at a time, not as one read at the end


async def test_a_full_receiver_pauses_reading_until_it_drains(upstream):
    session, url = upstream
    receiver = bytearray()
    delivered = bytearray()
    peak = 0
    limit = 64 * 1024

    def on_data(data: bytes) -> bool:
        nonlocal peak
        receiver.extend(data)
        peak = max(peak, len(receiver))
        return len(receiver) > limit

    async def drain() -> None:
        await asyncio.sleep(0.05)  # a slow client; without the pause the whole body would pile up
        delivered.extend(receiver)
        receiver.clear()

    params = {"chunks": 64, "size": 32 * 1024}  # 2 MiB as fast as the upstream can write it
    async with session.get(url, params=params) as resp:
        await bodypush.deliver(resp, on_data, drain)
    delivered.extend(receiver)
    assert bytes(delivered) == expected(64, 32 * 1024)
    assert peak < 1024 * 1024  # bounded by the limit plus what one socket read carries


async def test_an_upstream_that_breaks_mid_body_raises_after_what_arrived(upstream):
    session, url = upstream
    got: list[bytes] = []
    async with session.get(url, params={"chunks": 5, "gap": 0.01, "break": 1}) as resp:
        with pytest.raises(aiohttp.ClientPayloadError):
            await bodypush.deliver(resp, lambda data: got.append(data) or False, no_drain)
    assert b"".join(got) == expected(5)


async def test_the_callbacks_own_error_stops_the_push_and_is_raised(upstream):
    session, url = upstream
    calls = 0

    def on_data(data: bytes) -> bool:
        nonlocal calls
        calls += 1
        raise ValueError("relay bug")

    async with session.get(url, params={"chunks": 20, "gap": 0.005}) as resp:
        with pytest.raises(ValueError, match="relay bug"):
            await bodypush.deliver(resp, on_data, no_drain)
    assert calls == 1


async def test_a_quiet_upstream_times_out_through_the_read_watch(upstream):
    session, url = upstream
    timeout = aiohttp.ClientTimeout(sock_read=0.3)
    got: list[bytes] = []
    async with session.get(url, params={"chunks": 3, "gap": 0.1, "stall": 5}, timeout=timeout) as resp:
        watch = ReadWatch.take_over(resp, 0.3)
        assert watch is not None

        def on_data(data: bytes) -> bool:
            watch.read()
            got.append(data)
            return False

        with pytest.raises(aiohttp.ServerTimeoutError):
            await bodypush.deliver(resp, on_data, no_drain)
        watch.close()
    assert b"".join(got) == expected(3)


async def test_an_empty_body_delivers_nothing(upstream):
    session, url = upstream
    got: list[bytes] = []
    async with session.get(url + "empty") as resp:
        await bodypush.deliver(resp, lambda data: got.append(data) or False, no_drain)
    assert got == []


async def test_the_connection_goes_back_to_the_pool_after_a_pushed_body(upstream):
    session, url = upstream
    for _ in range(3):
        async with session.get(url, params={"chunks": 4}) as resp:
            await bodypush.deliver(resp, lambda data: False, no_drain)
    assert sum(len(v) for v in session.connector._conns.values()) == 1  # one keep-alive, reused
