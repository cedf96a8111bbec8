"""A request body parsed within bounds: what one body may cost the tap in memory and loop time.

``json.loads`` costs about 80 bytes and half a microsecond per array or object, whatever their
size: a 3.9 MB body of 1.3 million ``{}`` takes some 100 MB and 0.8 s of the loop that serves
every other request. So the containers are counted first (strings cut out by one regular
expression, then a byte count: linear and in C, ~25 ms for the largest body), and:

- up to ``LOOP_CONTAINERS``, the body is parsed on the loop (a few milliseconds at most);
- a larger one is counted and, up to ``max_containers`` (``tap.max_json_containers``), parsed in
  a worker thread, one body at a time, so the loop keeps serving and at most one large parse is
  in memory;
- beyond that it is refused (413 with the count and the limit): no inference request needs it,
  and the engine behind would pay the same price again.

The classifier needs a handful of top-level fields; nothing here rewrites a body it did not
fully parse.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from specguard import untrusted
from specguard.errors import InputError

LOOP_CONTAINERS = 4096
"""Bodies with at most this many arrays and objects are parsed on the loop (~2 ms)."""
MAX_CONTAINERS = 100_000
"""Default of ``tap.max_json_containers``: ~60 ms and ~8 MB of parsing in the worker thread."""

_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')
_OPEN = b"[{"
_NOT_OPEN = bytes(b for b in range(256) if b not in _OPEN)


@dataclass(frozen=True)
class Parsed:
    """A body's JSON object (None when it is not one), or why it is refused (``refused``)."""

    body: dict[str, Any] | None
    containers: int = 0
    refused: str | None = None
    status: int = 0  # of the refusal: 413 too many containers, 400 nested too deep


def containers(raw: bytes) -> int:
    """Arrays and objects in ``raw`` (JSON text), brackets inside strings not counted."""
    opening = raw.count(b"[") + raw.count(b"{")
    if opening <= LOOP_CONTAINERS:
        return opening  # an upper bound, and small: no need to look closer
    first, last = raw.find(b'"'), raw.rfind(b'"')
    if first < 0:
        return opening  # no strings at all
    # strings lie between the first and the last quote: only that part needs them cut out
    outside = raw.count(b"[", 0, first) + raw.count(b"{", 0, first)
    outside += raw.count(b"[", last + 1) + raw.count(b"{", last + 1)
    inside = _JSON_STRING.sub(b"", raw[first : last + 1]).translate(None, _NOT_OPEN)
    return outside + len(inside)


def _object(raw: bytes) -> tuple[dict[str, Any] | None, bool]:
    """(the JSON object or None, nested too deep?): the depth first, so no parser's stack is at risk."""
    if untrusted.json_depth_exceeds(raw):
        return None, True
    try:
        obj = untrusted.loads(raw)
    except InputError:
        return None, False
    return (obj if isinstance(obj, dict) else None), False


class BodyParser:
    """Parses request bodies within ``max_containers``; one large body at a time, off the loop."""

    def __init__(self, max_containers: int = MAX_CONTAINERS):
        self.max_containers = max_containers
        self._large = asyncio.Semaphore(1)
        self.offloaded = 0  # bodies examined in the worker thread
        self.refused = 0

    async def parse(self, raw: bytes) -> Parsed:
        if raw.count(b"[") + raw.count(b"{") <= LOOP_CONTAINERS:  # small: on the loop, ~2 ms at most
            return self._examine(raw)
        async with self._large:  # even counting a 4 MB body takes ~25 ms: twelve in a row would stall
            self.offloaded += 1
            return await asyncio.to_thread(self._examine, raw)

    def _examine(self, raw: bytes) -> Parsed:
        count = containers(raw)
        if count > self.max_containers:
            self.refused += 1
            message = (
                f"request body holds {count} JSON arrays and objects, more than the "
                f"{self.max_containers} this proxy parses (tap.max_json_containers)"
            )
            return Parsed(None, count, message, 413)
        body, deep = _object(raw)
        if deep:
            message = f"request body nested deeper than {untrusted.MAX_JSON_DEPTH} levels"
            return Parsed(None, count, message, 400)
        return Parsed(body, count)
