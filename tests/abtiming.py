"""Ground truth for the guard on a real engine: interleaved A/B timing of one class, shared by the
vLLM and llama.cpp tiers.

Independent of specguard's cost model: a request's TPOT is (end - first text chunk) / (tokens - 1)
from loadgen's raw stream timing, an RC is a ratio of two ratio-of-sums TPOTs, and its interval is a
percentile bootstrap over request pairs.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from specguard.lab import loadgen

CONFIDENCE = 0.90


@dataclass(frozen=True)
class Timed:
    tokens: int
    decode_seconds: float
    spec: dict | None


@dataclass(frozen=True)
class Ratio:
    """TPOT(A) / TPOT(B) over request pairs, with a bootstrap interval."""

    point: float
    lower: float
    upper: float
    pairs: int

    @property
    def verdict(self) -> str:
        """For an RC: "pays" (interval below 1), "loses" (above 1), else "undecided"."""
        return "pays" if self.upper < 1.0 else "loses" if self.lower > 1.0 else "undecided"

    def __str__(self) -> str:
        return f"{self.point:.3f} [{self.lower:.3f}, {self.upper:.3f}] ({self.pairs} pairs)"


def timed(url: str, cls: loadgen.RequestClass, seed: int) -> Timed:
    """One streamed request of ``cls`` (prompt fixed by ``seed``), alone on the server."""
    (result,) = asyncio.run(loadgen.run_load(url, [cls], 1, requests=1, stream=True, seed=seed))
    assert result.ok and result.ttft_seconds is not None, result
    return Timed(result.output_tokens, result.e2e_seconds - result.ttft_seconds, result.spec)


def ratio(
    pairs: Sequence[tuple[Timed, Timed]], seed: int = 0, resamples: int = 2000, confidence: float = CONFIDENCE
) -> Ratio:
    def of(sample: Sequence[tuple[Timed, Timed]]) -> float:
        a = sum(x.decode_seconds for x, _ in sample) / sum(x.tokens - 1 for x, _ in sample)
        b = sum(y.decode_seconds for _, y in sample) / sum(y.tokens - 1 for _, y in sample)
        return a / b

    usable = [(a, b) for a, b in pairs if a.tokens > 1 and b.tokens > 1]
    rng = random.Random(seed)
    boot = sorted(of([rng.choice(usable) for _ in usable]) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return Ratio(of(usable), boot[int(tail * resamples)], boot[int((1 - tail) * resamples) - 1], len(usable))


def interleaved(url_a: str, url_b: str, cls: loadgen.RequestClass, pairs: int, seed: int) -> list:
    """``pairs`` pairs of the same request on A and on B, in ABBA order (drift cancels)."""
    out = []
    for i in range(pairs):
        if i % 2 == 0:
            a = timed(url_a, cls, seed + i)
            b = timed(url_b, cls, seed + i)
        else:
            b = timed(url_b, cls, seed + i)
            a = timed(url_a, cls, seed + i)
        out.append((a, b))
    return out


Key = tuple[str, str]  # (task_type, temperature_bucket)


def guard_yaml(min_samples: int, tmp_path) -> str:
    """The shipped rule (off when even the lower confidence bound is above 1.0) with nothing else
    in its way: no cool-down, no failure limits, no prior, a fixed live-baseline holdout."""
    return f"""
cost: {{min_samples: {min_samples}, baseline_min_samples: {min_samples}, baseline_scope: class_then_load}}
guard:
  window_seconds: 3600
  min_samples: {min_samples}
  consecutive_failure_limit: 0
  failure_limit: -1
  cooldown_seconds: 0
  shorten: false
  best_pool: false
  prior: none
  holdout: fixed
  rules:
    - {{name: relative-cost, measure: rc_lower, threshold: 1.0,
       restore_measure: rc_upper, restore_threshold: 0.95}}
