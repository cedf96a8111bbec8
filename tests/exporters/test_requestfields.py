"""Per-request response fields of every engine -> SpecStats, and why they are missing."""

from __future__ import annotations

import copy

import pytest

from specguard.errors import InputError
from specguard.exporters import engines
from specguard.exporters.engines import llamacpp, sglang, trtllm, vllm

VLLM_SPEC = {
    "mean_acceptance_length": 2.5,
    "draft_acceptance_rate": 0.5,
    "acceptance_histogram": [14, 12, 9, 15],
    "num_spec_steps": 50,
    "num_accepted_draft_tokens": 75,
    "num_draft_tokens": 150,
    "num_spec_tokens": 3,
}
VLLM_BODY = {
    "object": "chat.completion",
    "choices": [{"index": 0, "finish_reason": "length", "message": {"content": "x"}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 126},
    "metrics": {"time_to_first_token_ms": None, "speculative_decoding": VLLM_SPEC},
}


def test_vllm_non_streamed_body():
    stats = vllm.request_stats(VLLM_BODY)
    assert (stats.rounds, stats.draft_tokens, stats.accepted_tokens) == (50, 150, 75)
    assert stats.accepted_histogram == (14, 12, 9, 15) and stats.full_rollback_rounds == 14
    assert stats.num_speculative_tokens == 3 and stats.output_tokens == 126
    assert stats.accept_length == pytest.approx(2.5)  # matches the engine's mean_acceptance_length
    assert stats.strict_accept_rate == pytest.approx(0.5)
    assert vllm.missing_reason(VLLM_BODY) is None


def test_vllm_final_usage_chunk_of_a_stream():
    chunk = {
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"completion_tokens": 126},
        "metrics": {"speculative_decoding": VLLM_SPEC},
    }
    assert engines.request_stats("vllm", chunk).rounds == 50


def test_vllm_zero_spec_steps_is_no_rounds_not_a_rollback():
    body = copy.deepcopy(VLLM_BODY)
    body["metrics"]["speculative_decoding"] = {
        "mean_acceptance_length": 1.0,
        "draft_acceptance_rate": 0.0,
        "acceptance_histogram": [0, 0, 0, 0, 0],
        "num_spec_steps": 0,
        "num_accepted_draft_tokens": 0,
        "num_draft_tokens": 0,
        "num_spec_tokens": 4,
    }
    stats = vllm.request_stats(body)
    assert stats.rounds == 0 and stats.full_rollback_rounds == 0
    assert stats.accept_length is None and stats.strict_accept_rate is None


@pytest.mark.parametrize(
    ("body", "request_body", "reason"),
    [
        ({**VLLM_BODY, "metrics": None, "choices": [{}, {}]}, {"n": 2}, "n_gt_1"),
        ({**VLLM_BODY, "metrics": None}, {"prompt": ["a", "b"]}, "n_gt_1"),
        (
            {**VLLM_BODY, "metrics": None, "choices": [{"finish_reason": "stop", "stop_reason": "###"}]},
            {},
            "stop_string",
        ),
        ({k: v for k, v in VLLM_BODY.items() if k != "metrics"}, {}, "no_metrics"),
        (
            {"choices": [{"finish_reason": "stop", "stop_reason": "END"}], "usage": {"completion_tokens": 4}},
            {"stop": ["END"]},
            "stop_string",
        ),
        ({"object": "chat.completion.chunk", "choices": [{"delta": {}}]}, {"stream": True}, "no_usage"),
        (
            {"object": "chat.completion.chunk", "choices": [], "usage": {"completion_tokens": 3}},
            {},
            "no_metrics",
        ),
        ({**VLLM_BODY, "metrics": {"speculative_decoding": None}}, {}, "no_spec_metrics"),
        ({**VLLM_BODY, "metrics": None}, {}, "metrics_null"),
    ],
)
def test_vllm_missing_reasons(body, request_body, reason):
    assert vllm.request_stats(body) is None
    assert engines.missing_reason("vllm", body, request_body) == reason


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("num_spec_steps", "fifty", "metrics.speculative_decoding.num_spec_steps"),
        ("num_draft_tokens", -1, "metrics.speculative_decoding.num_draft_tokens"),
        ("num_accepted_draft_tokens", 2.5, "metrics.speculative_decoding.num_accepted_draft_tokens"),
        ("acceptance_histogram", [1, True], r"metrics.speculative_decoding.acceptance_histogram\[1\]"),
        ("acceptance_histogram", "1,2", "metrics.speculative_decoding.acceptance_histogram"),
    ],
)
def test_vllm_malformed_fields_name_the_json_path(field, value, path):
    body = copy.deepcopy(VLLM_BODY)
    body["metrics"]["speculative_decoding"][field] = value
    with pytest.raises(InputError, match=path):
        vllm.request_stats(body)
    with pytest.raises(InputError, match="metrics: expected a JSON object"):
        vllm.request_stats({"metrics": [1]})


SGLANG_NEWEST = {
    "spec_accept_rate": 0.5,
    "spec_accept_length": 2.52,
    "spec_num_correct_drafts": 75,
    "spec_num_proposed_drafts": 150,
    "spec_verify_ct": 50,
    "spec_correct_drafts_histogram": [14, 12, 9, 15],
    "completion_tokens": 126,
}
SGLANG_MIDDLE = {
    "spec_accepted_drafts": 75,
    "spec_proposed_drafts": 150,
    "spec_verify_ct": 50,
    "spec_accept_histogram": [14, 12, 9, 15],
    "completion_tokens": 126,
}
SGLANG_OLDEST = {
    "spec_accept_token_num": 75,
    "spec_draft_token_num": 150,
    "spec_verify_ct": 50,
    "spec_accept_histogram": [14, 12, 9, 15],
    "completion_tokens": 126,
}


