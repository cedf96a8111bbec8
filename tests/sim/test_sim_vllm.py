"""The simulator's vLLM dialect over real HTTP: /metrics vs truth, OpenAI client, errors, streams."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import aiohttp
import openai
import pytest

from specguard.exporters import engines
from specguard.lab import loadgen
from specguard.sim import cluster
from specguard.sim import config as simconfig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu-ngram-k4.metrics.txt"
MIX = [
    loadgen.RequestClass("code", temperature=0.0, max_tokens=48),
    loadgen.RequestClass("creative", temperature=1.0, max_tokens=48),
    loadgen.RequestClass("chat", temperature=0.7, max_tokens=48, chat=False),
]


@pytest.fixture
async def sim():
    async with cluster.SimCluster.from_config(None, seed=0, time_scale=0.05) as running:
        yield running


async def until_aborted(sim: cluster.SimCluster) -> None:
    """Wait for spec-k4 to count an aborted request: a deadline of 20 s for a loaded machine, not
    a timing assertion (the test asserts the count)."""
    for _ in range(2000):
        if sim.truth()["pools"]["spec-k4"]["totals"]["requests_aborted"]:
            return
        await asyncio.sleep(0.01)


async def page(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return await response.text()


def headers_of(text: str) -> dict[str, tuple[str, str]]:
    """family -> (TYPE, HELP) for every vllm: family (model name normalised)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"# (HELP|TYPE) (vllm:\S+) ?(.*)", line)
        if match:
            out.setdefault(match.group(2), ["", ""])[0 if match.group(1) == "TYPE" else 1] = match.group(3)
    return {name: (kind, doc) for name, (kind, doc) in out.items()}


async def test_metrics_page_has_vllms_families_types_help_and_buckets(sim):
    async with aiohttp.ClientSession() as session:
        text = await page(session, sim.urls["spec-k4"])
    real = FIXTURE.read_text()
    assert headers_of(text) == headers_of(real)
    for family in (
        "vllm:inter_token_latency_seconds",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:iteration_tokens_total",
        "vllm:request_params_n",
    ):
        pattern = re.compile(re.escape(family) + r'_bucket\{[^}]*le="([^"]+)"')
        assert pattern.findall(text) == pattern.findall(real), family
    assert 'vllm:spec_decode_num_drafts_total{engine="0",model_name="sim-llama-3.1-8b"} 0.0' in text
    assert "vllm:spec_decode_num_drafts_created{" in text
    assert len(re.findall(r"vllm:spec_decode_num_accepted_tokens_per_pos_total\{", text)) == 4


async def test_nospec_pool_exposes_no_spec_families(sim):
    async with aiohttp.ClientSession() as session:
        await loadgen.run_load(sim.urls["nospec"], MIX, concurrency=2, requests=3, session=session)
        text = await page(session, sim.urls["nospec"])
    assert "spec_decode" not in text
    assert headers_of(text) == headers_of(FIXTURE.with_name("vllm-0.32-cpu-nospec.metrics.txt").read_text())
    snap = engines.parse_snapshot(text)
    assert snap.engine == "vllm" and snap.speculation_enabled is False and snap.drafts is None
    assert snap.generation_tokens and snap.generation_tokens > 0


async def test_metrics_through_the_adapter_reproduce_truth_over_a_window(sim):
    url = sim.urls["spec-k4"]
    async with aiohttp.ClientSession() as session:
        await loadgen.run_load(url, MIX, concurrency=4, requests=6, stream=True, session=session)
        before = engines.parse_snapshot(await page(session, url))
        truth_before = sim.truth()["pools"]["spec-k4"]["totals"]
        results = await loadgen.run_load(
            url, MIX, concurrency=8, requests=40, stream=True, seed=3, session=session
        )
        after = engines.parse_snapshot(await page(session, url))
        truth_after = sim.truth()["pools"]["spec-k4"]["totals"]
    assert all(r.ok for r in results)

    def delta(key):
        return truth_after[key] - truth_before[key]

    assert after.drafts - before.drafts == delta("drafts")
    assert after.draft_tokens - before.draft_tokens == delta("draft_tokens")
    assert after.accepted_tokens - before.accepted_tokens == delta("accepted_tokens")
    assert after.generation_tokens - before.generation_tokens == delta("generation_tokens")
    per_pos = [a - b for a, b in zip(after.accepted_per_position, before.accepted_per_position, strict=True)]
    assert per_pos == [
        x - y
        for x, y in zip(
            truth_after["accepted_per_position"], truth_before["accepted_per_position"], strict=True
        )
    ]
    assert after.num_speculative_tokens == 4
    # the per-request fields (final usage chunk of each stream) add up to the same window
    stats = [engines.request_stats("vllm", {"metrics": {"speculative_decoding": r.spec}}) for r in results]
    assert sum(s.rounds for s in stats) == delta("drafts")
    assert sum(s.accepted_tokens for s in stats) == delta("accepted_tokens")
    assert sum(r.output_tokens for r in results) == delta("generation_tokens")
    # ITL: one sample per running request per step after its first token
    assert after.step_latency.count - before.step_latency.count == delta("drafts")


