"""The tap against a scripted upstream: byte transparency, additions removed, errors, limits.

The upstream here is a small aiohttp app whose answers are fixed bytes, so the tests can
compare exactly what the client receives through the tap with what the engine sent.
End-to-end tests against the simulator are in test_tap_sim.py.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict
from prometheus_client import generate_latest

from specguard.exporters import tap, tapstream
from specguard.monitor import config
from specguard.monitor.app import Monitor
from tests.exporters import servekit
from tests.propkit import examples

VLLM_CHUNKS = [
    b'data: {"id":"c1","object":"text_completion","created":1,"model":"m",'
    b'"choices":[{"index":0,"text":" a"}]}\n\n',
    b'data: {"id":"c1","object":"text_completion","created":1,"model":"m",'
    b'"choices":[{"index":0,"text":" b c"}]}\n\n',
    b'data: {"id":"c1","object":"text_completion","created":1,"model":"m",'
    b'"choices":[{"index":0,"text":" d","finish_reason":"length"}]}\n\n',
]
USAGE_CHUNK = (
    b'data: {"id":"c1","object":"text_completion","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4},'
    b'"metrics":{"speculative_decoding":{"num_spec_steps":2,"num_draft_tokens":8,'
    b'"num_accepted_draft_tokens":2,"acceptance_histogram":[1,0,1,0,0],"num_spec_tokens":4}}}\n\n'
)
DONE = b"data: [DONE]\n\n"
BIG_EVENT = (  # 16 kB of text in one event: a stream big enough to fill the client's socket buffers
    b'data: {"id":"c1","object":"text_completion","created":1,"model":"m",'
    b'"choices":[{"index":0,"text":"' + b"x" * 16000 + b'"}]}\n\n'
)
PLAIN = (
    b'{"id": "c2", "choices": [{"index": 0, "text": "hi there"}], "usage": {"completion_tokens": 2},'
    b' "metrics": {"speculative_decoding": {"num_spec_steps": 1, "num_draft_tokens": 4,'
    b' "num_accepted_draft_tokens": 1, "acceptance_histogram": [0, 1, 0, 0, 0]}}}'
)
SGL_PLAIN = (
    b'{"id":"s1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],'
    b'"usage":{"completion_tokens":5},"sglext":{"spec_tokens_details":{"spec_verify_ct":2,'
    b'"spec_num_correct_drafts":3,"spec_num_proposed_drafts":6,"spec_correct_drafts_histogram":[0,1,1,0]}},'
    b'"x":"\\"sglext\\": 1"}'
)


FINGERPRINT = b'"vllm-0.32.0-83df1de2"'


def vllm_chunks(n: int = 1, fingerprint: bytes | None = None) -> list[bytes]:
    """vLLM's content chunks for ``n`` choices; without usage asked, each choice's terminal chunk
    ends with ``system_fingerprint`` (vLLM 0.32's placement)."""
    out = []
    for chunk in VLLM_CHUNKS:
        for index in range(n):
            one = chunk.replace(b'"index":0', b'"index":%d' % index)
            if fingerprint is not None and b'"finish_reason"' in one:
                one = one[: one.rindex(b"}")] + b',"system_fingerprint":' + fingerprint + b"}\n\n"
            out.append(one)
    return out


def usage_chunk(fingerprint: bytes | None = None) -> bytes:
    """The usage chunk; with a fingerprint it sits between ``usage`` and ``metrics`` (vLLM 0.32)."""
    if fingerprint is None:
        return USAGE_CHUNK
    return USAGE_CHUNK.replace(b',"metrics":', b',"system_fingerprint":' + fingerprint + b',"metrics":')


class Upstream:
    """A scripted engine: records what it received, answers with fixed bytes."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.cancelled = asyncio.Event()
        self.mode = "vllm"
        self.fingerprint: bytes | None = None  # vLLM --fingerprint-mode full: b'"vllm-..."'
        self.force_usage = False  # vLLM --enable-force-include-usage

    async def _hang(self) -> None:
        """Wait (for 30 s) until the tap cancels the request, and record that it did."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.headers.append(dict(request.headers))
        try:
            body = json.loads(raw)
        except ValueError:
            self.bodies.append({"raw": raw.decode(errors="replace")})
            return web.Response(body=b"raw:" + raw, content_type="text/plain")
        self.bodies.append(body)
        if self.mode == "hang":
            await self._hang()
        if self.mode == "llamacpp":
            data = (
                b'{"choices":[{"index":0,"text":"ok"}],"usage":{"completion_tokens":4},'
                b'"timings":{"predicted_n":4,"draft_n":8,"draft_n_accepted":5}}'
            )
            return web.Response(body=data, content_type="application/json")
        if self.mode == "error":
            return web.json_response({"error": {"message": "bad", "code": 400}}, status=400)
        if self.mode == "sglang":
            if body.get("stream"):
                return await self._stream(request, body, sglang=True)
            data = SGL_PLAIN
            if body.get("return_spec_tokens_details") is not True:
                data = tapstream.remove_key(data, "sglext")
            return web.Response(body=data, content_type="application/json", headers={"X-Engine": "sgl"})
        if body.get("stream"):
            return await self._stream(request, body)
        return web.Response(body=PLAIN, content_type="application/json", headers={"X-Engine": "v"})

    async def _stream(self, request, body, sglang=False):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Engine": "v"})
        await resp.prepare(request)
        usage = bool((body.get("stream_options") or {}).get("include_usage")) or self.force_usage
        if self.mode == "big":
            for _ in range(400):
                await resp.write(BIG_EVENT)
            await resp.write(DONE)
            await resp.write_eof()
            return resp
        for index, chunk in enumerate(vllm_chunks(body.get("n") or 1, None if usage else self.fingerprint)):
            if self.mode == "break" and index == 1:
                request.transport.close()
                return resp
            if self.mode in ("trickle", "trickle_stall"):
                await asyncio.sleep(0.2)
            if self.mode == "slowstream" and index == 1:
                await self._hang()
            if sglang and index == len(VLLM_CHUNKS) - 1 and body.get("return_spec_tokens_details"):
                chunk = chunk.replace(
                    b'"finish_reason":"length"}]}',
                    b'"finish_reason":"length"}],"sglext":{"spec_tokens_details":{"spec_verify_ct":2,'
                    b'"spec_num_correct_drafts":1,"spec_num_proposed_drafts":6}}}',
                )
            await resp.write(chunk)
        if self.mode == "trickle_stall":
            await self._hang()
        if self.mode == "break_after_finish":
            request.transport.close()
            return resp
        if usage and self.mode not in ("no_usage_chunk", "linger_after_done"):
            await resp.write(usage_chunk(self.fingerprint))
        await resp.write(DONE)
        if self.mode == "linger_after_done":  # a no-spec engine that ends its response after [DONE]
            await asyncio.sleep(0.3)
        await resp.write_eof()
        return resp


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    return await servekit.serve(app, handler_cancellation=True)


def tap_config(url: str, engine: str = "vllm", extra: str = "") -> config.SpecguardConfig:
    return config.parse_text(
        f"""
pools:
  - {{name: spec, url: "{url}", engine: {engine}, num_speculative_tokens: 4}}
  - {{name: base, url: "{url}", engine: {engine}, num_speculative_tokens: 0}}
tap: {{holdout_share: 0, probe_share: 0, max_body_bytes: 2048, upstream_timeout_seconds: 0.5{extra}}}
scrape: {{interval_seconds: 3600}}
"""
    )


def two_pools(spec_url: str, base_url: str, spec_extra: str = "") -> config.SpecguardConfig:
    """Pool ``spec`` (K=4) at ``spec_url`` and ``base`` (K=0) at ``base_url``; no holdout, no probe."""
    return config.parse_text(
        f"""
pools:
  - {{name: spec, url: "{spec_url}", engine: vllm, num_speculative_tokens: 4{spec_extra}}}
  - {{name: base, url: "{base_url}", engine: vllm, num_speculative_tokens: 0}}
tap: {{holdout_share: 0, probe_share: 0}}
scrape: {{interval_seconds: 3600}}
"""
    )


async def no_scrape(pool, timeout):
    raise OSError("scraping is not part of these tests")


@pytest.fixture
async def env():
    upstream = Upstream()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    up_runner, up_url = await serve(app)
    monitor = Monitor(tap_config(up_url, extra=", forward_paths: [{path: /generate}]"), fetch=no_scrape)
    tap_url = await monitor.start("127.0.0.1", 0)
    session = aiohttp.ClientSession(auto_decompress=False)
    yield upstream, up_url, monitor, tap_url, session
    await session.close()
    await monitor.stop()
    await up_runner.cleanup()


async def fetch(session, url, body=None, *, raw=None, headers=None):
    data = raw if raw is not None else json.dumps(body).encode()
    async with session.post(url, data=data, headers=headers or {"Content-Type": "application/json"}) as r:
        events = []
        async for chunk in r.content.iter_any():
            events.append(chunk)
        return r.status, r.headers, b"".join(events)


def strip_transport(headers):
    return {k: v for k, v in headers.items() if k not in ("Date", "Content-Length", "Transfer-Encoding")}


async def test_stream_without_usage_is_byte_identical_and_stats_are_read(env):
    upstream, up_url, monitor, tap_url, session = env
    body = {"model": "m", "prompt": "x", "stream": True, "temperature": 0}
    status, headers, via_tap = await fetch(
        session, tap_url + "/v1/completions", body, headers={"x-task-type": "code"}
    )
    _, direct_headers, direct = await fetch(session, up_url + "/v1/completions", body)
    assert status == 200
    assert via_tap == direct == b"".join(VLLM_CHUNKS) + DONE  # the usage chunk the tap asked for is gone
    assert strip_transport(headers) == strip_transport(direct_headers)
    assert upstream.bodies[0]["stream_options"] == {"include_usage": True}  # the tap asked for it
    (record,) = monitor.stats.records()
    assert (record.task_type, record.temperature_bucket, record.pool) == ("code", "greedy", "spec")
    assert (
        record.spec.rounds == 2 and record.spec.accepted_tokens == 2 and record.spec.full_rollback_rounds == 1
    )
    assert record.output_tokens == 4 and record.streamed and record.unattributed_reason is None
    assert record.ttft_seconds is not None and record.decode_seconds is not None


async def test_http_1_0_client_gets_the_stream_unframed_until_close(env):
    """HTTP/1.0 has no chunked encoding: the tap writes the events as they are and closes."""
    upstream, up_url, monitor, tap_url, session = env
    body = json.dumps({"model": "m", "prompt": "x", "stream": True}).encode()
    host, port = tap_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    raw = await asyncio.wait_for(reader.read(), 10)  # to the end: the tap closes the connection
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"Transfer-Encoding" not in head
    assert payload == b"".join(VLLM_CHUNKS) + DONE


@pytest.mark.parametrize("fingerprint", [FINGERPRINT, None], ids=["fingerprint", "no-fingerprint"])
@pytest.mark.parametrize("asked", [False, True], ids=["usage-not-asked", "usage-asked"])
@pytest.mark.parametrize("n", [1, 2])
async def test_stream_is_byte_identical_with_and_without_fingerprint(env, n, asked, fingerprint):
    """vLLM moves system_fingerprint to the usage chunk when usage is asked for; the tap asks for
    it on n = 1 streams, so it moves the fingerprint back onto the terminal chunk, byte for byte."""
    upstream, up_url, monitor, tap_url, session = env
    upstream.fingerprint = fingerprint
    body = {"model": "m", "prompt": "x", "stream": True, "n": n}
    if asked:
        body["stream_options"] = {"include_usage": True}
    _, _, via_tap = await fetch(session, tap_url + "/v1/completions", body)
    _, _, direct = await fetch(session, up_url + "/v1/completions", body)
    expected = b"".join(vllm_chunks(n, None if asked else fingerprint))
    expected += (usage_chunk(fingerprint) if asked else b"") + DONE
    assert via_tap == direct == expected
    added = not asked and n == 1  # n > 1: vLLM has no per-request numbers, nothing is asked for
    assert ("stream_options" in upstream.bodies[0]) == (asked or added)
    assert (fingerprint is not None) == (b"system_fingerprint" in via_tap)
    (record,) = monitor.stats.records()
    # (this scripted engine sends metrics whenever it sends usage; vLLM would not for n = 2)
    assert (record.spec is not None) == (n == 1 or asked)
    assert record.unattributed_reason == (None if n == 1 or asked else "n_gt_1")


@pytest.mark.parametrize("mode", ["no_usage_chunk", "break_after_finish"])
async def test_held_terminal_chunk_is_released_unchanged_without_a_usage_chunk(env, mode):
    upstream, up_url, monitor, tap_url, session = env
    upstream.mode = mode
    upstream.fingerprint = FINGERPRINT
    body = {"prompt": "x", "stream": True}
    received = []
    async with session.post(tap_url + "/v1/completions", json=body) as r:
        try:
            async for chunk in r.content.iter_any():
                received.append(chunk)
        except aiohttp.ClientPayloadError:
            assert mode == "break_after_finish"
    # the engine put the fingerprint on the usage chunk it never sent: the client gets the rest
    assert b"".join(received) == b"".join(VLLM_CHUNKS) + (DONE if mode == "no_usage_chunk" else b"")


async def test_force_include_usage_pool_adds_and_strips_nothing():
    upstream = Upstream()
    upstream.force_usage = True
    upstream.fingerprint = FINGERPRINT
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    up_runner, up_url = await serve(app)
    cfg = two_pools(up_url, up_url, ", force_include_usage: true")
    monitor = Monitor(cfg, fetch=no_scrape)
    tap_url = await monitor.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            _, _, via_tap = await fetch(session, tap_url + "/v1/completions", {"prompt": "x", "stream": True})
    finally:
        await monitor.stop()
        await up_runner.cleanup()
    assert via_tap == b"".join(VLLM_CHUNKS) + usage_chunk(FINGERPRINT) + DONE
    assert "stream_options" not in upstream.bodies[0]
    assert monitor.stats.records()[0].spec.rounds == 2


@pytest.mark.parametrize(
    "raw, value, expected",
    [
        (
            b'{"a":1,"choices":[{"x":"}"}]}',
            b'"fp"',
            b'{"a":1,"choices":[{"x":"}"}],"system_fingerprint":"fp"}',
        ),
        (b'{"a": 1}  ', b"null", b'{"a": 1,"system_fingerprint":null}  '),
        (b'{"a":1,"system_fingerprint":"old"}', b'"fp"', b'{"a":1,"system_fingerprint":"old"}'),
        (b"{}", b'"fp"', b"{}"),
    ],
)
def test_append_key_keeps_every_other_byte(raw, value, expected):
    assert tapstream.append_key(raw, "system_fingerprint", value) == expected


def test_raw_value_reads_only_top_level_keys():
    raw = b'{"u":{"system_fingerprint":"inner"},"s":"\\","system_fingerprint": "vllm-1-\\u00e9" ,"m":{}}'
    assert tapstream.raw_value(raw, "system_fingerprint") == b'"vllm-1-\\u00e9"'
    assert tapstream.raw_value(b'{"u":{"system_fingerprint":"inner"}}', "system_fingerprint") is None
    assert tapstream.raw_value(b'{"a":"\\"system_fingerprint\\": 1"}', "system_fingerprint") is None


async def test_stream_with_usage_requested_keeps_the_usage_chunk(env):
    upstream, up_url, monitor, tap_url, session = env
    body = {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    _, _, via_tap = await fetch(session, tap_url + "/v1/completions", body)
    _, _, direct = await fetch(session, up_url + "/v1/completions", body)
    assert via_tap == direct == b"".join(VLLM_CHUNKS) + USAGE_CHUNK + DONE
    assert upstream.bodies[0] == body  # nothing added, so the bytes went as they came
    assert monitor.stats.records()[0].spec.draft_tokens == 8


async def test_non_streamed_response_is_byte_identical(env):
    upstream, up_url, monitor, tap_url, session = env
    status, headers, data = await fetch(session, tap_url + "/v1/completions", {"prompt": "x"})
    assert (status, data) == (200, PLAIN)
    assert headers["X-Engine"] == "v" and headers["Content-Type"].startswith("application/json")
    assert monitor.stats.records()[0].spec.rounds == 1
    assert upstream.headers[0]["Accept-Encoding"] == "identity"


async def test_sglang_spec_details_requested_and_stripped(env):
    upstream, up_url, monitor, tap_url, session = env
    monitor.tap.engines["spec"] = "sglang"
    upstream.mode = "sglang"
    _, _, data = await fetch(session, tap_url + "/v1/chat/completions", {"messages": []})
    assert upstream.bodies[0]["return_spec_tokens_details"] is True
    assert data == tapstream.remove_key(SGL_PLAIN, "sglext")
    assert b'"x":"\\"sglext\\": 1"' in data  # a look-alike inside a string is untouched
    spec = monitor.stats.records()[0].spec
    assert (spec.rounds, spec.accepted_tokens, spec.draft_tokens, spec.full_rollback_rounds) == (2, 3, 6, 0)
    # the client asked for the details itself: it keeps them
    _, _, asked = await fetch(session, tap_url + "/v1/chat/completions", {"return_spec_tokens_details": True})
    assert asked == SGL_PLAIN
    # streamed: the sglext key is cut out of the one chunk that carries it
    _, _, streamed = await fetch(session, tap_url + "/v1/chat/completions", {"stream": True})
    assert streamed == b"".join(VLLM_CHUNKS) + DONE
    assert monitor.stats.records()[-1].spec.rounds == 2


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b'{"a":1,"sglext":{"b":[1,2]},"c":2}', b'{"a":1,"c":2}'),
        (b'{"a": 1, "sglext": {"b": "}"}}', b'{"a": 1}'),
        (b'{"sglext": null, "a": "x"}', b'{"a": "x"}'),
        (b'{"a": "\\"sglext\\": 1", "sglext": 2}', b'{"a": "\\"sglext\\": 1"}'),
        (b'{"a": "\xc3\xa9", "sglext": 1, "b": 2}', b'{"a": "\xc3\xa9", "b": 2}'),
    ],
)
def test_remove_key_keeps_every_other_byte(raw, expected):
    assert tapstream.remove_key(raw, "sglext") == expected


