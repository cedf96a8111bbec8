"""Fetch one engine /metrics page over HTTP and normalise it (aiohttp; a sync wrapper for the CLI).

An unreachable engine, a timeout or a non-200 answer is a ``SourceError`` naming the URL and the
reason (temporary: the scrape loop retries); one that could not even be connected to is an
``UnreachableError`` (the pool is down, see ``exporters.health``); a page that is not Prometheus
text is an ``InputError``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from specguard.errors import InputError, SourceError, UnreachableError
from specguard.exporters import engines, httpbody, promtext
from specguard.exporters.snapshot import EngineSnapshot

ACCEPT = "text/plain;version=0.0.4;q=0.9, application/openmetrics-text;version=1.0.0;q=0.5, */*;q=0.1"
MAX_PAGE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Scrape:
    """One fetched page: where from, how long it took, and the normalised snapshot."""

    url: str
    seconds: float
    snapshot: EngineSnapshot


def metrics_url(url: str, engine: str = "auto") -> str:
    """``http://host:port`` -> ``http://host:port/metrics`` (``/prometheus/metrics`` for TRT-LLM).

    A URL that already has a path is used as given.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"{url!r}: expected an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 (validates the port)
    except ValueError as exc:
        raise InputError(f"{url!r}: {exc}") from exc
    if parts.path in ("", "/"):
        parts = parts._replace(path=engines.metrics_path(engine))
    return urlunsplit(parts)


async def fetch_text(url: str, *, timeout: float = 5.0, session: aiohttp.ClientSession | None = None) -> str:
    """GET one page as text; SourceError on any transport failure or non-200 status."""
    own = session is None
    if own:
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout))
    try:
        # the connect gets most of the budget on its own clock: a connect that times out is a
        # pool that is down (UnreachableError), a page that is slow to come is not
        limits = aiohttp.ClientTimeout(total=timeout, sock_connect=timeout * 0.8)
        async with session.get(url, headers={"Accept": ACCEPT}, timeout=limits) as response:
            if response.status != 200:
                raise SourceError(f"{url}: HTTP {response.status} {response.reason or ''}".rstrip())
            try:
                body = await httpbody.read_limited(response.content, MAX_PAGE_BYTES, response.content_length)
            except httpbody.BodyTooLarge as exc:
                raise InputError(f"{url}: metrics page larger than {MAX_PAGE_BYTES} bytes") from exc
    except aiohttp.InvalidURL as exc:
        raise InputError(f"{url}: not a valid URL") from exc
    except aiohttp.ConnectionTimeoutError as exc:
        raise UnreachableError(f"{url}: unreachable: no connection within {timeout * 0.8:g} s") from exc
    except TimeoutError as exc:
        raise SourceError(f"{url}: unreachable: no answer within {timeout:g} s") from exc
    except aiohttp.ClientConnectorError as exc:
        raise UnreachableError(f"{url}: unreachable: {_reason(exc)}") from exc
    except aiohttp.ClientError as exc:
        raise SourceError(f"{url}: unreachable: {_reason(exc)}") from exc
    except OSError as exc:
        raise UnreachableError(f"{url}: unreachable: {exc.strerror or exc}") from exc
    finally:
        if own:
            await session.close()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{url}: metrics page is not UTF-8 (byte {exc.start})") from exc
    if text.lstrip()[:1] in ("{", "["):
        raise InputError(
            f"{url}: answered JSON, not a Prometheus text page "
            "(TensorRT-LLM serves its Prometheus page at /prometheus/metrics)"
        )
    return text


def _reason(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return f"connection refused by {exc.host}:{exc.port}"
        return str(exc.os_error.strerror or exc.os_error) if exc.os_error else str(exc)
    return str(exc) or type(exc).__name__


async def scrape(
    url: str,
    *,
    engine: str = "auto",
    timeout: float = 5.0,
    session: aiohttp.ClientSession | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Scrape:
    """Fetch and normalise one page. ``clock`` (monotonic seconds) times the scrape."""
    started = clock()
    text = await fetch_text(url, timeout=timeout, session=session)
    snap = engines.snapshot(promtext.parse(text, url), engine)
    return Scrape(url, clock() - started, snap)


def scrape_sync(url: str, *, engine: str = "auto", timeout: float = 5.0) -> Scrape:
    """Blocking ``scrape`` for the CLI (runs its own event loop)."""
    return asyncio.run(scrape(url, engine=engine, timeout=timeout))


async def fetch_snapshot(
    url: str, *, engine: str = "auto", timeout: float = 5.0, session: aiohttp.ClientSession | None = None
) -> EngineSnapshot:
    """Fetch one page (``url`` is the full page URL) and return only the normalised snapshot."""
    return (await scrape(url, engine=engine, timeout=timeout, session=session)).snapshot