async def test_truth_endpoint_matches_in_process_truth(sim):
    async with aiohttp.ClientSession() as session:
        await loadgen.run_load(sim.urls["spec-k2"], MIX, concurrency=2, requests=4, session=session)
        async with session.get(sim.urls["nospec"] + "/sim/truth") as response:
            served = await response.json()
    local = sim.truth()
    assert served["pools"]["spec-k2"]["totals"] == local["pools"]["spec-k2"]["totals"]
    assert served["pools"]["spec-k2"]["totals"]["requests_finished"] == 4
    assert served["model"]["classes"]["creative@1"]["pools"]["spec-k4"]["relative_cost"]["1"] > 1.0


async def test_openai_client_streaming_and_not(sim):
    client = openai.AsyncOpenAI(base_url=sim.urls["spec-k4"] + "/v1", api_key="none", max_retries=0)
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["sim-llama-3.1-8b"]
        chat = await client.chat.completions.create(
            model="sim-llama-3.1-8b",
            messages=[{"role": "user", "content": "write a sort"}],
            max_tokens=20,
            temperature=0,
            extra_headers={"x-task-type": "code"},
        )
        assert chat.choices[0].message.content and chat.usage.completion_tokens <= 20
        spec = chat.model_extra["metrics"]["speculative_decoding"]
        assert spec["num_spec_tokens"] == 4 and len(spec["acceptance_histogram"]) == 5
        completion = await client.completions.create(model="sim-llama-3.1-8b", prompt="hello", max_tokens=12)
        assert completion.usage.completion_tokens == len(completion.choices[0].text.split()) <= 12
        stream = await client.chat.completions.create(
            model="sim-llama-3.1-8b",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=30,
            stream=True,
            stream_options={"include_usage": True},
            temperature=0.7,
        )
        chunks = [chunk async for chunk in stream]
    finally:
        await client.close()
    final = chunks[-1]
    assert final.choices == [] and final.usage.completion_tokens <= 30
    spec = final.model_extra["metrics"]["speculative_decoding"]
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    # one chunk per engine step: the prefill step plus one per verify round
    assert len(content) == spec["num_spec_steps"] + 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all("metrics" not in (c.model_extra or {}) for c in chunks[:-1])


async def test_stream_without_usage_carries_no_metrics_and_n2_has_null_metrics(sim):
    url = sim.urls["spec-k4"]
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "x", "max_tokens": 8, "stream": True}
        async with session.post(url + "/v1/completions", json=body) as response:
            text = await response.text()
        assert "usage" not in text and "metrics" not in text and text.endswith("data: [DONE]\n\n")
        async with session.post(
            url + "/v1/completions", json={"prompt": "x", "max_tokens": 8, "n": 2}
        ) as response:
            payload = await response.json()
        assert payload["metrics"] is None and [c["index"] for c in payload["choices"]] == [0, 1]
        assert payload["usage"]["completion_tokens"] == sum(
            len(c["text"].split()) for c in payload["choices"]
        )


@pytest.mark.parametrize(
    "body,status,err_type,param",
    [
        (b"{not json", 400, "BadRequestError", None),
        (b'{"model": "gpt-9", "prompt": "x"}', 404, "NotFoundError", "model"),
        (b'{"prompt": "x", "max_tokens": 0}', 400, "BadRequestError", "max_tokens"),
        (b'{"prompt": "x", "temperature": -1}', 400, "BadRequestError", "temperature"),
        (b'{"max_tokens": 5}', 400, "BadRequestError", "prompt"),
        (b'{"prompt": "x", "max_tokens": 99999}', 400, "BadRequestError", "max_tokens"),
    ],
)
async def test_bad_requests_get_vllms_error_envelope(sim, body, status, err_type, param):
    async with aiohttp.ClientSession() as session:
        async with session.post(
            sim.urls["spec-k4"] + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        ) as response:
            assert response.status == status
            payload = await response.json()
    assert set(payload) == {"error"}
    assert payload["error"]["type"] == err_type and payload["error"]["code"] == status
    assert payload["error"]["param"] == param and payload["error"]["message"]