async def test_engine_error_status_passes_through_and_is_unattributed(env):
    upstream, up_url, monitor, tap_url, session = env
    upstream.mode = "error"
    status, _, data = await fetch(session, tap_url + "/v1/completions", {"prompt": "x"})
    assert status == 400 and json.loads(data)["error"]["message"] == "bad"
    assert monitor.stats.unattributed() == {("spec", "error_status"): 1}


async def test_upstream_timeout_is_504_and_cancels_upstream(env):
    upstream, up_url, monitor, tap_url, session = env
    upstream.mode = "hang"
    status, headers, data = await fetch(session, tap_url + "/v1/completions", {"prompt": "x"})
    assert status == 504
    error = json.loads(data)["error"]
    assert error["type"] == "upstream_timeout" and error["code"] == 504
    await asyncio.wait_for(upstream.cancelled.wait(), 5)
    assert monitor.stats.upstream_errors() == {("spec", "timeout"): 1}
    assert monitor.stats.records()[0].status == 504


async def test_stream_stalled_longer_than_the_timeout_is_cut_and_counted(env):
    upstream, up_url, monitor, tap_url, session = env
    upstream.mode = "trickle_stall"  # the chunks 0.2 s apart (each its own read), then silence
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with session.post(tap_url + "/v1/completions", json={"prompt": "x", "stream": True}) as r:
            assert r.status == 200
            async for data in r.content.iter_any():
                received += data
    assert received == b"".join(VLLM_CHUNKS)  # the held terminal chunk is released unchanged
    await asyncio.wait_for(upstream.cancelled.wait(), 5)
    assert monitor.stats.upstream_errors() == {("spec", "timeout"): 1}
    assert monitor.stats.unattributed() == {("spec", "upstream_error"): 1}


