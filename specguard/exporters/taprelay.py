"""Relaying upstream bodies through the tap: SSE events cut within an inspection window, the
one terminal event held back for its usage event, and bodies too large to inspect relayed as
they arrive, never buffered whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from specguard.exporters import bodypush, tapstream


@dataclass(frozen=True)
class Seen:
    """One inspected stream event: the bytes to forward (None = drop) and what it was."""

    event: bytes | None
    finish: bool = False  # ends a choice of an n = 1 stream whose usage the tap added
    usage: bool = False  # the tap's own usage event (dropped)
    fingerprint: bytes | None = None  # raw JSON value of the usage event's system_fingerprint
    done: bool = False  # the stream's terminating ``data: [DONE]``


class Relay:
    """Holds the terminal event of a tapped n = 1 stream until the usage event follows it."""

    def __init__(self) -> None:
        self._held: bytes | None = None

    def feed(self, raw: bytes, seen: Seen) -> list[bytes]:
        """The events to forward now, in order, after ``raw`` was inspected as ``seen``."""
        out: list[bytes] = []
        if seen.usage:
            if self._held is not None:
                held, self._held = self._held, None
                out.append(_with_fingerprint(held, seen.fingerprint) if seen.fingerprint else held)
            return out
        if self._held is not None:  # not the expected usage event: give up, keep the order
            out.append(self._held)
            self._held = None
        if seen.event is None:
            return out
        if seen.finish:
            self._held = seen.event
        else:
            out.append(seen.event)
        return out

    def raw(self, data: bytes) -> list[bytes]:
        """Bytes relayed uninspected (an event too long to inspect): after any held event."""
        held, self._held = self._held, None
        return [held, data] if held is not None else [data]

    def release(self) -> bytes:
        """The held event, unchanged (the stream ended or broke without a usage event)."""
        held, self._held = self._held, None
        return held or b""


def is_done(event: bytes) -> bool:
    """Whether ``event`` is the stream's terminating ``data: [DONE]``."""
    start = event.find(b"data:")
    return start >= 0 and event[start + 5 :].strip() == b"[DONE]"


def _with_fingerprint(event: bytes, fingerprint: bytes) -> bytes:
    """``event`` with ``"system_fingerprint":<fingerprint>`` appended to its JSON data."""
    start = event.find(b"data:")
    payload = event[start + 5 :].strip()
    at = event.find(payload, start)
    patched = tapstream.append_key(payload, "system_fingerprint", fingerprint)
    return event[:at] + patched + event[at + len(payload) :]


class EventSplitter:
    """Cuts a byte stream into complete SSE events (blank-line terminated, LF or CRLF).

    Linear in the bytes fed, however they are split: an unfinished event is kept as a list of
    reads and only the last few bytes are searched again. An event longer than ``limit`` (the
    inspection window) is not kept at all: its bytes are handed on uninspected as they arrive,
    up to its end, so one endless event costs neither memory nor quadratic time.
    """

    def __init__(self, limit: int = 1 << 20) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._tail = b""  # the unfinished event's last 3 bytes (a terminator may straddle reads)
        self._limit = limit
        self._passing = False  # inside an event too long to inspect: relaying it raw

    def feed(self, data: bytes) -> list[tuple[bool, bytes]]:
        """(inspect?, bytes) in stream order: complete events, or raw bytes of an oversized one."""
        out: list[tuple[bool, bytes]] = []
        pos = 0
        while pos < len(data):
            tail = self._tail
            if tail:  # probe[i] is data[base + i]
                probe, base = tail + data[pos:], pos - len(tail)
                end, sep = _event_end(probe, 0)
            else:
                base = 0
                end, sep = _event_end(data, pos)
            if end < 0:
                rest = data[pos:]
                self._tail = (tail + rest)[-3:]
                if self._passing:
                    out.append((False, rest))
                    return out
                self._parts.append(rest)
                self._size += len(rest)
                if self._size > self._limit:  # too long to inspect: pass it on as it comes
                    out.append((False, b"".join(self._parts)))
                    self._parts, self._size, self._passing = [], 0, True
                return out
            cut = base + end + sep
            piece = data[pos:cut]
            if self._passing:
                out.append((False, piece))
            else:
                event = b"".join((*self._parts, piece)) if self._parts else piece
                out.append((len(event) <= self._limit, event))
            self._parts, self._size, self._tail, self._passing = [], 0, b"", False
            pos = cut
        return out

    def rest(self) -> bytes:
        """What came after the last complete event (a stream that ended mid-event)."""
        rest = b"" if self._passing else b"".join(self._parts)
        self._parts, self._size, self._tail, self._passing = [], 0, b"", False
        return rest


def _event_end(buffer: bytes, start: int) -> tuple[int, int]:
    """(index, length) of the first blank-line terminator at or after ``start``; (-1, 0) if none."""
    end = buffer.find(b"\n\n", start)
    crlf = buffer.find(b"\r\n\r\n", start, len(buffer) if end < 0 else end + 4)
    if crlf >= 0 and (end < 0 or crlf < end):
        return crlf, 4
    return end, 2


async def read_window(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """Up to about ``limit`` bytes of ``resp``'s body, and whether that is the whole body."""
    if resp.content_length is not None and resp.content_length > limit:
        return b"", False
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        data = await resp.content.readany()
        if not data:
            return b"".join(parts), True
        parts.append(data)
        size += len(data)
    return b"".join(parts), False


async def relay_rest(
    request: web.Request,
    resp: aiohttp.ClientResponse,
    headers: CIMultiDict[str],
    head: bytes,
    drain: Callable[[], Awaitable[None]] | None = None,
) -> web.StreamResponse:
    """Relay a body too large to inspect: ``head`` (already read), then the rest as it arrives;
    ``drain`` waits for a client that is not keeping up (``request.writer.drain`` by default)."""
    drain = drain or request.writer.drain
    out = web.StreamResponse(status=resp.status, reason=resp.reason, headers=headers)
    if resp.content_length is not None:
        out.content_length = resp.content_length
    await out.prepare(request)
    send = bodypush.client_writer(request)
    if send(head):
        await drain()
    await bodypush.deliver(resp, send, drain)
    await out.write_eof()
    return out
