"""Hostile clients: idle sockets, trickled headers, stalled bodies, too
many connections, an exhausted open-file limit, malformed requests.

Every attack runs against the real tap (``Monitor``) in this process, except the open-file
limit, which needs a ``specguard run`` of its own. Each test checks that the tap's memory peak
stays bounded, that normal traffic is as fast under the attack as without it (a ratio in the
same test), that nothing logged a traceback, and that legitimate long streams are never cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import resource
import subprocess
import sys
import time

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from specguard.monitor.app import Monitor
from tests.reliability import hostkit, relkit
from tests.reliability.hostkit import MB

FAST = {
    "client_header_timeout_seconds": 0.5,
    "client_body_timeout_seconds": 0.5,
    "client_idle_timeout_seconds": 0.5,
}


async def start(
    engine: hostkit.Engine, engine_url: str, **tap: float
) -> tuple[Monitor, str, CollectorRegistry]:
    registry = CollectorRegistry()
    cfg = relkit.monitor_config({"spec-k4": engine_url}, extra=f"tap: {json.dumps({**FAST, **tap})}\n")
    monitor = Monitor(cfg, registry=registry)
    return monitor, await monitor.start("127.0.0.1", 0), registry


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: tap\r\nContent-Type: application/json\r\n"


async def received(reader: asyncio.StreamReader) -> bytes:
    """Every byte that arrived before the connection closed: a reset after the answer (the tap
    closes on bytes the client is still sending) does not lose the answer already read."""
    got = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            got += chunk
    return got


async def attacker(url: str, phase: str) -> bytes:
    """One connection misbehaving in ``phase``; returns what the tap answered before closing."""
    reader, writer = await asyncio.open_connection(*host_port(url))
    try:
        if phase == "headers":  # a request head that never ends, one header at a time
            writer.write(HEAD)
        elif phase in ("body-stalled", "body-trickled"):
            writer.write(HEAD + b"Content-Length: 100000\r\n\r\n" + b'{"model": "m"')
        await writer.drain()
        answer = asyncio.ensure_future(received(reader))
        for _ in range(100):
            if phase == "headers":
                writer.write(b"X-Slow: 1\r\n")
            elif phase == "body-trickled":
                writer.write(b" ")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            done, _ = await asyncio.wait({answer}, timeout=0.1)
            if done:
                return answer.result() or b"<closed>"
        answer.cancel()
        return b"<still open>"
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.mark.parametrize("phase", ["idle", "headers", "body-stalled", "body-trickled"])
async def test_slow_and_idle_clients_are_closed_and_counted(phase, caplog):
    engine = hostkit.Engine()
    async with relkit.serving(engine.app()) as engine_url:
        monitor, url, registry = await start(engine, engine_url)
        try:
            with caplog.at_level(logging.INFO, logger="specguard"), hostkit.PeakRSS() as rss:
                started = time.perf_counter()
                answers = await asyncio.gather(*(attacker(url, phase) for _ in range(20)))
                seconds = time.perf_counter() - started

            async def more() -> None:
                while True:
                    await asyncio.gather(*(attacker(url, phase) for _ in range(20)))

            slower = await hostkit.latency_ratio(url, more)
        finally:
            await monitor.stop()
    counted = "body" if phase.startswith("body") else phase
    timeouts = registry.get_sample_value("specguard_client_timeouts_total", {"phase": counted})
    assert seconds < 8, f"20 {phase} connections were held {seconds:.1f} s"
    assert b"<still open>" not in answers and timeouts >= 20
    if phase != "idle":
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[:2]
    assert rss.growth < 16 * MB, f"peak memory grew {rss.growth / MB:.0f} MB"
    assert slower < 2.0, f"normal traffic {slower:.2f}x slower under {phase} connections"
    assert hostkit.tracebacks(caplog) == []


async def test_at_the_connection_cap_idle_connections_make_room(caplog):
    engine = hostkit.Engine()
    async with relkit.serving(engine.app()) as engine_url:
        monitor, url, registry = await start(engine, engine_url, max_client_connections=8)
        idle = []
        try:
            with caplog.at_level(logging.INFO, logger="specguard"), hostkit.PeakRSS() as rss:
                for _ in range(40):  # far more idle sockets than the cap
                    idle.append(await asyncio.open_connection(*host_port(url)))
                await asyncio.sleep(0.05)
                open_now = registry.get_sample_value("specguard_client_connections")

                async def idlers() -> None:
                    while True:
                        idle.append(await asyncio.open_connection(*host_port(url)))
                        await asyncio.sleep(0.01)

                slower = await hostkit.latency_ratio(url, idlers)
        finally:
            await close_all(idle)
            await monitor.stop()
    evicted = registry.get_sample_value("specguard_client_connections_rejected_total", {"reason": "evicted"})
    assert open_now <= 8 and evicted >= 32
    assert rss.growth < 16 * MB
    assert slower < 2.0, f"normal traffic {slower:.2f}x slower with the cap full of idle sockets"
    assert hostkit.tracebacks(caplog) == []


async def test_when_every_connection_is_busy_a_new_one_gets_503():
    engine = hostkit.Engine()
    release = asyncio.Event()
    arrived = []

    async def slow(request: web.Request) -> web.Response:
        arrived.append(request)
        await release.wait()
        return web.json_response({"choices": []})

    engine.body = slow
    async with relkit.serving(engine.app()) as engine_url:
        monitor, url, registry = await start(engine, engine_url, max_client_connections=4)
        busy: list[asyncio.Task] = []
        try:
            async with aiohttp.ClientSession() as session:
                body = {"model": "m", "prompt": "p"}
                busy += [
                    asyncio.create_task(session.post(url + "/v1/completions", json=body)) for _ in range(4)
                ]
                async with asyncio.timeout(20):  # every connection admitted and busy at the engine
                    while len(arrived) < 4:
                        await asyncio.sleep(0.02)
                reader, writer = await asyncio.open_connection(*host_port(url))
                answer = await asyncio.wait_for(reader.read(), 5)
                writer.close()
                await writer.wait_closed()
                release.set()
                for task in busy:
                    assert (await task).status == 200
        finally:
            release.set()
            await asyncio.gather(*busy, return_exceptions=True)  # (none left unretrieved)
            await monitor.stop()
    assert answer.startswith(b"HTTP/1.1 503")
    assert (
        registry.get_sample_value("specguard_client_connections_rejected_total", {"reason": "refused"}) == 1
    )


async def test_legitimate_long_streams_slow_answers_and_keep_alive_are_never_cut(caplog):
    """Every deadline at 0.5 s; a 3 s stream, a 1.5 s answer and a paced upload all get through."""

    async def long_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(12):
            await response.write(hostkit.sse_event({"choices": [{"index": 0, "text": f"t{i}"}]}))
            await asyncio.sleep(0.25)
        await response.write(b"data: [DONE]\n\n")
        return response

    async def slow_answer(request: web.Request) -> web.Response:
        await asyncio.sleep(1.5)
        return web.json_response({"choices": [{"index": 0, "text": "done"}]})

    engine = hostkit.Engine()
    async with relkit.serving(engine.app()) as engine_url:
        monitor, url, registry = await start(engine, engine_url, client_body_timeout_seconds=2)
        try:
            async with aiohttp.ClientSession() as session:
                engine.body = long_stream
                async with session.post(url + "/v1/completions", json={"prompt": "p", "stream": True}) as r:
                    streamed = await r.read()
                engine.body = slow_answer
                async with session.post(url + "/v1/completions", json={"prompt": "p"}) as r:
                    answered = await r.json()
                await asyncio.sleep(0.3)  # idle, but less than the idle timeout: the connection is reused

                async def paced():
                    for _ in range(8):
                        yield b" " * 1024
                        await asyncio.sleep(0.1)
                    yield b'{"model": "m", "prompt": "p"}'

                async with session.post(url + "/v1/completions", data=paced()) as r:
                    uploaded = r.status
        finally:
            await monitor.stop()
    assert streamed.count(b"data: ") == 13 and streamed.endswith(b"data: [DONE]\n\n")
    assert answered == {"choices": [{"index": 0, "text": "done"}]} and uploaded == 200
    for phase in ("headers", "body", "idle"):
        assert registry.get_sample_value("specguard_client_timeouts_total", {"phase": phase}) == 0
    assert hostkit.tracebacks(caplog) == []


MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello to the plain-HTTP port
]


async def test_malformed_requests_get_400_and_one_log_line_without_a_traceback(caplog):
    engine = hostkit.Engine()
    async with relkit.serving(engine.app()) as engine_url:
        monitor, url, _ = await start(engine, engine_url)
        try:
            with caplog.at_level(logging.DEBUG, logger="specguard"), hostkit.PeakRSS() as rss:
                answers = []
                for raw in MALFORMED * 20:
                    reader, writer = await asyncio.open_connection(*host_port(url))
                    writer.write(raw)
                    answers.append(await asyncio.wait_for(reader.read(), 5))
                    writer.close()
                    await writer.wait_closed()

            async def garbage() -> None:
                while True:
                    for raw in MALFORMED:
                        reader, writer = await asyncio.open_connection(*host_port(url))
                        try:
                            writer.write(raw)
                            await reader.read()
                        finally:
                            writer.close()

            slower = await hostkit.latency_ratio(url, garbage)
        finally:
            await monitor.stop()
    assert all(a[:16] in (b"HTTP/1.0 400 Bad", b"HTTP/1.1 400 Bad") for a in answers[:4]), answers[:4]
    errors = [r for r in caplog.records if r.name.startswith("specguard") and r.levelno >= logging.ERROR]
    assert errors == [] and hostkit.tracebacks(caplog) == []
    assert "Error handling request" in caplog.text  # said once per request, on one line
    assert rss.growth < 16 * MB and slower < 2.0


def test_an_exhausted_open_file_limit_does_not_lock_out_legitimate_requests(tmp_path):
    """``specguard run`` with 64 open files (the review's case): 58 idle sockets, then real requests."""
    engine = tmp_path / "engine.py"
    engine.write_text(
        "from aiohttp import web\n"
        "async def ok(request):\n"
        "    await request.read()\n"
        "    return web.json_response({'choices': []})\n"
        "app = web.Application()\n"
        "app.router.add_route('*', '/{tail:.*}', ok)\n"
        f"web.run_app(app, host='127.0.0.1', port={relkit.closed_port()}, print=lambda *a: None)\n"
    )
    port = int(engine.read_text().rsplit("port=", 1)[1].split(",")[0])
    listen = relkit.closed_port()
    cfg = tmp_path / "specguard.yaml"
    cfg.write_text(
        f'pools: [{{name: spec-k4, url: "http://127.0.0.1:{port}", engine: vllm}}]\n'
        f'tap: {{listen: "127.0.0.1:{listen}"}}\nscrape: {{interval_seconds: 3600, timeout_seconds: 1}}\n'
        "guard: {enabled: false}\n"
        # a free port of its own: the tap's + 1 may be a client connection's port on a busy machine
        f'server: {{listen: "127.0.0.1:{relkit.closed_port()}"}}\n'
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    upstream = subprocess.Popen([sys.executable, str(engine)])
    tap = subprocess.Popen(
        [sys.executable, "-m", "specguard", "run", "--config", str(cfg)],
        preexec_fn=limit,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        asyncio.run(_lockout(listen, port))
    finally:
        tap.terminate()
        upstream.terminate()
        _, stderr = tap.communicate(timeout=20)
        upstream.wait(timeout=20)
    assert "Traceback" not in stderr and "Errno 24" not in stderr, stderr[-2000:]
    assert "lowered to 16 by the open-file limit" in stderr


async def _lockout(listen: int, port: int) -> None:
    url = f"http://127.0.0.1:{listen}"
    await _wait_for(f"http://127.0.0.1:{port}/")
    await _wait_for(url + "/healthz")
    idle = [await asyncio.open_connection("127.0.0.1", listen) for _ in range(58)]
    try:
        await asyncio.sleep(0.2)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            for _ in range(10):
                async with session.post(url + "/v1/completions", json={"prompt": "p"}) as response:
                    assert response.status == 200
            async with session.get(url + "/metrics") as response:
                page = await response.text()
        connections = float(re.search(r"^specguard_client_connections (\S+)$", page, re.M).group(1))
        assert connections <= 16  # (64 - 24 - 8) / 2: the cap the open-file limit allows
    finally:
        await close_all(idle)


async def close_all(connections: list) -> None:
    for _, writer in connections:
        writer.close()
    for _, writer in connections:
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _wait_for(url: str) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        for _ in range(200):
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url) as response:
                    await response.read()
                    return
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never answered")
