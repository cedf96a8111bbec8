"""Helpers for the reliability suite: misbehaving upstreams, loopback servers, configs, clocks.

Everything listens on 127.0.0.1 with an ephemeral port and is stopped by the caller
(``async with serving(app) as url``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from specguard.monitor import config

K = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
ROOT = Path(__file__).resolve().parents[2]


def run_specguard(cfg: Path) -> subprocess.CompletedProcess:
    """``specguard run --config cfg`` in a process of its own, to its exit: for the start-up
    refusals (a config that must stop it at once; 60 s would be a hang)."""
    return subprocess.run(
        [sys.executable, "-m", "specguard", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1:<ephemeral>; yields the base URL and always stops it."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released): connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def monitor_config(
    urls: dict[str, str], *, engine: str = "vllm", extra: str = "", k=None, scrape: dict | None = None
):
    """A parsed specguard config over ``urls`` (pool name -> URL); scrape only on demand.

    ``scrape``: ``scrape:`` keys to set (``{"max_page_bytes": 2097152}``). specguard needs a pool
    without speculation: when ``urls`` has none, a ``nospec`` pool on a port nobody listens on is
    added (it gets traffic only if the tests' pools are down).
    """
    ks = k or K
    if all(ks.get(name, 0) > 0 for name in urls):
        urls = {**urls, "nospec": f"http://127.0.0.1:{closed_port()}"}
        ks = {**ks, "nospec": 0}
    pools = "\n".join(
        f'  - {{name: {name}, url: "{url}", engine: {engine}, num_speculative_tokens: {ks.get(name, 0)}}}'
        for name, url in urls.items()
    )
    keys = {"interval_seconds": 3600, "timeout_seconds": 1, **(scrape or {})}
    text = f"pools:\n{pools}\nscrape: {json.dumps(keys)}\n{extra}"
    return config.parse_text(text, "reliability.yaml")


def normalise(data: bytes) -> bytes:
    """The only bytes that legitimately differ between two identical requests (id, created)."""
    data = re.sub(rb'"id": ?"[^"]+"', b'"id":"X"', data)
    return re.sub(rb'"created": ?\d+', b'"created":0', data)


class Clock:
    """A settable wall clock for the guard's state machine."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def chat_body(model: str = "m", *, stream: bool = False, text: str = "hi") -> dict:
    return {
        "model": model,
        "max_tokens": 8,
        "temperature": 0.0,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }


COMPLETION = {
    "id": "x",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
"""A small valid chat completion (what the test engines answer)."""


class Misbehaving:
    """An OpenAI-style upstream whose behaviour is set per test (``mode``).

    Modes: ``ok`` (a small valid answer), ``5xx`` (500 with a JSON error), ``loading`` (503 on
    every path, /metrics too, with llama.cpp's body while it loads its model), ``hang`` (never
    answers), ``hang_mid_stream`` (headers and one event, then silence), ``die_mid_stream``
    (two events, then the connection is closed).
    """

    LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}

    CHUNK = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "tok"}, "finish_reason": None}],
    }

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.requests = 0
        self.release = asyncio.Event()  # set at teardown so hanging handlers end

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        await request.read()
        if self.mode == "5xx":
            return web.json_response(
                {"error": {"message": "engine failed", "type": "server_error"}}, status=500
            )
        if self.mode == "loading":
            return web.json_response(self.LOADING, status=503)
        if self.mode == "hang":
            await self.release.wait()
            return web.Response(status=500)
        if self.mode in ("die_mid_stream", "hang_mid_stream"):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            events = 2 if self.mode == "die_mid_stream" else 1
            for _ in range(events):
                await out.write(b"data: " + json.dumps(self.CHUNK).encode() + b"\n\n")
            if self.mode == "hang_mid_stream":
                await self.release.wait()
                return out
            await asyncio.sleep(0.05)  # let the events go out before the crash
            assert request.transport is not None
            request.transport.abort()  # the engine process died: RST, no terminating chunk
            return out
        return web.json_response(COMPLETION)

    async def metrics(self, request: web.Request) -> web.Response:
        if self.mode == "5xx":
            return web.Response(status=500, text="boom")
        if self.mode == "loading":
            return web.json_response(self.LOADING, status=503)
        if self.mode == "hang":
            await self.release.wait()
        return web.Response(text="# nothing\n", content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app
