"""Traffic of several classes and temperatures through specguard's tap into two real vLLM engines.

- When every request reported its per-request stats, specguard's per-class counts summed over
  classes equal each engine's own /metrics counter deltas exactly.
- Otherwise they differ by exactly the requests the tap reports as unattributed: each of those is
  measured alone against the engine (raw scrapes around it), and the gap is their sum.
- ``specguard run`` (the real CLI, as a user starts it) exports per-class counters whose sums
  equal its own engine cross-check counters and the raw engine deltas.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import vllmkit as kit
from prometheus_client.parser import text_string_to_metric_families
from vllmkit import LOOP_PROMPT, MODEL_NAME, NUM_SPECULATIVE_TOKENS

from specguard.monitor import config, loadgen
from specguard.monitor.app import Monitor

pytestmark = pytest.mark.vllm

K = NUM_SPECULATIVE_TOKENS
SPEC_FIELDS = ("drafts", "draft_tokens", "accepted_tokens")
MIX = [
    loadgen.RequestClass("code", temperature=0.0, max_tokens=48, prompt_tokens=40, chat=False),
    loadgen.RequestClass("extraction", temperature=0.3, max_tokens=32, prompt_tokens=60),
    loadgen.RequestClass("chat", temperature=0.7, max_tokens=40, prompt_tokens=30),
    loadgen.RequestClass("creative", temperature=1.0, max_tokens=48, prompt_tokens=20, chat=False),
]


def config_text(engines, *, holdout: float, listen: str = "127.0.0.1:0", scrape_s: float = 3600) -> str:
    return f"""
pools:
  - {{name: spec, url: "{engines.spec.url}", engine: vllm, num_speculative_tokens: {K}}}
  - {{name: nospec, url: "{engines.nospec.url}", engine: vllm, num_speculative_tokens: 0}}