async def test_stream_slower_in_total_than_the_timeout_but_never_quiet_that_long_completes(env):
    upstream, up_url, monitor, tap_url, session = env
    upstream.mode = "trickle"  # a chunk every 0.2 s; the whole stream takes longer than the 0.5 s timeout
    started = asyncio.get_running_loop().time()
    status, _, data = await fetch(session, tap_url + "/v1/completions", {"prompt": "x", "stream": True})
    assert asyncio.get_running_loop().time() - started > 0.5
    assert status == 200 and data == b"".join(VLLM_CHUNKS) + DONE
    assert monitor.stats.upstream_errors() == {}
    assert monitor.stats.records()[0].spec is not None


async def test_unreachable_pool_is_502_in_openai_shape():
    # both pools unreachable: each is tried once (failover), then the client gets a 502
    monitor = Monitor(tap_config("http://127.0.0.1:9"), fetch=no_scrape)
    tap_url = await monitor.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            status, _, data = await fetch(session, tap_url + "/v1/chat/completions", {"messages": []})
            assert status == 502
            assert json.loads(data)["error"]["type"] == "upstream_error"
            assert monitor.stats.upstream_errors() == {("spec", "connect"): 1, ("base", "connect"): 1}
            async with session.get(tap_url + "/v1/models") as r:
                assert r.status == 502
        assert monitor.stats.upstream_errors()[("spec", "connect")] == 2
        assert monitor.stats.unattributed()[("base", "upstream_error")] == 1  # one record per request
        assert [s.healthy for s in monitor.health.view().values()] == [False, False]
        async with aiohttp.ClientSession() as session:
            async with session.get(tap_url + "/healthz") as r:  # every pool down: degraded, and why
                health = await r.json()
                assert r.status == 503 and health["status"] == "degraded", health
                assert "every pool is down: spec (" in health["reason"] and "base (" in health["reason"]
            async with session.get(tap_url + "/livez") as r:  # the probes' endpoint: the process serves
                assert r.status == 200 and (await r.json()) == {"status": "alive"}
    finally:
        await monitor.stop()


