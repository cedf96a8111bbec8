"""The guard on real llama.cpp servers: its decision per class, made on its own live evidence with
the shipped rule (off when the lower confidence bound of RC is above 1.0), agrees with a ground
truth this test measures itself on the same two servers (interleaved A/B TPOT per class).

The rule is the vLLM tier's: both are intervals, they must overlap (or their points be within 25%);
neither may say "pays" where the other says "loses"; a class whose truth pays must stay on
speculation; pairs are added while no class is decided. One greedy copy class and one sampled
creative class, short requests: the tier runs in the default suite.
"""

from __future__ import annotations

import asyncio
import random
import time

import llamacpp_ab as ab
import llamacppkit as kit
import pytest

from specguard.lab import loadgen
from specguard.monitor import config, guard_wiring
from specguard.monitor.app import Monitor
from specguard.rules import cost

pytestmark = pytest.mark.llamacpp

MAX_TOKENS = 16
MIX = [
    loadgen.RequestClass(
        "extraction", temperature=0.0, max_tokens=MAX_TOKENS, prompt_tokens=40, prompts="task"
    ),
    loadgen.RequestClass(
        "creative", temperature=1.0, max_tokens=MAX_TOKENS, prompt_tokens=20, prompts="task"
    ),
]
CLASSES = {("extraction", "greedy"): "copy", ("creative", "high"): "sampled"}
FIRST_PAIRS, MORE_PAIRS, MAX_PAIRS = 3, 3, 9

GUARD = """
cost: {min_samples: 3, baseline_min_samples: 3, baseline_scope: class_then_load}
guard:
  window_seconds: 3600
  min_samples: 3
  consecutive_failure_limit: 0
  failure_limit: -1
  cooldown_seconds: 0
  shorten: false
  best_pool: false
  prior: none
  holdout: fixed
  rules:
    # The shipped rule: off when even the lower confidence bound is above 1.0.
    - {name: relative-cost, measure: rc_lower, threshold: 1.0, restore_measure: rc, restore_threshold: 0.95}
server: {insecure_loopback: true}
"""


async def test_guard_decisions_agree_with_interleaved_ab_ground_truth(llamacpp_servers, tmp_path):
    servers = llamacpp_servers
    t0 = time.monotonic()
    # 1. Ground truth: per class, the same requests on spec and nospec in ABBA order; more pairs
    #    for the undecided classes while none is decided.
    pairs: dict[tuple[str, str], list] = {key: [] for key in CLASSES}
    truth: dict[tuple[str, str], ab.Ratio] = {}
    while not truth or (
        all(t.verdict == "undecided" for t in truth.values()) and len(pairs[next(iter(CLASSES))]) < MAX_PAIRS
    ):
        for cls, key in zip(MIX, CLASSES, strict=True):
            if key in truth and truth[key].verdict != "undecided":
                continue
            more = FIRST_PAIRS if not pairs[key] else MORE_PAIRS
            seed = 400 + 100 * len(pairs[key])
            pairs[key] += await asyncio.to_thread(
                ab.interleaved, servers.spec.url, servers.nospec.url, cls, more, seed
            )
            truth[key] = ab.ratio(pairs[key])
    # 2. The guard, on its own live evidence: traffic through the tap, half held out on nospec.
    actuators = (
        f'actuators: {{plan_file: "{tmp_path / "plan.json"}", audit_log: "{tmp_path / "audit.jsonl"}"}}'
    )
    text = kit.config_text(servers, holdout=0.5, extra=GUARD + actuators)
    cfg = config.parse_text(text, "specguard.yaml")
    monitor = Monitor(cfg, rng=random.Random(3))
    guard, _ = guard_wiring.build(monitor, cfg)
    url = await monitor.start("127.0.0.1", 0)
    try:
        results = await loadgen.run_load(url, MIX, 1, requests=20, stream=True, seed=500)
        assert {r.status for r in results} == {200}, [r.error for r in results if not r.ok]
        now = time.time()
        decisions = {d.key: d for d in await guard.evaluate(now)}
        settings = cfg.sections["cost"].with_traffic(
            cfg.exporter.classes.load_buckets, cfg.exporter.tap.full_rollback_request_threshold
        )
        measured = {
            (c.task_type, c.temperature_bucket): c
            for c in cost.evaluate(monitor.stats.records(), {"spec": kit.K, "nospec": 0}, None, now, settings)
            if c.pool == "spec" and c.load_bucket == "low"
        }
    finally:
        await monitor.stop()

    report = []
    decided = 0
    for key, kind in CLASSES.items():
        t, c = truth[key], measured[key]
        decision = decisions[(*key, "low")]
        assert c.rc is not None and c.baseline_source == "live", c
        report.append(
            f"{key[0]}/{key[1]} ({kind}): truth RC {t} -> {t.verdict}; guard RC {c.rc:.3f} "
            f"[{c.lower:.3f}, {c.upper:.3f}] -> {decision.action}"
        )
        # The decision follows the guard's own evidence (the shipped rule) ...
        if c.lower > 1.0:
            assert (decision.action, decision.to_pool) == ("off", "nospec"), report
        else:
            assert decision.action == "none", report
        # ... and that evidence agrees with the truth.
        assert not (c.upper < 1.0 < t.lower or t.upper < 1.0 < c.lower), report
        overlap = c.lower <= t.upper and t.lower <= c.upper
        assert overlap or abs(c.rc / t.point - 1.0) < 0.25, report
        if t.verdict == "pays":
            decided += 1
            assert decision.action == "none", report
        elif t.verdict == "loses":
            decided += 1
            assert c.upper > 1.0, report
    report.append(f"wall time {time.monotonic() - t0:.0f} s")
    print("\n".join(report))  # shown with -s; docs/real-model.md quotes a run
    assert decided >= 1, report
