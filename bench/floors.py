"""Relays that do nothing but relay: the floors the tap's cost is measured against.

- ``bare``: the plain aiohttp proxy (the relaying task reads the upstream body with
  ``iter_any()`` and awaits each write), as most aiohttp reverse proxies are written;
- ``push``: the tap's own relay path (``specguard.exporters.bodypush``: each upstream read is
  written to the client within the read callback) without any inspection, classification or
  statistics.

Each is started in its own process: ``main(kind, queue, upstream, cpus)`` (pinned to ``cpus``
when given) puts ``(url, pid)`` on ``queue`` once it serves POST /v1/chat/completions.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os

import aiohttp
import bench_tap
from aiohttp import web

from specguard.exporters import bodypush


async def _bare(resp: aiohttp.ClientResponse, request: web.Request, out: web.StreamResponse) -> None:
    async for data in resp.content.iter_any():
        await out.write(data)


async def _push(resp: aiohttp.ClientResponse, request: web.Request, out: web.StreamResponse) -> None:
    await bodypush.deliver(resp, bodypush.client_writer(request), request.writer.drain)


def main(kind: str, queue: mp.Queue, upstream: str, cpus: set[int] | None = None) -> None:
    bench_tap._pin(cpus)
    relay = {"bare": _bare, "push": _push}[kind]

    async def serve() -> None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

        async def handle(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            async with session.post(
                upstream + request.path, data=raw, headers={"Content-Type": "application/json"}
            ) as resp:
                out = web.StreamResponse(
                    status=resp.status, headers={"Content-Type": resp.headers["Content-Type"]}
                )
                await out.prepare(request)
                await relay(resp, request, out)
                await out.write_eof()
                return out

        queue.put((await bench_tap.serve_chat(handle), os.getpid()))
        await asyncio.Event().wait()

    asyncio.run(serve())  # asyncio, as the tap runs
