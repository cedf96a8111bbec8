"""The plan over HTTP, for fleets without Kubernetes: the decider serves it, followers poll it.

``GET /api/v1/plan`` answers the plan JSON (the plan file's format) with an ``ETag`` made of
the plan version and a digest of its entries, and ``X-Specguard-Plan-Version``. A request whose
``If-None-Match`` names the current ETag gets ``304 Not Modified`` and no body. Only the leading
decider serves a plan: a standby or a follower answers 503, so a follower never takes a plan
from a replica that does not decide. The endpoint is on the control listener and needs a
``follower`` (or ``operator``) credential.

``HttpPlanSource`` is the follower's side: each read tries the configured deciders in order,
each with a timeout and a body-size bound; the first 200 or 304 wins. When none answers it
raises SourceError, and the follower keeps routing by its last plan. It sends its follower
token (``plan_http.token_file``) and, for an mTLS decider, its client certificate. The follower
adopts only a plan newer than its own (``fleet``): an older or equal one is ignored and counted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from specguard import untrusted
from specguard.errors import InputError, SourceError
from specguard.exporters import httpbody
from specguard.monitor import state as state_mod

PATH = "/api/v1/plan"
VERSION_HEADER = "X-Specguard-Plan-Version"
MAX_PLAN_BYTES = 4 << 20


def render(doc: state_mod.PlanDocument) -> tuple[bytes, str]:
    """The body and the ETag of a plan; the ETag ignores ``updated_at`` (the time it was rendered)."""
    data = state_mod.encode(doc)
    digest = hashlib.sha256(json.dumps(data["entries"], sort_keys=True).encode()).hexdigest()[:16]
    return json.dumps(data, sort_keys=True).encode(), f'"{doc.version}-{digest}"'


def matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 weak comparison of ``If-None-Match`` (a list, or ``*``) with our ETag."""
    if not if_none_match:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


class PlanEndpoint:
    """The handler of ``GET /api/v1/plan`` over a guard (anything with ``document()``, ``follow``,
    ``is_leader`` and ``leader_holder``)."""

    def __init__(self, guard: Any, gate: Any = None):
        self.guard = guard
        self.gate = gate  # control_auth.Gate; None: no check (a test's bare endpoint)

    def routes(self) -> list[web.RouteDef]:
        return [web.get(PATH, self.get)]

    async def get(self, request: web.Request) -> web.Response:
        if self.gate is not None:
            from specguard.monitor import receiver

            receiver.check(self.gate, request, ("follower", "operator"))
        guard = self.guard
        if guard.follow is not None:
            return _unavailable("this replica follows a plan; ask the decider")
        if not guard.is_leader:
            holder = guard.leader_holder
            return _unavailable(f"not the leader (leader: {holder or 'unknown'}); ask the leader")
        body, etag = render(guard.document())
        headers = {"ETag": etag, VERSION_HEADER: str(guard.version), "Cache-Control": "no-cache"}
        if matches(request.headers.get("If-None-Match"), etag):
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, content_type="application/json", headers=headers)


def _unavailable(message: str) -> web.Response:
    return web.json_response({"error": message}, status=503, headers={"Retry-After": "1"})


class HttpPlanSource:
    """A follower's plan source: ``read_plan()`` is the new plan, or None when it is unchanged."""

    name = "http"

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout: float = 2.0,
        max_bytes: int = MAX_PLAN_BYTES,
        session_factory: Callable[[], aiohttp.ClientSession] | None = None,
        token: str | None = None,
        ssl: Any = None,
    ):
        if not urls:
            raise ValueError("HttpPlanSource needs at least one URL")
        self.urls = [plan_url(u) for u in urls]
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._factory = session_factory or aiohttp.ClientSession
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssl = ssl  # an ssl.SSLContext (client certificate, CA) for https deciders, or None
        self._session: aiohttp.ClientSession | None = None
        self.etag: str | None = None
        self.answered_by: str | None = None  # the URL of the last answer

    async def read_plan(self) -> state_mod.PlanDocument | None:
        failures = []
        for url in self.urls:
            try:
                doc = await self._get(url)
            except SourceError as exc:
                failures.append(str(exc))
                continue
            self.answered_by = url
            return doc
        raise SourceError("; ".join(failures))

    async def _get(self, url: str) -> state_mod.PlanDocument | None:
        if self._session is None or self._session.closed:
            self._session = self._factory()
        headers = {**self._auth, **({"If-None-Match": self.etag} if self.etag else {})}
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with self._session.get(
                url, headers=headers, timeout=timeout, allow_redirects=False, ssl=self._ssl or True
            ) as response:
                if response.status == 304:
                    return None
                body = await httpbody.read_limited(response.content, self.max_bytes, response.content_length)
                if response.status != 200:
                    raise SourceError(f"{url}: HTTP {response.status} {_reason(body)}")
                etag = response.headers.get("ETag")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SourceError(f"{url}: unreachable ({type(exc).__name__})") from exc
        except httpbody.BodyTooLarge as exc:
            raise SourceError(f"{url}: plan {exc}") from exc
        try:
            doc = state_mod.parse(body, url)
        except InputError as exc:  # not JSON, nested too deep, wrong types...
            raise SourceError(f"{url}: not a specguard plan ({exc})") from exc
        self.etag = etag
        return doc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def plan_url(url: str) -> str:
    """A decider's base URL (``http://host:port``) or the plan URL itself -> the plan URL."""
    url = url.rstrip("/")
    return url if url.endswith(PATH) else url + PATH


def _reason(body: bytes) -> str:
    """The ``error`` of a JSON error body, else its first 200 characters."""
    text = body.decode(errors="replace")
    try:
        data = untrusted.loads(body)
    except InputError:
        return untrusted.printable(text, 200)
    shown = data.get("error", text) if isinstance(data, dict) else text
    return untrusted.printable(shown, 200)
