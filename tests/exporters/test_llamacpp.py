"""llama.cpp page adapter on pages captured from llama-server build 11434 (tests/llamacpp/capture.py):
the speculative counters read as they are, and a build without them still works (null, not zero)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specguard.exporters import derive, engines, promtext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DRAFT = (FIXTURES / "llamacpp-11434-draft-k4.metrics.txt").read_text()
FRESH = (FIXTURES / "llamacpp-11434-draft-k4-fresh.metrics.txt").read_text()
NGRAM = (FIXTURES / "llamacpp-11434-ngram-k8.metrics.txt").read_text()
NOSPEC = (FIXTURES / "llamacpp-11434-nospec.metrics.txt").read_text()
PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos"


def raw(text: str) -> dict[str, float]:
    """The page by prometheus_client's parser (the oracle): sample name (+position) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            position = sample.labels.get("position")
            out[sample.name if position is None else f"{sample.name}:{position}"] = sample.value
    return out


def older_build(text: str) -> str:
    """The same page as a build before the speculative counters writes it."""
    return "".join(line + "\n" for line in text.splitlines() if "spec_decode" not in line)


@pytest.mark.parametrize(("text", "k"), [(DRAFT, 4), (NGRAM, 8)])
def test_speculative_counters_give_rounds_accept_length_positions_and_rollbacks(text, k):
    page = promtext.parse(text)
    assert engines.detect(page) == "llamacpp"
    d = derive.derive(engines.snapshot(page))
    r = raw(text)
    drafts = r["llamacpp:spec_decode_num_drafts_total"]
    drafted = r["llamacpp:spec_decode_num_draft_tokens_total"]
    accepted = r["llamacpp:spec_decode_num_accepted_tokens_total"]
    per_pos = [r[f"{PER_POS}_total:{i}"] for i in range(k)]
    assert drafts > 0 and (d.speculation_enabled, d.num_speculative_tokens) == (True, k)
    assert (d.drafts, d.draft_tokens, d.accepted_tokens) == (drafts, drafted, accepted)
    assert d.accepted_per_position == tuple(per_pos)
    assert d.accept_length == pytest.approx(1 + accepted / drafts)
    assert d.strict_accept_rate == pytest.approx(accepted / drafted)
    assert d.per_position_acceptance == pytest.approx([p / drafts for p in per_pos])
    assert d.full_rollback_ratio == pytest.approx(1 - per_pos[0] / drafts)
    assert d.ci_acceptance_proxy == pytest.approx(d.accept_length / (k + 1))
    assert sum(per_pos) == accepted  # every accepted draft sits at one position
    tokens = r["llamacpp:tokens_predicted_total"]
    assert d.generation_tokens == tokens
    assert d.time_per_output_token_seconds == pytest.approx(
        r["llamacpp:tokens_predicted_seconds_total"] / tokens
    )
    assert (d.running_requests, d.waiting_requests) == (0, 0)
    assert d.warnings == ()


def test_zero_counters_do_not_prove_speculation_on_or_off():
    for text in (FRESH, NOSPEC):
        d = derive.derive(engines.parse_snapshot(text))
        assert d.speculation_enabled is None and d.num_speculative_tokens is None
        assert (d.drafts, d.draft_tokens, d.accepted_tokens) == (0, 0, 0)
        assert d.accepted_per_position is None and d.accept_length is None and d.full_rollback_ratio is None
        assert d.strict_accept_rate is None


def test_a_build_without_the_speculative_counters_reports_null_not_zero():
    old = older_build(DRAFT)
    assert "spec_decode" not in old
    d = derive.derive(engines.parse_snapshot(old))
    assert d.speculation_enabled is None and d.num_speculative_tokens is None
    for key in ("drafts", "draft_tokens", "accepted_tokens", "strict_accept_rate", "accept_length"):
        assert getattr(d, key) is None, key
    assert d.generation_tokens == raw(DRAFT)["llamacpp:tokens_predicted_total"]


def test_window_between_two_real_pages():
    """The fresh page and the page after the capture's requests, from the same server."""
    d = derive.summarize(engines.parse_snapshot(DRAFT), engines.parse_snapshot(FRESH))
    before, after = raw(FRESH), raw(DRAFT)
    for key, name in (
        ("drafts", "drafts"),
        ("draft_tokens", "draft_tokens"),
        ("accepted_tokens", "accepted_tokens"),
    ):
        counter = f"llamacpp:spec_decode_num_{name}_total"
        assert getattr(d, key) == after[counter] - before[counter]
    assert d.accepted_per_position == tuple(
        after[f"{PER_POS}_total:{i}"] for i in range(4)
    )  # born in the window
    assert d.counter_resets == ()
