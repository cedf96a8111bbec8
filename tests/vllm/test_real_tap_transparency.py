"""The tap is transparent to clients of a real vLLM engine, ``system_fingerprint`` included."""

from __future__ import annotations

import json
import random
import re

import aiohttp
import pytest
from tapkit import config_text
from vllmkit import LOOP_PROMPT, MODEL_NAME

from specguard.monitor import config
from specguard.monitor.app import Monitor

pytestmark = pytest.mark.vllm


def normalise(data: bytes) -> bytes:
    """The bytes that legitimately differ between two identical greedy requests.

    ``system_fingerprint`` is compared as is: vLLM puts it on each choice's terminal chunk of a
    stream without usage but on the usage chunk when usage was asked for; the tap asks for usage
    and moves the fingerprint back onto the terminal chunk when it drops that usage chunk.
    """
    data = re.sub(rb'"id": ?"[^"]+"', b'"id":"X"', data)
    return re.sub(rb'"created": ?\d+', b'"created":0', data)


def stream_view(data: bytes) -> dict:
    """What a client reads from a stream, independent of how vLLM grouped tokens into chunks.

    vLLM coalesces the outputs of several engine steps into one chunk when its API server runs
    behind the engine, so two identical greedy requests can be cut into chunks differently.
    """
    events = [line[5:].strip() for line in normalise(data).split(b"\n") if line.startswith(b"data:")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text, keys, finish, fingerprints = {}, set(), [], []
    for chunk in chunks:
        if "system_fingerprint" in chunk:  # where it sits (which chunk, which key), and its value
            where = [c.get("finish_reason") for c in chunk["choices"]] if chunk["choices"] else "usage"
            fingerprints.append((str(where), list(chunk)[-1], chunk["system_fingerprint"]))
        # the fingerprint's placement is compared above; here only the chunk shapes, which must not
        # depend on how many chunks vLLM coalesced (a one-chunk answer has no fingerprint-free chunk)
        top = tuple(sorted(k for k in chunk if k != "system_fingerprint"))
        keys |= {(top, tuple(sorted(c)) if isinstance(c, dict) else ()) for c in chunk["choices"]}
        keys.add((top, None))
        for choice in chunk["choices"]:
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            text[choice.get("index")] = text.get(choice.get("index"), "") + piece
            if choice.get("finish_reason"):
                finish.append(choice["finish_reason"])
    usage = [c for c in chunks if not c["choices"]]
    # n > 1: the choices' chunks may interleave differently, so compare per choice, unordered
    return {
        "text": text,
        "finish": sorted(finish),
        "keys": keys,
        "usage_chunks": usage,
        "fingerprints": sorted(fingerprints),
    }


TRANSPARENCY = [
    pytest.param("/v1/completions", {"stream": True}, id="completions-stream"),
    pytest.param("/v1/chat/completions", {"stream": True}, id="chat-stream"),
    pytest.param(
        "/v1/chat/completions",
        {"stream": True, "stream_options": {"include_usage": True}},
        id="chat-stream-usage",
    ),
    pytest.param("/v1/completions", {}, id="completions"),
    # several sequences: vLLM has no per-request numbers, so the tap asks for nothing (vLLM
    # refuses n > 1 at temperature 0, so these are sampled and their text differs between runs)
    pytest.param("/v1/completions", {"stream": True, "n": 2, "temperature": 0.8}, id="completions-stream-n2"),
]


@pytest.mark.parametrize(("path", "extra"), TRANSPARENCY)
async def test_tap_is_transparent_to_the_client_on_the_real_engine(vllm_engines, path, extra):
    """Greedy requests straight to the engine and through the tap give the client the same thing
    (the same bytes when not streamed; the same text, chunk shapes, finish reason and usage chunk
    when streamed), although the tap asked the engine for a usage chunk the client did not want."""
    cfg = config.parse_text(config_text(vllm_engines, holdout=0.0), "specguard.yaml")
    monitor = Monitor(cfg, rng=random.Random(7))
    url = await monitor.start("127.0.0.1", 0)
    body = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0, **extra}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": LOOP_PROMPT}]
    else:
        body["prompt"] = LOOP_PROMPT
    got = []
    try:
        async with aiohttp.ClientSession() as session:
            for base in (vllm_engines.spec.url, url):
                async with session.post(base + path, json=body, headers={"x-task-type": "code"}) as resp:
                    data = await resp.read()
                    view = stream_view(data) if body.get("stream") else normalise(data)
                    got.append((resp.status, resp.headers.get("Content-Type"), view))
    finally:
        await monitor.stop()
    assert got[0][0] == 200
    if extra.get("n", 1) > 1:  # sampled: the same shapes, fingerprints and finish, not the same text
        for _, _, view in got:
            assert sorted(view.pop("text")) == [0, 1]
    assert got[1] == got[0]
    if body.get("stream"):
        assert len(got[0][2]["usage_chunks"]) == ("stream_options" in extra)
        # vLLM's default --fingerprint-mode full: the fingerprint the client sees survived the tap
        assert got[0][2]["fingerprints"] and got[1][2]["fingerprints"] == got[0][2]["fingerprints"]
    records = monitor.stats.records()
    assert len(records) == 1
    if extra.get("n", 1) > 1:
        assert records[0].spec is None and records[0].unattributed_reason == "n_gt_1"
    else:
        assert records[0].spec is not None and records[0].spec.rounds > 0
