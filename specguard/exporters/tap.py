"""The request tap: an OpenAI-compatible reverse proxy that classifies, routes and measures.

``/v1/completions`` and ``/v1/chat/completions`` are tapped; the other paths on the allowlist
(``exporters.tapgate``: ``GET /v1/models`` and what ``tap.forward_paths`` adds) are passed
through to the default pool; anything else is refused by the tap itself (404 or 405). The
client's ``Authorization`` never reaches a pool; a pool with an API key gets its own.

The client receives the engine's status, headers (minus
hop-by-hop), body and stream events byte for byte, except for what the tap itself asked
the engine for, which it removes again (see ``tapstream``). Each finished tapped request
becomes one ``RequestRecord`` in the ``WindowedStats``.

A connect that fails, or a 503 answer (the engine listens but does not serve: loading,
draining), marks the pool down (``exporters.health``) and, with ``tap.failover``, the request
is sent again to the best serving pool: only then, since the engine did nothing with it and
nothing has reached the client yet. Any other answer from a pool marks it up again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from specguard import untrusted
from specguard.errors import InputError
from specguard.exporters import (
    bodyparse,
    bodypush,
    clientguard,
    httpbody,
    loadmeter,
    readwatch,
    tapflow,
    tapgate,
    taprelay,
    tapstream,
)
from specguard.exporters.classify import Classifier
from specguard.exporters.config import ExporterConfig, PoolConfig
from specguard.exporters.health import PoolHealth
from specguard.exporters.routing import ROUTE_FAILOVER, RouteChoice, Router
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
        # the client's credential for the tap, never the engine's (a pool's own key is set per pool)
        "Authorization",
    )
)
# keys that make a stream chunk worth parsing (the tap's numbers or its own additions ride there)
_MARKERS = re.compile(rb'"(?:usage|metrics|sglext|timings|meta_info)"\s*:')
# a chunk carrying generated text: a non-empty text/content string, or tool calls
_CONTENT = re.compile(rb'"(?:text|content|reasoning_content)"\s*:\s*"(?!")|"tool_calls"\s*:\s*\[')
# a choice's terminal chunk (a non-null finish_reason); confirmed by a parse before it is held
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')


class ClientStalled(ConnectionResetError):
    """The client stopped taking a response's bytes for ``tap.client_write_timeout_seconds``."""


_CLIENT_GONE = (ConnectionResetError, aiohttp.ClientConnectionResetError)
# a connect that failed: nothing reached the pool (aiohttp's connect timeout is also a TimeoutError)
_CONNECT_FAILED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
UPSTREAM_KEEPALIVE_SECONDS = 4.0
"""How long an idle connection to a pool is kept for reuse: below the engines' own keep-alive
(uvicorn's 5 s default for vLLM and SGLang, llama.cpp's 5 s), so the tap never sends a request on a
connection the engine is closing at that moment (a 502 ``ClientOSError`` on real vLLM, seen in CI)."""
# a pooled connection the engine closed as the request went out (the keep-alive race, which the margin
# above narrows but cannot close on a loaded machine: a 502 ``ServerDisconnectedError`` in CI)
_DROPPED = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectionResetError)


def _upstream_session(connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
    """Bytes as the pool sent them (the tap reads what it measures) and no headers of its own."""
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent", "Accept"),
    )


def openai_error(status: int, message: str, kind: str) -> web.Response:
    """An error in the OpenAI shape, so client SDKs surface it normally."""
    payload = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(payload, status=status)