async def test_task_type_from_header_or_metadata_and_default_temperature(sim):
    url = sim.urls["spec-k2"]
    async with aiohttp.ClientSession() as session:
        await session.post(
            url + "/v1/completions", json={"prompt": "a", "max_tokens": 4}, headers={"x-task-type": "code"}
        )
        await session.post(
            url + "/v1/completions",
            json={"prompt": "b", "max_tokens": 4, "metadata": {"task": "extraction"}, "temperature": 0},
        )
        await session.post(url + "/v1/completions", json={"prompt": "c", "max_tokens": 4, "temperature": 0.3})
    classes = set(sim.truth()["pools"]["spec-k2"]["classes"])
    assert classes == {"code@1", "extraction@0", "chat@0.3"}


async def test_same_seed_same_requests_same_results():
    async def one_run():
        async with cluster.SimCluster.from_config(None, seed=7, time_scale=0.05, pools=["spec-k4"]) as sim:
            results = await loadgen.run_load(sim.urls["spec-k4"], MIX, concurrency=4, requests=12, seed=5)
            return [(r.task_type, r.output_tokens, r.spec["acceptance_histogram"]) for r in results]

    assert await one_run() == await one_run()


async def test_client_disconnect_aborts_the_request():
    # real time (time_scale 1): the 400 tokens take seconds, so the stream is still writing when the
    # client leaves, however loaded the machine (at 0.05 a starved run finished it first)
    async with cluster.SimCluster.from_config(None, seed=0, time_scale=1.0) as sim:
        url = sim.urls["spec-k4"]
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "long", "max_tokens": 400, "stream": True, "ignore_eos": True}
            async with session.post(url + "/v1/completions", json=body) as response:
                await response.content.readline()  # first chunk arrived: the request is running
            await until_aborted(sim)
            text = await page(session, url)
        totals = sim.truth()["pools"]["spec-k4"]["totals"]
        assert totals["requests_aborted"] == 1 and totals["requests_finished"] == 0
        assert (
            'vllm:request_success_total{engine="0",finished_reason="abort",model_name="sim-llama-3.1-8b"} 1.0'
            in text
        )
        assert sim.runtimes["spec-k4"].engine.idle


async def test_unknown_route_answers_like_fastapi_and_health_works(sim):
    async with aiohttp.ClientSession() as session:
        async with session.get(sim.urls["nospec"] + "/v1/nothing") as response:
            assert response.status == 404 and await response.json() == {"detail": "Not Found"}
        async with session.get(sim.urls["nospec"] + "/v1/completions") as response:
            assert response.status == 405
        async with session.get(sim.urls["nospec"] + "/health") as response:
            assert response.status == 200
    assert (
        sim.relative_cost("creative", 1.0, "spec-k4", 1) > 1.0 > sim.relative_cost("code", 0.0, "spec-k2", 1)
    )
    assert sim.relative_cost("code", 0.0, "nospec", 1) == 1.0


async def test_stop_string_finish_has_no_metrics_but_counts_on_the_page(sim):
    url = sim.urls["spec-k4"]
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "q", "max_tokens": 2000, "stop": ["\n\n"], "temperature": 0}
        async with session.post(
            url + "/v1/completions", json=body, headers={"x-task-type": "code"}
        ) as response:
            stopped = await response.json()
        body = {"prompt": "q", "max_tokens": 3, "stop": ["\n\n"], "temperature": 0}
        async with session.post(url + "/v1/completions", json=body) as response:
            truncated = await response.json()
        snap = engines.parse_snapshot(await page(session, url))
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == "\n\n"
    assert stopped["metrics"] is None and engines.missing_reason("vllm", stopped) is not None
    assert truncated["choices"][0]["finish_reason"] == "length" and truncated["metrics"] is not None
    totals = sim.truth()["pools"]["spec-k4"]["totals"]
    assert totals["requests_finished"] == 2 and totals["requests_with_spec_fields"] == 1
    assert snap.drafts == totals["drafts"] > truncated["metrics"]["speculative_decoding"]["num_spec_steps"]


async def test_an_engine_failure_fails_requests_instead_of_hanging(sim, monkeypatch):
    runtime = sim.runtimes["spec-k2"]

    def broken():
        raise ZeroDivisionError("simulated bug")

    monkeypatch.setattr(runtime.engine, "step", broken)
    async with aiohttp.ClientSession() as session:
        async with session.post(sim.urls["spec-k2"] + "/v1/completions", json={"prompt": "x"}) as response:
            assert response.status == 500
        async with session.post(sim.urls["spec-k2"] + "/v1/completions", json={"prompt": "y"}) as response:
            assert response.status == 500
    assert isinstance(runtime.error, ZeroDivisionError)


async def _events(session: aiohttp.ClientSession, url: str, path: str, body: dict) -> list[dict]:
    async with session.post(url + path, json={**body, "stream": True}) as response:
        text = await response.text()
    assert text.endswith("data: [DONE]\n\n")
    return [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]


