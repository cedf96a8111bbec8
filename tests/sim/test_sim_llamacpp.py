"""The simulator's llama.cpp dialect speaks what llama-server build 11434 speaks: its /metrics page
(names, labels, HELP, TYPE, order, number format) and its responses (keys, value types, the
``timings`` fields, where a stream puts them), checked against pages and responses captured from
the real server (tests/llamacpp/capture.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest

from specguard.exporters import derive, engines
from specguard.sim import cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = {
    name: (FIXTURES / f"llamacpp-11434-{name}.metrics.txt").read_text()
    for name in ("draft-k4-fresh", "draft-k4", "ngram-k8", "nospec")
}
RESPONSES = json.loads((FIXTURES / "llamacpp-11434-responses.json").read_text())
COPY = "Copy this exactly: the quick brown fox jumps over the lazy dog."


def structure(text: str) -> list[str]:
    """A page's lines with every sample value replaced: names, labels, HELP and TYPE, in order."""
    return [
        line if line.startswith("#") else re.sub(r" \S+$", " <value>", line) for line in text.splitlines()
    ]


def shape(value):
    """A JSON value's keys (in order) and value types, recursively: what must match; the numbers
    and the text may not."""
    if isinstance(value, dict):
        return tuple((k, shape(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(shape(v) for v in value[:1])
    return type(value).__name__


def events(sse: str) -> list[dict | str]:
    out: list[dict | str] = []
    for block in sse.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture
async def sim():
    async with cluster.SimCluster.from_config(None, seed=0, dialect="llamacpp", time_scale=0.02) as running:
        yield running


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        return await response.text()


async def _post(url: str, body: dict) -> tuple[str, str]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        return await response.text(), response.headers["Content-Type"]


async def test_the_metrics_page_has_the_real_names_labels_help_type_and_order(sim):
    fresh = await _get(sim.urls["spec-k4"] + "/metrics")
    # before anything was drafted: the real fresh page, line for line but the values
    assert structure(fresh) == structure(REAL["draft-k4-fresh"])
    for url in (sim.urls["spec-k4"], sim.urls["nospec"]):
        await _post(
            url + "/v1/chat/completions", {"messages": [{"role": "user", "content": COPY}], "max_tokens": 16}
        )
    spec = await _get(sim.urls["spec-k4"] + "/metrics")
    assert structure(spec) == structure(REAL["draft-k4"])
    assert structure(await _get(sim.urls["nospec"] + "/metrics")) == structure(REAL["nospec"])
    # numbers as a C++ stream prints a double: integers without a point, 6 significant digits
    for page in (spec, REAL["draft-k4"]):
        for line in page.splitlines():
            if not line.startswith("#"):
                assert re.fullmatch(r"\S+ (0|-?\d{1,6}|-?\d+\.\d+|-?\d(\.\d+)?e[+-]\d\d)", line), line
    # and specguard reads both the same way
    for sim_page, real_page in ((spec, REAL["draft-k4"]), (fresh, REAL["draft-k4-fresh"])):
        ours, theirs = (
            derive.derive(engines.parse_snapshot(sim_page)),
            derive.derive(engines.parse_snapshot(real_page)),
        )
        assert (ours.speculation_enabled, ours.num_speculative_tokens) == (
            theirs.speculation_enabled,
            theirs.num_speculative_tokens,
        )


async def test_non_streamed_responses_have_the_real_keys_and_timings(sim):
    chat = {"messages": [{"role": "user", "content": COPY}], "max_tokens": 16, "temperature": 0}
    for pool, real in (("spec-k4", "draft-k4"), ("nospec", "nospec")):
        text, content_type = await _post(sim.urls[pool] + "/v1/chat/completions", chat)
        assert content_type.startswith("application/json")
        ours, theirs = json.loads(text), json.loads(RESPONSES[real]["chat-greedy"])
        assert shape(ours) == shape(theirs), pool
        assert text == json.dumps(ours, separators=(",", ":"))  # no spaces, as the server writes it
        assert ("draft_n" in ours["timings"]) == ("draft_n" in theirs["timings"]) == (pool == "spec-k4")
        assert ours["system_fingerprint"] == theirs["system_fingerprint"]
    text, _ = await _post(sim.urls["spec-k4"] + "/v1/completions", {"prompt": COPY, "max_tokens": 16})
    assert shape(json.loads(text)) == shape(json.loads(RESPONSES["draft-k4"]["completion-greedy"]))


@pytest.mark.parametrize(
    ("kind", "path", "extra"),
    [
        ("chat-greedy-stream-usage", "/v1/chat/completions", {"stream_options": {"include_usage": True}}),
        ("chat-sampled-stream", "/v1/chat/completions", {}),
        ("completion-greedy-stream-usage", "/v1/completions", {"stream_options": {"include_usage": True}}),
    ],
)
async def test_streams_send_one_chunk_per_token_and_timings_on_the_last(sim, kind, path, extra):
    body = {"max_tokens": 12, "temperature": 0, "stream": True, **extra}
    body.update({"messages": [{"role": "user", "content": COPY}]} if "chat" in path else {"prompt": COPY})
    text, content_type = await _post(sim.urls["spec-k4"] + path, body)
    assert content_type.startswith("text/event-stream")
    ours, theirs = events(text), events(RESPONSES["draft-k4"][kind])
    assert ours[-1] == theirs[-1] == "[DONE]"
    ours, theirs = ours[:-1], theirs[:-1]

    # the same sequence of chunk shapes, envelope and key order included: the opening (role)
    # chunk, token chunks, the finish chunk, the usage chunk
    ours_shapes, theirs_shapes = [shape(c) for c in ours], [shape(c) for c in theirs]
    assert ours_shapes[:2] == theirs_shapes[:2] and ours_shapes[-2:] == theirs_shapes[-2:], kind
    assert set(ours_shapes[2:-2]) == set(theirs_shapes[2:-2]), kind
    assert shape(ours[-1]) == shape(theirs[-1])
    tokens = sum(
        1
        for c in ours
        if c["choices"] and (c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text"))
    )
    assert tokens == ours[-1]["timings"]["predicted_n"] == 12


async def test_errors_use_the_llamacpp_envelope(sim):
    async with aiohttp.ClientSession() as session:
        async with session.post(
            sim.urls["nospec"] + "/v1/completions", json={"prompt": "x", "n": 2}
        ) as response:
            assert response.status == 400
            body = await response.json()
    assert body == {
        "error": {
            "code": 400,
            "message": "Only one completion choice is allowed",
            "type": "invalid_request_error",
        }
    }
