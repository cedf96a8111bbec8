"""Each engine's own page through the tap (``exporters.enginepage``): read-only, at
``/engines/<pool>/metrics``, with the tap's API beneath the prefix, as tools that read
``<base-url>/metrics`` need (``vllm bench serve``'s speculative-decoding section)."""

from __future__ import annotations

import asyncio
import random

import aiohttp
import pytest

from specguard.monitor import config
from specguard.monitor.app import Monitor
from specguard.sim import cluster

K = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}


def monitor_for(sim: cluster.SimCluster, extra: str = "") -> Monitor:
    pools = "\n".join(
        f'  - {{name: {name}, url: "{url}", engine: vllm, num_speculative_tokens: {K[name]}}}'
        for name, url in sim.urls.items()
    )
    text = f"pools:\n{pools}\ntap: {{holdout_share: 0, probe_share: 0{extra}}}\n"
    text += "scrape: {interval_seconds: 3600}\n"
    return Monitor(config.parse_text(text), rng=random.Random(1))


def spec_decode_totals(page: str) -> dict[str, float]:
    """What ``vllm bench serve`` reads from ``<base-url>/metrics`` (its parser, in short)."""
    out: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith("vllm:spec_decode"):
            name = line.split(None, 1)[0].split("{")[0]
            if name.endswith("_total"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(None, 1)[-1])
    return out


async def test_the_engines_own_page_is_read_through_the_tap_and_its_api_beneath_the_prefix():
    async with cluster.SimCluster.from_config(None, seed=3, dialect="vllm", time_scale=0.005) as sim:
        monitor = monitor_for(sim)
        monitor.router.set_plan({("code", "greedy", "low"): "spec-k2"})
        url = await monitor.start("127.0.0.1", 0)
        base = f"{url}/engines/spec-k4"
        model = sim.config.model_name
        try:
            async with aiohttp.ClientSession() as session:

                async def get(path):
                    async with session.get(path) as r:
                        return r.status, r.headers.get("Content-Type", ""), await r.text()

                before = spec_decode_totals((await get(base + "/metrics"))[2])
                # a benchmark through the tap with the base URL beneath the prefix
                body = {"model": model, "prompt": "write a sort", "max_tokens": 24, "temperature": 0}
                for task in ("chat", "code", "chat"):
                    async with session.post(
                        base + "/v1/completions", json=body, headers={"x-task-type": task}
                    ) as r:
                        assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 24
                status, ctype, page = await get(base + "/metrics")
                async with session.get(sim.urls["spec-k4"] + "/metrics") as r:
                    direct = await r.text()
                status_models, _, models = await get(base + "/v1/models")
                tap_page = (await get(url + "/metrics"))[2]
        finally:
            await monitor.stop()
    assert status == 200 and ctype.startswith("text/plain")
    after = spec_decode_totals(page)
    assert after == spec_decode_totals(direct)  # the engine's own counters, as it serves them
    drafts = "vllm:spec_decode_num_drafts_total"
    assert after[drafts] > before.get(drafts, 0.0)  # two chat requests went to K=4
    assert spec_decode_totals(tap_page) == {}  # what the tool read at the tap's own /metrics
    assert status_models == 200 and model in models
    records = monitor.stats.records()
    assert [(r.task_type, r.pool) for r in records] == [
        ("chat", "spec-k4"),
        ("code", "spec-k2"),
        ("chat", "spec-k4"),
    ]


async def test_readers_at_once_share_one_fetch_and_nothing_else_is_reachable():
    async with cluster.SimCluster.from_config(None, seed=4, dialect="vllm", time_scale=0.005) as sim:
        monitor = monitor_for(sim)
        url = await monitor.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:

                async def status(method, path):
                    async with session.request(method, url + path) as r:
                        await r.read()
                        return r.status

                got = await asyncio.gather(*(status("GET", "/engines/nospec/metrics") for _ in range(20)))
                assert got == [200] * 20
                assert monitor.pages.fetches < 20
                assert await status("HEAD", "/engines/nospec/metrics") == 200
                assert await status("POST", "/engines/nospec/metrics") == 405
                assert await status("GET", "/engines/nope/metrics") == 404
                assert await status("POST", "/engines/spec-k4/sleep") == 404  # the tap's allowlist
                assert await status("GET", "/engines/spec-k4/health") == 404
        finally:
            await monitor.stop()


@pytest.mark.parametrize("extra", [", engine_pages: false"])
async def test_the_prefix_can_be_turned_off(extra):
    async with cluster.SimCluster.from_config(None, seed=5, dialect="vllm", time_scale=0.005) as sim:
        monitor = monitor_for(sim, extra)
        url = await monitor.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session, session.get(url + "/engines/spec-k4/metrics") as r:
                assert r.status == 404
                assert "not forwarded" in (await r.json())["error"]["message"]
        finally:
            await monitor.stop()
    assert monitor.pages is None
