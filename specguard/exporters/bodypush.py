"""A streamed upstream body handed to a callback as aiohttp's parser produces it.

Reading a stream with ``async for data in resp.content.iter_any()`` wakes the relaying task once
per chunk, and the chunk passes through the ``StreamReader``'s buffer and an awaited write: for a
token stream that is most of a proxy's CPU per chunk, and when an engine step emits a chunk for
every running stream at once the last stream waits for all of that (bench/bench_relay.py). Here
the reader hands each chunk to a plain callback from within the socket's read callback, so the
relay inspects and forwards it there and then; the relaying task sleeps until the body ends,
fails, or the receiver is full (then reading pauses until the receiver drains).
``client_writer`` is the other half: a callback that writes to the client without awaiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.streams import StreamReader

# on_data(chunk) -> True when the receiver is full: reading pauses until drain() returns
OnData = Callable[[bytes], bool]


class _Push:
    """One body being pushed: where its chunks go and what wakes the waiting task."""

    def __init__(self, on_data: OnData, protocol: Any) -> None:
        self.on_data = on_data
        self.protocol = protocol  # aiohttp's ResponseHandler: pause_reading / resume_reading
        self.waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.error: BaseException | None = None
        self.ended = False
        self.full = False

    def deliver(self, data: bytes) -> None:
        if self.ended:
            return
        try:
            full = self.on_data(data)
        except Exception as exc:  # the relay's own failure: stop reading, raise it in the task
            self.protocol.pause_reading()
            self.finish(exc)
            return
        if full and not self.full:
            self.full = True
            self.protocol.pause_reading()
            self._wake()

    def finish(self, error: BaseException | None) -> None:
        if self.ended:
            return
        self.ended, self.error = True, error
        self._wake()

    def _wake(self) -> None:
        if not self.waiter.done():
            self.waiter.set_result(None)


_PUSHES: dict[StreamReader, _Push] = {}


class _PushReader(StreamReader):
    """``StreamReader`` whose body goes to the registered push instead of its buffer."""

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        push = _PUSHES.get(self)
        if push is None:
            return super().feed_data(data, size)
        if data:
            push.deliver(data)
        return False

    def feed_eof(self) -> None:
        super().feed_eof()  # (releases the connection to the pool via the response's eof callback)
        push = _PUSHES.get(self)
        if push is not None:
            push.finish(None)

    def set_exception(self, exc: BaseException, *args: Any) -> None:
        super().set_exception(exc, *args)
        push = _PUSHES.get(self)
        if push is not None:
            push.finish(exc)


def client_writer(request: web.Request) -> OnData:
    """An ``on_data`` that writes to ``request``'s client at once (chunk-framed when aiohttp
    chose chunked for the prepared response); True when the client's send buffer is past its
    high-water mark. Between ``prepare()`` and ``write_eof()`` of that response only.
    """
    writer: Any = request.writer
    flush_headers = getattr(writer, "send_headers", None)
    if flush_headers is not None:  # (aiohttp >= 3.12 may hold the headers back for the first write)
        flush_headers()
    transport = request.transport
    high = transport.get_write_buffer_limits()[1] if transport is not None else 0
    chunked = bool(getattr(writer, "chunked", False))

    def send(data: bytes) -> bool:
        if not data:
            return False
        if transport is None or transport.is_closing():
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        framed = b"%x\r\n%b\r\n" % (len(data), data) if chunked else data
        writer.output_size += len(framed)
        transport.write(framed)
        return transport.get_write_buffer_size() > high

    return send


def _take_over(reader: StreamReader) -> bool:
    """Turn ``reader`` into a ``_PushReader`` (its body then goes to the registered push)."""
    if type(reader) is not StreamReader:
        return False
    try:
        reader.__class__ = _PushReader
    except TypeError:  # an aiohttp whose reader's layout differs: stay on the ordinary path
        return False
    return True


async def deliver(
    resp: aiohttp.ClientResponse, on_data: OnData, drain: Callable[[], Awaitable[None]]
) -> None:
    """Hand ``resp``'s whole body to ``on_data``; return at its end, raise its error.

    Whatever the reader had buffered before goes first. A reader that is not aiohttp's plain
    ``StreamReader`` (an empty body), or one that cannot be taken over, is read the ordinary way
    into the same callback.
    """
    reader = resp.content
    connection = resp.connection
    if connection is None or connection.protocol is None or not _take_over(reader):
        async for data in reader.iter_any():
            if on_data(data):
                await drain()
        return
    push = _Push(on_data, connection.protocol)
    early = reader.read_nowait()  # (raises the body's error if it already failed)
    if early:
        push.deliver(early)
    if reader.is_eof():
        push.finish(None)
    else:
        _PUSHES[reader] = push
    try:
        while True:
            await push.waiter
            if push.full and not push.ended:
                push.waiter = asyncio.get_running_loop().create_future()
                await drain()
                push.full = False
                push.protocol.resume_reading()
                continue
            break
    finally:
        _PUSHES.pop(reader, None)
    if push.error is not None:
        raise push.error
