"""Bounds on the tap's client connections: how many may be open, how long a request head may
take to arrive, how long a connection may sit idle between requests.

aiohttp's server has no deadline for a request head, and its keep-alive timer does not tell
idle from trickled headers, so every connection's protocol is wrapped here (``factory``): the
wrapper watches bytes arrive and the app's middleware (``middleware``) marks when a request is
being handled. A deadline never runs while a request is handled or a response is still being
written, so long streams and slow downloads are never cut; the body of a request is bounded
by its handler (``httpbody.read_limited(timeout=...)``, counted here with ``count``).

At the connection cap the longest-idle connection (no request in flight) is closed to admit
the new one; when every connection is busy the new one gets ``503`` and is closed. The cap is
also kept below the process's open-file limit, so accepting never fails with EMFILE.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specguard import untrusted

log = logging.getLogger("specguard.clients")

PHASES = ("headers", "body", "idle", "response")
_TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_BUSY_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 29\r\n\r\ntoo many client connections\r\n"
)
FD_RESERVE = 24
"""File descriptors kept for the process itself (listening socket, event loop, files, scrapes)."""


@dataclass(frozen=True)
class ClientLimits:
    max_connections: int = 1024
    header_timeout: float = 30.0  # seconds from the first byte of a request head to its end
    body_timeout: float = 60.0  # seconds to receive a whole request body
    idle_timeout: float = 75.0  # seconds a connection may wait for its next request


def _open_files(limit: int | None) -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if limit is None else limit
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def accept_burst(open_files: int | None = None) -> int:
    """Connections accepted per turn of the event loop (asyncio's ``backlog``): their descriptors
    are taken before the cap can close anything, so they come out of the budget too."""
    return max(8, min(128, _open_files(open_files) // 8))


def fd_cap(open_files: int | None = None) -> int:
    """Client connections the open-file limit allows: two descriptors each (client and upstream)
    after the process's own and one accept burst."""
    soft = _open_files(open_files)
    return max(4, (soft - FD_RESERVE - accept_burst(soft)) // 2)


class ClientGuard:
    """The connection table of one server, its deadlines, and the counters ``/metrics`` shows."""

    def __init__(self, limits: ClientLimits = ClientLimits(), *, open_files: int | None = None):
        self.limits = limits
        self.max_connections = min(limits.max_connections, fd_cap(open_files))
        self.backlog = accept_burst(open_files)
        if self.max_connections < limits.max_connections:
            log.warning(
                "tap.max_client_connections %d lowered to %d by the open-file limit",
                limits.max_connections,
                self.max_connections,
            )
        self.open: dict[Any, _Connection] = {}  # transport -> connection
        self.timeouts = dict.fromkeys(PHASES, 0)
        self.rejected = {"evicted": 0, "refused": 0}

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server`` wrapping aiohttp's (``runner.server``)."""
        return lambda: _Connection(self, inner())

    def count(self, phase: str) -> None:
        self.timeouts[phase] += 1

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        conn = self.open.get(request.transport)
        if conn is None:
            return await handler(request)
        conn.begin()
        try:
            return await handler(request)
        finally:
            conn.end()

    def admit(self, new: _Connection) -> bool:
        """Room for ``new``: under the cap, or after closing the longest-idle connection."""
        if len(self.open) < self.max_connections:
            return True
        idle = [c for c in self.open.values() if c.busy == 0]
        if not idle:
            self.rejected["refused"] += 1
            return False
        # quiet ones first (no partial request), then the oldest
        victim = min(idle, key=lambda c: (c.head_since is not None, c.since))
        self.rejected["evicted"] += 1
        self.open.pop(victim.transport, None)  # its room is free now, not when the close completes
        victim.close()
        return True

    def collector(self) -> Collector:
        return _Collector(self)


class _Connection(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the deadlines of its current phase."""

    def __init__(self, guard: ClientGuard, inner: asyncio.Protocol):
        self.guard = guard
        self.inner = inner
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.admitted = False
        self.busy = 0  # requests in the app's handler
        self.since = self.loop.time()  # last change of phase
        self.head_since: float | None = None  # a request head started arriving (not yet handled)
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol, forwarded to aiohttp's handler ---------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.guard.admit(self):
            transport.write(_BUSY_503)  # type: ignore[attr-defined]
            transport.close()
            return
        self.admitted = True
        self.guard.open[transport] = self
        self.inner.connection_made(transport)
        self._arm(self.guard.limits.idle_timeout)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if self.busy == 0 and self.head_since is None:
            self.head_since = self.loop.time()
            self._arm(self.guard.limits.header_timeout)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self.admitted:
            self.guard.open.pop(self.transport, None)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()

    # -- phases ---------------------------------------------------------------------------------
    def begin(self) -> None:
        """The app started handling a request: no deadline runs until it is done."""
        self.busy += 1
        self.head_since = None
        self._cancel()

    def end(self) -> None:
        self.busy -= 1
        self.since = self.loop.time()
        if self.busy == 0:
            self._arm(self.guard.limits.idle_timeout)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _arm(self, seconds: float) -> None:
        self._cancel()
        self.timer = self.loop.call_later(seconds, self._expire)

    def _cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        transport = self.transport
        if self.busy or transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size():  # a response is still going out: not idle
            self._arm(self.guard.limits.idle_timeout)
            return
        phase = "headers" if self.head_since is not None else "idle"
        self.guard.count(phase)
        if phase == "headers":
            transport.write(_TIMEOUT_408)
        transport.close()


class _Collector(Collector):
    def __init__(self, guard: ClientGuard):
        self._guard = guard

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        connections, timeouts, rejected = self._families()
        connections.add_metric([], float(len(self._guard.open)))
        for phase, value in self._guard.timeouts.items():
            timeouts.add_metric([phase], float(value))
        for reason, value in self._guard.rejected.items():
            rejected.add_metric([reason], float(value))
        return iter((connections, timeouts, rejected))

    @staticmethod
    def _families() -> tuple[Metric, Metric, Metric]:
        return (
            GaugeMetricFamily("specguard_client_connections", "Open client connections to the tap."),
            CounterMetricFamily(
                "specguard_client_timeouts",
                "Client connections closed for being too slow: headers (a request head not received "
                "in tap.client_header_timeout_seconds), body (tap.client_body_timeout_seconds), idle "
                "(no request in tap.client_idle_timeout_seconds), response (a response the client did "
                "not take in tap.client_write_timeout_seconds).",
                labels=["phase"],
            ),
            CounterMetricFamily(
                "specguard_client_connections_rejected",
                "Connections closed at tap.max_client_connections: evicted (the longest-idle one, to "
                "admit a new one) or refused (every connection busy: 503).",
                labels=["reason"],
            ),
        )


class ServerLog(logging.LoggerAdapter):
    """aiohttp's server logger: a malformed request is one line at INFO, not an ERROR traceback
    (any client can send one); a failure inside a handler keeps its traceback."""

    def __init__(self, logger: logging.Logger):
        super().__init__(logger, {})

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):  # aiohttp logs these at ERROR or DEBUG, with a traceback
            kwargs.pop("exc_info")
            level = min(level, logging.INFO)
            msg, args = f"{msg}: %s", (*args, _one_line(exc))
        super().log(level, msg, *args, **kwargs)


def _one_line(exc: BaseException) -> str:
    return untrusted.printable(f"{type(exc).__name__}: {getattr(exc, 'message', exc)}", 300)
