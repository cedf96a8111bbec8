"""specguard's vLLM adapters and ``specguard inspect`` on a real engine, against hand-computed values.

The expected numbers come from the raw page (prometheus_client's parser, in vllmkit) and the raw
JSON responses; specguard's page parser, snapshot, derive and per-request readers must agree.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import vllmkit as kit
from vllmkit import LOOP_PROMPT, MODEL_NAME, NUM_SPECULATIVE_TOKENS

from specguard.exporters import derive, engines, scrape

pytestmark = pytest.mark.vllm

K = NUM_SPECULATIVE_TOKENS
TRAFFIC = [
    {"prompt": LOOP_PROMPT, "max_tokens": 40, "temperature": 0},
    {"prompt": "queue cache server request", "max_tokens": 24, "temperature": 1.0},
    {"prompt": LOOP_PROMPT + " over", "max_tokens": 32, "temperature": 0.3, "top_p": 0.9},
]


def send_traffic(url: str) -> list[dict]:
    return [kit.post(url, "/v1/completions", {"model": MODEL_NAME, **body}) for body in TRAFFIC]


def inspect_json(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "specguard", "inspect", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def hand_computed(page: kit.Page, k: int) -> dict:
    """What inspect must print for one page, from raw samples."""
    itl_sum = page.total("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_sum")
    itl_count = page.total("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count")
    tpot = "vllm:request_time_per_output_token_seconds"
    out = {
        "engine": "vllm",
        "generation_tokens": page.total(kit.GENERATION),
        "running_requests": page.total("vllm:num_requests_running"),
        "waiting_requests": page.total("vllm:num_requests_waiting"),
        "mean_step_seconds": itl_sum / itl_count,
        "time_per_output_token_seconds": page.total(tpot, tpot + "_sum") / page.total(tpot, tpot + "_count"),
    }
    if k == 0:
        return {**out, "speculation_enabled": False, "num_speculative_tokens": 0, "drafts": None}
    drafts = page.total(kit.SPEC_COUNTERS["drafts"])
    draft_tokens = page.total(kit.SPEC_COUNTERS["draft_tokens"])
    accepted = page.total(kit.SPEC_COUNTERS["accepted_tokens"])
    per_pos = page.per_position()
    accept_length = 1 + accepted / drafts
    return {
        **out,
        "speculation_enabled": True,
        "num_speculative_tokens": k,
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "accepted_per_position": per_pos,
        "per_position_acceptance": [p / drafts for p in per_pos],
        "strict_accept_rate": accepted / draft_tokens,
        "accept_length": accept_length,
        "ci_acceptance_proxy": accept_length / (k + 1),
        "full_rollback_ratio": 1 - per_pos[0] / drafts,
    }


def assert_matches(got: dict, want: dict) -> None:
    for key, value in want.items():
        assert key in got, f"inspect --json has no {key!r}"
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-9), key
        elif isinstance(value, list):
            assert got[key] == pytest.approx(value, rel=1e-9), key
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("which", ["spec", "nospec"])
def test_inspect_url_matches_hand_computed_values(vllm_engines, which):
    engine = getattr(vllm_engines, which)
    send_traffic(engine.url)
    before = kit.scrape(engine.url)
    got = inspect_json("--url", engine.url)
    after = kit.scrape(engine.url)
    # Nothing ran between the two raw scrapes, so inspect saw the same counters.
    assert before.spec_counters() == after.spec_counters()
    assert_matches(got, hand_computed(after, engine.num_speculative_tokens))


def test_inspect_window_of_two_saved_pages_equals_per_request_sums(vllm_engines, tmp_path):
    url = vllm_engines.spec.url
    first = kit.fetch(f"{url}/metrics")
    responses = send_traffic(url)
    second = kit.fetch(f"{url}/metrics")
    (tmp_path / "a.txt").write_text(first)
    (tmp_path / "b.txt").write_text(second)
    got = inspect_json("--file", str(tmp_path / "a.txt"), "--file", str(tmp_path / "b.txt"))
    stats = [kit.spec_metrics(r) for r in responses]
    want = kit.expected_deltas(stats, K)
    assert got["drafts"] == want["drafts"]
    assert got["draft_tokens"] == want["draft_tokens"]
    assert got["accepted_tokens"] == want["accepted_tokens"]
    assert got["accepted_per_position"] == [want[f"per_pos_{i}"] for i in range(K)]
    assert got["generation_tokens"] == sum(r["usage"]["completion_tokens"] for r in responses)
    assert got["counter_resets"] == []
    assert got["accept_length"] == pytest.approx(1 + want["accepted_tokens"] / want["drafts"])


def test_snapshot_of_real_page_and_window_deltas(vllm_engines):
    url = vllm_engines.spec.url
    page_url = scrape.metrics_url(url)
    snap_before = scrape.scrape_sync(page_url).snapshot
    responses = send_traffic(url)
    snap_after = scrape.scrape_sync(page_url).snapshot
    raw = kit.scrape(url)
    assert snap_after.engine == "vllm"
    assert snap_after.speculation_enabled is True
    assert snap_after.num_speculative_tokens == K
    assert snap_after.drafts == raw.total(kit.SPEC_COUNTERS["drafts"])
    assert list(snap_after.accepted_per_position) == raw.per_position()
    # specguard names counter families by their samples (`x_total`), prometheus_client without.
    assert {f.removesuffix("_total") for f in snap_after.families} == {
        f.removesuffix("_total") for f in raw.types
    }
    d = derive.summarize(snap_after, snap_before)
    stats = [kit.spec_metrics(r) for r in responses]
    want = kit.expected_deltas(stats, K)
    assert (d.drafts, d.draft_tokens, d.accepted_tokens) == (
        want["drafts"],
        want["draft_tokens"],
        want["accepted_tokens"],
    )


def test_nospec_page_snapshot_says_speculation_off(vllm_engines):
    snap = scrape.scrape_sync(scrape.metrics_url(vllm_engines.nospec.url)).snapshot
    assert snap.speculation_enabled is False
    assert snap.num_speculative_tokens == 0
    assert snap.drafts is None and snap.accepted_per_position is None
    assert snap.generation_tokens == kit.scrape(vllm_engines.nospec.url).total(kit.GENERATION)


# --- per-request fields ------------------------------------------------------------------------


def assert_stats_equal_raw(stats, raw: dict, completion_tokens: int) -> None:
    assert stats is not None
    assert stats.source == "vllm"
    assert stats.rounds == raw["num_spec_steps"]
    assert stats.draft_tokens == raw["num_draft_tokens"]
    assert stats.accepted_tokens == raw["num_accepted_draft_tokens"]
    assert list(stats.accepted_histogram) == raw["acceptance_histogram"]
    assert stats.full_rollback_rounds == raw["acceptance_histogram"][0]
    assert stats.num_speculative_tokens == K
    assert stats.output_tokens == completion_tokens
    if raw["num_spec_steps"]:
        assert stats.accept_length == pytest.approx(raw["mean_acceptance_length"])
    if raw["num_draft_tokens"]:
        assert stats.strict_accept_rate == pytest.approx(raw["draft_acceptance_rate"])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_acceptance_histogram_from_real_responses_streaming_and_not(vllm_engines, path, temperature):
    url = vllm_engines.spec.url
    if path == "/v1/completions":
        body = {"prompt": LOOP_PROMPT, "max_tokens": 40, "temperature": temperature}
    else:
        messages = [{"role": "user", "content": LOOP_PROMPT}]
        body = {"messages": messages, "max_tokens": 40, "temperature": temperature}
    body["model"] = MODEL_NAME
    plain = kit.post(url, path, body)
    assert_stats_equal_raw(
        engines.request_stats("vllm", plain), kit.spec_metrics(plain), plain["usage"]["completion_tokens"]
    )
    events = kit.stream(url, path, {**body, "stream_options": {"include_usage": True}})
    last = events[-1]
    assert_stats_equal_raw(
        engines.request_stats("vllm", last), kit.spec_metrics(last), last["usage"]["completion_tokens"]
    )
    # Content chunks carry no per-request stats, and say so without raising.
    assert all(engines.request_stats("vllm", e) is None for e in events[:-1])


def test_unattributed_reasons_of_real_responses(vllm_engines):
    url = vllm_engines.spec.url
    base = {"model": MODEL_NAME, "prompt": LOOP_PROMPT, "max_tokens": 40, "temperature": 0}
    text = kit.post(url, "/v1/completions", base)["choices"][0]["text"]
    stop_request = {**base, "stop": [kit.stop_string_in(text)]}
    stopped = kit.post(url, "/v1/completions", stop_request)
    assert engines.request_stats("vllm", stopped) is None
    assert engines.missing_reason("vllm", stopped, stop_request) == "stop_string"

    n2_request = {**base, "n": 2, "temperature": 0.7, "seed": 3}
    n2 = kit.post(url, "/v1/completions", n2_request)
    assert engines.request_stats("vllm", n2) is None
    assert engines.missing_reason("vllm", n2, n2_request) == "n_gt_1"

    stream_request = {**base, "stream": True}
    last = kit.stream(url, "/v1/completions", base)[-1]
    assert engines.request_stats("vllm", last) is None
    assert engines.missing_reason("vllm", last, stream_request) == "no_usage"

    nospec = kit.post(vllm_engines.nospec.url, "/v1/completions", base)
    assert engines.request_stats("vllm", nospec) is None
    assert engines.missing_reason("vllm", nospec, base) is not None


def test_inspect_table_on_the_real_engine(vllm_engines):
    url = vllm_engines.spec.url
    proc = subprocess.run(
        [sys.executable, "-m", "specguard", "inspect", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    page = kit.scrape(url)
    drafts = page.total(kit.SPEC_COUNTERS["drafts"])
    accept_length = 1 + page.total(kit.SPEC_COUNTERS["accepted_tokens"]) / drafts
    lines = proc.stdout.splitlines()
    assert lines[0] == f"engine: vllm (speculation on, K={K})"
    row = next(line for line in lines if line.strip().startswith("accept length"))
    assert row.split()[2] == f"{accept_length:.3f}"
    row = next(line for line in lines if line.strip().startswith("verify rounds"))
    assert row.split()[3] == str(int(drafts))