@pytest.mark.parametrize(
    "meta", [SGLANG_NEWEST, SGLANG_MIDDLE, SGLANG_OLDEST], ids=["newest", "middle", "oldest"]
)
def test_sglang_meta_info_in_all_three_generations(meta):
    stats = sglang.request_stats({"text": "...", "meta_info": meta})
    assert (stats.rounds, stats.draft_tokens, stats.accepted_tokens) == (50, 150, 75)
    assert stats.full_rollback_rounds == 14 and stats.num_speculative_tokens == 3
    assert stats.output_tokens == 126
    # SGLang's own spec_accept_length (2.52) counts the prefill token; the round-level value is 2.5
    assert stats.accept_length == pytest.approx(2.5)


def test_sglang_openai_sglext_single_and_list():
    details = {k: v for k, v in SGLANG_NEWEST.items() if k != "completion_tokens"}
    body = {"choices": [{}], "usage": {"completion_tokens": 126}, "sglext": {"spec_tokens_details": details}}
    stats = engines.request_stats("sglang", body)
    assert stats.rounds == 50 and stats.output_tokens == 126
    many = {
        **body,
        "usage": {"completion_tokens": 250},
        "sglext": {"spec_tokens_details": [details, details]},
    }
    summed = sglang.request_stats(many)
    assert (summed.rounds, summed.accepted_tokens, summed.full_rollback_rounds) == (100, 150, 28)
    assert summed.accepted_histogram == (28, 24, 18, 30) and summed.output_tokens == 250


def test_sglang_native_batch_list_and_missing():
    stats = sglang.request_stats([{"meta_info": SGLANG_NEWEST}, {"meta_info": SGLANG_OLDEST}])
    assert stats.rounds == 100 and stats.output_tokens == 252
    assert sglang.request_stats({"meta_info": {"completion_tokens": 3}}) is None
    assert sglang.missing_reason({"meta_info": {"completion_tokens": 3}}) == "no_spec_fields"
    assert sglang.missing_reason({"choices": [{}]}) == "no_spec_details"
    with pytest.raises(InputError, match=r"meta_info.spec_verify_ct"):
        sglang.request_stats({"meta_info": {**SGLANG_NEWEST, "spec_verify_ct": "x"}})
    with pytest.raises(InputError, match=r"sglext.spec_tokens_details\[1\].spec_num_correct_drafts"):
        sglang.request_stats(
            {"sglext": {"spec_tokens_details": [SGLANG_NEWEST, {"spec_num_correct_drafts": -3}]}}
        )


def test_llamacpp_timings():
    body = {
        "choices": [{}],
        "timings": {
            "cache_n": 804,
            "prompt_n": 4,
            "predicted_n": 665,
            "draft_n": 604,
            "draft_n_accepted": 515,
        },
    }
    stats = llamacpp.request_stats(body)
    assert (stats.draft_tokens, stats.accepted_tokens, stats.output_tokens) == (604, 515, 665)
    assert stats.rounds is None and stats.full_rollback_rounds is None and stats.accept_length is None
    assert stats.strict_accept_rate == pytest.approx(515 / 604)
    # The server writes the draft fields only when the request drafted: without them it drafted
    # nothing (known zeros, so the request is attributed)
    no_draft = {"timings": {"predicted_n": 10}}
    stats = llamacpp.request_stats(no_draft)
    assert (stats.draft_tokens, stats.accepted_tokens, stats.output_tokens) == (0, 0, 10)
    assert llamacpp.missing_reason(no_draft) is None
    assert llamacpp.request_stats({"timings": {"prompt_n": 3}}) is None
    assert llamacpp.missing_reason({"timings": {"prompt_n": 3}}) == "no_draft_fields"
    assert llamacpp.missing_reason({"choices": []}) == "no_timings"
    with pytest.raises(InputError, match="timings.draft_n_accepted"):
        llamacpp.request_stats({"timings": {"draft_n": 5, "draft_n_accepted": 6}})


def test_trtllm_perf_metrics_keyed_by_request_id():
    payload = [
        {
            "request_id": 7,
            "perf_metrics": {
                "timing_metrics": {},
                "speculative_decoding": {
                    "acceptance_rate": 0.5,
                    "total_accepted_draft_tokens": 60,
                    "total_draft_tokens": 120,
                },
            },
        },
        {"request_id": "8", "perf_metrics": {"timing_metrics": {}}},
    ]
    stats = trtllm.perf_metrics_stats(payload)
    assert list(stats) == ["7"]
    assert stats["7"].strict_accept_rate == pytest.approx(0.5) and stats["7"].rounds is None
    assert trtllm.missing_reason(payload[1]) == "no_spec_metrics"
    with pytest.raises(InputError, match=r"/perf_metrics\[0\].request_id"):
        trtllm.perf_metrics_stats([{"perf_metrics": {}}])
    bad = [{"request_id": 1, "perf_metrics": {"speculative_decoding": {"total_draft_tokens": "many"}}}]
    with pytest.raises(
        InputError, match=r"/perf_metrics\[0\].perf_metrics.speculative_decoding.total_draft_tokens"
    ):
        trtllm.perf_metrics_stats(bad)


def test_tgi_reports_nothing_per_request():
    assert engines.request_stats("tgi", {"generated_text": "x"}) is None
    assert engines.missing_reason("tgi", {}) == "engine_reports_none"


def test_unknown_engine_is_an_input_error():
    with pytest.raises(InputError, match="unknown engine 'foo'"):
        engines.request_stats("foo", {})
