"""ReadWatch: the read timeout of a relayed stream, checked lazily instead of per read."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from specguard.exporters.readwatch import ReadWatch
from tests.exporters.servekit import serve


@pytest.fixture
async def upstream():
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(int(request.query["chunks"])):
            await asyncio.sleep(float(request.query["gap"]))
            await resp.write(b"data: x\n\n")
        await asyncio.sleep(float(request.query["stall"]))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", stream)
    runner, url = await serve(app)
    async with aiohttp.ClientSession() as session:
        yield session, url + "/"
    await runner.cleanup()


async def read_all(resp: aiohttp.ClientResponse, watch: ReadWatch | None) -> bytes:
    out = b""
    async for data in resp.content.iter_any():
        if watch is not None:
            watch.read()
        out += data
    return out


async def test_switches_the_per_read_timer_off_and_times_out_a_quiet_stream(upstream):
    session, url = upstream
    timeout = aiohttp.ClientTimeout(sock_read=0.3)
    async with session.get(url, params={"chunks": 3, "gap": 0.1, "stall": 5}, timeout=timeout) as resp:
        watch = ReadWatch.take_over(resp, 0.3)
        assert watch is not None and resp.connection.protocol.read_timeout is None
        started = asyncio.get_running_loop().time()
        with pytest.raises(aiohttp.ServerTimeoutError):
            await read_all(resp, watch)
        waited = asyncio.get_running_loop().time() - started
        watch.close()
    assert 0.3 <= waited < 3  # three reads 0.1 s apart kept it alive, then 0.3 s of quiet ended it


async def test_reads_closer_than_the_timeout_keep_a_long_stream_alive(upstream):
    session, url = upstream
    # the timeout is 30x the gap: server and reader share this process, and a starved machine can
    # hold the whole process still for over a second (CI did), after which the watch's timer and
    # the pending chunk are due together and the timer runs first, as aiohttp's sock_read would
    timeout = aiohttp.ClientTimeout(sock_read=3.0)
    async with session.get(url, params={"chunks": 45, "gap": 0.1, "stall": 0}, timeout=timeout) as resp:
        watch = ReadWatch.take_over(resp, 3.0)
        assert await read_all(resp, watch) == b"data: x\n\n" * 45  # 4.5 s in all, never 3 s quiet
        watch.close()


async def test_nothing_to_watch_once_the_body_is_in(upstream):
    session, url = upstream
    async with session.get(url, params={"chunks": 1, "gap": 0, "stall": 0}) as resp:
        await resp.read()
        assert ReadWatch.take_over(resp, 1.0) is None
    async with session.get(url, params={"chunks": 1, "gap": 0, "stall": 0}) as resp:
        assert ReadWatch.take_over(resp, None) is None  # no timeout configured: nothing to do
        await resp.read()
