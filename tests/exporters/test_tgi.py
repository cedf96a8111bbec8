"""TGI page adapter: the skipped-tokens summary is accepted drafts per verify round."""

from __future__ import annotations

from pathlib import Path

import pytest

from specguard.exporters import derive, engines, promtext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PAGE = (FIXTURES / "tgi-reconstructed.metrics.txt").read_text()


def test_detected_and_derived():
    page = promtext.parse(PAGE)
    assert engines.detect(page) == "tgi"
    assert page.families["tgi_request_skipped_tokens"].type == "summary"
    d = derive.derive(engines.snapshot(page))
    assert d.drafts == 1000 and d.accepted_tokens == 1580
    assert d.accept_length == pytest.approx(2.58)  # 1 + sum / count
    assert d.draft_tokens is None and d.strict_accept_rate is None  # K is not on the page
    assert d.num_speculative_tokens is None and d.ci_acceptance_proxy is None
    assert d.speculation_enabled is True
    assert d.generation_tokens == 2600
    assert d.mean_step_seconds == pytest.approx(10 / 500)  # decode forward passes only
    assert d.time_per_output_token_seconds == pytest.approx(0.01)
    assert (d.running_requests, d.waiting_requests) == (8, 3)


def test_no_speculation_evidence_is_unknown_not_false():
    text = (
        "# TYPE tgi_request_skipped_tokens summary\n"
        "tgi_request_skipped_tokens_sum 0\ntgi_request_skipped_tokens_count 40\n"
    )
    d = derive.derive(engines.parse_snapshot(text))
    assert d.speculation_enabled is None and d.accept_length == 1.0
