"""TensorRT-LLM page adapter: iteration totals, per-position counters, pid gauges, /prometheus/metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from specguard.exporters import derive, engines, promtext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PAGE = (FIXTURES / "trtllm-reconstructed.metrics.txt").read_text()


def test_detected_normalised_and_served_elsewhere():
    page = promtext.parse(PAGE)
    assert engines.detect(page) == "trtllm"
    snap = engines.snapshot(page)
    assert snap.metrics_path == "/prometheus/metrics" == engines.metrics_path("trtllm")
    assert snap.drafts == 1000  # drafted{token_position="0"}: rounds that carried drafts
    assert (snap.draft_tokens, snap.accepted_tokens) == (3000, 1580)
    assert snap.accepted_per_position == (720, 510, 350)
    assert snap.num_speculative_tokens == 3 and snap.speculation_enabled is True
    assert snap.accept_length_gauge == 2.6 and snap.draft_overhead_gauge == 0.18
    assert snap.running_requests == 6  # two pids report the same gauge: not added up
    assert snap.waiting_requests == 1


def test_derived():
    d = derive.derive(engines.parse_snapshot(PAGE))
    assert d.strict_accept_rate == pytest.approx(1580 / 3000)
    assert d.accept_length == pytest.approx(2.58)
    assert d.full_rollback_ratio == pytest.approx(0.28)
    assert d.per_position_acceptance == pytest.approx((0.72, 0.51, 0.35))
    assert d.time_per_output_token_seconds == pytest.approx(0.008)
    assert d.ci_acceptance_proxy == pytest.approx(2.58 / 4)


def test_configured_k_from_the_info_gauge_wins_over_vector_length():
    text = (
        PAGE
        + '# TYPE trtllm_speculative_config_info gauge\ntrtllm_speculative_config_info{max_draft_len="5"} 1\n'
    )
    assert engines.parse_snapshot(text).num_speculative_tokens == 5


def test_gauge_only_page_does_not_invent_counters():
    text = (
        "# TYPE trtllm_spec_decode_acceptance_length gauge\n"
        'trtllm_spec_decode_acceptance_length{pid="1"} 2.2\n'
    )
    d = derive.derive(engines.parse_snapshot(text))
    assert d.drafts is None and d.strict_accept_rate is None
    assert d.accept_length == pytest.approx(2.2) and d.speculation_enabled is None


def test_iteration_totals_when_no_per_position_counters():
    lines = [line for line in PAGE.splitlines() if "token_position" not in line]
    snap = engines.parse_snapshot("\n".join(lines))
    assert (snap.draft_tokens, snap.accepted_tokens) == (3000, 1580)
    assert snap.drafts is None and snap.accepted_per_position is None
    d = derive.derive(snap)
    assert d.strict_accept_rate == pytest.approx(1580 / 3000) and d.accept_length == pytest.approx(2.6)
