"""Read a whole HTTP body with a size bound.

``StreamReader.read(n)`` returns as soon as *some* data is buffered, so a single call can
yield a truncated page or payload under load; every body specguard parses goes through here.
"""

from __future__ import annotations

import aiohttp


class BodyTooLarge(Exception):
    """The body (declared or streamed) exceeds the limit."""

    def __init__(self, limit: int):
        super().__init__(f"body larger than {limit} bytes")
        self.limit = limit


async def read_limited(stream: aiohttp.StreamReader, limit: int, declared: int | None = None) -> bytes:
    """The whole body up to EOF; BodyTooLarge as soon as it (or its Content-Length) passes ``limit``."""
    if declared is not None and declared > limit:
        raise BodyTooLarge(limit)
    parts: list[bytes] = []
    size = 0
    while True:
        data = await stream.readany()
        if not data:
            return b"".join(parts)
        size += len(data)
        if size > limit:
            raise BodyTooLarge(limit)
        parts.append(data)
