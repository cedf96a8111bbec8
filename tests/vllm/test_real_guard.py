"""The guard against real engines: RC measured against the real no-speculation engine, and a
decision consistent with the measured numbers, applied to the real routing.

Two classes go through the tap one request at a time (so the load bucket is fixed): greedy
"code", where the tiny model's loops make n-gram drafts pay, and "creative" at temperature 1,
where most drafts are rejected. A share of each class is held out on the no-spec engine for the
live baseline. The test recomputes every RC from the tap's raw request records, then checks that
the guard's decision follows from those numbers (off when even the lower bound of RC is above 1,
unchanged otherwise, whichever way this machine's measurement goes: a rule naming ``rc`` is read
as its bound, no move rests on a point estimate) and that the plan really moves traffic.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import vllmkit as kit
from vllmkit import NUM_SPECULATIVE_TOKENS

from specguard.lab import loadgen
from specguard.monitor import config, guard_wiring
from specguard.monitor.app import Monitor
from specguard.rules import baseline, cost

pytestmark = pytest.mark.vllm

MIX = [
    loadgen.RequestClass("code", temperature=0.0, max_tokens=64, prompt_tokens=40, chat=False),
    loadgen.RequestClass("creative", temperature=1.0, max_tokens=64, prompt_tokens=20, chat=False),
]
MIN_SAMPLES = 8


def config_text(engines, tmp_path) -> str:
    k = NUM_SPECULATIVE_TOKENS
    return f"""
pools:
  - {{name: spec, url: "{engines.spec.url}", engine: vllm, num_speculative_tokens: {k}}}
  - {{name: nospec, url: "{engines.nospec.url}", engine: vllm, num_speculative_tokens: 0}}
tap: {{listen: "127.0.0.1:0", holdout_share: 0.4, probe_share: 0, default_pool: spec, nospec_pool: nospec}}
scrape: {{interval_seconds: 3600}}
cost: {{min_samples: {MIN_SAMPLES}, baseline_min_samples: {MIN_SAMPLES}, baseline_scope: load}}
guard:
  window_seconds: 600
  min_samples: {MIN_SAMPLES}
  consecutive_failure_limit: 0  # act on the first bad evaluation
  failure_limit: -1
  cooldown_seconds: 0
  shorten: false
  rules:
    # A rule naming the point estimate: the guard reads it as the interval's bound all the same
    # (rc_lower to move off speculation), so no move rests on a point.
    - {{name: relative-cost, measure: rc, threshold: 1.0, restore_threshold: 0.95}}
server: {{insecure_loopback: true}}
actuators: {{plan_file: "{tmp_path / "plan.json"}", audit_log: "{tmp_path / "audit.jsonl"}"}}
"""


def ratio_of_sums(records) -> float:
    usable = [r for r in records if baseline.usable_for_tpot(r)]
    return sum(r.decode_seconds for r in usable) / sum(r.output_tokens - 1 for r in usable)


async def test_guard_measures_rc_against_the_real_nospec_engine_and_decides_consistently(
    vllm_engines, tmp_path
):
    cfg = config.parse_text(config_text(vllm_engines, tmp_path), "specguard.yaml")
    monitor = Monitor(cfg, rng=random.Random(11))
    guard, _ = guard_wiring.build(monitor, cfg)  # no scheduler: the test triggers evaluations
    await guard.elector.start()  # (the lock on the plan file: this guard decides)
    url = await monitor.start("127.0.0.1", 0)
    try:
        results = await loadgen.run_load(url, MIX, 1, requests=48, stream=True, seed=21)
        assert {r.status for r in results} == {200}, [r.error for r in results if not r.ok]
        now = time.time()
        decisions = {d.key: d for d in await guard.evaluate(now)}
        records = monitor.stats.records()
        settings = cfg.sections["cost"].with_traffic(
            cfg.exporter.classes.load_buckets, cfg.exporter.tap.full_rollback_request_threshold
        )
        costs = {
            (c.task_type, c.temperature_bucket, c.load_bucket): c
            for c in cost.evaluate(
                records, {"spec": NUM_SPECULATIVE_TOKENS, "nospec": 0}, None, now, settings
            )
            if c.pool == "spec"
        }
        plan = monitor.router.plan()
        # After the decision: the plan routes real traffic (no probes, the holdout still applies).
        nospec_before = await asyncio.to_thread(kit.scrape, vllm_engines.nospec.url)
        later = await loadgen.run_load(url, MIX, 1, requests=10, stream=True, seed=22)
        nospec_after = await asyncio.to_thread(kit.scrape, vllm_engines.nospec.url)
        later_records = monitor.stats.records()[len(records) :]
    finally:
        await monitor.stop()
        await guard.elector.stop()

    keys = {("code", "greedy", "low"), ("creative", "high", "low")}
    assert set(costs) == keys
    measured = {}
    for key in keys:
        c = costs[key]
        spec_side = [
            r for r in records if r.pool == "spec" and (r.task_type, r.temperature_bucket) == key[:2]
        ]
        base_side = [r for r in records if r.pool == "nospec" and r.load_bucket == key[2]]
        # The baseline is live, from the real no-spec engine, and the RC is the ratio of the two
        # ratio-of-sums TPOTs, recomputed here from the raw records. The samples are the requests
        # with an observable decode phase: on a loaded machine the engine may deliver a whole
        # answer in one chunk, and such a request has no per-token time (counting every request
        # once failed as 15 == 16).
        timed = [r for r in spec_side if baseline.usable_for_tpot(r)]
        assert c.baseline_source == "live"
        assert c.n_spec == len(timed) >= MIN_SAMPLES
        assert c.n_base == sum(1 for r in base_side if baseline.usable_for_tpot(r)) >= MIN_SAMPLES
        assert c.spec_tpot_seconds == pytest.approx(ratio_of_sums(spec_side), rel=1e-9)
        assert c.base_tpot_seconds == pytest.approx(ratio_of_sums(base_side), rel=1e-9)
        assert c.rc == pytest.approx(c.spec_tpot_seconds / c.base_tpot_seconds, rel=1e-9)
        assert c.lower <= c.rc <= c.upper
        # Acceptance of the class, from the engine's own per-request summaries.
        rounds = sum(r.spec.rounds for r in spec_side)
        accepted = sum(r.spec.accepted_tokens for r in spec_side)
        assert c.accept_length == pytest.approx(1 + accepted / rounds)
        measured[key] = c.rc

        decision = decisions[key]
        if c.lower > 1.0:  # even the lower bound costs more per token than the no-spec engine: off
            assert (decision.action, decision.to_pool) == ("off", "nospec"), decision
            assert plan[key] == "nospec"
            assert "not rc (no move on a point estimate)" in decision.reason
        else:  # it pays, breaks even or is not known to lose: the class stays on speculation
            assert decision.action == "none", decision
            assert plan.get(key, "spec") == "spec"

    # Greedy loops make drafts pay much more often than sampled text does.
    assert costs[("code", "greedy", "low")].accept_length > costs[("creative", "high", "low")].accept_length
    print("measured RC:", measured)  # shown with -s; the README quotes a run

    # The plan is applied to the real engines: a class turned off now goes to the no-spec engine.
    for record in later_records:
        key = (record.task_type, record.temperature_bucket, record.load_bucket)
        expected = plan.get(key, "spec")
        assert record.pool == expected or record.route == "holdout", record
    sent_to_nospec = sum(1 for r in later_records if r.pool == "nospec")
    assert kit.delta(nospec_before, nospec_after)["requests"] == sent_to_nospec
    assert len(later) == len(later_records)