async def test_a_refused_connect_is_sent_again_to_a_pool_that_serves(env):
    """Failover: nothing reached the dead pool nor the client, so the request goes elsewhere once."""
    upstream, up_url, _, _, session = env
    cfg = two_pools("http://127.0.0.1:9", up_url)
    monitor = Monitor(cfg, fetch=no_scrape)
    tap_url = await monitor.start("127.0.0.1", 0)
    try:
        for stream in (True, False, True):
            body = {"prompt": "x", "stream": stream}
            status, _, data = await fetch(session, tap_url + "/v1/completions", body)
            assert status == 200 and data.startswith(b"data:" if stream else b"{")
        async with session.get(tap_url + "/v1/models") as r:  # passed through: also served
            assert r.status == 200
        # one failed connect (the first request); then the pool is down and skipped
        assert monitor.stats.upstream_errors() == {("spec", "connect"): 1}
        records = monitor.stats.records()
        assert [(r.pool, r.route, r.status) for r in records] == [("base", "failover", 200)] * 3
        assert records[0].unattributed_reason is None  # a whole answer, measured on the pool that served
        assert monitor.health.failovers == {("spec", "base"): 3}
        assert len(upstream.bodies) == 4  # each request reached an engine exactly once
        text = generate_latest(monitor.registry).decode()
        assert 'specguard_pool_healthy{pool="spec"} 0.0' in text
        assert 'specguard_failover_requests_total{pool="spec",to_pool="base"} 3.0' in text
    finally:
        await monitor.stop()


