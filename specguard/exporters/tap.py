"""The request tap: an OpenAI-compatible reverse proxy that classifies, routes and measures.

``/v1/completions`` and ``/v1/chat/completions`` are tapped; every other path is passed
through to the default pool. The client receives the engine's status, headers (minus
hop-by-hop), body and stream events byte for byte, except for what the tap itself asked
the engine for, which it removes again (see ``tapstream``). Each finished tapped request
becomes one ``RequestRecord`` in the ``WindowedStats``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from specguard.exporters import bodypush, httpbody, loadmeter, readwatch, tapflow, tapstream
from specguard.exporters.classify import Classifier
from specguard.exporters.config import ExporterConfig
from specguard.exporters.routing import Router
from specguard.exporters.stats import WindowedStats

log = logging.getLogger("specguard.tap")

TAPPED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)
# keys that make a stream chunk worth parsing (the tap's numbers or its own additions ride there)
_MARKERS = re.compile(rb'"(?:usage|metrics|sglext|timings|meta_info)"\s*:')
# a chunk carrying generated text: a non-empty text/content string, or tool calls
_CONTENT = re.compile(rb'"(?:text|content|reasoning_content)"\s*:\s*"(?!")|"tool_calls"\s*:\s*\[')
# a choice's terminal chunk (a non-null finish_reason); confirmed by a parse before it is held
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')
_CLIENT_GONE = (ConnectionResetError, aiohttp.ClientConnectionResetError)


@dataclass(frozen=True)
class _Seen:
    """One inspected stream event: the bytes to forward (None = drop) and what it was."""

    event: bytes | None
    finish: bool = False  # ends a choice of an n = 1 stream whose usage the tap added
    usage: bool = False  # the tap's own usage event (dropped)
    fingerprint: bytes | None = None  # raw JSON value of the usage event's system_fingerprint


class _Relay:
    """Holds the terminal event of a tapped n = 1 stream until the usage event follows it."""

    def __init__(self) -> None:
        self._held: bytes | None = None

    def feed(self, raw: bytes, seen: _Seen) -> list[bytes]:
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

    def release(self) -> bytes:
        """The held event, unchanged (the stream ended or broke without a usage event)."""
        held, self._held = self._held, None
        return held or b""


def _with_fingerprint(event: bytes, fingerprint: bytes) -> bytes:
    """``event`` with ``"system_fingerprint":<fingerprint>`` appended to its JSON data."""
    start = event.find(b"data:")
    payload = event[start + 5 :].strip()
    at = event.find(payload, start)
    patched = tapstream.append_key(payload, "system_fingerprint", fingerprint)
    return event[:at] + patched + event[at + len(payload) :]


class _EventSplitter:
    """Cuts a byte stream into complete SSE events (blank-line terminated, LF or CRLF)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer + data if self._buffer else data
        events: list[bytes] = []
        while True:
            end = buffer.find(b"\n\n")
            sep = 2
            crlf = buffer.find(b"\r\n\r\n")
            if crlf >= 0 and (end < 0 or crlf < end):
                end, sep = crlf, 4
            if end < 0:
                break
            events.append(buffer[: end + sep])
            buffer = buffer[end + sep :]
        self._buffer = buffer
        return events

    def rest(self) -> bytes:
        """What came after the last complete event (a stream that ended mid-event)."""
        rest, self._buffer = self._buffer, b""
        return rest


def openai_error(status: int, message: str, kind: str) -> web.Response:
    """An error in the OpenAI shape, so client SDKs surface it normally."""
    payload = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(payload, status=status)


def json_object(data: bytes) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object; None when it is not JSON or not an object."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def forward_headers(headers: Any, *, identity: bool) -> CIMultiDict[str]:
    """Headers minus hop-by-hop ones (the fixed set plus any named in ``Connection``)."""
    drop = HOP_BY_HOP
    connection = headers.get("Connection")
    if connection:
        drop = drop | {token.strip().lower() for token in connection.split(",")}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    if identity:
        out["Accept-Encoding"] = "identity"  # the tap must read what it measures
    return out


