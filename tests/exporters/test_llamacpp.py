"""llama.cpp page adapter: no labels, no speculative metrics (null, not zero)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specguard.exporters import derive, engines, promtext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PAGE = (FIXTURES / "llamacpp-reconstructed.metrics.txt").read_text()


def test_detected_and_spec_fields_are_null():
    page = promtext.parse(PAGE)
    assert engines.detect(page) == "llamacpp"
    d = derive.derive(engines.snapshot(page))
    assert d.speculation_enabled is None and d.num_speculative_tokens is None
    for key in ("drafts", "draft_tokens", "accepted_tokens", "strict_accept_rate", "accept_length"):
        assert getattr(d, key) is None, key
    assert d.generation_tokens == 2580
    assert d.time_per_output_token_seconds == pytest.approx(80.0352 / 2580)
    assert (d.running_requests, d.waiting_requests) == (1, 0)


def test_window_of_llamacpp_counters():
    later = PAGE.replace("tokens_predicted_total 2580", "tokens_predicted_total 2680").replace(
        "tokens_predicted_seconds_total 80.0352", "tokens_predicted_seconds_total 83.0352"
    )
    d = derive.summarize(engines.parse_snapshot(later), engines.parse_snapshot(PAGE))
    assert d.generation_tokens == 100 and d.time_per_output_token_seconds == pytest.approx(0.03)
