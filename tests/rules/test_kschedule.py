"""``rules.kschedule``: the K per batch-size range that costs a measured mix least per token."""

from __future__ import annotations

import json

import pytest

from specguard.rules import kschedule
from specguard.rules import profile as profile_mod

BASE = {1: 0.020, 8: 0.022, 32: 0.030, 128: 0.060}
SPEC = {  # TPOT of the whole mix on each K, and of the creative class
    4: ({1: 0.012, 8: 0.014, 32: 0.033, 128: 0.120}, 1.40),
    2: ({1: 0.014, 8: 0.015, 32: 0.027, 128: 0.080}, 1.20),
}


def level(c: float, tpot: float, creative_rc: float | None) -> profile_mod.ProfileLevel:
    classes = (
        profile_mod.ClassLevel("code", "greedy", tpot_seconds=tpot * 0.8, samples=50),
        profile_mod.ClassLevel("creative", "high", tpot_seconds=BASE[c] * (creative_rc or 1.0), samples=50),
    )
    return profile_mod.ProfileLevel(c, tpot, 100, classes=classes)


def profile() -> profile_mod.Profile:
    pools = [profile_mod.ProfilePool("nospec", 0, tuple(level(c, t, None) for c, t in BASE.items()))]
    for k, (tpots, creative) in SPEC.items():
        pools.append(
            profile_mod.ProfilePool(f"k{k}", k, tuple(level(c, t, creative) for c, t in tpots.items()))
        )
    return profile_mod.Profile(tuple(pools))


def test_the_cheapest_k_per_level_joined_into_ranges_with_boundaries_where_the_curves_cross():
    advice = kschedule.recommend(profile())
    assert [(r.start, r.end, r.k) for r in advice.ranges] == [(1, 10, 4), (11, 44, 2), (45, None, 0)]
    # K=4 (0.636 at 8, 1.1 at 32) against K=2 (0.682, 0.9): equal at 10.3 in log-concurrency
    first = advice.ranges[0]
    assert first.rc == pytest.approx((0.6, 0.6363636)) and first.levels == (1, 8)
    assert first.losing() == {"creative/high": pytest.approx(1.4)}  # the class the schedule cannot spare
    assert advice.ranges[2].losing() == {}  # K=0: nothing speculates there
    config = json.loads(advice.vllm_config())
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 10, 4], [11, 44, 2], [45, 128, 0]],
    }
    assert advice.trtllm_config() == {
        "decoding_type": "NGram",
        "max_draft_len": 4,
        "draft_len_schedule": {10: 4, 44: 2},
    }
    lines = advice.lines()
    assert lines[0] == "batch 1-10: K=4 (RC 0.60-0.64), batch 11-44: K=2 (RC 0.90), batch 45+: K=0 (RC 1.00)"
    assert any("creative/high (1.40)" in line for line in lines)


def test_no_advice_without_a_baseline_or_a_speculative_pool():
    only = profile_mod.Profile((profile_mod.ProfilePool("nospec", 0, (level(1, 0.02, None),)),))
    assert kschedule.recommend(only) is None
