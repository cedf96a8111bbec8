"""The simulator's SGLang dialect: meta_info, sglext, custom labels, windowed gauges, /server_info."""

from __future__ import annotations

import json
from dataclasses import replace

import aiohttp
import pytest

from specguard.exporters import engines
from specguard.lab import loadgen
from specguard.sim import cluster
from specguard.sim import config as simconfig

CODE = [loadgen.RequestClass("code", temperature=0.0, max_tokens=40)]


def sim_with(**changes):
    cfg = replace(simconfig.load(), **changes)
    return cluster.SimCluster.from_config(cfg, seed=0, dialect="sglang", time_scale=0.05)


async def get_text(session, url):
    async with session.get(url) as response:
        assert response.status == 200
        return await response.text()


async def test_metrics_page_reproduces_truth_per_custom_label():
    async with sim_with() as sim:
        url = sim.urls["spec-k4"]
        async with aiohttp.ClientSession() as session:
            for task, temperature in (("code", 0.0), ("creative", 1.0)):
                mix = [loadgen.RequestClass(task, temperature=temperature, max_tokens=40)]
                labels = {"x-custom-labels": json.dumps({"task": task, "tenant": "dropped"})}
                await loadgen.run_load(url, mix, concurrency=4, requests=8, session=session, headers=labels)
            text = await get_text(session, url + "/metrics")
        truth = sim.truth()["pools"]["spec-k4"]
    assert "_created" not in text and "tenant" not in text
    snap = engines.parse_snapshot(text)
    assert snap.engine == "sglang" and snap.num_speculative_tokens == 4 and snap.speculation_enabled
    assert snap.drafts == truth["totals"]["drafts"]
    assert snap.generation_tokens == truth["totals"]["generation_tokens"]
    by_task = snap.breakdown["task"]
    for task, key in (("code", "code@0"), ("creative", "creative@1")):
        assert by_task[task].drafts == truth["classes"][key]["verify_rounds"]
        assert by_task[task].generation_tokens == truth["classes"][key]["output_tokens"]
        # per-token ITL: one count per output token after the first
        assert by_task[task].token_latency.count == truth["classes"][key]["output_tokens"] - 8


async def test_window_gauges_refresh_only_every_decode_log_interval():
    async with sim_with(decode_log_interval=10**6) as never, sim_with() as every_40:
        async with aiohttp.ClientSession() as session:
            for sim in (never, every_40):
                await loadgen.run_load(sim.urls["spec-k4"], CODE, concurrency=2, requests=8, session=session)
            stale = engines.parse_snapshot(await get_text(session, never.urls["spec-k4"] + "/metrics"))
            fresh = engines.parse_snapshot(await get_text(session, every_40.urls["spec-k4"] + "/metrics"))
            info = json.loads(await get_text(session, every_40.urls["spec-k4"] + "/server_info"))
    assert stale.accept_length_gauge == 0.0 and stale.accept_rate_gauge == 0.0
    assert 1.0 < fresh.accept_length_gauge <= 5.0 and 0.0 < fresh.accept_rate_gauge <= 1.0
    state = info["internal_states"][0]
    assert state["step_time_dict"] and all(t > 0 for ts in state["step_time_dict"].values() for t in ts)
    assert 1.0 < state["avg_spec_accept_length"] <= 5.0
    assert info["speculative_num_draft_tokens"] == 5


async def test_generate_meta_info_has_0_5_23_spec_fields():
    async with sim_with() as sim:
        async with aiohttp.ClientSession() as session:
            body = {"text": "def f(x):", "sampling_params": {"max_new_tokens": 30, "temperature": 0}}
            async with session.post(sim.urls["spec-k4"] + "/generate", json=body) as response:
                payload = await response.json()
            async with session.post(sim.urls["nospec"] + "/generate", json=body) as response:
                plain = await response.json()
    meta = payload["meta_info"]
    assert meta["completion_tokens"] == 30 and meta["finish_reason"] == {"type": "length", "length": 30}
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
    assert meta["spec_num_proposed_drafts"] == 4 * meta["spec_verify_ct"]
    assert sum(meta["spec_correct_drafts_histogram"]) == meta["spec_verify_ct"]
    assert len(meta["spec_correct_drafts_histogram"]) == 5
    stats = engines.request_stats("sglang", payload)
    assert stats.rounds == meta["spec_verify_ct"] and stats.accepted_tokens == meta["spec_num_correct_drafts"]
    assert "spec_verify_ct" not in plain["meta_info"]
    assert engines.request_stats("sglang", plain) is None


async def test_openai_endpoints_add_sglext_only_when_asked():
    async with sim_with() as sim:
        url = sim.urls["spec-k2"] + "/v1/chat/completions"
        messages = [{"role": "user", "content": "hello"}]
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json={"messages": messages, "max_tokens": 12}) as response:
                without = await response.json()
            body = {"messages": messages, "max_tokens": 12, "return_spec_tokens_details": True}
            async with session.post(url, json=body) as response:
                asked = await response.json()
            body = {**body, "stream": True}
            async with session.post(url, json=body) as response:
                stream = await response.text()
            async with session.post(url, json={"messages": messages, "max_tokens": -3}) as response:
                error = (response.status, await response.json())
    assert "sglext" not in without
    details = asked["sglext"]["spec_tokens_details"]
    assert details["spec_num_proposed_drafts"] == 2 * details["spec_verify_ct"]
    assert engines.request_stats("sglang", asked).rounds == details["spec_verify_ct"]
    assert stream.count('"sglext"') == 1 and stream.endswith("data: [DONE]\n\n")
    assert error[0] == 400 and error[1]["object"] == "error" and error[1]["code"] == 400
    totals = sim.truth()["pools"]["spec-k2"]["totals"]
    assert totals["requests_finished"] == 3 and totals["requests_with_spec_fields"] == 2


async def test_nospec_pool_reports_speculation_off():
    async with sim_with() as sim:
        async with aiohttp.ClientSession() as session:
            await loadgen.run_load(sim.urls["nospec"], CODE, concurrency=2, requests=3, session=session)
            snap = engines.parse_snapshot(await get_text(session, sim.urls["nospec"] + "/metrics"))
    assert snap.speculation_enabled is False and snap.num_speculative_tokens == 0
    assert snap.generation_tokens == sim.truth()["pools"]["nospec"]["totals"]["generation_tokens"]
