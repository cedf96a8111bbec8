"""The default setup, tried as a new user would: the shipped default config and the simulator's
default setup, 36 concurrent clients of mixed traffic, no calibration profile. Within 5 (simulated)
minutes of traffic sent every load bucket carrying traffic exports an RC whose baseline source is
not ``none``; over real HTTP.

Time is scaled: the simulator runs at ``SCALE`` wall seconds per model second and every timer of
the default config (guard interval, windows, cooldowns, scrape interval) is scaled with it, so the
5 minutes take about a minute of wall time. Nothing else of the default config changes.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import replace

import aiohttp

from specguard.cli.commands import status as status_cmd
from specguard.lab import loadgen
from specguard.lab import replay_policies as rp
from specguard.monitor import config, control_auth, guard_wiring
from specguard.monitor.app import Monitor
from specguard.rules import policy as policy_mod
from specguard.sim import cluster

SCALE = 0.2  # wall seconds per model second
DEADLINE_MODEL_SECONDS = 300.0  # "within 5 minutes of traffic"
CLIENTS = 36
ROUND = 30.0  # model seconds of traffic between two looks at /metrics
MIX = [
    loadgen.RequestClass("code", 3, 0.0, max_tokens=None),
    loadgen.RequestClass("extraction", 2, 0.0, max_tokens=None),
    loadgen.RequestClass("chat", 3, 0.7, max_tokens=None),
    loadgen.RequestClass("creative", 2, 1.0, max_tokens=None),
]
SAMPLE = re.compile(r"^(specguard_[a-z_]+)\{([^}]*)\} (\S+)$")


def default_config_scaled(urls: dict[str, str]) -> config.SpecguardConfig:
    """The shipped config with the simulator's URLs and every timer times ``SCALE``."""
    cfg = config.load_default()
    ex = cfg.exporter
    ex = replace(
        ex,
        pools=tuple(replace(p, url=urls[p.name]) for p in ex.pools),
        tap=replace(ex.tap, listen="127.0.0.1:0", window_seconds=ex.tap.window_seconds * SCALE),
        scrape=replace(ex.scrape, interval_seconds=ex.scrape.interval_seconds * SCALE, timeout_seconds=2.0),
    )
    sections = {**cfg.sections, "guard": rp.scaled_policy(policy_mod.load_default(), SCALE)}
    return replace(cfg, exporter=ex, sections=sections, file="<default-config, timers scaled>")


def samples(text: str, name: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        found = SAMPLE.match(line)
        if found and found.group(1) == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(2)))
            out.append({**labels, "value": found.group(3)})
    return out


def covered(text: str, traffic: set[str]) -> dict[str, set[str]]:
    """Per load bucket carrying speculative traffic: the baseline sources of the RCs exported there."""
    rc = {
        (s["task_type"], s["temperature_bucket"], s["load_bucket"], s["pool"]) for s in samples(text, RATIO)
    }
    out: dict[str, set[str]] = {bucket: set() for bucket in traffic}
    for s in samples(text, "specguard_relative_cost_baseline_info"):
        key = (s["task_type"], s["temperature_bucket"], s["load_bucket"], s["pool"])
        if key in rc and s["load_bucket"] in out and s["value"] == "1.0":
            out[s["load_bucket"]].add(s["source"])
    return out


RATIO = "specguard_relative_cost_per_token_ratio"


async def test_default_setup_gives_rc_at_every_load_bucket_with_traffic_within_5_minutes():
    async with cluster.SimCluster.from_config(None, seed=0, dialect="vllm", time_scale=SCALE) as sim:
        cfg = default_config_scaled(sim.urls)
        monitor = Monitor(cfg, rng=random.Random(0))
        guard_wiring.configure(monitor, cfg)
        url = await monitor.start("127.0.0.1", 0)
        # no credential configured: the operator token specguard makes at start reads /status
        token = control_auth.generated_token_path(monitor.control_port).read_text().strip()
        operator = {"Authorization": f"Bearer {token}"}
        try:
            async with aiohttp.ClientSession() as session:
                # at start-up, before any traffic: every cell is listed as having no baseline
                async with session.get(f"{monitor.control_url}/status", headers=operator) as response:
                    status = await response.json()
                assert {row["source"] for row in status["baselines"]["load_buckets"]} == {"none"}
                assert {(m["pool"], m["load_bucket"]) for m in status["baselines"]["missing"]} >= {
                    ("spec-k4", "medium")
                }
                # traffic in rounds of ROUND model seconds (clients finish their request at the end
                # of a round), until every bucket with speculative traffic has a baseline'd RC
                results, found, covered_at, sent = [], {}, None, 0.0
                start = time.monotonic()
                while sent < DEADLINE_MODEL_SECONDS:
                    results += await loadgen.run_load(
                        url, MIX, CLIENTS, duration_s=ROUND * SCALE, stream=True, seed=int(sent)
                    )
                    sent += ROUND
                    await asyncio.sleep(cfg.sections["guard"].interval_seconds)  # one more evaluation
                    traffic = {r.load_bucket for r in monitor.stats.records() if r.pool != "nospec"}
                    async with session.get(f"{url}/metrics") as response:
                        page = await response.text()
                    async with session.get(f"{monitor.control_url}/status", headers=operator) as response:
                        status = await response.json()
                    found = covered(page, traffic)
                    available = samples(page, "specguard_baseline_available")
                    rows = {row["load_bucket"]: row for row in status["baselines"]["load_buckets"]}
                    seen = {(s["load_bucket"], s["source"]) for s in available if s["value"] == "1.0"}
                    # both reads from one evaluation: the page's availability is the status's bucket,
                    # and every bucket with traffic has a baseline there too
                    same = all(b in rows and (b, rows[b]["source"]) in seen for b in traffic)
                    same = same and all(rows[b]["source"] != "none" for b in traffic)
                    if traffic and all(found[b] - {"none"} for b in traffic) and same:
                        # the deadline counts the traffic sent, not the wall clock: on a starved
                        # machine (CI: a real engine beside it) the rounds' stragglers and the
                        # reads between rounds took the scaled wall clock to 307 s before this
                        covered_at = sent
                        wall = (time.monotonic() - start) / SCALE
                        break
        finally:
            await monitor.stop()
    assert all(r.ok for r in results)
    assert covered_at is not None and covered_at <= DEADLINE_MODEL_SECONDS, (sent, found)
    print(f"covered after {covered_at:.0f} model seconds of traffic ({wall:.0f} on the wall clock, scaled)")
    assert {"medium"} <= set(found)  # 36 clients: the speculative pool runs at medium load
    assert all(sources - {"none"} for sources in found.values()), found
    # /status and the availability metric say the same
    assert rows["medium"]["source"] != "none"
    live = {(s["load_bucket"], s["source"]) for s in available if s["value"] == "1.0"}
    assert ("medium", rows["medium"]["source"]) in live
    # each class in /status shows its RC with the baseline source, and `specguard status` prints them
    sources = {c["rc"]["baseline_source"] for c in status["classes"] if c["rc"] and c["rc"]["rc"] is not None}
    assert sources and "none" not in sources
    text = status_cmd.render(status)
    assert "baselines (no-spec TPOT per load bucket):" in text
    assert f"  medium   {rows['medium']['source']}" in text
    # and the holdout in force: the default matched_on_demand, with its shares per load bucket
    assert status["holdout"]["mode"] == "matched_on_demand"
    assert status["holdout"]["shares"] and set(status["holdout"]["refilling"]) <= {"low", "medium", "high"}
    assert "  holdout: matched_on_demand; share " in text