tap: {{listen: "{listen}", holdout_share: {holdout}, probe_share: 0, default_pool: spec, nospec_pool: nospec}}
scrape: {{interval_seconds: {scrape_s}, timeout_seconds: {min(5.0, scrape_s)}}}
"""


async def scrape_all(monitor: Monitor) -> None:
    for loop in monitor.loops:
        assert await loop.scrape_once(), loop.watch.last_error


def pool_sums(monitor: Monitor, pool: str) -> dict[str, float]:
    totals = [t for key, t in monitor.stats.totals().items() if key[0] == pool]
    per_pos = [0] * K
    for t in totals:
        for i, value in enumerate(t.accepted_per_position):
            per_pos[i] += value
    out = {
        "requests": sum(t.requests for t in totals),
        "spec_requests": sum(t.spec_requests for t in totals),
        "generation_tokens": sum(t.output_tokens for t in totals),
        "drafts": sum(t.verify_rounds for t in totals),
        "draft_tokens": sum(t.draft_tokens for t in totals),
        "accepted_tokens": sum(t.accepted_tokens for t in totals),
    }
    out.update({f"per_pos_{i}": v for i, v in enumerate(per_pos)})
    return out


async def test_per_class_sums_equal_engine_counter_deltas_when_every_request_reported(vllm_engines):
    cfg = config.parse_text(config_text(vllm_engines, holdout=0.25), "specguard.yaml")
    monitor = Monitor(cfg, rng=random.Random(4))
    url = await monitor.start("127.0.0.1", 0)
    try:
        await scrape_all(monitor)
        before = {p: await asyncio.to_thread(kit.scrape, e.url) for p, e in _pools(vllm_engines)}
        results = await loadgen.run_load(url, MIX, 4, requests=24, stream=True, include_usage=False, seed=1)
        hidden_phase = {key: t.copy() for key, t in monitor.stats.totals().items()}
        results += await loadgen.run_load(url, MIX, 4, requests=12, stream=True, include_usage=True, seed=2)
        results += await loadgen.run_load(url, MIX, 4, requests=12, stream=False, seed=3, keep_body=True)
        after = {p: await asyncio.to_thread(kit.scrape, e.url) for p, e in _pools(vllm_engines)}
        await scrape_all(monitor)
    finally:
        await monitor.stop()

    assert {r.status for r in results} == {200}, [r.error for r in results if not r.ok]
    assert monitor.stats.unattributed() == {}
    records = monitor.stats.records()
    assert len(records) == len(results)
    # Several classes and temperature buckets really went through, to both pools.
    assert {(r.task_type, r.temperature_bucket) for r in records} == {
        ("code", "greedy"),
        ("extraction", "low"),
        ("chat", "medium"),
        ("creative", "high"),
    }
    assert {r.pool for r in records} == {"spec", "nospec"}
    for pool, engine in _pools(vllm_engines):
        raw = kit.delta(before[pool], after[pool])
        mine = pool_sums(monitor, pool)
        view = monitor.watches[pool].view()
        if engine.num_speculative_tokens:
            assert mine["spec_requests"] == mine["requests"]  # every request reported
        assert mine["requests"] == raw["requests"]
        assert (
            mine["generation_tokens"] == raw["generation_tokens"] == view["accumulated"]["generation_tokens"]
        )
        if engine.num_speculative_tokens:
            assert raw["drafts"] > 0 and raw["accepted_tokens"] > 0
            for name in SPEC_FIELDS:
                assert mine[name] == raw[name] == view["accumulated"][name], name
            assert [mine[f"per_pos_{i}"] for i in range(K)] == [raw[f"per_pos_{i}"] for i in range(K)]
        else:
            assert mine["spec_requests"] == 0
            assert not view["has"]["drafts"]
    # Streams whose client did not ask for usage were attributed too (the tap asked for it) ...
    streamed_no_usage = [r for r in records if r.streamed and r.pool == "spec"]
    assert streamed_no_usage and all(r.spec is not None for r in streamed_no_usage)
    # ... and per class, the tap's numbers are the engine's per-request summaries that the client
    # saw itself in the later phases (streams with usage, and non-streamed requests).
    visible: dict[str, list[dict]] = {}
    for r in results[24:]:
        if r.spec is not None and r.spec.get("num_spec_steps") is not None:
            visible.setdefault(r.task_type, []).append(r.spec)
    totals = monitor.stats.totals()
    for task in ("code", "extraction", "chat", "creative"):
        keys = [key for key in totals if key[0] == "spec" and key[1] == task]
        for name, field in (
            ("verify_rounds", "num_spec_steps"),
            ("accepted_tokens", "num_accepted_draft_tokens"),
        ):
            later = sum(getattr(totals[k], name) - getattr(hidden_phase.get(k), name, 0) for k in keys)
            assert later == sum(s[field] for s in visible.get(task, [])), (task, name)


def _pools(engines) -> list[tuple[str, object]]:
    return [("spec", engines.spec), ("nospec", engines.nospec)]


async def test_unattributed_requests_explain_the_gap_exactly(vllm_engines):
    """Sequential requests, each bracketed by raw engine scrapes, through a tap with no holdout."""
    cfg = config.parse_text(config_text(vllm_engines, holdout=0.0), "specguard.yaml")
    monitor = Monitor(cfg, rng=random.Random(5))
    engine_url = vllm_engines.spec.url
    url = await monitor.start("127.0.0.1", 0)
    base = {"model": MODEL_NAME, "prompt": LOOP_PROMPT, "max_tokens": 40, "temperature": 0}
    try:
        text = (await asyncio.to_thread(kit.post, engine_url, "/v1/completions", base))["choices"][0]["text"]
        await scrape_all(monitor)
        view_base = monitor.watches["spec"].view()["accumulated"]
        start = await asyncio.to_thread(kit.scrape, engine_url)
        monitor_base = pool_sums(monitor, "spec")
        stop = kit.stop_string_in(text)
        plan = [
            ("code", "/v1/completions", base, False),
            ("code", "/v1/completions", {**base, "stop": [stop]}, False),  # stop string
            ("chat", "/v1/completions", {**base, "n": 2, "temperature": 0.7, "seed": 2}, False),  # n > 1
            ("extraction", "/v1/completions", {**base, "prompt": [LOOP_PROMPT, "alpha beta"]}, False),
            ("code", "/v1/completions", base, True),  # stream; the client did not ask for usage
            (
                "creative",
                "/v1/chat/completions",
                {
                    "model": MODEL_NAME,
                    "messages": [{"role": "user", "content": LOOP_PROMPT}],
                    "max_tokens": 32,
                    "temperature": 1.0,
                    "stream_options": {"include_usage": True},
                },
                True,
            ),
        ]
        per_request = []
        for task, path, body, streamed in plan:
            before = await asyncio.to_thread(kit.scrape, engine_url)
            call = kit.stream if streamed else kit.post
            answer = await asyncio.to_thread(call, url, path, body, {"x-task-type": task})
            after = await asyncio.to_thread(kit.scrape, engine_url)
            per_request.append((body, streamed, answer, kit.delta(before, after)))
        end = await asyncio.to_thread(kit.scrape, engine_url)
        await scrape_all(monitor)
    finally:
        await monitor.stop()

    # The stop-string request did end on its stop string, and the stream hid the usage it never asked for.
    assert per_request[1][2]["choices"][0]["finish_reason"] == "stop"
    hidden = per_request[4][2]
    assert all(not e.get("usage") and kit.spec_metrics(e) is None for e in hidden)
    assert monitor.stats.unattributed() == {
        ("spec", "stop_string"): 1,
        ("spec", "n_gt_1"): 1,
        ("spec", "prompt_list"): 1,
    }

    records = monitor.stats.records()
    assert len(records) == len(plan)
    attributed = [r for r in records if r.spec is not None]
    unattributed = [r for r in records if r.spec is None]
    assert sorted(r.unattributed_reason for r in unattributed) == ["n_gt_1", "prompt_list", "stop_string"]
    # Every attributed request equals what the engine counted while it alone ran.
    deltas_by_rounds = sorted(
        (d["drafts"], d["draft_tokens"], d["accepted_tokens"])
        for body, streamed, answer, d in per_request
        if not unattributed_by_vllm(body)
    )
    assert deltas_by_rounds == sorted(
        (r.spec.rounds, r.spec.draft_tokens, r.spec.accepted_tokens) for r in attributed
    )

    engine = kit.delta(start, end)
    view = monitor.watches["spec"].view()["accumulated"]
    mine = pool_sums(monitor, "spec")
    gap = {name: engine[name] - (mine[name] - monitor_base[name]) for name in SPEC_FIELDS}
    unattributed_deltas = [d for body, streamed, answer, d in per_request if unattributed_by_vllm(body)]
    assert len(unattributed_deltas) == 3
    assert gap == {name: sum(d[name] for d in unattributed_deltas) for name in SPEC_FIELDS}
    assert gap["drafts"] > 0  # the unattributed requests did draft: the gap is real, not zero
    for name in SPEC_FIELDS:
        # specguard's own engine cross-check saw the same deltas
        assert view[name] - view_base[name] == engine[name]
    assert mine["requests"] == len(plan)
    assert mine["spec_requests"] == len(attributed) == 3


def unattributed_by_vllm(body: dict) -> bool:
    """vLLM reports no per-request stats for these (research/engines.md section 5)."""
    return "stop" in body or body.get("n", 1) > 1 or isinstance(body.get("prompt"), list)


# --- specguard run, the real CLI ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return None


def exported(text: str) -> dict[str, list[tuple[dict, float]]]:
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def total(metrics: dict, name: str, **labels: str) -> float:
    return sum(v for lab, v in metrics.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def wait_until(predicate, deadline_s: float, what: str, proc: subprocess.Popen, log: Path):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(
                f"specguard run exited ({proc.returncode}) while waiting for {what}:\n{log.read_text()}"
            )
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"specguard run: no {what} within {deadline_s:.0f} s:\n{log.read_text()[-3000:]}")


class SpecguardRun:
    """``specguard run --config FILE`` as a user starts it, on a free port; always stopped."""

    def __init__(self, engines, tmp_path: Path, extra_yaml: str, holdout: float):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        path = tmp_path / "specguard.yaml"
        listen = f"127.0.0.1:{self.port}"
        path.write_text(config_text(engines, holdout=holdout, listen=listen, scrape_s=0.5) + extra_yaml)
        self.log = tmp_path / "run.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "specguard", "run", "--config", str(path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def wait_until(self, predicate, deadline_s: float, what: str):
        return wait_until(predicate, deadline_s, what, self.proc, self.log)

    def wait_healthy(self) -> None:
        def both_up():
            body = _get(f"{self.base}/healthz")
            return body and all(json.loads(body)["pools_up"].values())

        self.wait_until(both_up, 60, "healthy pools")

    def metrics(self) -> dict:
        return exported(_get(f"{self.base}/metrics") or "")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode


def test_specguard_run_exports_counters_equal_to_the_engines(vllm_engines, tmp_path):
    run = SpecguardRun(vllm_engines, tmp_path, "guard: {enabled: false}\n", holdout=0.3)
    try:
        run.wait_healthy()
        before = {p: kit.scrape(e.url) for p, e in _pools(vllm_engines)}
        results = asyncio.run(
            loadgen.run_load(run.base, MIX, 2, requests=16, stream=True, include_usage=False, seed=7)
        )
        assert {r.status for r in results} == {200}
        after = {p: kit.scrape(e.url) for p, e in _pools(vllm_engines)}
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


async def test_client_disconnect_mid_stream_is_unattributed_and_explains_the_gap(vllm_engines):
    """A client that goes away mid-stream: the tap counts the request as unattributed, and the
    cross-check gap is exactly what the engine spent on it."""
    cfg = config.parse_text(config_text(vllm_engines, holdout=0.0), "specguard.yaml")
    monitor = Monitor(cfg, rng=random.Random(6))
    engine_url = vllm_engines.spec.url
    url = await monitor.start("127.0.0.1", 0)
    body = {"model": MODEL_NAME, "prompt": LOOP_PROMPT, "max_tokens": 300, "temperature": 0, "stream": True}
    try:
        await scrape_all(monitor)
        view_base = monitor.watches["spec"].view()["accumulated"]
        before = await asyncio.to_thread(kit.scrape, engine_url)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{url}/v1/completions", json=body, headers={"x-task-type": "code"}
            ) as resp:
                assert resp.status == 200
                seen = 0
                async for line in resp.content:
                    seen += line.startswith(b"data:")
                    if seen == 12:
                        break  # leave with the stream still running
        # Wait until the tap has recorded the request and the engine's counters stand still.
        deadline = time.monotonic() + 60
        after = before
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            previous, after = after, await asyncio.to_thread(kit.scrape, engine_url)
            if monitor.stats.records() and previous.spec_counters() == after.spec_counters():
                break
        await scrape_all(monitor)
    finally:
        await monitor.stop()

    engine = kit.delta(before, after)
    # Whether the engine finished or stopped early depends on timing (it usually stops: vLLM 0.32
    # then does not count the request in vllm:request_success_total); the accounting holds either way.
    assert engine["generation_tokens"] > 0
    assert monitor.stats.unattributed() == {("spec", "client_disconnected"): 1}
    mine = pool_sums(monitor, "spec")
    assert mine["requests"] == 1 and mine["spec_requests"] == 0
    view = monitor.watches["spec"].view()["accumulated"]
    for name in SPEC_FIELDS:
        assert mine[name] == 0
        assert view[name] - view_base[name] == engine[name]  # the whole gap is this one request
    assert engine["drafts"] > 0, engine


def test_specguard_run_exports_rc_consistent_with_its_own_counters(vllm_engines, tmp_path):
    """The RC that ``specguard run`` exports is the ratio of the TPOTs its own counters give:
    decode seconds / decode tokens of the class on the speculative engine, over the same of every
    class on the real no-spec engine in the same load bucket."""
    guard = """
