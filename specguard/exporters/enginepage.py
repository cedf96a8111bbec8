"""Each engine's own ``/metrics`` page, read-only, at ``/engines/<pool>/metrics`` on the tap.

Tools that read an engine's page through the base URL they send requests to (``vllm bench serve``
reads ``<base-url>/metrics`` before and after a run for its speculative-decoding section) get
specguard's page at the tap's ``/metrics``, without the engine's ``vllm:spec_decode_*``. So the tap
serves, under ``/engines/<pool>/``:

- ``GET /engines/<pool>/metrics``: the pool's own page, fetched from the pool's configured page
  (``pools[].url`` + ``metrics_path``) when asked, with the scrape's limits (``scrape.max_*``,
  ``scrape.timeout_seconds``) and the pool's API key when it has one, as the scrape loop reads it;
  the engine's bytes, unchanged. Concurrent readers of one pool share one fetch, so no number of
  clients makes the tap ask an engine more than once at a time;
- the inference API the tap forwards anyway (``/v1/chat/completions``, ``/v1/completions``,
  ``/v1/models`` and ``tap.forward_paths``), under that prefix too, handled exactly as without it:
  classified, routed by the plan (not pinned to the pool), measured. So a tool given
  ``--base-url http://tap/engines/spec-k4`` sends its traffic through the tap as any client does
  and reads the K=4 engine's counters.

Nothing else is reachable under the prefix: a pool that is not configured, any other path and any
method but GET or HEAD on the page answer 404 or 405 from the tap itself, like every path the tap
does not forward. The page is only read, never written, and carries what the engine exports to
anyone who can reach its own port (counters, model name, engine configuration); ``tap.engine_pages:
false`` turns the whole prefix off where that is more than the tap's clients should see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiohttp import web

from specguard import untrusted
from specguard.errors import SpecguardError
from specguard.exporters import promtext, scrape, tapgate
from specguard.exporters.config import PoolConfig

PREFIX = "/engines/"
PAGE = "metrics"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, kind: str) -> web.Response:
    payload = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(payload, status=status)


class EnginePages:
    """The ``/engines/<pool>/`` prefix: each pool's own page, and the tap's API beneath it."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        *,
        keys: Mapping[str, str],
        tap: Handler,
        timeout: float = 5.0,
        limits: promtext.Limits = promtext.LIMITS,
    ):
        self._pools = {p.name: p for p in pools}
        self._keys = dict(keys)
        self._tap = tap
        self._timeout = timeout
        self._limits = limits
        self._fetching: dict[str, asyncio.Future[bytes]] = {}
        self.fetches = 0  # upstream page fetches made (one per pool at a time, however many readers)

    def routes(self) -> list[web.RouteDef]:
        """Mount before the tap's catch-all."""
        return [web.route("*", PREFIX + "{pool}/{tail:.*}", self.handle)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        pool = request.match_info["pool"]
        tail = request.match_info["tail"]
        shown = untrusted.printable(request.rel_url.raw_path, 200)
        if pool not in self._pools or f"{PREFIX}{pool}/" not in request.rel_url.raw_path:
            return _error(
                404, f"{shown}: no such pool (configured: {', '.join(self._pools)})", "not_found_error"
            )
        if tail == PAGE:
            if request.method not in ("GET", "HEAD"):
                response = _error(
                    405, f"{request.method} is not allowed on {shown} (read-only)", "invalid_request_error"
                )
                response.headers["Allow"] = "GET, HEAD"
                return response
            return await self._page(pool)
        # the tap's own API under the prefix: the same request without it
        raw = request.rel_url.raw_path_qs
        rest = raw[raw.index(f"{PREFIX}{pool}/") + len(PREFIX) + len(pool) :]
        return await self._tap(request.clone(rel_url=rest))

    async def _page(self, pool: str) -> web.Response:
        try:
            body = await asyncio.shield(self._shared_fetch(pool))
        except (SpecguardError, OSError) as exc:
            message = f"pool {pool}'s page: {untrusted.printable(str(exc) or type(exc).__name__, 300)}"
            return _error(502, message, "upstream_error")
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    def _shared_fetch(self, pool: str) -> asyncio.Future[bytes]:
        """The fetch in flight for ``pool``, or a new one: readers at the same time share it."""
        found = self._fetching.get(pool)
        if found is None:
            found = asyncio.ensure_future(self._fetch(pool))
            self._fetching[pool] = found
            found.add_done_callback(lambda _: self._fetching.pop(pool, None))
        return found

    async def _fetch(self, pool: str) -> bytes:
        self.fetches += 1
        config = self._pools[pool]
        return await scrape.fetch_page(
            config.url + config.metrics_path,
            timeout=self._timeout,
            limits=self._limits,
            headers=tapgate.auth_headers(self._keys, pool),
        )