def json_object(data: bytes) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object; None when it is not JSON (or not acceptable: nested too
    deep, an integer too long to convert) or not an object."""
    try:
        obj = untrusted.loads(data)
    except InputError:
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
        health: PoolHealth | None = None,
    ):
        self.config = config
        self.stats = stats
        self.router = router
        self.classifier = classifier or Classifier(config.classes)
        self._session = session
        self._own_session = session is None
        self._fresh: aiohttp.ClientSession | None = None  # a new connection per request: the resend
        self._clock = clock
        self._mono = monotonic
        self._pools = {p.name: p for p in config.pools}
        self.engines = {p.name: p.engine for p in config.pools}  # "auto" resolved by the scrape loop
        self.load = loadmeter.LoadMeter(p.name for p in config.pools)
        self.in_flight = self.load.in_flight
        self.clients: clientguard.ClientGuard | None = None  # counts body timeouts (set by the app)
        self.health = health
        self.failover = config.tap.failover and health is not None
        self.gate = tapgate.Gate(config.tap.forward_paths)
        self.bodies = bodyparse.BodyParser(config.tap.max_json_containers)
        self.keys = {
            p.name: tapgate.read_key(p.api_key_file, f"pools[{i}].api_key_file")
            for i, p in enumerate(config.pools)
            if p.api_key_file
        }
        tap = config.tap
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=tap.connect_timeout_seconds, sock_read=tap.upstream_timeout_seconds
        )

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self._session is None:
            self._session = _upstream_session(
                aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=UPSTREAM_KEEPALIVE_SECONDS)
            )
        if self._fresh is None:
            self._fresh = _upstream_session(
                aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True)
            )

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None
        if self._fresh is not None:
            await self._fresh.close()
            self._fresh = None

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
        tap = self.config.tap
        verdict = self.gate.check(request.method, request.rel_url.raw_path, request.path)
        if not verdict.allowed:  # answered before the body is read: nothing of it reaches a pool
            return self._refuse(request, verdict)
        try:
            raw = await httpbody.read_limited(
                request.content,
                tap.max_body_bytes,
                request.content_length,
                timeout=tap.client_body_timeout_seconds,
            )
        except httpbody.BodyTooLarge:
            limit = tap.max_body_bytes
            return openai_error(413, f"request body exceeds {limit} bytes", "invalid_request_error")
        except httpbody.BodyTimeout as exc:
            return self.body_timeout(request, exc)
        if request.method == "POST" and request.rel_url.raw_path in TAPPED_PATHS:
            return await self._tapped(request, raw)
        return await self._passthrough(request, raw)

    @staticmethod
    def _refuse(request: web.Request, verdict: tapgate.Verdict) -> web.Response:
        shown = untrusted.printable(request.rel_url.raw_path, 200)
        if verdict.status == 405:
            allow = ", ".join(verdict.allow)
            response = openai_error(
                405,
                f"{request.method} is not forwarded for {shown} (allowed: {allow})",
                "invalid_request_error",
            )
            response.headers["Allow"] = allow
            return response
        message = f"{shown} is not forwarded by this proxy (it forwards the inference API only)"
        return openai_error(404, message, "not_found_error")

    def _connect_failed(self, pool: PoolConfig, exc: Exception) -> None:
        """Passive health: a connect to ``pool`` failed."""
        self.stats.count_error(pool.name, "connect")
        if self.health is not None:
            reason = str(exc) or type(exc).__name__
            self.health.mark_down(pool.name, f"connect failed: {reason}", "tap")

    def _answered(self, pool: PoolConfig, status: int) -> None:
        """An answer means the pool serves, a 5xx one counting towards its ejection; but a 503 says
        it listens without serving (loading, draining): down, like a failed connect."""
        if self.health is None:
            return
        if status == 503:
            self.health.mark_down(pool.name, "answered 503 Service Unavailable (not serving)", "tap")
            return
        self.health.mark_up(pool.name, "tap")
        self.health.answered(pool.name, status >= 500)

    def _reset(self, pool: PoolConfig) -> None:
        """The pool took the request and broke the connection: a failure towards its ejection."""
        if self.health is not None:
            self.health.answered(pool.name, True)

    async def _passthrough(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        """Any other path goes to the default pool, or the best serving one while it is down."""
        name = self.router.default_pool
        if self.failover and not self.router.serving(name):
            name = self.router.fallback("", "", "", name) or name
        if request.method == "POST":
            self.stats.count_unattributed(name, "other_path")
        tried: list[str] = []
        while True:
            pool = self._pools[name]
            response = await self._pass(request, raw, pool)
            if response is not None:
                return response
            tried.append(pool.name)
            later = self.router.fallback("", "", "", pool.name, tried) if self.failover else None
            if later is None:
                return openai_error(502, f"pool {pool.name} failed: no pool answers", "upstream_error")
            name = later

    async def _pass(self, request: web.Request, raw: bytes, pool: PoolConfig) -> web.StreamResponse | None:
        """One forward of a passed-through request; None when the connect failed (with failover)."""
        headers = forward_headers(request.headers, identity=False)
        out: web.StreamResponse | None = None
        try:
            url = pool.url + request.rel_url.raw_path_qs
            async with await self._send(pool, request.method, url, headers, raw or None) as resp:
                self._answered(pool, resp.status)
                reply_headers = forward_headers(resp.headers, identity=False)
                if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                    data, whole = await taprelay.read_window(resp, self.config.tap.max_inspect_bytes)
                    if whole:
                        return web.Response(
                            body=data, status=resp.status, reason=resp.reason, headers=reply_headers
                        )
                    out = await taprelay.relay_rest(request, resp, reply_headers, data, self._drain(request))
                    return out
                out = web.StreamResponse(status=resp.status, reason=resp.reason, headers=reply_headers)
                await out.prepare(request)
                # as it arrives; a client that stops reading gets tap.client_write_timeout_seconds
                await bodypush.deliver(resp, bodypush.client_writer(request), self._drain(request))
                await out.write_eof()
                return out
        except _CONNECT_FAILED as exc:
            self._connect_failed(pool, exc)
            if self.failover:
                return None
            return openai_error(502, f"pool {pool.name} failed: {type(exc).__name__}", "upstream_error")
        except TimeoutError:
            self.stats.count_error(pool.name, "timeout")
            if out is not None:
                return self._abort(request, out)
            return openai_error(504, f"pool {pool.name} did not answer in time", "upstream_timeout")
        except _CLIENT_GONE:
            raise
        except aiohttp.ClientError as exc:
            self.stats.count_error(pool.name, "connect" if out is None else "broken")
            self._reset(pool)
            if out is not None:
                return self._abort(request, out)
            if self.failover:
                return None
            return openai_error(502, f"pool {pool.name} failed: {type(exc).__name__}", "upstream_error")

    async def _send(
        self, pool: PoolConfig, method: str, url: str, headers: CIMultiDict[str], data: bytes | None
    ) -> aiohttp.ClientResponse:
        """The pool's response, its headers read. A pooled connection the pool dropped before any
        answer (the keep-alive race) costs the client nothing: the request goes once more, on a new
        connection (as Go's transport and nginx do with a cached connection). A second drop is the
        pool's failure (``ServerDisconnectedError``)."""
        key = self.keys.get(pool.name)
        if key:
            headers = CIMultiDict(headers)
            headers["Authorization"] = f"Bearer {key}"
        sent = dict(headers=headers, data=data, timeout=self._timeout, allow_redirects=False)
        try:
            return await self._session.request(method, url, **sent)  # type: ignore[union-attr,arg-type]
        except _CONNECT_FAILED:
            raise
        except _DROPPED as exc:
            self.stats.count_resend(pool.name, "dropped")
            log.info("pool %s dropped a pooled connection (%s); sending again on a new one", pool.name, exc)
        try:
            return await self._fresh.request(method, url, **sent)  # type: ignore[union-attr,arg-type]
        except _CONNECT_FAILED:
            raise
        except _DROPPED as exc:
            raise aiohttp.ServerDisconnectedError(f"dropped on a new connection too: {exc}") from exc

    async def _tapped(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        parsed = await self.bodies.parse(raw)  # bounded work per body (exporters.bodyparse)
        if parsed.refused is not None:  # no engine needs this; the tap forwards none of it
            return openai_error(parsed.status, parsed.refused, "invalid_request_error")
        body = parsed.body
        cls = self.classifier.classify(request.headers, request.path, body)
        choice = self.router.choose(
            cls.task_type, cls.temperature_bucket, self._load_bucket_of, self._load_of
        )
        headers = forward_headers(request.headers, identity=True)
        started_at, t0 = self._clock(), self._mono()
        tried: list[str] = []
        while True:
            flow = self._attempt(choice, cls, body, started_at, t0)
            flow.containers = parsed.containers
            response = await self._finish(request, flow, raw, headers)
            if flow.resend and self.failover:
                tried.append(flow.pool.name)
                retry = self.router.retry(
                    cls.task_type, cls.temperature_bucket, self._load_bucket_of, choice, tried
                )
                if retry is not None:  # nothing reached the pool nor the client: send it again
                    self.load.change(flow.pool.name, -1, self._mono())
                    choice = retry
                    continue
            self.load.change(flow.pool.name, -1, self._mono())
            self.stats.add(tapflow.to_record(flow, self.engines[flow.pool.name], self._mono()))
            if choice.route == ROUTE_FAILOVER and self.health is not None:
                self.health.count_failover(choice.planned, choice.pool)
            return response

    def _attempt(
        self, choice: RouteChoice, cls: Any, body: dict[str, Any] | None, started_at: float, t0: float
    ) -> tapflow.Flow:
        """A request's forward to the pool ``choice`` names, counted in flight until recorded."""
        pool = self._pools[choice.pool]
        load = self._load_of(pool.name)
        self.load.change(pool.name, 1, self._mono())
        return tapflow.Flow(
            pool=pool,
            cls=cls,
            route=choice.route,
            load_bucket=self.classifier.load_bucket(load),
            load=load,
            replicas=self.router.replicas().get(pool.name, 1),
            started_at=started_at,
            t0=t0,
            body=body,
        )

    async def _finish(
        self, request: web.Request, flow: tapflow.Flow, raw: bytes, headers: CIMultiDict[str]
    ) -> web.StreamResponse:
        """Forward ``flow``'s request; a cancelled one (its client went away) is recorded here."""
        pool = flow.pool
        payload = raw
        if flow.body is not None:
            new, flow.additions = tapstream.prepare(
                self.engines[pool.name], flow.body, force_include_usage=pool.force_include_usage
            )
            if new is not None:
                if flow.containers > bodyparse.LOOP_CONTAINERS:  # as costly as its parse: off the loop too
                    payload = (await asyncio.to_thread(json.dumps, new)).encode()
                else:
                    payload = json.dumps(new).encode()
        try:
            return await self._forward(request, flow, payload, headers)
        except BaseException as exc:
            # after [DONE] the client has the whole answer: leaving then is no failure
            if isinstance(exc, asyncio.CancelledError) and not flow.done:
                flow.failure = flow.failure or "client_disconnected"
            self.load.change(pool.name, -1, self._mono())
            self.stats.add(tapflow.to_record(flow, self.engines[pool.name], self._mono()))
            raise

    async def _forward(
        self, request: web.Request, flow: tapflow.Flow, payload: bytes, headers: CIMultiDict[str]
    ) -> web.StreamResponse:
        pool = flow.pool
        out: web.StreamResponse | None = None
        try:
            url = pool.url + request.rel_url.raw_path_qs
            async with await self._send(pool, "POST", url, headers, payload) as resp:
                self._answered(pool, resp.status)
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
                data, whole = await taprelay.read_window(resp, self.config.tap.max_inspect_bytes)
                if whole and resp.status == 503:
                    # it did nothing: another pool may serve it (nginx's proxy_next_upstream
                    # http_503); with none, the client gets this answer as it came
                    flow.resend = True
                    return web.Response(body=data, status=503, reason=resp.reason, headers=reply_headers)
                if whole:
                    data = self._inspect_body(data, flow)
                    return web.Response(
                        body=data, status=resp.status, reason=resp.reason, headers=reply_headers
                    )
                flow.failure = "response_too_large"  # relayed, not inspected: no per-request numbers
                out = await taprelay.relay_rest(request, resp, reply_headers, data, self._drain(request))
                return out
        except _CONNECT_FAILED as exc:
            self._connect_failed(pool, exc)
            flow.connect_failed = flow.resend = True
            flow.failure = "upstream_error"
            flow.status = 502
            return openai_error(502, f"pool {pool.name} failed: {type(exc).__name__}", "upstream_error")
        except TimeoutError:
            self.stats.count_error(pool.name, "timeout")
            flow.failure = "upstream_error"
            if out is not None:
                return self._abort(request, out)
            flow.status = 504
            return openai_error(504, f"pool {pool.name} did not answer in time", "upstream_timeout")
        except _CLIENT_GONE:
            if not flow.done:
                flow.failure = "client_disconnected"
            if out is not None:
                return out
            raise
        except aiohttp.ClientError as exc:
            self.stats.count_error(pool.name, "broken")
            self._reset(pool)
            flow.failure = "upstream_error"
            if out is not None:
                return self._abort(request, out)
            flow.resend = flow.status == 0  # no answer at all (a reset): another pool may serve it
            flow.status = 502
            return openai_error(502, f"pool {pool.name} failed: {type(exc).__name__}", "upstream_error")

    def body_timeout(self, request: web.Request, exc: httpbody.BodyTimeout) -> web.StreamResponse:
        """408 for a body that did not arrive in time; the connection is closed after it."""
        if self.clients is not None:
            self.clients.count("body")
        response = openai_error(408, f"request {exc}", "invalid_request_error")
        response.force_close()
        return response

    def _drain(
        self, request: web.Request, watch: readwatch.ReadWatch | None = None
    ) -> Callable[[], Awaitable[None]]:
        """The wait for a client whose send buffer is full. The engine's read timeout does not run
        meanwhile (the tap is not reading it); the client gets ``tap.client_write_timeout_seconds``
        to take bytes again, then its connection is closed and counted as the client's."""
        limit = self.config.tap.client_write_timeout_seconds

        async def drain() -> None:
            if watch is not None:
                watch.pause()
            try:
                async with asyncio.timeout(limit):
                    await request.writer.drain()
            except TimeoutError:
                if self.clients is not None:
                    self.clients.count("response")
                if request.transport is not None:
                    request.transport.abort()
                raise ClientStalled(f"the client took no response bytes in {limit:g} s") from None
            finally:
                if watch is not None:
                    watch.resume()

        return drain

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
        prompt = tapstream.prompt_tokens(obj)
        if prompt is not None:
            flow.prompt_tokens = prompt
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
        events = taprelay.EventSplitter(self.config.tap.max_inspect_bytes)
        relay = taprelay.Relay()
        send = bodypush.client_writer(request)
        watch = readwatch.ReadWatch.take_over(resp, self._timeout.sock_read)

        def on_data(data: bytes) -> bool:
            if watch is not None:
                watch.read()
            out: list[bytes] = []
            done = False
            for inspect, event in events.feed(data):
                if inspect:
                    seen = self._inspect_event(event, flow)
                    done = done or seen.done
                    out += relay.feed(event, seen)
                else:  # an event past the inspection window: relayed as it comes, never parsed
                    done = done or taprelay.is_done(event)
                    out += relay.raw(event)
            full = send(b"".join(out)) if out else False
            flow.done = flow.done or done  # (only once the client has it: send raises otherwise)
            return full

        try:
            await bodypush.deliver(resp, on_data, self._drain(request, watch))
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

    def _inspect_event(self, event: bytes, flow: tapflow.Flow) -> taprelay.Seen:
        start = event.find(b"data:")
        if start < 0:
            return taprelay.Seen(event)
        payload = event[start + 5 :].strip()
        if not payload.startswith(b"{"):
            return taprelay.Seen(event, done=payload == b"[DONE]")
        now = self._mono()
        hold = flow.additions.hold_finish
        marked = _MARKERS.search(payload) is not None
        if not marked:
            # fast path: an ordinary token chunk (no usage, metrics or extensions): no JSON parse
            if _CONTENT.search(payload) is not None:
                self._saw_content(flow, now, self.load.area(flow.pool.name, now))
            if not (hold and _FINISH.search(payload)):
                return taprelay.Seen(event)
        obj = json_object(payload)
        if obj is None:
            return taprelay.Seen(event)
        if marked and tapstream.has_content(obj):  # (unmarked chunks were counted above)
            self._saw_content(flow, now, self.load.area(flow.pool.name, now))
        self._absorb(obj, flow)
        if flow.additions.usage and tapstream.is_usage_only(obj):
            fingerprint = tapstream.raw_value(payload, "system_fingerprint") if hold else None
            return taprelay.Seen(None, usage=True, fingerprint=fingerprint)
        if flow.additions.spec_details and "sglext" in obj:
            trimmed = tapstream.remove_key(payload, "sglext")
            at = event.find(payload, start)
            event = event[:at] + trimmed + event[at + len(payload) :]
        return taprelay.Seen(event, finish=hold and tapstream.has_finish(obj))

    @staticmethod
    def _saw_content(flow: tapflow.Flow, now: float, area: float) -> None:
        flow.chunks += 1
        if flow.first_at is None:
            flow.first_at, flow.first_area = now, area
        flow.last_at, flow.last_area = now, area

    def routes(self) -> list[web.RouteDef]:
        """Catch-all route; mount after the app's own endpoints (/metrics, /healthz)."""
        return [web.route("*", "/{tail:.*}", self.handle)]