async def test_unreachable_pool_without_failover_is_502_at_once():
    monitor = Monitor(tap_config("http://127.0.0.1:9", extra=", failover: false"), fetch=no_scrape)
    tap_url = await monitor.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            status, _, data = await fetch(session, tap_url + "/v1/chat/completions", {"messages": []})
            assert status == 502 and "pool spec failed" in json.loads(data)["error"]["message"]
            async with session.get(tap_url + "/v1/models") as r:
                assert r.status == 502
        assert monitor.stats.upstream_errors() == {("spec", "connect"): 2}
        assert monitor.stats.unattributed()[("spec", "upstream_error")] == 1
        assert not monitor.health.healthy("spec")  # still reported (specguard_pool_healthy)
    finally:
        await monitor.stop()


async def test_a_client_that_closes_right_after_done_is_not_client_disconnected(env):
    """The `openai` client closes as soon as it has read `data: [DONE]`; 2 of 15 such
    streams were counted as client_disconnected although they had their whole answer and usage."""
    upstream, _, monitor, tap_url, _ = env
    upstream.mode = "linger_after_done"
    # on the no-spec pool: there a record has no spec stats, so its failure is what it reports
    monitor.router.set_plan({("other", "high", load): "base" for load in ("low", "medium", "high")})
    host, port = tap_url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    for _ in range(15):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head + body)
        received = b""
        while b"data: [DONE]" not in received:
            data = await reader.read(65536)
            assert data, received
            received += data
        writer.close()  # read to [DONE], then gone, as the openai client does
        await writer.wait_closed()
    for _ in range(200):
        if len(monitor.stats.records()) == 15:
            break
        await asyncio.sleep(0.02)
    records = monitor.stats.records()
    assert len(records) == 15
    assert {(r.pool, r.status, r.unattributed_reason) for r in records} == {("base", 200, None)}
    assert monitor.stats.unattributed() == {}


