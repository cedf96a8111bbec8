"""The keep-alive race: a pool closes a pooled connection just as the tap sends a request on it.

uvicorn (vLLM, SGLang) closes a connection idle for 5 s; the tap lets its own go at 4 s, but on a
loaded machine the tap reads a response's last bytes late, so the engine's idle clock can be ahead
by more than the margin (three 502 ``ServerDisconnectedError`` in one CI run on real vLLM). The
upstream here is a raw HTTP/1.1 server that drops chosen requests without a byte of answer, so the
race happens every time instead of once a day.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest
from prometheus_client import generate_latest

from specguard.monitor.app import Monitor
from tests.exporters.test_tap import PLAIN, fetch, no_scrape, tap_config


class DroppingUpstream:
    """Answers every request with ``PLAIN`` on a kept-alive connection, except those for which
    ``drop(connection, request_on_it)`` is true: those it closes the connection on, unanswered."""

    def __init__(self, drop: Callable[[int, int], bool]):
        self.drop = drop
        self.seen: list[tuple[int, int, str]] = []  # (connection, request on it, request line)
        self._connections = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection, self._connections = self._connections, self._connections + 1
        try:
            for nth in range(1000):
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                length = next(
                    (
                        int(v)
                        for k, _, v in (h.partition(": ") for h in lines)
                        if k.lower() == "content-length"
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.seen.append((connection, nth, lines[0]))
                if self.drop(connection, nth):
                    return
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(PLAIN), PLAIN)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def race():
    """A tap whose pools are one ``DroppingUpstream`` (set ``upstream.drop`` per test)."""
    upstream = DroppingUpstream(lambda connection, nth: False)
    url = await upstream.start()
    monitor = Monitor(tap_config(url, extra=", forward_paths: [{path: /tokenize}]"), fetch=no_scrape)
    tap_url = await monitor.start("127.0.0.1", 0)
    session = aiohttp.ClientSession()
    yield upstream, monitor, tap_url, session
    await session.close()
    await monitor.stop()
    await upstream.stop()


def counted(monitor: Monitor, family: str) -> dict[str, float]:
    """``family``'s samples on the tap's /metrics page, by their label text."""
    page = generate_latest(monitor.registry).decode()
    prefix = family + "{"
    return {
        line[len(prefix) : line.index("}")]: float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith(prefix)
    }


BODY = {"model": "m", "prompt": "x", "temperature": 0}


# aiohttp resends an idempotent request (GET) itself; a POST is the tap's to resend
@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize"], ids=["tapped", "passed-through"])
async def test_a_pooled_connection_dropped_before_any_answer_is_sent_again_on_a_new_one(race, path):
    upstream, monitor, tap_url, session = race
    upstream.drop = lambda connection, nth: connection == 0 and nth == 1  # the reused connection
    statuses = []
    for _ in range(3):
        status, _headers, body = await fetch(session, tap_url + path, BODY)
        statuses.append(status)
        assert body == PLAIN
    assert statuses == [200, 200, 200]
    # the dropped request went once more on a connection of its own (1); the next opened another
    assert [(c, n) for c, n, _ in upstream.seen] == [(0, 0), (0, 1), (1, 0), (2, 0)], upstream.seen
    # a resend is counted as one, not as an upstream error (the client saw none)
    assert counted(monitor, "specguard_upstream_resends_total") == {'pool="spec",reason="dropped"': 1}
    assert counted(monitor, "specguard_upstream_errors_total") == {}
    if path == "/v1/completions":  # every answer attributed, the resent one included
        records = monitor.stats.records()
        assert len(records) == 3 and all(r.status == 200 and r.spec is not None for r in records), records


async def test_a_pool_that_drops_every_request_is_a_502_after_one_resend(race):
    upstream, monitor, tap_url, session = race
    upstream.drop = lambda connection, nth: connection >= 1 or nth == 1
    assert (await fetch(session, tap_url + "/v1/completions", BODY))[0] == 200
    status, _headers, body = await fetch(session, tap_url + "/v1/completions", BODY)
    assert status == 502, body
    # the pool took the request and broke the connection twice: nothing reached the client, so it
    # went to the other pool (here the same upstream, which drops it too), again at most twice
    assert b"pool base failed: ServerDisconnectedError" in body
    assert len(upstream.seen) == 5  # the first, then the dropped one twice per pool: never a third time
    resends = counted(monitor, "specguard_upstream_resends_total")
    assert resends == {'pool="base",reason="dropped"': 1, 'pool="spec",reason="dropped"': 1}
    errors = counted(monitor, "specguard_upstream_errors_total")
    assert errors == {'kind="broken",pool="base"': 1, 'kind="broken",pool="spec"': 1}
