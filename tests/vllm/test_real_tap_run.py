"""``specguard run`` (the real CLI, as a user starts it) in front of two real vLLM engines.

Its exported per-class counters sum to its own engine cross-check counters and to the raw engine
deltas, and the RC it exports is the ratio of the TPOTs its own counters give.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import vllmkit as kit
from tapkit import MIX, K, SpecguardRun, get, pools, total

from specguard.lab import loadgen

pytestmark = pytest.mark.vllm


def test_specguard_run_exports_counters_equal_to_the_engines(vllm_engines, tmp_path):
    run = SpecguardRun(vllm_engines, tmp_path, "guard: {enabled: false}\n", holdout=0.3)
    try:
        run.wait_healthy()
        before = {p: kit.scrape(e.url) for p, e in pools(vllm_engines)}
        results = asyncio.run(
            loadgen.run_load(run.base, MIX, 2, requests=16, stream=True, include_usage=False, seed=7)
        )
        assert {r.status for r in results} == {200}
        after = {p: kit.scrape(e.url) for p, e in pools(vllm_engines)}
        raw = {p: kit.delta(before[p], after[p]) for p in before}

        def caught_up():
            metrics = run.metrics()
            ok = all(
                total(metrics, "specguard_engine_generation_tokens_total", pool=p)
                == raw[p]["generation_tokens"]
                for p in raw
            )
            return metrics if ok else None

        metrics = run.wait_until(caught_up, 30, "engine counters caught up with the traffic")
    finally:
        code = run.stop()
    assert code == 0, run.log.read_text()[-3000:]

    assert total(metrics, "specguard_requests_total") == len(results)
    assert total(metrics, "specguard_unattributed_requests_total") == 0
    for pool in ("spec", "nospec"):
        assert total(metrics, "specguard_output_tokens_total", pool=pool) == raw[pool]["generation_tokens"]
        assert total(metrics, "specguard_requests_total", pool=pool) == raw[pool]["requests"]
    pairs = {
        "specguard_verify_rounds_total": ("specguard_engine_verify_rounds_total", "drafts"),
        "specguard_draft_tokens_total": ("specguard_engine_draft_tokens_total", "draft_tokens"),
        "specguard_accepted_tokens_total": ("specguard_engine_accepted_tokens_total", "accepted_tokens"),
    }
    for mine, (engine_name, field) in pairs.items():
        assert (
            total(metrics, mine, pool="spec")
            == total(metrics, engine_name, pool="spec")
            == raw["spec"][field]
        )
    for i in range(K):
        got = total(metrics, "specguard_accepted_per_position_total", pool="spec", position=str(i))
        assert got == raw["spec"][f"per_pos_{i}"]
    # Several classes, each with its own series.
    tasks = {lab["task_type"] for lab, v in metrics["specguard_requests_total"] if v > 0}
    assert tasks == {"code", "extraction", "chat", "creative"}


def test_specguard_run_exports_rc_consistent_with_its_own_counters(vllm_engines, tmp_path):
    """The RC that ``specguard run`` exports is the ratio of the TPOTs its own counters give:
    decode seconds / decode tokens of the class on the speculative engine, over the same of every
    class on the real no-spec engine in the same load bucket (``baseline_scope: load``, one request
    at a time: both sides at one request in flight, so the like-for-like baseline has nothing to
    adjust; at two clients the holdout ran alone while the speculative engine had two, and the
    guard rightly gave no live baseline)."""
    # dry run: a class the guard moved off its pool would export RC 1 there from then on;
    guard = """