async def test_broken_stream_closes_the_client_connection(env):
    upstream, up_url, monitor, tap_url, session = env
    upstream.mode = "break"
    with pytest.raises(aiohttp.ClientPayloadError):
        await fetch(session, tap_url + "/v1/completions", {"prompt": "x", "stream": True})
    await asyncio.sleep(0.05)
    assert monitor.stats.unattributed() == {("spec", "upstream_error"): 1}
    assert monitor.stats.upstream_errors() == {("spec", "broken"): 1}


async def test_a_slow_client_gets_a_large_stream_whole(env):
    upstream, up_url, monitor, tap_url, session = env
    upstream.mode = "big"
    got = bytearray()
    async with session.post(tap_url + "/v1/completions", json={"prompt": "x", "stream": True}) as r:
        while chunk := await r.content.read(256 * 1024):
            got += chunk
            await asyncio.sleep(0.02)  # ~13 MB/s: the tap must wait for this client, not pile up
    assert bytes(got) == BIG_EVENT * 400 + DONE
    await asyncio.sleep(0.05)
    (record,) = monitor.stats.records()
    assert record.status == 200 and record.unattributed_reason != "client_disconnected"
    assert record.output_tokens == 400  # (counted per content chunk: the scripted engine gives no usage)


@pytest.mark.parametrize("stream", [False, True])
async def test_client_disconnect_cancels_the_upstream_request(env, stream):
    upstream, up_url, monitor, tap_url, session = env
    upstream.mode = "slowstream" if stream else "hang"
    monitor.tap._timeout = aiohttp.ClientTimeout(total=None, sock_read=20)

    async def client():
        async with session.post(tap_url + "/v1/completions", json={"prompt": "x", "stream": stream}) as r:
            await r.content.read(10)
            await asyncio.sleep(30)

    task = asyncio.create_task(
        client() if stream else fetch(session, tap_url + "/v1/completions", {"prompt": "x"})
    )
    for _ in range(500):
        if upstream.bodies:
            break
        await asyncio.sleep(0.01)
    assert upstream.bodies, "the request never reached the upstream"
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(upstream.cancelled.wait(), 5)
    for _ in range(100):
        if monitor.stats.records():
            break
        await asyncio.sleep(0.02)
    assert monitor.stats.unattributed() == {("spec", "client_disconnected"): 1}
    assert monitor.tap.in_flight["spec"] == 0


