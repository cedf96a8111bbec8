"""Bad input, generated: the metrics-page parser, per-request fields of every engine, the tap's
stream relay, the config loaders and the Alertmanager payload parser.

Property: nothing crashes. Each input is either accepted or rejected with the project's own
error (InputError for pages/bodies/payloads, ConfigError for configs) whose message says
where. Example counts: ``python3 -m pytest tests/reliability/test_fuzz.py --hypothesis-show-statistics``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specguard import configfile
from specguard.errors import ConfigError, InputError
from specguard.exporters import engines, promtext, tapstream
from specguard.exporters.records import SpecStats
from specguard.monitor import config, guard_wiring, receiver
from specguard.monitor.app import Monitor
from tests.reliability import relkit

guard_wiring.register_sections(config.SECTIONS)  # the full config, as `specguard run` parses it

# SPECGUARD_FUZZ_SCALE=10 runs ten times as many examples (the default keeps CI under ~20 s)
SCALE = float(os.environ.get("SPECGUARD_FUZZ_SCALE", "1"))


def examples(n: int) -> int:
    return max(10, int(n * SCALE))


FUZZ = settings(
    max_examples=examples(120),
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = sorted((ROOT / "tests" / "fixtures").glob("*.metrics.txt"))

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON-like value (keys and list indexes)."""
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += paths(child, prefix + (index,))
    return out


def mutate(data: st.DataObject, value: Any) -> Any:
    """Replace one node of ``value`` (or delete a key) with generated JSON."""
    value = copy.deepcopy(value)
    where = data.draw(st.sampled_from(paths(value)[1:] or [()]))
    if not where:
        return data.draw(json_values)
    parent = value
    for step in where[:-1]:
        parent = parent[step]
    if isinstance(parent, dict) and data.draw(st.booleans()):
        del parent[where[-1]]
    else:
        parent[where[-1]] = data.draw(json_values)
    return value


# ------------------------------------------------------------------ metrics pages
def _page_lines():
    lines = []
    for path in FIXTURES:
        lines += path.read_text().splitlines()
    return lines


PAGE_LINES = _page_lines()


def check_page(text: str | bytes) -> None:
    try:
        page = promtext.parse(text, "fuzz.txt")
    except InputError as exc:
        assert str(exc).startswith("fuzz.txt"), str(exc)
        return
    for engine in ("auto", "vllm", "sglang", "trtllm", "llamacpp", "tgi"):
        try:
            engines.snapshot(page, engine)
        except InputError as exc:
            assert str(exc), engine


@FUZZ
@given(st.text(max_size=400) | st.binary(max_size=400))
def test_metrics_parser_on_noise(text):
    check_page(text)


@FUZZ
@given(st.data())
def test_metrics_parser_on_mutated_real_pages(data):
    """Real fixture lines, shuffled, truncated and with characters replaced."""
    lines = data.draw(st.lists(st.sampled_from(PAGE_LINES), min_size=1, max_size=30))
    if data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(lines) - 1))
        line = lines[index]
        cut = data.draw(st.integers(0, len(line)))
        noise = data.draw(
            st.sampled_from(["", "{", "}", '"', "\\", "=", " ", "NaN", "+Inf", "\x00", "é", "1e999"])
        )
        lines[index] = line[:cut] + noise + line[cut + 1 :]
    check_page("\n".join(lines) + data.draw(st.sampled_from(["", "\n", "\n# EOF\n"])))


