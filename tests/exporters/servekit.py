"""A scripted aiohttp app served on loopback, for the tests that need a real HTTP peer."""

from __future__ import annotations

from aiohttp import web


async def serve(app: web.Application, **runner_options) -> tuple[web.AppRunner, str]:
    """Start ``app`` on 127.0.0.1 (ephemeral port); its runner (to clean up) and base URL."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
