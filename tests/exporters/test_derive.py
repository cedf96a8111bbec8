"""Derived metrics (CONCEPTS.md worked examples) and Prometheus-style windows with counter resets."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specguard.errors import InputError
from specguard.exporters import derive, engines
from specguard.exporters.snapshot import EngineSnapshot, HistogramTotals
from tests.propkit import examples

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
K4 = (FIXTURES / "vllm-0.32-cpu-ngram-k4.metrics.txt").read_text()


def spec_snapshot(rounds, k, accepted_per_position, **extra) -> EngineSnapshot:
    """A vLLM-like snapshot where every round drafted ``k`` tokens."""
    return EngineSnapshot(
        engine="vllm",
        speculation_enabled=True,
        num_speculative_tokens=k,
        drafts=rounds,
        draft_tokens=rounds * k,
        accepted_tokens=sum(accepted_per_position),
        accepted_per_position=tuple(accepted_per_position),
        **extra,
    )


def test_seed_000_one_round_five_drafts_three_accepted():
    d = derive.derive(spec_snapshot(1, 5, [1, 1, 1, 0, 0]))
    assert d.strict_accept_rate == pytest.approx(0.6)
    assert d.accept_length == pytest.approx(4.0)  # D1..D3 + bonus
    assert d.ci_acceptance_proxy == pytest.approx(4 / 6)
    assert d.full_rollback_ratio == 0.0


def test_ci_proxy_is_accept_length_over_verify_width():
    # "accept_rate >= 0.5" with verify width 7 (K = 6) means A >= 3.5, not alpha >= 50 %
    d = derive.derive(spec_snapshot(2, 6, [2, 2, 1, 0, 0, 0]))
    assert d.accept_length == pytest.approx(3.5) and d.ci_acceptance_proxy == pytest.approx(0.5)
    assert d.strict_accept_rate == pytest.approx(5 / 12)  # far below 0.5


@given(
    st.integers(min_value=1, max_value=8).flatmap(
        lambda k: st.tuples(st.just(k), st.lists(st.integers(0, k), min_size=1, max_size=50))
    )
)
def test_accept_length_is_one_plus_alpha_k_and_one_plus_sum_p(case):
    k, accepted_per_round = case
    per_pos = [sum(1 for a in accepted_per_round if a > i) for i in range(k)]
    d = derive.derive(spec_snapshot(len(accepted_per_round), k, per_pos))
    assert d.accept_length == pytest.approx(1 + d.strict_accept_rate * k)
    assert d.accept_length == pytest.approx(1 + sum(d.per_position_acceptance))
    assert d.full_rollback_ratio == pytest.approx(accepted_per_round.count(0) / len(accepted_per_round))


@pytest.mark.parametrize(("accept_length", "per_token_ms"), [(3, 17.67), (4, 13.25)])
def test_rtp_llm_round_time_over_accept_length(accept_length, per_token_ms):
    # seed 002: T_round = 5 * 7 ms + 18 ms = 53 ms; per-token time = T_round / A
    rounds = 100
    snap = spec_snapshot(
        rounds,
        5,
        [rounds] * (accept_length - 1) + [0] * (6 - accept_length),
        step_latency=HistogramTotals(sum=0.053 * rounds, count=rounds),
    )
    d = derive.derive(snap)
    assert d.accept_length == pytest.approx(accept_length)
    assert d.mean_step_seconds == pytest.approx(0.053)
    assert d.time_per_output_token_seconds * 1000 == pytest.approx(per_token_ms, abs=0.005)


def test_json_has_exactly_the_stable_keys_and_nulls():
    d = derive.derive(EngineSnapshot(engine="llamacpp"))
    out = d.as_dict()
    assert tuple(out) == derive.KEYS
    assert out["engine"] == "llamacpp" and out["models"] == {} and out["warnings"] == []
    assert all(out[k] is None for k in derive.KEYS if k not in ("engine", "models", "warnings"))


def _lower(text: str, name: str, old: str, new: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith(name) and line.endswith(old))
    return text.replace(line, line[: -len(old)] + new)


def test_window_between_two_real_pages():
    earlier = _lower(K4, "vllm:spec_decode_num_drafts_total", "192.0", "92.0")
    earlier = _lower(earlier, "vllm:spec_decode_num_accepted_tokens_total", "528.0", "228.0")
    prev, cur = engines.parse_snapshot(earlier), engines.parse_snapshot(K4)
    d = derive.summarize(cur, prev)
    assert d.drafts == 100 and d.accepted_tokens == 300 and d.accept_length == pytest.approx(4.0)
    assert d.draft_tokens == 0 and d.strict_accept_rate is None
    assert d.counter_resets == ()
    assert d.running_requests == 0  # gauges: the value at the end of the window


def test_counter_reset_counts_from_zero_and_is_reported():
    # the earlier page has a higher counter: the engine restarted in between (Prometheus rate())
    earlier = _lower(K4, "vllm:spec_decode_num_drafts_total", "192.0", "500.0")
    d = derive.summarize(engines.parse_snapshot(K4), engines.parse_snapshot(earlier))
    assert d.drafts == 192
    assert d.counter_resets == ("vllm:spec_decode_num_drafts_total",)
    assert d.as_dict()["counter_resets"] == ["vllm:spec_decode_num_drafts_total"]


def test_restarted_engine_window_equals_the_new_cumulative_page():
    huge = K4
    for name, value in [
        ("vllm:spec_decode_num_drafts_total", "192.0"),
        ("vllm:spec_decode_num_draft_tokens_total", "671.0"),
        ("vllm:spec_decode_num_accepted_tokens_total", "528.0"),
        ("vllm:generation_tokens_total", "1156.0"),
    ]:
        huge = _lower(huge, name, value, "1e9")
    window = derive.summarize(engines.parse_snapshot(K4), engines.parse_snapshot(huge))
    cumulative = derive.summarize(engines.parse_snapshot(K4))
    assert window.accept_length == cumulative.accept_length
    assert window.strict_accept_rate == cumulative.strict_accept_rate
    assert window.generation_tokens == 1156
    assert len(window.counter_resets) == 4


def test_series_born_inside_the_window_counts_from_zero_and_models_window_too():
    text = (FIXTURES / "vllm-dp2-two-models-multiproc.metrics.txt").read_text()
    engine1 = [line for line in text.splitlines() if 'engine="1"' in line]
    earlier = "\n".join(line for line in text.splitlines() if line not in engine1)
    d = derive.summarize(engines.parse_snapshot(text), engines.parse_snapshot(earlier))
    assert d.drafts == 300 and d.models["alpha"].drafts == 300 and d.models["beta"].drafts == 0
    assert d.models["alpha"].accept_length == pytest.approx(2.5)


def test_window_of_different_engines_is_an_input_error():
    with pytest.raises(InputError, match="different engines"):
        derive.window(EngineSnapshot(engine="vllm"), EngineSnapshot(engine="sglang"))


_STEPS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1000), st.booleans()), min_size=1, max_size=30)


@settings(max_examples=examples(150), deadline=None)
@given(st.integers(0, 10_000), _STEPS)
def test_window_deltas_are_invariant_under_counter_resets(start, steps):
    """Sum of window deltas over consecutive scrapes = what really happened, resets or not.

    Three series (e.g. three DP engines) each grow; some restart from zero between two scrapes
    (and grow again before the next one). Each step's delta must be the true increase, and the
    resets must be reported exactly when a counter went down.
    """
    values = {0: float(start), 1: float(start // 2), 2: 0.0}
    key = "vllm:spec_decode_num_drafts_total"

    def snap():
        series = {(key, (("engine", str(i)),)): v for i, v in values.items()}
        return EngineSnapshot(engine="vllm", drafts=sum(values.values()), series={"drafts": series})

    prev = snap()
    true_total = windows_total = 0.0
    for which, grow, restart in steps:
        # a restart that ends at or above the old value cannot be seen (nor by Prometheus): growth
        restart = restart and grow < values[which]
        values[which] = float(grow) if restart else values[which] + grow
        true_total += grow
        cur = snap()
        window = derive.window(prev, cur)
        windows_total += window.drafts
        assert window.drafts == grow
        assert window.counter_resets == ((key,) if restart else ())
        prev = cur
    assert windows_total == true_total