async def test_non_json_body_is_forwarded_untouched_and_counted_unclassified(env):
    upstream, up_url, monitor, tap_url, session = env
    status, _, data = await fetch(
        session, tap_url + "/v1/completions", raw=b"not json {", headers={"x-task-type": "code"}
    )
    assert (status, data) == (200, b"raw:not json {")
    assert upstream.bodies == [{"raw": "not json {"}]
    assert monitor.stats.unclassified() == {"spec": 1}
    assert monitor.stats.unattributed() == {("spec", "not_json"): 1}


async def test_oversized_body_is_413_by_length_and_by_stream(env):
    upstream, up_url, monitor, tap_url, session = env
    big = {"prompt": "x" * 5000}
    status, _, data = await fetch(session, tap_url + "/v1/completions", big)
    assert status == 413 and json.loads(data)["error"]["type"] == "invalid_request_error"

    async def chunks():
        for _ in range(10):
            yield b"x" * 500

    async with session.post(tap_url + "/v1/completions", data=chunks()) as r:
        assert r.status == 413
    assert upstream.bodies == []


async def test_other_paths_pass_through_and_unattributed_posts_are_counted(env):
    upstream, up_url, monitor, tap_url, session = env
    async with session.get(tap_url + "/v1/models?x=1") as r:
        assert r.status == 200 and await r.read() == b"raw:"
    status, _, data = await fetch(session, tap_url + "/generate", {"text": "x"})  # tap.forward_paths
    assert status == 200 and data == PLAIN
    status, _, data = await fetch(session, tap_url + "/sleep", {})  # not on the allowlist
    assert status == 404 and json.loads(data)["error"]["type"] == "not_found_error"
    assert monitor.stats.unattributed() == {("spec", "other_path"): 1}
    assert monitor.stats.records() == []


async def test_unattributed_reasons_and_metrics_endpoint(env):
    upstream, up_url, monitor, tap_url, session = env
    upstream.mode = "sglang"  # answers without vLLM metrics
    await fetch(session, tap_url + "/v1/chat/completions", {"messages": [], "n": 2})
    await fetch(session, tap_url + "/v1/chat/completions", {"messages": [], "stop": ["\n"]})
    await fetch(session, tap_url + "/v1/chat/completions", {"messages": []})
    assert monitor.stats.unattributed() == {
        ("spec", "n_gt_1"): 1,
        ("spec", "stop_string"): 1,
        ("spec", "no_spec_stats"): 1,
    }
    async with session.get(tap_url + "/metrics") as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = (await r.read()).decode()
    assert 'specguard_unattributed_requests_total{pool="spec",reason="n_gt_1"} 1.0' in text
    assert 'specguard_engine_up{pool="spec"} 0.0' in text
    other = 'load_bucket="low",pool="spec",task_type="other",temperature_bucket="high"'
    assert f"specguard_requests_total{{{other}}} 3.0" in text
    unseen = 'load_bucket="high",pool="base",task_type="creative",temperature_bucket="greedy"'
    assert f"specguard_requests_total{{{unseen}}}" not in text  # a label set appears with its traffic
    async with session.get(tap_url + "/healthz") as r:
        assert r.status == 200 and (await r.json())["status"] == "ok"


async def test_llamacpp_timings_give_drafts_and_accepted(env):
    upstream, up_url, monitor, tap_url, session = env
    monitor.tap.engines["spec"] = "llamacpp"
    upstream.mode = "llamacpp"
    _, _, data = await fetch(session, tap_url + "/v1/completions", {"prompt": "x"})
    assert b'"draft_n_accepted":5' in data  # llama.cpp's own field: nothing to hide
    spec = monitor.stats.records()[0].spec
    assert (spec.source, spec.draft_tokens, spec.accepted_tokens, spec.rounds) == ("llamacpp", 8, 5, None)
    assert spec.num_speculative_tokens == 4  # from the pool config