cost: {min_samples: 2, baseline_min_samples: 2, baseline_scope: load, confidence: 0.5}
guard: {interval_seconds: 1, min_samples: 2, window_seconds: 600, dry_run: true}
server: {insecure_loopback: true}
"""
    run = SpecguardRun(vllm_engines, tmp_path, guard, holdout=0.4)
    labels = ("task_type", "temperature_bucket", "load_bucket")
    try:
        run.wait_healthy()
        # two classes, 24 requests each, and 50% intervals: an RC whose interval spans 1.0 more than
        # four-fold is not exported ("not enough evidence"), as 95% ones of a few dozen requests on
        # a loaded 2-core machine can (this test checks the number, not the evidence)
        results = asyncio.run(loadgen.run_load(run.base, MIX[:2], 1, requests=48, stream=True, seed=8))
        assert {r.status for r in results} == {200}

        last: list[str] = []  # what the last look saw, for the failure message

        def ratio(metrics, lab) -> float:
            """The RC the counters give: the class's TPOT on its pool over every class's on nospec."""
            key = {k: lab[k] for k in labels}
            spec = total(metrics, "specguard_decode_seconds_total", pool=lab["pool"], **key) / total(
                metrics, "specguard_decode_tokens_total", pool=lab["pool"], **key
            )
            load = lab["load_bucket"]
            base = total(metrics, "specguard_decode_seconds_total", pool="nospec", load_bucket=load) / total(
                metrics, "specguard_decode_tokens_total", pool="nospec", load_bucket=load
            )
            return spec / base

        def consistent():
            metrics = run.metrics()
            rcs = [(lab, v) for lab, v in metrics.get("specguard_relative_cost_per_token_ratio", [])]
            lowers = metrics.get("specguard_relative_cost_per_token_lower_ratio", [])
            uppers = {
                tuple(sorted(lab.items())): v
                for lab, v in metrics.get("specguard_relative_cost_per_token_upper_ratio", [])
            }
            requests = total(metrics, "specguard_requests_total")
            last[:] = [f"{len(metrics)} metric names on the page, {requests:g} requests counted, RCs {rcs}"]
            last.append(str(sorted(n for n in metrics if "relative" in n or "evaluation" in n)))
            last.append(str(metrics.get("specguard_evaluations_total")))
            if len(lowers) < 2:  # several classes measured (an evaluation may come before the last)
                return None
            # a point too uncertain to be a number is not exported (not enough evidence): its
            # interval still is, and holds the counters' ratio
            for lab, lower in lowers:
                upper, counted = uppers.get(tuple(sorted(lab.items()))), ratio(metrics, lab)
                if upper is None or not lower * (1 - 1e-9) <= counted <= upper * (1 + 1e-9):
                    last.append(f"{lab}: interval [{lower}, {upper}], counters give {counted}")
                    return None  # the last evaluation predates the last requests: wait for the next
            for lab, value in rcs:
                counted = ratio(metrics, lab)
                if value != pytest.approx(counted, rel=1e-9):
                    last.append(f"{lab}: exported {value}, counters give {counted}")
                    return None
            return metrics

        try:
            metrics = run.wait_until(consistent, 60, "an RC evaluated over all the traffic")
        except pytest.fail.Exception as exc:
            status = get(f"{run.control}/status") or "{}"
            rows = [
                {k: c.get(k) for k in ("task_type", "load_bucket", "pool", "rc", "status", "baseline", "why")}
                for c in json.loads(status).get("classes", [])
            ]
            pytest.fail(f"{exc}\nlast seen: {'; '.join(last)}\n/status classes: {rows}"[:8000])
    finally:
        code = run.stop()
    assert code == 0, run.log.read_text()[-3000:]
    rcs = metrics["specguard_relative_cost_per_token_lower_ratio"]
    assert {lab["pool"] for lab, v in rcs} == {"spec"}
    assert len(rcs) >= 2 and all(v > 0 for lab, v in rcs)  # several classes measured
    for lab, _ in rcs:
        key = {k: lab[k] for k in labels}
        # samples are the requests with an observable decode phase (two or more content chunks)
        spec_n = total(metrics, "specguard_relative_cost_samples", side="spec", pool="spec", **key)
        assert 1 <= spec_n <= total(metrics, "specguard_requests_total", pool="spec", **key)
        base_n = total(metrics, "specguard_relative_cost_samples", side="baseline", pool="spec", **key)
        assert (
            1
            <= base_n
            <= total(metrics, "specguard_requests_total", pool="nospec", load_bucket=lab["load_bucket"])
        )
        source = total(metrics, "specguard_relative_cost_baseline_info", source="live", pool="spec", **key)
        assert source == 1  # the baseline is the real no-spec engine's live traffic
