"""Fetch one engine /metrics page over HTTP and normalise it (aiohttp; a sync wrapper for the CLI).

An unreachable engine, a timeout or a non-200 answer is a ``SourceError`` naming the URL and the
reason (temporary: the scrape loop retries); one that could not even be connected to is an
``UnreachableError`` and one that answered 503 a ``NotReadyError`` (either way the pool is down,
see ``exporters.health``); a page that is not Prometheus
text is an ``InputError``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from specguard.errors import InputError, NotReadyError, SourceError, UnreachableError
from specguard.exporters import engines, offload, promtext
from specguard.exporters.addresses import mask_url
from specguard.exporters.snapshot import EngineSnapshot

ACCEPT = "text/plain;version=0.0.4;q=0.9, application/openmetrics-text;version=1.0.0;q=0.5, */*;q=0.1"


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


async def fetch_page(
    url: str,
    *,
    timeout: float = 5.0,
    session: aiohttp.ClientSession | None = None,
    limits: promtext.Limits = promtext.LIMITS,
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """GET one page's bytes (with ``headers``: the pool's ``Authorization``); SourceError on a
    transport failure or a non-200 status.

    The page is checked while it arrives: past ``limits.max_page_bytes`` or with a line longer
    than ``limits.max_line_bytes`` it is refused at once (``promtext.PageRejected``) and the rest
    is never read, so a hostile engine costs at most one limit's worth of memory.
    """
    shown = mask_url(url)
    own = session is None
    if own:
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout))
    try:
        # the connect gets most of the budget on its own clock: a connect that times out is a
        # pool that is down (UnreachableError), a page that is slow to come is not
        budget = aiohttp.ClientTimeout(total=timeout, sock_connect=timeout * 0.8)
        sent = {"Accept": ACCEPT, **(headers or {})}
        async with session.get(url, headers=sent, timeout=budget) as response:
            if response.status == 503:  # listening, not serving (llama.cpp: "Loading model")
                raise NotReadyError(f"{shown}: HTTP 503 {response.reason or ''}: not ready".rstrip())
            if response.status != 200:
                raise SourceError(f"{shown}: HTTP {response.status} {response.reason or ''}".rstrip())
            return await _read_page(response, shown, limits)
    except aiohttp.InvalidURL as exc:
        raise InputError(f"{shown}: not a valid URL") from exc
    except aiohttp.ConnectionTimeoutError as exc:
        raise UnreachableError(f"{shown}: unreachable: no connection within {timeout * 0.8:g} s") from exc
    except TimeoutError as exc:
        raise SourceError(f"{shown}: unreachable: no answer within {timeout:g} s") from exc
    except aiohttp.ClientConnectorError as exc:
        raise UnreachableError(f"{shown}: unreachable: {_reason(exc)}") from exc
    except aiohttp.ClientError as exc:
        raise SourceError(f"{shown}: unreachable: {_reason(exc)}") from exc
    except OSError as exc:
        raise UnreachableError(f"{shown}: unreachable: {exc.strerror or exc}") from exc
    finally:
        if own:
            await session.close()


async def _read_page(response: aiohttp.ClientResponse, shown: str, limits: promtext.Limits) -> bytes:
    declared = response.content_length
    if declared is not None and declared > limits.max_page_bytes:
        raise promtext.PageRejected(
            f"{shown}: metrics page larger than {limits.max_page_bytes} bytes ({declared})", "page_too_large"
        )
    parts: list[bytes] = []
    size = carried = 0
    async for data in response.content.iter_any():
        size += len(data)
        if size > limits.max_page_bytes:
            raise promtext.PageRejected(
                f"{shown}: metrics page larger than {limits.max_page_bytes} bytes", "page_too_large"
            )
        line = promtext.carried_line(data, carried, limits.max_line_bytes)
        if line is None:
            raise promtext.PageRejected(
                f"{shown}: metrics page has a line longer than {limits.max_line_bytes} bytes", "line_too_long"
            )
        carried = line
        parts.append(data)
    return b"".join(parts)


def page_text(body: bytes, shown: str) -> str:
    """A fetched page as text: UTF-8 and not JSON (TensorRT-LLM's /metrics answers JSON)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise promtext.PageRejected(
            f"{shown}: metrics page is not UTF-8 (byte {exc.start})", "not_utf8"
        ) from exc
    if text.lstrip()[:1] in ("{", "["):
        raise InputError(
            f"{shown}: answered JSON, not a Prometheus text page "
            "(TensorRT-LLM serves its Prometheus page at /prometheus/metrics)"
        )
    return text


async def fetch_text(
    url: str,
    *,
    timeout: float = 5.0,
    session: aiohttp.ClientSession | None = None,
    limits: promtext.Limits = promtext.LIMITS,
) -> str:
    """GET one page as text (``fetch_page`` + ``page_text``)."""
    body = await fetch_page(url, timeout=timeout, session=session, limits=limits)
    return page_text(body, mask_url(url))


def normalise(
    body: bytes, shown: str, engine: str, limits: promtext.Limits = promtext.LIMITS
) -> EngineSnapshot:
    """Decode, parse and normalise one fetched page (CPU only: ``scrape`` runs it off the loop).
    NaN and infinite samples are dropped one by one and counted (``EngineSnapshot.non_finite``)."""
    page, dropped = promtext.finite_only(promtext.parse(page_text(body, shown), shown, limits))
    snap = engines.snapshot(page, engine)
    return dataclasses.replace(snap, non_finite=dropped) if dropped else snap


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
    limits: promtext.Limits = promtext.LIMITS,
    headers: Mapping[str, str] | None = None,
) -> Scrape:
    """Fetch and normalise one page. ``clock`` (monotonic seconds) times the scrape.

    Parsing runs in a worker thread, or a worker process for a large page (``offload``), so it
    never holds up the event loop that serves traffic; ``limits`` bound what a page may cost.
    """
    started = clock()
    body = await fetch_page(url, timeout=timeout, session=session, limits=limits, headers=headers)
    snap = await offload.run(normalise, body, mask_url(url), engine, limits, weight=len(body))
    return Scrape(url, clock() - started, snap)


def scrape_sync(
    url: str, *, engine: str = "auto", timeout: float = 5.0, limits: promtext.Limits = promtext.LIMITS
) -> Scrape:
    """Blocking ``scrape`` for the CLI (runs its own event loop)."""
    return asyncio.run(scrape(url, engine=engine, timeout=timeout, limits=limits))


async def fetch_snapshot(
    url: str,
    *,
    engine: str = "auto",
    timeout: float = 5.0,
    session: aiohttp.ClientSession | None = None,
    limits: promtext.Limits = promtext.LIMITS,
    headers: Mapping[str, str] | None = None,
) -> EngineSnapshot:
    """Fetch one page (``url`` is the full page URL) and return only the normalised snapshot."""
    found = await scrape(url, engine=engine, timeout=timeout, session=session, limits=limits, headers=headers)
    return found.snapshot
