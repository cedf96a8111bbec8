"""The calibration profile as prior evidence (``rules.prior``): rc per class, load bucket and pool."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard.rules import evidence as evidence_mod
from specguard.rules import policy as policy_mod
from specguard.rules import prior
from specguard.rules import profile as profile_mod
from specguard.rules.cost_config import CostSettings

POOLS = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
BASE = {1: 0.010, 4: 0.011, 16: 0.014, 32: 0.020, 64: 0.030}  # no-spec TPOT by concurrency
CHAT = {  # (K=4, K=2) class TPOT by concurrency: K=2 cheaper by 15% or more
    1: (0.0066, 0.0056),
    4: (0.0074, 0.0063),
    16: (0.0105, 0.0089),
    32: (0.0260, 0.0145),
    64: (0.0800, 0.0400),
}


def level(c, tpot, chat=None):
    """A level with standard errors of 1% (the whole level) and 2% (the class)."""
    classes = ()
    if chat is not None:
        cls = profile_mod.ClassLevel(
            "chat", "medium", tpot_seconds=chat, samples=40, tpot_stderr_seconds=0.02 * chat
        )
        classes = (cls,)
    return profile_mod.ProfileLevel(c, tpot, 100, tpot_stderr_seconds=0.01 * tpot, classes=classes)


def profile():
    def pool(name, k, index):
        levels = tuple(
            level(c, BASE[c] if k == 0 else CHAT[c][index], None if k == 0 else CHAT[c][index]) for c in BASE
        )
        return profile_mod.ProfilePool(name, k, levels)

    return profile_mod.Profile((pool("spec-k4", 4, 0), pool("spec-k2", 2, 1), pool("nospec", 0, 0)))


BUCKETS = [("low", 0.0, 8.0), ("medium", 8.0, 24.0), ("high", 24.0, float("inf"))]


def test_rc_per_class_bucket_and_pool():
    out = prior.prior_rcs(profile(), POOLS, BUCKETS)
    assert set(out) == {("chat", "medium", b) for b, _, _ in BUCKETS}
    assert set(out[("chat", "medium", "low")]) == {"spec-k4", "spec-k2"}  # no-spec is 1.0 by definition
    # medium (8, 24]: only level 16 inside
    assert out[("chat", "medium", "medium")]["spec-k2"].rc == pytest.approx(0.0089 / 0.014)
    # the open top bucket stands at its lowest swept level (32), not an average with 64
    assert out[("chat", "medium", "high")]["spec-k4"].rc == pytest.approx(0.026 / 0.020)
    assert out[("chat", "medium", "high")]["spec-k2"].rc == pytest.approx(0.0145 / 0.020)


def test_a_prior_carries_an_interval_from_the_profiles_standard_errors():
    """With standard errors, theirs (2% the class, 1% the no-spec level); without (an older
    profile), PRIOR_CV per request over the samples (the class's 40, the level's 100)."""
    import math

    found = prior.prior_rcs(profile(), POOLS, BUCKETS)[("chat", "medium", "medium")]["spec-k2"]
    assert found.upper / found.rc == pytest.approx(math.exp(1.96 * math.hypot(0.01, 0.02)), rel=1e-3)
    assert found.lower * found.upper == pytest.approx(found.rc**2)
    bare = profile_mod.Profile(
        tuple(
            replace(
                pool,
                levels=tuple(
                    replace(
                        lv,
                        tpot_stderr_seconds=None,
                        classes=tuple(replace(c, tpot_stderr_seconds=None) for c in lv.classes),
                    )
                    for lv in pool.levels
                ),
            )
            for pool in profile().pools
        )
    )
    found = prior.prior_rcs(bare, POOLS, BUCKETS)[("chat", "medium", "medium")]["spec-k2"]
    sd = math.hypot(prior.PRIOR_CV / math.sqrt(40), prior.PRIOR_CV / math.sqrt(100))
    assert found.upper / found.rc == pytest.approx(math.exp(1.96 * sd), rel=1e-3)


def test_pools_matched_by_k_when_names_differ():
    out = prior.prior_rcs(profile(), {"big": 4, "plain": 0}, BUCKETS[:1])
    assert set(out[("chat", "medium", "low")]) == {"big"}


def test_no_baseline_pool_or_no_profile_gives_nothing():
    no_base = replace(profile(), pools=profile().pools[:2])
    assert prior.prior_rcs(no_base, POOLS, BUCKETS) == {}
    assert prior.prior_rcs(None, POOLS, BUCKETS) == {}


def test_for_policy_follows_the_prior_key_and_the_cost_buckets():
    settings = CostSettings().with_traffic([("low", 8), ("medium", 24), ("high", None)])
    policy = policy_mod.Policy(rules=(), pools=POOLS)
    assert set(prior.for_policy(profile(), policy, settings)) == {
        ("chat", "medium", b) for b, _, _ in BUCKETS
    }
    assert prior.for_policy(profile(), replace(policy, prior="none"), settings) == {}


def test_with_prior_covers_every_class_it_knows_and_keeps_live_pools():
    key = ("chat", "medium", "low")
    live = {key: evidence_mod.Evidence(pools={"spec-k4": evidence_mod.PoolEvidence("spec-k4")})}
    rcs = prior.prior_rcs(profile(), POOLS, BUCKETS)
    out = evidence_mod.with_prior(live, rcs)
    assert set(out[key].pools) == {"spec-k4"}
    points = {k: {p: v.rc for p, v in found.items()} for k, found in rcs.items()}
    assert out[key].prior == points[key] and out[key].prior["spec-k2"] < out[key].prior["spec-k4"]
    assert out[key].prior_bounds["spec-k2"] == (rcs[key]["spec-k2"].lower, rcs[key]["spec-k2"].upper)
    high = ("chat", "medium", "high")
    assert out[high].pools == {} and out[high].prior == points[high]  # a load bucket not reached yet
    unseen = evidence_mod.with_prior({}, rcs)  # a class before its first request is planned too
    assert set(unseen) == set(rcs) and all(e.pools == {} and e.prior == points[k] for k, e in unseen.items())
