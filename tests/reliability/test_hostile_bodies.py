"""JSON amplification: request bodies whose parse costs far more than their size.

A 3.9 MB body of 1.3 million ``{}`` inside a list costs ``json.loads`` about 100 MB and 0.8 s of
the loop; twelve at once cost 1.3 GB and stalled every other request for seconds. The tap counts
a body's arrays and objects before it parses (``exporters.bodyparse``): such a body is refused
(413) at once, a merely large one is parsed in a worker thread, one at a time, and still
forwarded byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
from aiohttp import web

from specguard.monitor.app import Monitor
from tests.reliability import hostkit, relkit
from tests.reliability.hostkit import MB

HEAD = b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "pad": ['
AMPLIFIER = HEAD + b"{}," * 1_300_000 + b"{}]}"  # 3.9 MB, 1.3 million objects
CONCURRENT = 12


class LoopLag:
    """The longest the event loop kept a 5 ms sleeper waiting inside the block, in CPU seconds of
    the loop's thread (``worst``: on a machine other processes load, the wall-clock wait also
    counts the time the process was not scheduled at all; that is ``worst_wall``)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.worst_wall = 0.0
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        while True:
            start, cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0.005)
            self.worst_wall = max(self.worst_wall, time.perf_counter() - start - 0.005)
            self.worst = max(self.worst, time.thread_time() - cpu)

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def chunks(data: bytes):
    """``data`` in 256 KiB slices of the one buffer (twelve bodies in flight share it)."""
    view = memoryview(data)
    for start in range(0, len(view), 256 * 1024):
        yield view[start : start + 256 * 1024]


async def post(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, dict]:
    sent = chunks(data) if len(data) > MB else data
    async with session.post(url + "/v1/chat/completions", data=sent) as response:
        return response.status, json.loads(await response.read())


async def test_twelve_amplification_bodies_are_refused_in_bounded_memory_and_loop_time(caplog):
    engine = hostkit.Engine()
    async with relkit.serving(engine.app()) as engine_url:
        monitor = Monitor(relkit.monitor_config({"nospec": engine_url}))
        url = await monitor.start("127.0.0.1", 0)
        try:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                await post(session, url, json.dumps(hostkit.chat()).encode())  # warm: one normal request
                before = engine.requests
                with hostkit.PeakRSS() as rss:
                    async with LoopLag() as lag:
                        answers = await asyncio.gather(
                            *(post(session, url, AMPLIFIER) for _ in range(CONCURRENT))
                        )
                reached = engine.requests - before

                # normal traffic while the bodies keep coming is as fast as without them
                async def attack() -> None:
                    while True:
                        await post(session, url, AMPLIFIER)

                slower = await hostkit.latency_ratio(url, attack)
        finally:
            await monitor.stop()
    for status, answer in answers:
        assert status == 413, answer
        message = answer["error"]["message"]
        assert "1300005 JSON arrays and objects" in message and "tap.max_json_containers" in message
    assert reached == 0  # none of them reached the engine
    assert monitor.tap.bodies.refused >= CONCURRENT
    # (one parse of such a body held the loop for 0.8 s of CPU; what is left is reading 47 MB of bodies)
    assert lag.worst < 0.4, f"the loop stalled {lag.worst:.2f} s of CPU ({lag.worst_wall:.2f} s wall)"
    # the bodies themselves (12 x 3.9 MB, read by the tap) are most of it; parsing them was 1.3 GB
    assert rss.growth < 200 * MB, f"peak memory grew {rss.growth / MB:.0f} MB"
    assert slower < 2.0, f"normal traffic {slower:.2f}x slower under the bodies"
    assert hostkit.tracebacks(caplog) == []


async def test_a_large_body_is_parsed_off_the_loop_classified_and_forwarded_byte_for_byte():
    received: list[bytes] = []

    async def handle(request: web.Request) -> web.Response:
        if request.path == "/v1/chat/completions":
            received.append(await request.read())
        return web.json_response(relkit.COMPLETION)

    app = web.Application(client_max_size=8 * MB)
    app.router.add_route("*", "/{tail:.*}", handle)
    # 50,000 objects: over the loop's share (parsed in the worker thread), under the limit
    body = (
        b'{"model": "m", "metadata": {"task": "code"}, "temperature": 0, '
        b'"messages": [{"role": "user", "content": "x"}], "pad": [' + b"{}, " * 49_999 + b"{}]}"
    )
    async with relkit.serving(app) as engine_url:
        monitor = Monitor(relkit.monitor_config({"nospec": engine_url}))
        url = await monitor.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session, LoopLag() as lag:
                status, _answer = await post(session, url, body)
        finally:
            await monitor.stop()
    assert status == 200
    assert received == [body]  # not re-serialised: the engine reads what the client wrote
    assert monitor.tap.bodies.offloaded == 1
    record = monitor.stats.records()[0]
    assert (record.task_type, record.temperature_bucket, record.classified) == ("code", "greedy", True)
    assert lag.worst < 0.02, f"the loop stalled {lag.worst:.3f} s of CPU ({lag.worst_wall:.2f} s wall)"
