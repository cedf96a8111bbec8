"""vLLM page adapter: the real 0.32 CPU captures (values computed by hand), DP, models, multiprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from specguard.errors import InputError
from specguard.exporters import derive, engines, promtext
from specguard.exporters.engines import vllm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PER_POS = vllm.PER_POS


def page(name: str) -> promtext.Page:
    return promtext.parse((FIXTURES / name).read_text(), name)


def test_real_k4_page_snapshot():
    snap = engines.snapshot(page("vllm-0.32-cpu-ngram-k4.metrics.txt"))
    assert snap.engine == "vllm" and snap.metrics_path == "/metrics"
    assert snap.speculation_enabled is True
    assert snap.num_speculative_tokens == 4  # the per-position vector has 4 entries
    assert (snap.drafts, snap.draft_tokens, snap.accepted_tokens) == (192, 671, 528)
    assert snap.accepted_per_position == (176, 150, 109, 93)
    assert sum(snap.accepted_per_position) == snap.accepted_tokens
    assert snap.generation_tokens == 1156
    assert snap.step_latency.count == 631 and snap.step_latency.sum == pytest.approx(2.766296617999899)
    assert snap.time_per_output_token.count == 14
    assert snap.time_to_first_token.sum == pytest.approx(2.0985915660858154)
    assert snap.e2e_latency.sum == pytest.approx(4.862314224243164)
    assert (snap.running_requests, snap.waiting_requests) == (0, 0)
    assert snap.models == {}


def test_real_k4_page_derived_by_hand():
    d = derive.derive(engines.snapshot(page("vllm-0.32-cpu-ngram-k4.metrics.txt")))
    assert d.strict_accept_rate == pytest.approx(528 / 671)  # 0.7869
    assert d.accept_length == pytest.approx(1 + 528 / 192)  # 3.75
    assert d.ci_acceptance_proxy == pytest.approx(3.75 / 5)
    assert d.per_position_acceptance == pytest.approx((176 / 192, 150 / 192, 109 / 192, 93 / 192))
    assert d.full_rollback_ratio == pytest.approx(16 / 192)
    assert d.mean_step_seconds == pytest.approx(2.766296617999899 / 631)
    assert d.time_per_output_token_seconds == pytest.approx(0.034597342682981404 / 14)
    # with every round drafting K, A = 1 + sum(p_i) (CONCEPTS.md section 1)
    assert 1 + sum(d.per_position_acceptance) == pytest.approx(d.accept_length)


def test_real_nospec_page_means_speculation_off_and_spec_numbers_not_reported():
    snap = engines.snapshot(page("vllm-0.32-cpu-nospec.metrics.txt"))
    assert snap.speculation_enabled is False and snap.num_speculative_tokens == 0
    assert snap.drafts is None and snap.draft_tokens is None and snap.accepted_tokens is None
    assert snap.accepted_per_position is None
    d = derive.derive(snap)
    assert d.strict_accept_rate is None and d.accept_length is None and d.full_rollback_ratio is None
    assert d.generation_tokens == 1156
    assert d.mean_step_seconds == pytest.approx(snap.step_latency.sum / snap.step_latency.count)
    assert d.time_per_output_token_seconds == pytest.approx(snap.time_per_output_token.sum / 14)


def test_reconstructed_033_page_matches_the_research_notes():
    d = derive.derive(engines.snapshot(page("vllm-0.33-reconstructed-k3.metrics.txt")))
    assert d.num_speculative_tokens == 3
    assert d.strict_accept_rate == pytest.approx(0.527, abs=5e-4)
    assert d.accept_length == pytest.approx(2.58)
    assert d.full_rollback_ratio == pytest.approx(0.28)
    assert d.mean_step_seconds == pytest.approx(0.01978)
    # no per-request TPOT histogram on this page: step time / accept length (~7.7 ms)
    assert d.time_per_output_token_seconds == pytest.approx(0.01978 / 2.58)
    assert d.running_requests == 12 and d.waiting_requests is None


def test_dp_engines_and_two_models_multiprocess_page():
    snap = engines.snapshot(page("vllm-dp2-two-models-multiproc.metrics.txt"))
    assert (snap.drafts, snap.draft_tokens, snap.accepted_tokens) == (600, 1800, 720)
    assert snap.accepted_per_position == (360, 230, 130)
    assert snap.num_speculative_tokens == 3
    assert snap.running_requests == 3 + 4 + 1  # pid replicas of one series: the largest, not the sum
    assert snap.waiting_requests == 7
    assert set(snap.models) == {"alpha", "beta"}
    d = derive.derive(snap)
    assert d.accept_length == pytest.approx(2.2) and d.strict_accept_rate == pytest.approx(0.4)
    assert d.full_rollback_ratio == pytest.approx(0.4)
    assert d.mean_step_seconds == pytest.approx(52 / 2400)
    assert d.time_per_output_token_seconds == pytest.approx(0.6 / 50)
    alpha, beta = d.models["alpha"], d.models["beta"]
    assert (alpha.drafts, alpha.accept_length, alpha.full_rollback_ratio) == (400, 2.5, pytest.approx(0.3))
    assert (alpha.running_requests, alpha.waiting_requests) == (7, 5)
    assert alpha.mean_step_seconds == pytest.approx(
        0.02
    ) and alpha.time_per_output_token_seconds == pytest.approx(0.01)
    assert (beta.drafts, beta.accept_length, beta.strict_accept_rate) == (200, 1.6, 0.2)
    assert beta.per_position_acceptance == pytest.approx((0.4, 0.15, 0.05))
    assert d.as_dict()["models"]["beta"]["accepted_per_position"] == [80, 30, 10]


def test_models_with_different_k_keep_per_model_vectors_only():
    text = "\n".join(
        [
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="a"} 10',
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="b"} 10',
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
            *(f'{PER_POS}{{engine="0",model_name="a",position="{i}"}} 5' for i in range(4)),
            *(f'{PER_POS}{{engine="0",model_name="b",position="{i}"}} 5' for i in range(2)),
        ]
    )
    snap = engines.parse_snapshot(text)
    assert snap.num_speculative_tokens is None and snap.accepted_per_position is None
    assert snap.models["a"].num_speculative_tokens == 4 and snap.models["b"].num_speculative_tokens == 2
    assert snap.drafts == 20


def test_older_time_per_output_token_name_is_the_step_latency():
    text = (
        "# TYPE vllm:time_per_output_token_seconds histogram\n"
        'vllm:time_per_output_token_seconds_sum{model_name="m"} 3.0\n'
        'vllm:time_per_output_token_seconds_count{model_name="m"} 100\n'
        "# TYPE vllm:spec_decode_draft_acceptance_rate gauge\n"
        'vllm:spec_decode_draft_acceptance_rate{model_name="m"} 0.6\n'
    )
    snap = engines.parse_snapshot(text)
    assert snap.step_latency.sum == 3.0 and snap.step_latency.count == 100
    d = derive.derive(snap)
    assert d.mean_step_seconds == pytest.approx(0.03)
    assert d.speculation_enabled is True and d.strict_accept_rate == pytest.approx(0.6)


def test_absent_counter_is_none_and_nan_samples_are_ignored():
    snap = engines.parse_snapshot(
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} NaN\n'
        'vllm:num_requests_waiting{engine="0"} 2\n'
    )
    assert snap.running_requests is None and snap.waiting_requests == 2
    assert snap.generation_tokens is None and snap.speculation_enabled is False


def test_bad_position_label_names_the_line():
    text = f'# TYPE {PER_POS} counter\n{PER_POS}{{position="x"}} 1\n'
    with pytest.raises(InputError, match=r"p\.txt:2: .*position"):
        engines.snapshot(promtext.parse(text, "p.txt"), "vllm")


def test_forced_engine_must_match_the_page():
    with pytest.raises(InputError, match="no sglang:\\* metrics.*families seen"):
        engines.snapshot(page("vllm-0.32-cpu-ngram-k4.metrics.txt"), "sglang")
    assert vllm.METRICS_PATH == engines.metrics_path("vllm") == "/metrics"
