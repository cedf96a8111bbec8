"""``specguard report`` against a REAL Prometheus scraping specguard running in front of the simulator."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from reportrun import CONFIG, free_port, start_prometheus

from specguard.lab import loadgen, report
from specguard.lab.report_data import PromData
from specguard.monitor import app as monitor_app
from specguard.monitor import config as monitor_config
from specguard.monitor import guard_wiring
from specguard.monitor.cost_metrics import RATIO
from specguard.sim.cluster import SimCluster


async def rc_exported(url: str, tasks: set[str]) -> bool:
    """Whether the tap's /metrics has an RC point for every task type in ``tasks``."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    found = {
        s.labels.get("task_type")
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == RATIO
    }
    return tasks <= found


async def scraped_after(prom_url: str, at: float, timeout_s: float = 30.0) -> None:
    """Wait until Prometheus holds a sample of the tap's series stamped after epoch ``at``."""
    query = {"query": "max(timestamp(specguard_requests_total))"}
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.get(prom_url + "/api/v1/query", params=query) as resp:
                result = (await resp.json())["data"]["result"]
            if result and float(result[0]["value"][1]) > at:
                return
            await asyncio.sleep(0.5)
    raise AssertionError(f"Prometheus scraped nothing after {at} within {timeout_s} s")


async def drive(tmp: Path) -> tuple[str, float, float, subprocess.Popen]:
    async with SimCluster.from_config(None, seed=0, time_scale=0.25) as sim:
        text = CONFIG.format(k4=sim.urls["spec-k4"], k2=sim.urls["spec-k2"], k0=sim.urls["nospec"])
        cfg = monitor_config.parse_text(text, "test-config.yaml")
        monitor = monitor_app.Monitor(cfg)
        guard_wiring.configure(monitor, cfg)
        url = await monitor.start(port=0)
        prom, prom_url = start_prometheus(tmp, url.removeprefix("http://"))
        start = time.time()
        try:
            mix = [
                loadgen.RequestClass("code", temperature=0.0, max_tokens=64),
                loadgen.RequestClass("creative", temperature=1.0, max_tokens=64),
            ]
            # 20 s of load, then more in 10 s steps until the tap exports RC for both classes (on a
            # busy machine 20 s may not reach the samples and the baseline RC needs), at most 120 s
            await loadgen.run_load(url, mix, concurrency=6, duration_s=20, stream=True, seed=1)
            for step in range(10):
                if await rc_exported(url, {"code", "creative"}):
                    break
                await loadgen.run_load(url, mix, concurrency=6, duration_s=10, stream=True, seed=2 + step)
            await asyncio.sleep(3)  # a few more scrapes
            # the end of the report's range while the tap still serves, and the tap stopped only once
            # a scrape stamped after it is in: Prometheus marks the series stale at the first scrape
            # that fails, stamped when it started, and an instant query past that marker finds no
            # requests and no plan (CI: a scrape begun before `end` failed on the stop)
            end = time.time()
            await scraped_after(prom_url, end)
        finally:
            await monitor.stop()
        return prom_url, start, end, prom


def test_report_renders_from_real_prometheus(tmp_path):
    prom_url, start, end, prom = asyncio.run(drive(tmp_path))
    try:
        source = PromData(prom_url)
        data = report.collect(source, start, end, 1.0, window="5s")
        source.close()
    finally:
        prom.terminate()
        prom.wait(timeout=10)
    assert data.requests > 20
    assert not data.rc.empty and set(data.rc["task_type"]) >= {"code", "creative"}
    creative = data.rc[data.rc["task_type"] == "creative"]["value"].dropna()
    assert creative.max() > 1.0  # creative at temperature 1 loses on K=4 at any load
    assert not data.actions.empty and "creative" in set(data.actions["task_type"])
    assert not data.throughput.empty and data.throughput["value"].max() > 0
    assert not data.accept_length.empty and (data.accept_length["value"].dropna() >= 1.0).all()
    assert not data.plan.empty and "pool" in data.plan.columns
    page = report.render_html(data)
    assert page.count("data:image/png;base64,") >= 2
    # the plan table names each class's pool (which pools: the guard's call on this run's noise)
    planned = set(data.plan["pool"].dropna())
    assert planned and all(f"<td>{pool}</td>" in page for pool in planned)
    assert "http://" not in page.replace(prom_url, "")  # self-contained: no external resources


def test_report_says_clearly_when_prometheus_is_down():
    from specguard.errors import SourceError

    source = PromData(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    with pytest.raises(SourceError, match="cannot reach Prometheus"):
        report.collect(source, time.time() - 60, time.time(), 5.0)
