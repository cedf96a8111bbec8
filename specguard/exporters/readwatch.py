"""The upstream read timeout of a relayed stream, without a timer per stream chunk.

aiohttp's ``sock_read`` timeout cancels and re-arms a timer on every read: for a token stream
that is one timer per chunk, about a sixth of the tap's CPU per relayed chunk. ``ReadWatch``
takes over once a stream's headers are in: the relay loop only records the time of each read,
and one timer per quiet period checks it, re-arming itself for the remainder when reads came
in meanwhile. A stream quiet for the whole timeout fails exactly as ``sock_read`` would: the
reader gets aiohttp's ``ServerTimeoutError`` (a ``TimeoutError``).

The timeout measures the engine, not the client: while the relay has stopped reading because
the client is not taking the bytes (``pause``), the engine's silence is not counted, and the
quiet period starts again when reading resumes (as aiohttp's own ``sock_read`` does).
"""

from __future__ import annotations

import asyncio

import aiohttp


class ReadWatch:
    """Fails ``resp``'s body with a read timeout after ``timeout`` seconds without a read."""

    def __init__(self, resp: aiohttp.ClientResponse, timeout: float):
        self._resp = resp
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self.last_read = self._loop.time()
        self.paused = False  # reading stopped while the client catches up
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self.last_read + timeout, self._check)

    @classmethod
    def take_over(cls, resp: aiohttp.ClientResponse, timeout: float | None) -> ReadWatch | None:
        """Switch ``resp``'s per-read timer off and watch it instead (None: nothing to watch).

        The timer aiohttp armed at the last read stays until the next read cancels it, so the
        gap before the first body chunk is covered either way.
        """
        connection = resp.connection
        protocol = connection.protocol if connection is not None else None
        if not timeout or protocol is None or not hasattr(protocol, "read_timeout"):
            return None  # body already read in full, or an aiohttp without the knob: keep sock_read
        protocol.read_timeout = None
        return cls(resp, timeout)

    def read(self) -> None:
        """Called by the relay loop for each read: all the per-chunk work there is."""
        self.last_read = self._loop.time()

    def pause(self) -> None:
        """Reading stopped for the client (its buffer is full): no engine timeout meanwhile."""
        self.paused = True

    def resume(self) -> None:
        """Reading again: the engine has the whole timeout from now."""
        self.paused = False
        self.last_read = self._loop.time()

    def _check(self) -> None:
        if self.paused:
            self._handle = self._loop.call_at(self._loop.time() + self._timeout, self._check)
            return
        due = self.last_read + self._timeout
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self._handle = None
        self._resp.content.set_exception(aiohttp.ServerTimeoutError("Timeout on reading data from socket"))

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
