"""The load generator against the simulator: bounded, self-stopping, reproducible, honest about errors."""

from __future__ import annotations

import socket
import time

import pytest

from specguard.errors import ConfigError
from specguard.lab import loadgen
from specguard.sim import cluster


@pytest.fixture
async def sim():
    async with cluster.SimCluster.from_config(
        None, seed=0, time_scale=0.05, pools=["spec-k4", "nospec"]
    ) as running:
        yield running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_request_bound_and_mix_weights(sim):
    mix = [
        loadgen.RequestClass("code", weight=3, temperature=0.0, max_tokens=16),
        loadgen.RequestClass("creative", weight=1, temperature=1.0, max_tokens=16, chat=False),
    ]
    results = await loadgen.run_load(sim.urls["spec-k4"], mix, concurrency=6, requests=40, stream=True)
    assert [r.index for r in results] == list(range(40))
    assert all(r.ok and r.stream and r.status == 200 for r in results)
    assert 20 <= sum(r.task_type == "code" for r in results) <= 38
    for r in results:
        assert 1 <= r.output_tokens <= 16 and r.ttft_seconds is not None and r.ttft_seconds <= r.e2e_seconds
        assert r.spec["num_spec_tokens"] == 4
        assert r.chunks == r.spec["num_spec_steps"] + 1
        assert r.tpot_seconds is None or r.tpot_seconds > 0
    # the task type travelled in x-task-type: the engine's truth has exactly these classes
    truth = sim.truth()["pools"]["spec-k4"]["classes"]
    assert set(truth) == {"code@0", "creative@1"}
    assert sum(c["requests"] for c in truth.values()) == 40


async def test_duration_bound_stops_by_itself(sim):
    started = time.monotonic()
    results = await loadgen.run_load(
        sim.urls["nospec"], {"chat": 1.0}, concurrency=3, duration_s=0.4, requests=None
    )
    elapsed = time.monotonic() - started
    assert results and all(r.ok for r in results)
    assert all(r.started_at <= results[0].started_at + elapsed for r in results)
    assert all(r.spec is None for r in results)  # K = 0: no per-request spec block


async def test_several_targets_round_robin_and_route(sim):
    urls = [sim.urls["spec-k4"], sim.urls["nospec"]]
    results = await loadgen.run_load(urls, {"code": 1.0}, concurrency=2, requests=6)
    assert [r.url for r in results] == urls * 3
    routed = await loadgen.run_load(
        sim.urls,
        {"code": 1.0, "chat": 1.0},
        concurrency=2,
        requests=6,
        route=lambda cls, i: sim.urls["nospec" if cls.task_type == "chat" else "spec-k4"],
    )
    assert all((r.url == sim.urls["nospec"]) == (r.task_type == "chat") for r in routed)


async def test_errors_are_results_not_exceptions(sim):
    dead = f"http://127.0.0.1:{free_port()}"
    results = await loadgen.run_load(dead, {"code": 1.0}, concurrency=2, requests=3)
    assert len(results) == 3 and all(r.status == 0 and r.error and not r.ok for r in results)
    bad = await loadgen.run_load(sim.urls["spec-k4"], {"code": 1.0}, concurrency=1, requests=1, model="nope")
    assert bad[0].status == 404 and "does not exist" in bad[0].error


async def test_same_seed_same_prompts():
    mix = {"code": 1.0, "chat": 2.0}
    cls = loadgen.RequestClass("code")
    assert loadgen.prompt_for(cls, 3, seed=1) == loadgen.prompt_for(cls, 3, seed=1)
    assert loadgen.prompt_for(cls, 3, seed=1) != loadgen.prompt_for(cls, 3, seed=2)
    assert len(loadgen.prompt_for(loadgen.RequestClass("x", prompt_tokens=100), 0, 0)) >= 400
    with pytest.raises(ConfigError):
        await loadgen.run_load("http://127.0.0.1:1", mix, concurrency=1)
    with pytest.raises(ConfigError):
        await loadgen.run_load("http://127.0.0.1:1", mix, concurrency=0, requests=1)
    with pytest.raises(ConfigError):
        await loadgen.run_load("http://127.0.0.1:1", {"code": 0.0}, concurrency=1, requests=1)


async def test_ignore_eos_and_extra_body(sim):
    mix = [loadgen.RequestClass("creative", temperature=1.0, max_tokens=12, ignore_eos=True, chat=False)]
    results = await loadgen.run_load(
        sim.urls["spec-k4"], mix, concurrency=2, requests=4, keep_body=True, extra_body={"n": 2}
    )
    assert all(r.output_tokens == 24 and r.finish_reason == "length" for r in results)
    assert all(len(r.body["choices"]) == 2 and r.spec is None for r in results)  # n > 1: metrics null