async def test_engine_without_per_request_stats_falls_back_to_chunks_marked_approximate(env):
    upstream, up_url, monitor, tap_url, session = env
    monitor.tap.engines["spec"] = "tgi"
    body = {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    _, _, data = await fetch(session, tap_url + "/v1/completions", body)
    assert data == b"".join(VLLM_CHUNKS) + USAGE_CHUNK + DONE
    assert upstream.bodies[0] == body
    (record,) = monitor.stats.records()
    assert record.spec.source == "chunks" and record.spec.approximate
    assert (record.spec.rounds, record.spec.output_tokens, record.spec.accepted_tokens) == (3, 4, 1)
    assert monitor.stats.totals()[("spec", "other", "high", "low")].approximate_requests == 1


def test_hop_by_hop_headers_are_dropped_including_those_named_in_connection():
    headers = CIMultiDict(
        [
            ("Connection", "keep-alive, X-Private"),
            ("X-Private", "1"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Host", "tap"),
            ("Authorization", "Bearer t"),
            ("X-Task-Type", "code"),
            ("X-Task-Type", "twice"),
        ]
    )
    out = tap.forward_headers(headers, identity=True)
    assert list(out.items()) == [  # the client's credential is the tap's, never a pool's
        ("X-Task-Type", "code"),
        ("X-Task-Type", "twice"),
        ("Accept-Encoding", "identity"),
    ]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=examples(60), deadline=None)
@given(
    before=st.dictionaries(st.text(max_size=6).filter(lambda k: k != "sglext"), _json, max_size=3),
    after=st.dictionaries(st.text(max_size=6).filter(lambda k: k != "sglext"), _json, max_size=3),
    value=_json,
    compact=st.booleans(),
    ascii_only=st.booleans(),
)
def test_remove_key_equals_serialising_without_the_key(before, after, value, compact, ascii_only):
    after = {k: v for k, v in after.items() if k not in before}
    separators = (",", ":") if compact else (", ", ": ")
    whole = {**before, "sglext": value, **after}
    rest = {**before, **after}
    raw = json.dumps(whole, separators=separators, ensure_ascii=ascii_only).encode()
    expected = json.dumps(rest, separators=separators, ensure_ascii=ascii_only).encode()
    assert tapstream.remove_key(raw, "sglext") == expected


@pytest.mark.parametrize(
    "engine, body, sent, additions",
    [
        pytest.param(
            "vllm", {"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}, (1, 0)
        ),
        pytest.param(
            "vllm",
            {"stream": True, "stream_options": {"continuous_usage_stats": True}},
            {"stream": True, "stream_options": {"continuous_usage_stats": False, "include_usage": True}},
            (1, 0),
            id="continuous-without-usage-stays-off",
        ),
        pytest.param("vllm", {"stream": True, "stream_options": {"include_usage": True}}, None, (0, 0)),
        pytest.param("vllm", {"stream": False}, None, (0, 0)),
        pytest.param("sglang", {}, {"return_spec_tokens_details": True}, (0, 1)),
        pytest.param("sglang", {"return_spec_tokens_details": True}, None, (0, 0)),
        pytest.param("vllm", {"stream": True, "n": 2}, None, (0, 0), id="n2-nothing-to-gain"),
        pytest.param("vllm", {"stream": True, "best_of": 3}, None, (0, 0), id="best-of"),
        pytest.param("vllm", {"stream": True, "prompt": ["a", "b"]}, None, (0, 0), id="prompt-list"),
        pytest.param(
            "vllm",
            {"stream": True, "prompt": [1, 2]},
            {"stream": True, "prompt": [1, 2], "stream_options": {"include_usage": True}},
            (1, 0),
            id="token-prompt",
        ),
        pytest.param("llamacpp", {"stream": True}, None, (0, 0)),
        pytest.param("auto", {"stream": True}, None, (0, 0)),
    ],
)
def test_prepare_adds_only_what_is_missing(engine, body, sent, additions):
    new, added = tapstream.prepare(engine, body)
    assert new == sent
    assert (int(added.usage), int(added.spec_details)) == additions
    assert added.hold_finish == added.usage
    # a pool whose server forces usage on: nothing to add for usage
    forced, added = tapstream.prepare(engine, body, force_include_usage=True)
    assert not added.usage and (forced is None) == (not added.spec_details)


async def test_an_idle_upstream_connection_is_dropped_before_the_engines_keep_alive_ends():
    """uvicorn (vLLM, SGLang) closes a connection idle for 5 s; a request the tap sends on such a
    connection as it closes fails with ``ClientOSError`` (2 requests in one CI run on real vLLM).
    The tap lets its idle connections go first: a request after 4.5 s idle opens a new one."""
    peers: list[int] = []

    async def answer(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername")[1])
        return web.Response(body=PLAIN, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    up_runner, up_url = await servekit.serve(app, keepalive_timeout=5.0)  # uvicorn's default
    monitor = Monitor(tap_config(up_url), fetch=no_scrape)
    tap_url = await monitor.start("127.0.0.1", 0)
    body = {"model": "m", "prompt": "x", "temperature": 0}
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):  # back to back: one connection, reused
                assert (await fetch(session, tap_url + "/v1/completions", body))[0] == 200
            await asyncio.sleep(tap.UPSTREAM_KEEPALIVE_SECONDS + 0.5)
            assert (await fetch(session, tap_url + "/v1/completions", body))[0] == 200
    finally:
        await monitor.stop()
        await up_runner.cleanup()
    assert peers[0] == peers[1] and peers[2] != peers[1], peers
    assert tap.UPSTREAM_KEEPALIVE_SECONDS < 5.0
