"""Read a whole HTTP body with a size bound.

``StreamReader.read(n)`` returns as soon as *some* data is buffered, so a single call can
yield a truncated page or payload under load; every body specguard parses goes through here.
"""

from __future__ import annotations

import asyncio

import aiohttp


class BodyTooLarge(Exception):
    """The body (declared or streamed) exceeds the limit."""

    def __init__(self, limit: int):
        super().__init__(f"body larger than {limit} bytes")
        self.limit = limit


class BodyTimeout(Exception):
    """The whole body did not arrive within the time allowed (a stalled or trickling sender)."""

    def __init__(self, seconds: float):
        super().__init__(f"body not received within {seconds:g} s")
        self.seconds = seconds


async def read_limited(
    stream: aiohttp.StreamReader, limit: int, declared: int | None = None, *, timeout: float | None = None
) -> bytes:
    """The whole body up to EOF; BodyTooLarge as soon as it (or its Content-Length) passes ``limit``,
    BodyTimeout when it has not all arrived ``timeout`` seconds after the call."""
    if declared is not None and declared > limit:
        raise BodyTooLarge(limit)
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                data = await stream.readany()
                if not data:
                    return b"".join(parts)
                size += len(data)
                if size > limit:
                    raise BodyTooLarge(limit)
                parts.append(data)
    except TimeoutError as exc:
        raise BodyTimeout(timeout or 0.0) from exc