cost: {min_samples: 2, baseline_min_samples: 2, baseline_scope: load}
guard: {interval_seconds: 1, min_samples: 2, window_seconds: 600}
server: {insecure_loopback: true}
"""
    run = SpecguardRun(vllm_engines, tmp_path, guard, holdout=0.4)
    labels = ("task_type", "temperature_bucket", "load_bucket")
    try:
        run.wait_healthy()
        results = asyncio.run(loadgen.run_load(run.base, MIX, 2, requests=24, stream=True, seed=8))
        assert {r.status for r in results} == {200}

        def consistent():
            metrics = run.metrics()
            rcs = [(lab, v) for lab, v in metrics.get("specguard_relative_cost_per_token_ratio", [])]
            if not rcs:
                return None
            for lab, value in rcs:
                key = {k: lab[k] for k in labels}
                spec = total(metrics, "specguard_decode_seconds_total", pool=lab["pool"], **key) / total(
                    metrics, "specguard_decode_tokens_total", pool=lab["pool"], **key
                )
                load = lab["load_bucket"]
                base = total(
                    metrics, "specguard_decode_seconds_total", pool="nospec", load_bucket=load
                ) / total(metrics, "specguard_decode_tokens_total", pool="nospec", load_bucket=load)
                if value != pytest.approx(spec / base, rel=1e-9):
                    return None  # the last evaluation predates the last requests: wait for the next
            return metrics

        metrics = run.wait_until(consistent, 30, "an RC evaluated over all the traffic")
    finally:
        code = run.stop()
    assert code == 0, run.log.read_text()[-3000:]
    rcs = metrics["specguard_relative_cost_per_token_ratio"]
    assert {lab["pool"] for lab, v in rcs} == {"spec"}
    assert len(rcs) >= 2 and all(v > 0 for lab, v in rcs)  # several classes measured
    for lab, _ in rcs:
        key = {k: lab[k] for k in labels}
        spec_n = total(metrics, "specguard_relative_cost_samples", side="spec", pool="spec", **key)
        assert spec_n == total(metrics, "specguard_requests_total", pool="spec", **key)
        base_n = total(metrics, "specguard_relative_cost_samples", side="baseline", pool="spec", **key)
        assert base_n == total(
            metrics, "specguard_requests_total", pool="nospec", load_bucket=lab["load_bucket"]
        )
        source = total(metrics, "specguard_relative_cost_baseline_info", source="live", pool="spec", **key)
        assert source == 1  # the baseline is the real no-spec engine's live traffic