server: {{insecure_loopback: true}}
actuators: {{plan_file: "{tmp_path / "plan.json"}", audit_log: "{tmp_path / "audit.jsonl"}"}}
"""


async def ground_truth(
    url_a: str,
    url_b: str,
    mix: Sequence[loadgen.RequestClass],
    keys: Sequence[Key],
    first: int,
    more: int,
    max_pairs: int,
    seed: int = 400,
) -> dict[Key, Ratio]:
    """Per class, the same requests on A and on B in ABBA order; more pairs for the undecided
    classes while none is decided (a loaded machine widens every interval). ``seed`` picks the
    prompts."""
    pairs: dict[Key, list] = {key: [] for key in keys}
    truth: dict[Key, Ratio] = {}
    while not truth or (
        all(t.verdict == "undecided" for t in truth.values()) and len(pairs[keys[0]]) < max_pairs
    ):
        for cls, key in zip(mix, keys, strict=True):
            if key in truth and truth[key].verdict != "undecided":
                continue
            count = first if not pairs[key] else more
            prompts = seed + 100 * len(pairs[key])
            pairs[key] += await asyncio.to_thread(interleaved, url_a, url_b, cls, count, prompts)
            truth[key] = ratio(pairs[key])
    return truth


async def guard_on_live_evidence(
    cfg, mix: Sequence[loadgen.RequestClass], requests: int, ks: dict[str, int], seed: int = 500
):
    """The guard's decisions and its measured per-class costs (pool `spec`, load `low`) after
    ``requests`` requests of ``mix`` (prompts by ``seed``) through the tap, one at a time."""
    from specguard.monitor import guard_wiring
    from specguard.monitor.app import Monitor
    from specguard.rules import cost

    monitor = Monitor(cfg, rng=random.Random(3))
    guard, _ = guard_wiring.build(monitor, cfg)
    url = await monitor.start("127.0.0.1", 0)
    try:
        results = await loadgen.run_load(url, list(mix), 1, requests=requests, stream=True, seed=seed)
        assert {r.status for r in results} == {200}, [r.error for r in results if not r.ok]
        now = time.time()
        decisions = {d.key: d for d in await guard.evaluate(now)}
        settings = cfg.sections["cost"].with_traffic(
            cfg.exporter.classes.load_buckets, cfg.exporter.tap.full_rollback_request_threshold
        )
        measured = {
            (c.task_type, c.temperature_bucket): c
            for c in cost.evaluate(monitor.stats.records(), ks, None, now, settings)
            if c.pool == "spec" and c.load_bucket == "low"
        }
    finally:
        await monitor.stop()
    return decisions, measured


def judge(
    classes: dict[Key, str], truth: dict[Key, Ratio], measured: dict, decisions: dict, report: list[str]
) -> None:
    """The guard's decision per class follows its own evidence (the shipped rule), and that
    evidence agrees with the A/B: neither says "pays" (upper < 1) where the other says "loses"
    (lower > 1), and the two intervals overlap or the point estimates are within 25% of each
    other. (The guard measures the live mix, the truth an interleaved A/B of one class at a time:
    CI runs saw intervals missing each other by 0.005, both saying "loses", and points 26% apart
    with overlapping intervals.) At least one class must be decided by the A/B."""
    decided = 0
    for key, kind in classes.items():
        t, c = truth[key], measured[key]
        decision = decisions[(*key, "low")]
        assert c.rc is not None and c.baseline_source == "live", c
        report.append(
            f"{key[0]}/{key[1]} ({kind}): truth RC {t} -> {t.verdict}; guard RC {c.rc:.3f} "
            f"[{c.lower:.3f}, {c.upper:.3f}] -> {decision.action}"
        )
        if c.lower > 1.0:
            assert (decision.action, decision.to_pool) == ("off", "nospec"), report
        else:
            assert decision.action == "none", report
        assert not (c.upper < 1.0 < t.lower or t.upper < 1.0 < c.lower), report
        overlap = c.lower <= t.upper and t.lower <= c.upper
        assert overlap or abs(c.rc / t.point - 1.0) < 0.25, report
        if t.verdict == "pays":
            decided += 1
            assert decision.action == "none", report
        elif t.verdict == "loses":
            decided += 1
            assert c.upper > 1.0, report
    assert decided >= 1, report
