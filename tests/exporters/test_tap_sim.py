"""End to end: load through the tap into the simulator, compared with the simulator's truth.

- per class, the tap's counts equal what the engine really did (``/sim/truth``), and the
  measured ratios are within sampling tolerance of the model's expectation;
- per pool, the per-class sums equal the engine's own /metrics counter deltas exactly
  (scraped through the adapters), when every request was attributed;
- transparency: the same request to an identically seeded simulator directly and through the
  tap gives the same chunk sequence (only the random ``id`` and the ``created`` second differ).
"""

from __future__ import annotations

import asyncio
import json
import random
import re

import aiohttp
import pytest

from specguard.lab import loadgen
from specguard.monitor import config
from specguard.monitor.app import Monitor
from specguard.sim import cluster

DIALECTS = ["vllm", "sglang", "llamacpp"]
K = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
TIME_SCALE = 0.005
MIX = [
    loadgen.RequestClass("code", temperature=0.0),
    loadgen.RequestClass("creative", temperature=1.0, chat=False),
    loadgen.RequestClass("chat", temperature=0.7),
]
BUCKET = {0.0: "greedy", 0.7: "medium", 1.0: "high"}
POOL_OF = {"code": "spec-k4", "creative": "spec-k4", "chat": "spec-k2"}  # the plan under test


def monitor_for(sim: cluster.SimCluster, dialect: str, shares: str) -> Monitor:
    pools = "\n".join(
        f'  - {{name: {name}, url: "{url}", engine: {dialect}, num_speculative_tokens: {K[name]}}}'
        for name, url in sim.urls.items()
    )
    cfg = config.parse_text(f"pools:\n{pools}\ntap: {{{shares}}}\nscrape: {{interval_seconds: 3600}}\n")
    return Monitor(cfg, rng=random.Random(3))


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_per_class_numbers_match_truth_and_engine_counters(dialect):
    async with cluster.SimCluster.from_config(None, seed=0, dialect=dialect, time_scale=TIME_SCALE) as sim:
        monitor = monitor_for(sim, dialect, "holdout_share: 0.1, probe_share: 0")
        monitor.router.set_plan({("chat", "medium", load): "spec-k2" for load in ("low", "medium", "high")})
        url = await monitor.start("127.0.0.1", 0)
        try:
            for loop in monitor.loops:
                assert await loop.scrape_once(), loop.watch.last_error
            results = await loadgen.run_load(
                url, MIX, 16, requests=240, stream=True, include_usage=False, seed=1
            )
            results += await loadgen.run_load(
                url, MIX, 16, requests=60, stream=True, include_usage=True, seed=2
            )
            results += await loadgen.run_load(url, MIX, 16, requests=90, stream=False, seed=3)
            assert {r.status for r in results} == {200}
            for loop in monitor.loops:
                assert await loop.scrape_once(), loop.watch.last_error
            truth = sim.truth()
        finally:
            await monitor.stop()

    assert monitor.stats.unattributed() == {}
    totals = monitor.stats.totals()
    # 1. per pool: sums over classes == the engine's own counter deltas, exactly
    for pool in K:
        mine = [t for key, t in totals.items() if key[0] == pool]
        view = monitor.watches[pool].view()
        engine, has = view["accumulated"], view["has"]
        assert sum(t.output_tokens for t in mine) == engine["generation_tokens"] > 0
        if K[pool] and dialect == "llamacpp":
            # llama.cpp reports drafted and accepted tokens per request, rounds only on its page
            assert engine["drafts"] > 0 and sum(t.verify_rounds for t in mine) == 0
            assert sum(t.draft_tokens for t in mine) == engine["draft_tokens"] > 0
            assert sum(t.accepted_tokens for t in mine) == engine["accepted_tokens"]
        elif K[pool]:
            assert sum(t.verify_rounds for t in mine) == engine["drafts"] > 0
            # SGLang exports no draft/accepted counters (only window gauges): nothing to compare
            assert has["draft_tokens"] == has["accepted_tokens"] == (dialect == "vllm")
            if dialect == "vllm":
                assert sum(t.draft_tokens for t in mine) == engine["draft_tokens"]
                assert sum(t.accepted_tokens for t in mine) == engine["accepted_tokens"]
    holdout = sum(t.requests for key, t in totals.items() if key[0] == "nospec")
    assert 0.05 * len(results) < holdout < 0.16 * len(results)

    # 2. per class on its planned pool: equal to the truth's counts, close to the model's rates
    for cls in MIX:
        key = f"{cls.task_type}@{cls.temperature:g}"
        pool = POOL_OF[cls.task_type]
        real = truth["pools"][pool]["classes"][key]
        model = truth["model"]["classes"][key]["pools"][pool]
        mine = [
            t
            for k, t in totals.items()
            if k[0] == pool and k[1] == cls.task_type and k[2] == BUCKET[cls.temperature]
        ]
        rounds = sum(t.verify_rounds for t in mine)
        accepted = sum(t.accepted_tokens for t in mine)
        drafts = sum(t.draft_tokens for t in mine)
        rollbacks = sum(t.full_rollback_rounds for t in mine)
        assert sum(t.requests for t in mine) == real["requests"]
        assert accepted == real["accepted_tokens"]
        assert drafts == real["draft_tokens"]
        assert accepted / drafts == pytest.approx(model["strict_accept_rate"], abs=0.06)
        if dialect == "llamacpp":  # no rounds per request: no per-class rollbacks or positions
            assert rounds == rollbacks == 0
            continue
        assert rounds == real["verify_rounds"]
        assert rollbacks == real["full_rollback_rounds"]
        assert sum(t.full_rollback_requests for t in mine) == real["full_rollback_requests"]
        assert rollbacks / rounds == pytest.approx(model["full_rollback_round_ratio"], abs=0.06)
        per_position = [0] * K[pool]
        for t in mine:
            for i, value in enumerate(t.accepted_per_position):
                per_position[i] += value
        assert per_position == real["per_position_accepted"]


