"""Holdout on demand (``rules.holdout``) and the router's per-load-bucket shares."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from specguard.cli.commands import status as status_cmd
from specguard.errors import InputError
from specguard.exporters import routing
from specguard.exporters.config import PoolConfig
from specguard.exporters.records import RequestRecord
from specguard.rules import holdout
from specguard.rules import policy as policy_mod
from specguard.rules.cost_config import CostSettings

POOLS = {"spec-k4": 4, "nospec": 0}


def record(pool, route, load_bucket="low", output_tokens=20):
    return RequestRecord(
        pool=pool,
        task_type="chat",
        temperature_bucket="medium",
        load_bucket=load_bucket,
        route=route,
        started_at=0.0,
        status=200,
        streamed=True,
        output_tokens=output_tokens,
        decode_seconds=0.2,
    )


def two_pool_router(holdout_share: float, seed: int) -> routing.Router:
    pools = [
        PoolConfig("spec-k4", "http://a", num_speculative_tokens=4),
        PoolConfig("nospec", "http://b", num_speculative_tokens=0),
    ]
    return routing.Router(
        pools,
        default_pool="spec-k4",
        nospec_pool="nospec",
        holdout_share=holdout_share,
        rng=random.Random(seed),
    )


def records(planned_nospec, speculating, load_bucket="low"):
    return [record("nospec", "plan", load_bucket) for _ in range(planned_nospec)] + [
        record("spec-k4", "plan", load_bucket) for _ in range(speculating)
    ]


@pytest.mark.parametrize(
    ("planned", "speculating", "expected"),
    [
        pytest.param(45, 500, 0.0, id="planned-no-spec-covers-the-baseline"),
        pytest.param(40, 500, 5 / 500, id="tops-up-what-is-missing"),
        pytest.param(0, 500, 0.05, id="capped-at-the-tap-share"),
        pytest.param(0, 0, None, id="bucket-not-seen-keeps-the-tap-share"),
    ],
)
def test_share_is_just_enough_for_the_baseline(planned, speculating, expected):
    out = holdout.shares(
        records(planned, speculating), POOLS, baseline_min_samples=30, min_share=0.0, max_share=0.05
    )
    assert out.get("low") == (None if expected is None else pytest.approx(expected))


def test_probes_holdouts_and_unusable_requests_do_not_count_as_planned():
    rows = [record("nospec", "holdout") for _ in range(100)] + [
        record("spec-k4", "probe") for _ in range(100)
    ]
    rows += [record("nospec", "plan", output_tokens=1) for _ in range(100)]  # no decode phase
    out = holdout.shares(rows, POOLS, baseline_min_samples=30, min_share=0.01, max_share=0.05)
    assert out == {"low": 0.05}  # 100 holdouts are eligible, 45 wanted, capped at 0.05


def test_spread_requests_feed_the_baseline_and_are_never_drawn_from():
    """The spread routes before any holdout draw: its no-spec requests feed the baseline for free,
    and its speculative ones are not there for the share to draw from."""
    rows = records(30, 500)
    rows += [record("nospec", "spread") for _ in range(10)] + [
        record("spec-k4", "spread") for _ in range(300)
    ]
    out = holdout.shares(rows, POOLS, baseline_min_samples=30, min_share=0.0, max_share=0.05)
    assert out == {"low": pytest.approx((45 - 40) / 500)}  # not (45 - 30) / 810


def test_fixed_mode_and_per_class_baselines_keep_the_tap_share():
    rows, policy = records(100, 10), policy_mod.Policy(rules=(), holdout="on_demand")
    assert holdout.for_policy(rows, POOLS, policy, CostSettings(), 0.05) == holdout.Holdout({"low": 0.0})
    per_class = CostSettings(baseline_scope="class_then_load")
    assert holdout.for_policy(rows, POOLS, policy, per_class, 0.05) == holdout.Holdout()
    fixed = policy_mod.Policy(rules=(), holdout="fixed")
    assert holdout.for_policy(rows, POOLS, fixed, CostSettings(), 0.05) == holdout.Holdout()  # tap's share
    matched = policy_mod.Policy(rules=(), holdout="capacity_matched")  # the router matches loads, no shares
    assert holdout.router_mode(matched) == "capacity_matched"
    assert holdout.for_policy(rows, POOLS, matched, CostSettings(), 0.05) == holdout.Holdout()
    assert holdout.router_mode(fixed) == "share"
    default = policy_mod.Policy(rules=())
    assert default.holdout == "matched_on_demand" and holdout.router_mode(default) == "matched_on_demand"


def test_matched_on_demand_names_the_buckets_whose_live_baseline_is_short():
    rows = records(100, 10, "low") + records(0, 200, "medium") + records(29, 200, "high")
    rows += [record("spec-k4", "probe", "huge") for _ in range(50)]  # probes alone ask for nothing
    held = holdout.for_policy(rows, POOLS, policy_mod.Policy(rules=()), CostSettings(), 0.05)
    # medium has no no-spec request at its load, high has 29 (below baseline_min_samples): both refill
    assert held.matched == {"medium", "high"}
    assert held.shares["low"] == 0.0  # and the shares are on_demand's
    rows += [record("nospec", "holdout", "high")]
    held = holdout.for_policy(rows, POOLS, policy_mod.Policy(rules=()), CostSettings(), 0.05)
    assert held.matched == {"medium"}
    per_class = CostSettings(baseline_scope="class_then_load")
    default = policy_mod.Policy(rules=())
    assert holdout.for_policy(rows, POOLS, default, per_class, 0.05).matched == frozenset()


def test_router_matches_capacity_only_in_the_named_buckets():
    router = two_pool_router(0.05, seed=1)
    router.set_holdout_mode("matched_on_demand")
    router.set_holdout_shares({"low": 0.0, "medium": 0.0}, matched={"medium"})
    loads = {"spec-k4": 20.0, "nospec": 3.0}  # the no-spec replica is far below the fleet's load
    medium = router.choose("chat", "medium", lambda pool: "medium", loads.get)
    low = [router.choose("chat", "medium", lambda pool: "low", loads.get).route for _ in range(200)]
    assert medium.route == "holdout" and medium.pool == "nospec"
    assert "holdout" not in low  # low keeps its share (0 here)
    assert router.matched_buckets() == {"medium"}
    report = router.holdout_report()  # what /status shows, and `specguard status` prints
    assert report == {
        "mode": "matched_on_demand",
        "share": 0.05,
        "shares": {"low": 0.0, "medium": 0.0},
        "class_shares": {},
        "refilling": ["medium"],
    }
    text = status_cmd.render({"holdout": report})
    assert (
        "holdout: matched_on_demand; share low 0.0%, medium 0.0%; refilling (capacity matched): medium"
        in (text)
    )
    loads["nospec"] = 25.0  # matched: nothing more once the no-spec replica is as loaded
    assert router.choose("chat", "medium", lambda pool: "medium", loads.get).route == "plan"


def _starvation_run(pin_back_at: float, end: float) -> list[tuple[float, int]]:
    """On-demand holdout through the real router, re-planned every 30 s on a 300 s window.

    10 requests/s of a speculating class and, until ``pin_back_at``, 2/s of a class planned on the
    no-spec pool; then that class is pinned back to speculation. Returns (time, no-spec requests in
    the window) at every evaluation.
    """
    router = two_pool_router(0.05, seed=7)
    router.set_holdout_mode("share")
    policy = policy_mod.Policy(rules=(), holdout="on_demand", window_seconds=300.0)
    settings = CostSettings(baseline_min_samples=30)
    log: list[RequestRecord] = []
    seen = []
    t = 0.0
    while t < end:
        if t % 30 == 0:
            window = [r for r in log if r.started_at >= t - 300]
            seen.append((t, sum(1 for r in window if r.pool == "nospec")))
            router.set_holdout_shares(holdout.for_policy(window, POOLS, policy, settings, 0.05, now=t).shares)
        router.set_plan({} if t >= pin_back_at else {("creative", "high", "low"): "nospec"})
        for task, count in (("chat", 10), ("creative", 2)):
            for _ in range(count):
                choice = router.choose(task, "high", lambda pool: "low")
                log.append(replace(record(choice.pool, choice.route), task_type=task, started_at=t))
        t += 1.0
    return seen


def test_on_demand_never_lets_the_baseline_lapse_when_planned_nospec_traffic_stops():
    # a class planned on the no-spec pool was pinned back; the old shares counted its
    # planned requests over the whole window, kept the holdout at 0 until they aged out, and the
    # bucket's baseline fell below baseline_min_samples for about a minute
    seen = _starvation_run(pin_back_at=600.0, end=1500.0)
    after_warmup = [(t, n) for t, n in seen if t >= 300]
    assert min(n for _, n in after_warmup) >= 30, after_warmup
    # and the holdout settles to about what the baseline needs (1.5 x 30 per window), not the ceiling
    assert 30 <= seen[-1][1] <= 110


def test_a_window_still_filling_is_projected_to_a_whole_window():
    rows = [replace(r, started_at=90.0) for r in records(30, 300)]  # 10 s of a 100 s window
    share = holdout.shares(
        rows, POOLS, baseline_min_samples=30, min_share=0.0, max_share=0.5, now=100.0, window_seconds=100.0
    )
    assert share == {"low": 0.0}  # 30 in 10 s is 300 per window: the baseline is covered
    unprojected = holdout.shares(rows, POOLS, baseline_min_samples=30, min_share=0.0, max_share=0.5)
    assert unprojected == {"low": pytest.approx(15 / 300)}


def test_no_lowering_before_the_live_baseline_stands():
    # 15 planned no-spec requests in the first 10 s project to 150 per window, but the baseline
    # needs 30 now: until the window holds them, the bucket gets the ceiling (as a fixed share would)
    rows = [replace(r, started_at=90.0) for r in records(15, 300)]
    share = holdout.shares(
        rows, POOLS, baseline_min_samples=30, min_share=0.0, max_share=0.5, now=100.0, window_seconds=100.0
    )
    assert share == {"low": 0.5}
    rows += [replace(r, route="holdout", started_at=95.0) for r in records(15, 0)]  # now 30 no-spec
    share = holdout.shares(
        rows, POOLS, baseline_min_samples=30, min_share=0.0, max_share=0.5, now=100.0, window_seconds=100.0
    )
    assert share["low"] < 0.5


def test_router_uses_the_share_of_the_request_load_bucket():
    router = two_pool_router(0.5, seed=1)
    router.set_holdout_shares({"low": 0.0})
    low = [router.choose("chat", "medium", lambda pool: "low").route for _ in range(400)]
    high = [router.choose("chat", "medium", lambda pool: "high").route for _ in range(400)]
    assert "holdout" not in low
    assert 120 < high.count("holdout") < 280  # the tap's 0.5 where no share is set
    assert router.holdout_shares() == {"low": 0.0}
    with pytest.raises(InputError, match="between 0 and 1"):
        router.set_holdout_shares({"low": 1.5})