# ------------------------------------------------------------------ per-request fields, every engine
VLLM_SPEC = {
    "mean_acceptance_length": 2.5,
    "draft_acceptance_rate": 0.5,
    "acceptance_histogram": [14, 12, 9, 15],
    "num_spec_steps": 50,
    "num_accepted_draft_tokens": 75,
    "num_draft_tokens": 150,
    "num_spec_tokens": 3,
}
SGLANG_DETAILS = {
    "spec_accept_rate": 0.5,
    "spec_accept_length": 2.52,
    "spec_num_correct_drafts": 75,
    "spec_num_proposed_drafts": 150,
    "spec_verify_ct": 50,
    "spec_correct_drafts_histogram": [14, 12, 9, 15],
}
VALID = {
    "vllm": {
        "choices": [{"index": 0, "message": {"content": "x"}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 126},
        "metrics": {"speculative_decoding": VLLM_SPEC},
    },
    "sglang": {
        "choices": [{}],
        "usage": {"completion_tokens": 126},
        "sglext": {"spec_tokens_details": SGLANG_DETAILS},
        "meta_info": {**SGLANG_DETAILS, "completion_tokens": 126},
    },
    "llamacpp": {
        "choices": [{}],
        "timings": {"prompt_n": 4, "predicted_n": 665, "draft_n": 604, "draft_n_accepted": 515},
    },
    "trtllm": {"choices": [{}], "usage": {"completion_tokens": 5}},
    "tgi": {"generated_text": "x", "details": {"generated_tokens": 5}},
}
ENGINES = sorted(VALID)


def check_stats(engine: str, body: Any) -> None:
    try:
        stats = engines.request_stats(engine, body)
    except InputError as exc:
        assert str(exc)
        return
    assert stats is None or isinstance(stats, SpecStats)
    if stats is not None:
        for name in ("rounds", "draft_tokens", "accepted_tokens"):
            value = getattr(stats, name)
            assert value is None or (isinstance(value, int) and value >= 0), (name, value)
    # the tap's own entry point never raises for any body
    spec = tapstream.spec_from(engine, body if isinstance(body, dict) else {}, 4)
    assert spec is None or isinstance(spec, SpecStats)


def test_valid_bodies_give_stats():
    assert engines.request_stats("vllm", VALID["vllm"]).rounds == 50
    assert engines.request_stats("sglang", VALID["sglang"]).rounds == 50
    assert engines.request_stats("llamacpp", VALID["llamacpp"]) is not None


@FUZZ
@given(st.sampled_from(ENGINES), st.data())
def test_request_fields_on_mutated_bodies(engine, data):
    check_stats(engine, mutate(data, VALID[engine]))


@FUZZ
@given(st.sampled_from(ENGINES), json_values)
def test_request_fields_on_any_json(engine, body):
    check_stats(engine, body)


# ------------------------------------------------------------------ the tap's stream relay
class LiveTap:
    """A real tap (Monitor) in front of a scripted SSE upstream, on a loop in its own thread.

    Pool ``v`` speaks vLLM, pool ``s`` SGLang; ``x-task-type: code`` goes to ``v``, ``chat`` to ``s``.
    Each request streams the chunks registered under its ``x-fuzz`` id, with a pause between them.
    """

    def __init__(self):
        self.scripts: dict[str, list[bytes]] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-tap", daemon=True)
        self.thread.start()
        self._call(self._start())

    def _call(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _sse(self, request):
        await request.read()
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for chunk in self.scripts.pop(request.headers["x-fuzz"]):
            await out.write(chunk)
            await asyncio.sleep(0)
        await out.write_eof()
        return out

    async def _start(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._sse)
        self.servers = [TestServer(app, host="127.0.0.1"), TestServer(app, host="127.0.0.1")]
        for server in self.servers:
            await server.start_server()
        urls = {
            "v": f"http://127.0.0.1:{self.servers[0].port}",
            "s": f"http://127.0.0.1:{self.servers[1].port}",
        }
        cfg = relkit.monitor_config(
            {"v": urls["v"], "s": urls["s"]},
            extra="tap: {holdout_share: 0, probe_share: 0}\n",
            k={"v": 4, "s": 4},
        )
        text = "\n".join(
            f'  - {{name: {n}, url: "{u}", engine: {e}, num_speculative_tokens: 4}}'
            for n, u, e in (("v", urls["v"], "vllm"), ("s", urls["s"], "sglang"))
        )
        text += f'\n  - {{name: n, url: "{urls["v"]}", engine: vllm, num_speculative_tokens: 0}}'
        cfg = config.parse_text(
            f"pools:\n{text}\ntap: {{holdout_share: 0, probe_share: 0}}\n"
            "scrape: {interval_seconds: 3600}\n",
            "fuzz.yaml",
        )
        self.monitor = Monitor(cfg)
        self.monitor.router.set_plan(
            {("code", "greedy", b): "v" for b in ("low", "medium", "high")}
            | {("chat", "greedy", b): "s" for b in ("low", "medium", "high")}
        )
        self.url = await self.monitor.start("127.0.0.1", 0)
        self.session = aiohttp.ClientSession()

    async def _request(self, chunks, engine, client_asks_usage):
        ident = str(len(self.scripts)) + "-" + str(id(chunks))
        self.scripts[ident] = chunks
        body = {
            "model": "m",
            "stream": True,
            "temperature": 0.0,
            "messages": [{"role": "user", "content": "x"}],
        }
        if client_asks_usage:
            body["stream_options"] = {"include_usage": True}
            if engine == "sglang":
                body["return_spec_tokens_details"] = True
        headers = {"x-fuzz": ident, "x-task-type": "code" if engine == "vllm" else "chat"}
        async with self.session.post(f"{self.url}/v1/chat/completions", json=body, headers=headers) as resp:
            return resp.status, await resp.read()

    def request(self, chunks, engine, client_asks_usage):
        return self._call(self._request(chunks, engine, client_asks_usage))

    async def _stop(self):
        await self.session.close()
        await self.monitor.stop()
        for server in self.servers:
            await server.close()

    def close(self):
        self._call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def live_tap():
    tap = LiveTap()
    try:
        yield tap
    finally:
        tap.close()


EVENTS = [
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
    b'data: {"choices":[],"usage":{"completion_tokens":3},"metrics":{"speculative_decoding":'
    + json.dumps(VLLM_SPEC).encode()
    + b"}}\n\n",
    b'data: {"choices":[{"delta":{}}],"sglext":{"spec_tokens_details":'
    + json.dumps(SGLANG_DETAILS).encode()
    + b"}}\n\n",
    b"data: [DONE]\n\n",
    b": keep-alive\r\n\r\n",
    b'data: {"choices":[{"text":"\\u00e9"}],"usage":null}\n\n',
    b"event: x\ndata: {not json\n\n",
]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


STREAM_FUZZ = settings(FUZZ, max_examples=examples(60))
STREAM = (  # the engine's events (or any bytes), where the stream is cut, the engine
    st.lists(st.sampled_from(EVENTS) | st.binary(max_size=40), max_size=8),
    st.lists(st.integers(0, 10_000), max_size=6),
    st.sampled_from(["vllm", "sglang"]),
)


@STREAM_FUZZ
@given(*STREAM)
def test_stream_relay_is_transparent(live_tap, events, cuts, engine):
    """Whatever bytes the engine streams, in whatever pieces: a client that asked for everything
    the tap needs gets exactly those bytes through the real tap."""
    data = b"".join(events)
    status, sent = live_tap.request(split(data, cuts), engine, client_asks_usage=True)
    assert status == 200 and sent == data


@STREAM_FUZZ
@given(*STREAM)
def test_stream_relay_with_additions_never_breaks_the_stream(live_tap, events, cuts, engine):
    """When the tap added usage/spec details, it removes only those; the rest goes through."""
    data = b"".join(events)
    status, sent = live_tap.request(split(data, cuts), engine, client_asks_usage=False)
    assert status == 200 and len(sent) <= len(data)
    assert sent.count(EVENTS[0]) >= min(1, data.count(EVENTS[0])) or EVENTS[0] not in data
    assert sent.count(b"[DONE]") == data.count(b"[DONE]")


@settings(FUZZ, max_examples=examples(80))
@given(
    st.text(min_size=1, max_size=6),
    json_values,
    st.dictionaries(st.text(max_size=6), json_values, max_size=3),
)
def test_remove_key_keeps_every_other_byte(key, value, obj):
    obj[key] = value
    raw = json.dumps(obj, allow_nan=True).encode()
    cut = tapstream.remove_key(raw, key)
    expected = dict(obj)
    del expected[key]
    assert _same(json.loads(cut), expected)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# ------------------------------------------------------------------ config loaders
DEFAULT_TEXT = config.DEFAULT_CONFIG.read_text()
DEFAULT_DATA = yaml.safe_load(DEFAULT_TEXT)
SECTIONS = ["pools", "classes", "tap", "scrape", "guard", "server", "actuators", "alertmanager", "cost"]


def check_config(text: str) -> None:
    try:
        config.parse_text(text, "fuzz.yaml")
    except ConfigError as exc:
        assert exc.issues
        for issue in exc.issues:
            assert issue.file == "fuzz.yaml" and issue.message, issue
            # it says where: a key path, a line, or (PyYAML reader errors) a character position
            assert issue.path or issue.line is not None or "position" in issue.message, issue


CONFIG_FUZZ = settings(FUZZ, max_examples=examples(40))


@CONFIG_FUZZ
@given(st.text(max_size=300))
def test_config_loader_on_noise(text):
    try:
        configfile.parse_text(text, "fuzz.yaml")
    except ConfigError as exc:
        assert all(issue.file == "fuzz.yaml" for issue in exc.issues)
    check_config(text)


@CONFIG_FUZZ
@given(st.data())
def test_config_loader_on_mutated_default(data):
    """The shipped config with one value replaced or one key removed, anywhere in it."""
    check_config(yaml.safe_dump(mutate(data, DEFAULT_DATA), allow_unicode=True))


@CONFIG_FUZZ
@given(st.dictionaries(st.sampled_from(SECTIONS) | st.text(max_size=8), json_values, max_size=5))
def test_config_loader_on_random_sections(doc):
    check_config(yaml.safe_dump(doc, allow_unicode=True))


# ------------------------------------------------------------------ Alertmanager payloads
VALID_ALERT = {
    "version": "4",
    "groupKey": "{}:{}",
    "truncatedAlerts": 0,
    "status": "firing",
    "receiver": "specguard",
    "groupLabels": {},
    "commonLabels": {"task_type": "creative"},
    "commonAnnotations": {},
    "externalURL": "http://alertmanager",
    "alerts": [
        {
            "status": "firing",
            "labels": {
                "alertname": "SpecGuardRelativeCostAboveOne",
                "task_type": "creative",
                "pool": "spec-k4",
            },
            "annotations": {"summary": "x"},
            "startsAt": "2026-11-29T10:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "",
            "fingerprint": "abc",
        }
    ],
}


def check_alerts(payload: Any) -> None:
    try:
        records = receiver.parse_alertmanager(payload, 1.0)
    except InputError as exc:
        assert str(exc)
        return
    assert all(r.status in ("firing", "resolved") and isinstance(r.fingerprint, str) for r in records)
    from specguard.rules.evidence import AlertBook

    book = AlertBook()
    for record in records:
        book.ingest(record)
    book.for_class(("creative", "high", "low"))


@FUZZ
@given(st.data())
def test_webhook_parser_on_mutated_payloads(data):
    check_alerts(mutate(data, VALID_ALERT))


@FUZZ
@given(json_values)
def test_webhook_parser_on_any_json(payload):
    check_alerts(payload)