class Tap:
    """Framework-light core: ``handle(request)`` serves every path; I/O comes in by constructor."""

    def __init__(
        self,
        config: ExporterConfig,
        *,
        stats: WindowedStats,
        router: Router,
        classifier: Classifier | None = None,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.perf_counter,
    ):
        self.config = config
        self.stats = stats
        self.router = router
        self.classifier = classifier or Classifier(config.classes)
        self._session = session
        self._own_session = session is None
        self._clock = clock
        self._mono = monotonic
        self._pools = {p.name: p for p in config.pools}
        self.engines = {p.name: p.engine for p in config.pools}  # "auto" resolved by the scrape loop
        self.load = loadmeter.LoadMeter(p.name for p in config.pools)
        self.in_flight = self.load.in_flight
        tap = config.tap
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=tap.connect_timeout_seconds, sock_read=tap.upstream_timeout_seconds
        )

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding", "User-Agent", "Accept"),
            )

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def cleanup_ctx(self, app: web.Application):  # aiohttp cleanup context
        await self.start()
        yield
        await self.close()

    def set_engine(self, pool: str, engine: str) -> None:
        """Resolve a pool configured as ``engine: auto`` (the scrape loop detects it)."""
        if self._pools[pool].engine == "auto":
            self.engines[pool] = engine

    def _load_of(self, pool: str) -> float:
        """In-flight requests per replica of ``pool`` if one more request joined it."""
        return self.router.load(pool, self.in_flight[pool])

    def _load_bucket_of(self, pool: str) -> str:
        return self.classifier.load_bucket(self._load_of(pool))

    # -- request handling --------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            raw = await httpbody.read_limited(
                request.content, self.config.tap.max_body_bytes, request.content_length
            )
        except httpbody.BodyTooLarge:
            limit = self.config.tap.max_body_bytes
            return openai_error(413, f"request body exceeds {limit} bytes", "invalid_request_error")
        if request.method == "POST" and request.path in TAPPED_PATHS:
            return await self._tapped(request, raw)
        return await self._passthrough(request, raw)

    async def _passthrough(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        pool = self._pools[self.router.default_pool]
        if request.method == "POST":
            self.stats.count_unattributed(pool.name, "other_path")
        headers = forward_headers(request.headers, identity=False)
        out: web.StreamResponse | None = None
        try:
            async with self._session.request(  # type: ignore[union-attr]
                request.method,
                pool.url + request.rel_url.raw_path_qs,
                headers=headers,
                data=raw or None,
                timeout=self._timeout,
                allow_redirects=False,
            ) as resp:
                reply_headers = forward_headers(resp.headers, identity=False)
                if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                    data = await resp.read()
                    return web.Response(
                        body=data, status=resp.status, reason=resp.reason, headers=reply_headers
                    )
                out = web.StreamResponse(status=resp.status, reason=resp.reason, headers=reply_headers)
                await out.prepare(request)
                async for data in resp.content.iter_any():
                    await out.write(data)
                await out.write_eof()
                return out
        except TimeoutError:
            self.stats.count_error(pool.name, "timeout")
            if out is not None:
                return self._abort(request, out)
            return openai_error(504, f"pool {pool.name} did not answer in time", "upstream_timeout")
        except _CLIENT_GONE:
            raise
        except aiohttp.ClientError as exc:
            self.stats.count_error(pool.name, "connect" if out is None else "broken")
            if out is not None:
                return self._abort(request, out)
            return openai_error(502, f"pool {pool.name} failed: {type(exc).__name__}", "upstream_error")

    async def _tapped(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        body = json_object(raw)
        cls = self.classifier.classify(request.headers, request.path, body)
        choice = self.router.choose(
            cls.task_type, cls.temperature_bucket, self._load_bucket_of, self._load_of
        )
        pool = self._pools[choice.pool]
        load = self._load_of(pool.name)
        self.load.change(pool.name, 1, self._mono())
        flow = tapflow.Flow(
            pool=pool,
            cls=cls,
            route=choice.route,
            load_bucket=self.classifier.load_bucket(load),
            load=load,
            replicas=self.router.replicas().get(pool.name, 1),
            started_at=self._clock(),
            t0=self._mono(),
            body=body,
        )
        payload = raw
        if body is not None:
            new, flow.additions = tapstream.prepare(
                self.engines[pool.name], body, force_include_usage=pool.force_include_usage
            )
            if new is not None:
                payload = json.dumps(new).encode()
        headers = forward_headers(request.headers, identity=True)
        try:
            return await self._forward(request, flow, payload, headers)
        except asyncio.CancelledError:
            flow.failure = flow.failure or "client_disconnected"
            raise
        finally:
            self.load.change(pool.name, -1, self._mono())
            self.stats.add(tapflow.to_record(flow, self.engines[pool.name], self._mono()))

    async def _forward(
        self, request: web.Request, flow: tapflow.Flow, payload: bytes, headers: CIMultiDict[str]
    ) -> web.StreamResponse:
        pool = flow.pool
        out: web.StreamResponse | None = None
        try:
            async with self._session.request(  # type: ignore[union-attr]
                "POST",
                pool.url + request.rel_url.raw_path_qs,
                headers=headers,
                data=payload,
                timeout=self._timeout,
                allow_redirects=False,
            ) as resp:
                flow.status = resp.status
                if resp.status >= 500:
                    self.stats.count_error(pool.name, "status_5xx")
                reply_headers = forward_headers(resp.headers, identity=False)
                ctype = resp.headers.get("Content-Type", "")
                if ctype.startswith("text/event-stream"):
                    flow.streamed = True
                    out = web.StreamResponse(status=resp.status, reason=resp.reason, headers=reply_headers)
                    await out.prepare(request)
                    await self._relay_stream(request, resp, flow)
                    await out.write_eof()
                    return out
                data = await resp.read()
                data = self._inspect_body(data, flow)
                return web.Response(body=data, status=resp.status, reason=resp.reason, headers=reply_headers)
        except TimeoutError:
            self.stats.count_error(pool.name, "timeout")
            flow.failure = "upstream_error"
            if out is not None:
                return self._abort(request, out)
            flow.status = 504
            return openai_error(504, f"pool {pool.name} did not answer in time", "upstream_timeout")
        except _CLIENT_GONE:
            flow.failure = "client_disconnected"
            if out is not None:
                return out
            raise
        except aiohttp.ClientError as exc:
            kind = "connect" if isinstance(exc, aiohttp.ClientConnectorError) else "broken"
            self.stats.count_error(pool.name, kind)
            flow.failure = "upstream_error"
            if out is not None:
                return self._abort(request, out)
            flow.status = 502
            return openai_error(502, f"pool {pool.name} failed: {type(exc).__name__}", "upstream_error")

    @staticmethod
    def _abort(request: web.Request, out: web.StreamResponse) -> web.StreamResponse:
        """Headers already went out: close the connection so the client sees a broken stream."""
        if request.transport is not None:
            request.transport.close()
        return out

    def _inspect_body(self, data: bytes, flow: tapflow.Flow) -> bytes:
        """Read spec stats from a whole JSON response; strip what the tap added."""
        flow.last_at = self._mono()
        obj = json_object(data)
        if obj is None:
            return data
        self._absorb(obj, flow)
        if flow.additions.spec_details and "sglext" in obj:
            data = tapstream.remove_key(data, "sglext")
        return data

    def _absorb(self, obj: dict[str, Any], flow: tapflow.Flow) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            flow.usage_tokens = usage["completion_tokens"]
        spec = tapstream.spec_from(self.engines[flow.pool.name], obj, flow.pool.num_speculative_tokens)
        if spec is not None:
            flow.spec = spec

    async def _relay_stream(
        self, request: web.Request, resp: aiohttp.ClientResponse, flow: tapflow.Flow
    ) -> None:
        """Forward SSE events as they complete; drop or trim only the tap's own additions.

        Each upstream read is inspected and written to the client within the read callback
        (``bodypush``). When the tap added usage to an n = 1 stream, the event that finishes the
        choice is held until the usage event (which follows at once) so the ``system_fingerprint``
        vLLM moved there goes back onto it; at most that one event is ever held.
        """
        events = _EventSplitter()
        relay = _Relay()
        send = bodypush.client_writer(request)
        watch = readwatch.ReadWatch.take_over(resp, self._timeout.sock_read)

        def on_data(data: bytes) -> bool:
            if watch is not None:
                watch.read()
            out: list[bytes] = []
            for event in events.feed(data):
                out += relay.feed(event, self._inspect_event(event, flow))
            return send(b"".join(out)) if out else False

        try:
            await bodypush.deliver(resp, on_data, request.writer.drain)
        except (TimeoutError, aiohttp.ClientError):
            held = relay.release()
            if held:
                try:
                    send(held)
                except _CLIENT_GONE:
                    pass
            raise
        finally:
            if watch is not None:
                watch.close()
        rest = events.rest()
        tail = relay.feed(rest, self._inspect_event(rest, flow)) if rest else []
        tail.append(relay.release())
        send(b"".join(tail))

    def _inspect_event(self, event: bytes, flow: tapflow.Flow) -> _Seen:
        start = event.find(b"data:")
        if start < 0:
            return _Seen(event)
        payload = event[start + 5 :].strip()
        if not payload.startswith(b"{"):
            return _Seen(event)
        now = self._mono()
        hold = flow.additions.hold_finish
        marked = _MARKERS.search(payload) is not None
        if not marked:
            # fast path: an ordinary token chunk (no usage, metrics or extensions): no JSON parse
            if _CONTENT.search(payload) is not None:
                self._saw_content(flow, now, self.load.area(flow.pool.name, now))
            if not (hold and _FINISH.search(payload)):
                return _Seen(event)
        obj = json_object(payload)
        if obj is None:
            return _Seen(event)
        if marked and tapstream.has_content(obj):  # (unmarked chunks were counted above)
            self._saw_content(flow, now, self.load.area(flow.pool.name, now))
        self._absorb(obj, flow)
        if flow.additions.usage and tapstream.is_usage_only(obj):
            fingerprint = tapstream.raw_value(payload, "system_fingerprint") if hold else None
            return _Seen(None, usage=True, fingerprint=fingerprint)
        if flow.additions.spec_details and "sglext" in obj:
            trimmed = tapstream.remove_key(payload, "sglext")
            at = event.find(payload, start)
            event = event[:at] + trimmed + event[at + len(payload) :]
        return _Seen(event, finish=hold and tapstream.has_finish(obj))

    @staticmethod
    def _saw_content(flow: tapflow.Flow, now: float, area: float) -> None:
        flow.chunks += 1
        if flow.first_at is None:
            flow.first_at, flow.first_area = now, area
        flow.last_at, flow.last_area = now, area

    def routes(self) -> list[web.RouteDef]:
        """Catch-all route; mount after the app's own endpoints (/metrics, /healthz)."""
        return [web.route("*", "/{tail:.*}", self.handle)]
