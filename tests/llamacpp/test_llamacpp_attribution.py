"""specguard in front of two real llama.cpp servers (draft-model speculation K = 4, and none):

- attribution: per class, the tap's counts are the ``timings.draft_n*`` the clients got (streamed
  with and without ``stream_options.include_usage``, and not streamed); summed over classes they
  are the engine's own counter increases, exactly;
- acceptance: greedy copy tasks accept more drafts than sampled ones, as measured here;
- ``specguard inspect`` on the live server reads the engine's speculative counters as they are.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys

import llamacppkit as kit
import pytest

from specguard.lab import loadgen
from specguard.monitor import config
from specguard.monitor.app import Monitor
from tests import realmix
from tests.realmix import CLASSES, scrape_all

pytestmark = pytest.mark.llamacpp

MAX_TOKENS = 16


def real_mix(stream: bool | None = None) -> list[loadgen.RequestClass]:
    return realmix.task_mix(MAX_TOKENS, 40, 20, stream)


async def test_per_class_counts_are_the_engines_own_and_greedy_copy_tasks_accept_more(llamacpp_servers):
    servers = llamacpp_servers
    cfg = config.parse_text(kit.config_text(servers, holdout=0.25), "specguard.yaml")
    monitor = Monitor(cfg, rng=random.Random(17))
    url = await monitor.start("127.0.0.1", 0)
    pools = {"spec": servers.spec, "nospec": servers.nospec}
    try:
        await scrape_all(monitor)
        before = {p: await asyncio.to_thread(kit.scrape, s.url) for p, s in pools.items()}
        results = await loadgen.run_load(url, real_mix(stream=True), 2, requests=8, seed=1)
        results += await loadgen.run_load(
            url, real_mix(stream=True), 2, requests=4, seed=3, include_usage=False
        )
        results += await loadgen.run_load(url, real_mix(stream=False), 2, requests=8, seed=2)
        after = {p: await asyncio.to_thread(kit.scrape, s.url) for p, s in pools.items()}
        await scrape_all(monitor)
    finally:
        await monitor.stop()

    assert {r.status for r in results} == {200}, [r.error for r in results if not r.ok]
    assert monitor.stats.unattributed() == {}
    records = monitor.stats.records()
    assert len(records) == len(results)
    assert {(r.task_type, r.temperature_bucket) for r in records} == set(CLASSES)
    assert {r.streamed for r in records} == {True, False}
    assert {r.pool for r in records} == {"spec", "nospec"}
    # Every response carried llama.cpp's timings (the last chunk of a stream, with usage or not).
    assert all(r.spec is not None and "timings" in r.spec for r in results)

    # Summed over classes: the engines' own counter increases, exactly.
    for pool, server in pools.items():
        raw = kit.delta(before[pool], after[pool])
        mine = kit.class_sums(monitor, pool)
        assert sum(c["output_tokens"] for c in mine.values()) == raw["generation_tokens"], pool
        assert sum(c["draft_tokens"] for c in mine.values()) == raw["draft_tokens"], pool
        assert sum(c["accepted_tokens"] for c in mine.values()) == raw["accepted_tokens"], pool
        if server.k:
            assert raw["drafts"] > 0 and raw["draft_tokens"] <= raw["drafts"] * server.k
            # one series per draft position, rounds accepting at least i + 1 drafts
            per_pos = [raw[f"per_pos_{i}"] for i in range(server.k)]
            assert per_pos == sorted(per_pos, reverse=True) and per_pos[0] <= raw["drafts"], per_pos
            assert sum(per_pos) == raw["accepted_tokens"]
        else:
            assert (raw["drafts"], raw["draft_tokens"]) == (0, 0)

    # Per class: exactly the timings the clients received (the no-spec server's carry no draft
    # fields, so they add nothing).
    spec_sums = kit.class_sums(monitor, "spec")
    rates = {}
    for task, bucket in CLASSES:
        theirs = [r.spec["timings"] for r in results if r.task_type == task]
        drafted = sum(t.get("draft_n", 0) for t in theirs)
        accepted = sum(t.get("draft_n_accepted", 0) for t in theirs)
        mine = spec_sums.get((task, bucket), {"draft_tokens": 0, "accepted_tokens": 0})
        assert (mine["draft_tokens"], mine["accepted_tokens"]) == (drafted, accepted), task
        if any(r.task_type == task and r.pool == "spec" for r in records):
            assert drafted > 0, task
            rates[(task, bucket)] = accepted / drafted
    print("strict accept rate per class:", {f"{t}/{b}": round(v, 3) for (t, b), v in rates.items()})
    copy = [v for key, v in rates.items() if CLASSES[key] == "copy"]
    sampled = [v for key, v in rates.items() if CLASSES[key] == "sampled"]
    assert copy and sampled, rates
    assert min(copy) > max(sampled), rates


def inspect(url: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "specguard", "inspect", "--url", url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_inspect_reads_the_engines_speculative_counters(llamacpp_servers):
    servers = llamacpp_servers
    raw = kit.scrape(servers.spec.url)  # no request runs meanwhile: the page stays as it is
    shown = inspect(servers.spec.url)
    assert (shown["engine"], shown["speculation_enabled"], shown["num_speculative_tokens"]) == (
        "llamacpp",
        True,
        kit.K,
    )
    for key in ("drafts", "draft_tokens", "accepted_tokens"):
        assert shown[key] == raw[key], key
    per_pos = [raw[f"per_pos_{i}"] for i in range(kit.K)]
    assert shown["accepted_per_position"] == per_pos
    assert shown["accept_length"] == pytest.approx(1 + raw["accepted_tokens"] / raw["drafts"])
    assert shown["strict_accept_rate"] == pytest.approx(raw["accepted_tokens"] / raw["draft_tokens"])
    assert shown["full_rollback_ratio"] == pytest.approx(1 - per_pos[0] / raw["drafts"])
    assert shown["per_position_acceptance"] == pytest.approx([p / raw["drafts"] for p in per_pos])
    assert shown["warnings"] == []
    # The no-spec server: the counters are there and 0, so speculation is not known to be on.
    idle = inspect(servers.nospec.url)
    assert (idle["speculation_enabled"], idle["drafts"], idle["accepted_per_position"]) == (None, 0, None)
    assert idle["accept_length"] is None and idle["time_per_output_token_seconds"] > 0