def normalise(data: bytes) -> bytes:
    """The only bytes that legitimately differ between two identical requests (llama.cpp's
    ``timings`` carry wall-clock durations)."""
    data = re.sub(rb'"id": ?"[^"]+"', b'"id":"X"', data)
    data = re.sub(rb'"((?:prompt|predicted)_(?:ms|per_token_ms|per_second))":[-0-9.e+]+', rb'"\1":0', data)
    return re.sub(rb'"created": ?\d+', b'"created":0', data)


BODIES = [
    pytest.param("/v1/chat/completions", {"stream": True}, id="chat-stream"),
    pytest.param(
        "/v1/chat/completions",
        {"stream": True, "stream_options": {"include_usage": True}},
        id="chat-stream-usage",
    ),
    pytest.param("/v1/completions", {"stream": True}, id="completions-stream"),
    pytest.param("/v1/completions", {}, id="completions"),
    pytest.param("/v1/chat/completions", {"temperature": 1.0}, id="chat"),
    # several sequences: no per-request numbers, so the tap asks for nothing and passes through
    pytest.param("/v1/chat/completions", {"stream": True, "n": 2}, id="chat-stream-n2"),
    pytest.param(
        "/v1/completions",
        {"stream": True, "n": 2, "stream_options": {"include_usage": True}},
        id="completions-stream-n2-usage",
    ),
]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_transparent_to_the_client(dialect):
    seeded = dict(seed=5, dialect=dialect, time_scale=TIME_SCALE)
    async with (
        cluster.SimCluster.from_config(None, **seeded) as direct,
        cluster.SimCluster.from_config(None, **seeded) as behind,
    ):
        monitor = monitor_for(behind, dialect, "holdout_share: 0, probe_share: 0")
        url = await monitor.start("127.0.0.1", 0)
        model = direct.config.model_name
        try:
            async with aiohttp.ClientSession() as session:
                for param in BODIES:
                    path, extra = param.values
                    body = {"model": model, "max_tokens": 24, "temperature": 0.0, **extra}
                    if path.endswith("chat/completions"):
                        body["messages"] = [{"role": "user", "content": f"tell me {param.id}"}]
                    else:
                        body["prompt"] = f"tell me {param.id}"
                    got = []
                    for base in (direct.urls["spec-k4"], url):
                        async with session.post(base + path, json=body, headers={"x-task-type": "code"}) as r:
                            got.append((r.status, r.headers.get("Content-Type"), normalise(await r.read())))
                    assert got[0] == got[1], param.id
                    # llama.cpp serves one choice per request (n > 1 is refused)
                    assert got[0][0] == (400 if dialect == "llamacpp" and "n2" in param.id else 200)
                    if got[0][0] != 200:
                        continue
                    has_usage = b'"choices":[],' in got[0][2] or b'"choices": [],' in got[0][2]
                    assert has_usage == ("include_usage" in json.dumps(extra)), param.id
                    if dialect == "vllm":  # vLLM's default --fingerprint-mode full
                        assert re.search(rb'"system_fingerprint": ?"vllm-', got[0][2]), param.id
        finally:
            await monitor.stop()
    records = monitor.stats.records()
    assert len(records) == len(BODIES)
    several = [r for r in records if r.spec is None]
    if dialect == "vllm":  # vLLM reports no per-request metrics for n > 1 (SGLang does)
        assert len(several) == 2 and {r.unattributed_reason for r in several} == {"n_gt_1"}
    elif dialect == "llamacpp":  # ... and llama.cpp refuses it
        assert len(several) == 2 and {r.unattributed_reason for r in several} == {"error_status"}
    else:
        assert several == []
    if dialect == "llamacpp":
        assert all(r.spec.draft_tokens and r.spec.rounds is None for r in records if r.spec is not None)
    else:
        assert all(r.spec.rounds for r in records if r.spec is not None)


