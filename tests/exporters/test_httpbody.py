"""Bodies that arrive in pieces are read whole; oversized ones are refused (page, payload, request)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from specguard.errors import InputError
from specguard.exporters import promtext, scrape
from specguard.exporters.httpbody import BodyTooLarge, read_limited
from tests.exporters.servekit import serve

PAGE = "".join(f'vllm:generation_tokens_total{{engine="{i}",model_name="m"}} {i}.0\n' for i in range(400))


async def slow_page(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
    await response.prepare(request)
    data = PAGE.encode()
    for start in range(0, len(data), 1000):  # several TCP writes with pauses, like a big real page
        await response.write(data[start : start + 1000])
        await asyncio.sleep(0.01)
    await response.write_eof()
    return response


async def echo_size(request: web.Request) -> web.Response:
    try:
        body = await read_limited(request.content, 4096, request.content_length)
    except BodyTooLarge as exc:
        return web.Response(status=413, text=str(exc))
    return web.Response(text=str(len(body)))


@pytest.fixture
async def server():
    app = web.Application()
    app.router.add_get("/metrics", slow_page)
    app.router.add_post("/echo", echo_size)
    runner, url = await serve(app)
    yield url
    await runner.cleanup()


async def test_a_page_sent_in_pieces_is_read_to_the_end(server):
    text = await scrape.fetch_text(f"{server}/metrics", timeout=10)
    assert text == PAGE


async def test_streamed_bodies_are_bounded_without_content_length(server):
    import aiohttp

    async def chunks(size: int):
        for start in range(0, size, 512):
            yield b"x" * min(512, size - start)

    async with aiohttp.ClientSession() as session:
        async with session.post(f"{server}/echo", data=chunks(3000)) as response:
            assert (response.status, await response.text()) == (200, "3000")
        async with session.post(f"{server}/echo", data=chunks(5000)) as response:
            assert response.status == 413 and "4096" in await response.text()
        async with session.post(f"{server}/echo", data=b"y" * 5000) as response:  # declared length
            assert response.status == 413


async def test_oversized_page_is_an_input_error(server):
    limits = promtext.Limits(max_page_bytes=2000)
    with pytest.raises(InputError, match="larger than 2000 bytes"):
        await scrape.fetch_text(f"{server}/metrics", timeout=10, limits=limits)
