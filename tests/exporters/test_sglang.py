"""SGLang page adapter: window gauges, verify-call counter, per-token ITL, custom-label breakdown."""

from __future__ import annotations

from pathlib import Path

import pytest

from specguard.exporters import derive, engines, promtext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PAGE = (FIXTURES / "sglang-0.5.23-reconstructed.metrics.txt").read_text()


def test_detected_and_normalised():
    page = promtext.parse(PAGE)
    assert engines.detect(page) == "sglang"
    snap = engines.snapshot(page)
    assert snap.speculation_enabled is True
    assert snap.num_speculative_tokens == 3  # spec_num_draft_tokens 4 -> 3 drafts per round
    assert snap.drafts == 1000  # verify calls, summed over the task label
    assert snap.generation_tokens == 2580 and snap.round_tokens == 2580
    assert snap.draft_tokens is None and snap.accepted_tokens is None  # no such counters: not reported
    assert snap.accept_length_gauge == 2.58 and snap.accept_rate_gauge == 0.527
    assert snap.token_latency.count == 2580 and snap.step_latency is None
    assert snap.running_requests == 7 and snap.waiting_requests == 2  # TP ranks report one scheduler


def test_derived_normalises_per_token_itl_to_step_time():
    d = derive.derive(engines.parse_snapshot(PAGE))
    assert d.accept_length == pytest.approx(2580 / 1000)
    assert d.strict_accept_rate == pytest.approx(0.527)
    assert d.ci_acceptance_proxy == pytest.approx(2.58 / 4)
    assert d.time_per_output_token_seconds == pytest.approx(
        21.96 / 2580
    )  # per-token ITL is already per token
    assert d.mean_step_seconds == pytest.approx(21.96 / 2580 * 2.58)  # tokens per round x per-token time
    assert d.per_position_acceptance is None and d.full_rollback_ratio is None


def test_custom_task_label_breakdown():
    d = derive.derive(engines.parse_snapshot(PAGE))
    code, chat = d.breakdown["task"]["code"], d.breakdown["task"]["chat"]
    assert code.drafts == 640 and code.accept_length == pytest.approx(1900 / 640)
    assert chat.drafts == 360 and chat.accept_length == pytest.approx(680 / 360)
    assert code.num_speculative_tokens == 3 and code.running_requests is None  # gauges carry no task
    assert chat.time_per_output_token_seconds is None  # no ITL series for chat on this page


def test_speculation_off_when_steps_gauge_is_zero():
    text = (
        '# TYPE sglang:spec_num_steps gauge\nsglang:spec_num_steps{tp_rank="0"} 0\n'
        '# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{tp_rank="0"} 0\n'
        "# TYPE sglang:inter_token_latency_seconds histogram\n"
        "sglang:inter_token_latency_seconds_sum 2.0\nsglang:inter_token_latency_seconds_count 100\n"
    )
    d = derive.derive(engines.parse_snapshot(text))
    assert d.speculation_enabled is False and d.num_speculative_tokens == 0
    assert d.accept_length is None  # the zeroed gauge of a no-spec server is not an accept length
    assert d.mean_step_seconds == pytest.approx(0.02)  # one token per step without speculation


def test_window_of_two_sglang_pages_uses_counter_deltas():
    later = PAGE.replace('task="code"} 640.0', 'task="code"} 740.0').replace(
        'model_name="meta-llama/Llama-3.1-8B-Instruct",task="code"} 1900.0',
        'model_name="meta-llama/Llama-3.1-8B-Instruct",task="code"} 2200.0',
    )
    d = derive.summarize(engines.parse_snapshot(later), engines.parse_snapshot(PAGE))
    assert d.drafts == 100 and d.generation_tokens == 300 and d.accept_length == pytest.approx(3.0)
    assert d.breakdown["task"]["chat"].drafts == 0 and d.breakdown["task"]["chat"].accept_length is None
    assert d.counter_resets == ()
    idle = derive.summarize(engines.parse_snapshot(PAGE), engines.parse_snapshot(PAGE))
    assert idle.drafts == 0  # no verify round in the window: the stale gauges are not reported
    assert idle.accept_length is None and idle.strict_accept_rate is None


def test_per_token_itl_is_preferred_over_the_request_tpot_histogram():
    text = PAGE + (
        "# TYPE sglang:request_time_per_output_token_seconds histogram\n"
        'sglang:request_time_per_output_token_seconds_sum{task="code"} 0.5\n'
        'sglang:request_time_per_output_token_seconds_count{task="code"} 10\n'
    )
    snap = engines.parse_snapshot(text)
    assert snap.time_per_output_token.count == 10
    assert derive.derive(snap).time_per_output_token_seconds == pytest.approx(21.96 / 2580)