async def test_unattributed_requests_are_counted_and_explain_the_cross_check_gap():
    async with cluster.SimCluster.from_config(None, seed=1, dialect="vllm", time_scale=TIME_SCALE) as sim:
        monitor = monitor_for(sim, "vllm", "holdout_share: 0, probe_share: 0")
        url = await monitor.start("127.0.0.1", 0)
        model = sim.config.model_name
        try:
            for loop in monitor.loops:
                assert await loop.scrape_once()
            async with aiohttp.ClientSession() as session:

                async def send(i, extra):
                    body = {"model": model, "prompt": f"p{i}", "max_tokens": 400, "temperature": 0.0, **extra}
                    async with session.post(url + "/v1/completions", json=body) as r:
                        assert r.status == 200
                        return (await r.json())["choices"][0]["finish_reason"]

                plain = await asyncio.gather(*(send(i, {}) for i in range(10)))
                several = await asyncio.gather(*(send(100 + i, {"n": 2}) for i in range(6)))
                stopped = await asyncio.gather(*(send(200 + i, {"stop": ["\n\n"]}) for i in range(10)))
            for loop in monitor.loops:
                assert await loop.scrape_once()
        finally:
            await monitor.stop()
    assert len(plain) == 10 and len(several) == 6
    on_stop = stopped.count("stop")
    assert on_stop > 0  # the simulator ends natural stops on the stop string
    expected = {("spec-k4", "n_gt_1"): 6, ("spec-k4", "stop_string"): on_stop}
    assert monitor.stats.unattributed() == expected
    totals = [t for key, t in monitor.stats.totals().items() if key[0] == "spec-k4"]
    assert sum(t.requests for t in totals) == 26
    assert sum(t.spec_requests for t in totals) == 26 - 6 - on_stop
    engine = monitor.watches["spec-k4"].view()["accumulated"]
    # the engine counted the unattributed requests' rounds too: the gap is theirs alone
    assert engine["drafts"] > sum(t.verify_rounds for t in totals) > 0


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_records_carry_the_prompt_length_and_keep_several_sequences_out_of_tpot(dialect):
    """Each record has the prompt length the engine reported (what a like-for-like baseline
    adjusts for), streamed or not, asked for usage or not; a request of several sequences counts
    its tokens from usage when the client asked for it, and never enters a class's TPOT (its
    sequences decode side by side: 48 tokens in the time of 24 read as a class twice as fast)."""
    async with cluster.SimCluster.from_config(None, seed=2, dialect=dialect, time_scale=TIME_SCALE) as sim:
        monitor = monitor_for(sim, dialect, "holdout_share: 0, probe_share: 0")
        url = await monitor.start("127.0.0.1", 0)
        model = sim.config.model_name
        bodies = [
            {"stream": True},
            {"stream": True, "stream_options": {"include_usage": True}},
            {},
        ]
        if dialect != "llamacpp":  # llama.cpp serves one choice per request
            bodies += [
                {"stream": True, "n": 2},
                {"stream": True, "n": 2, "stream_options": {"include_usage": True}},
            ]
        answers = []
        try:
            async with aiohttp.ClientSession() as session:
                for i, extra in enumerate(bodies):
                    body = {"model": model, "prompt": "count " * (5 + 7 * i), "max_tokens": 24, **extra}
                    body["temperature"] = 0.0
                    async with session.post(url + "/v1/completions", json=body) as r:
                        assert r.status == 200
                        answers.append(await r.read())
            direct = []
            async with aiohttp.ClientSession() as session:
                for i in range(len(bodies)):
                    body = {
                        "model": model,
                        "prompt": "count " * (5 + 7 * i),
                        "max_tokens": 24,
                        "temperature": 0.0,
                    }
                    async with session.post(sim.urls["spec-k4"] + "/v1/completions", json=body) as r:
                        direct.append((await r.json())["usage"]["prompt_tokens"])
        finally:
            await monitor.stop()
    records = sorted(monitor.stats.records(), key=lambda r: r.started_at)
    assert len(records) == len(bodies)
    # vLLM's stream of several sequences brings no usage unless the client asks (the tap adds none
    # there: vLLM would then move every choice's system_fingerprint to the usage chunk)
    unseen = {3} if dialect == "vllm" else set()
    assert [r.prompt_tokens for r in records] == [None if i in unseen else n for i, n in enumerate(direct)]
    assert len(set(direct)) == len(direct)  # the prompts differ in length, and each record says so
    for record, extra, answer in zip(records, bodies, answers, strict=True):
        several = extra.get("n") == 2
        assert record.sequences == (2 if several else 1)
        if several:
            assert record.tpot_seconds is None
            if "stream_options" in extra:  # the engine's own count of both sequences
                usage = [json.loads(line[5:]) for line in answer.split(b"\n") if b'"usage"' in line]
                assert record.output_tokens == usage[-1]["usage"]["completion_tokens"] == 48
        elif extra.get("stream"):
            assert record.tpot_seconds is not None
    stats = monitor.stats.window()
    assert sum(a.totals.decode_tokens for a in stats.values()) == sum(
        r.output_tokens - 1
        for r, extra in zip(records, bodies, strict=True)
        if extra.get("stream") and "n" not in extra
    )