@pytest.mark.parametrize("mode", ["full", "hash", "none"])
async def test_system_fingerprint_follows_vllms_fingerprint_mode(mode):
    config = simconfig.load().with_overrides(fingerprint_mode=mode)
    async with cluster.SimCluster.from_config(config, seed=0, time_scale=0.01) as sim:
        url = sim.urls["spec-k4"]
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 6}) as r:
                full = await r.json()
            async with session.post(url + "/v1/completions", json={"prompt": "y", "max_tokens": 6}) as r:
                again = await r.json()
            async with session.post(sim.urls["nospec"] + "/v1/completions", json={"prompt": "x"}) as r:
                other = await r.json()
            plain = await _events(
                session,
                url,
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "n": 2},
            )
            usage = await _events(
                session,
                url,
                "/v1/completions",
                {"prompt": "x", "max_tokens": 6, "stream_options": {"include_usage": True}},
            )
    fingerprint = full["system_fingerprint"]
    terminal = [i for i, e in enumerate(plain) if e["choices"][0]["finish_reason"] is not None]
    assert len(terminal) == 2  # one per choice
    stamped = [i for i, e in enumerate(plain) if "system_fingerprint" in e]
    assert all("system_fingerprint" not in e for e in usage[:-1])
    if mode == "none":
        assert fingerprint is None and other["system_fingerprint"] is None
        assert stamped == [] and "system_fingerprint" not in usage[-1]
        return
    assert re.fullmatch(r"vllm-0\.33\.0-[0-9a-f]{8}", fingerprint)
    assert again["system_fingerprint"] == fingerprint != other["system_fingerprint"]
    # Without usage: on each choice's terminal chunk, as its last key; with usage: on the usage
    # chunk only, right after "usage".
    assert stamped == terminal
    assert all(list(plain[i])[-1] == "system_fingerprint" for i in terminal)
    assert {plain[i]["system_fingerprint"] for i in terminal} == {fingerprint}
    assert list(usage[-1])[list(usage[-1]).index("system_fingerprint") - 1] == "usage"
    assert usage[-1]["system_fingerprint"] == fingerprint


async def test_response_keys_where_vllm_puts_them(sim):
    """per_step_* are null on a full response and absent from the stream's usage chunk; a
    completion has prompt_logprobs / prompt_token_ids inside its choices only, a chat at the top."""
    url = sim.urls["spec-k4"]
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 6}) as r:
            completion = await r.json()
        chat_body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
        async with session.post(url + "/v1/chat/completions", json=chat_body) as r:
            chat = await r.json()
        usage = await _events(
            session,
            url,
            "/v1/completions",
            {"prompt": "x", "max_tokens": 6, "stream_options": {"include_usage": True}},
        )
    block = completion["metrics"]["speculative_decoding"]
    assert block["per_step_accepted"] is None and block["per_step_drafted"] is None
    streamed = usage[-1]["metrics"]["speculative_decoding"]
    assert "per_step_accepted" not in streamed and "per_step_drafted" not in streamed
    assert sorted(set(block) - set(streamed)) == ["per_step_accepted", "per_step_drafted"]
    assert "prompt_logprobs" not in completion and "prompt_token_ids" not in completion
    assert completion["choices"][0]["prompt_logprobs"] is None
    assert completion["choices"][0]["prompt_token_ids"] is None
    assert chat["prompt_logprobs"] is None and chat["prompt_token_ids"] is None
    assert "prompt_logprobs" not in chat["choices"][0]


@pytest.mark.parametrize("dialect", ["vllm", "sglang", "llamacpp"])
async def test_a_client_that_leaves_mid_stream_leaves_no_traceback(dialect, caplog):
    """The simulator once printed a full ClientConnectionResetError traceback each time a
    streaming client disconnected."""
    # real time (time_scale 1): the 400 tokens take seconds, so the stream is still writing when the
    # client leaves, however loaded the machine (at 0.05 it could finish first: no abort to count)
    async with cluster.SimCluster.from_config(None, seed=0, time_scale=1.0, dialect=dialect) as running:
        url = running.urls["spec-k4"]
        with caplog.at_level(logging.DEBUG):
            async with aiohttp.ClientSession() as session:
                body = {"prompt": "long", "max_tokens": 400, "stream": True, "ignore_eos": True}
                async with session.post(url + "/v1/completions", json=body) as response:
                    await response.content.readline()
                await until_aborted(running)
                await asyncio.sleep(0.2)  # the write that finds the client gone
    assert running.truth()["pools"]["spec-k4"]["totals"]["requests_aborted"] == 1
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert loud == [], [r.getMessage() for r in loud]
