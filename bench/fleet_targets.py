"""Many follower ``/metrics`` endpoints from one process, for bench_fleet.py.

``template_page()`` runs one real follower (the shipped sidecar config, deploy/kubernetes/base/
specguard.yaml: 2 pools, 5 task labels x 4 temperature buckets x 3 load buckets) in front of the
simulator, drives streaming traffic through every task type and temperature, lets it scrape its
engines, measure RC per class and follow a plan naming every class, and returns its /metrics page:
the default label cardinality of one sidecar, with real values (whatever that checkout's follower
exports of the plan: its version only, or every cell too, as earlier releases did).

``Targets`` serves that page on N ports, each a different replica whose counters keep growing at
its own rate (histograms scaled as a whole, so buckets stay cumulative) and whose gauges (RC and
its bounds, in-flight requests) move a little on every scrape.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import specguard
from specguard.lab import loadgen
from specguard.monitor import config as config_mod
from specguard.monitor import guard_wiring
from specguard.monitor import state as state_mod
from specguard.monitor.app import Monitor
from specguard.monitor.cost_metrics import CostCollector
from specguard.monitor.guard_metrics import GuardCollector
from specguard.rules.guard import ClassState
from specguard.sim.cluster import SimCluster

# the checkout whose specguard is imported (bench_fleet --baseline runs another one's)
SIDECAR = Path(specguard.__file__).resolve().parents[1] / "deploy" / "kubernetes" / "base" / "specguard.yaml"
TASKS = ("code", "extraction", "chat", "creative", "translation")  # the last one is exported as `other`
TEMPERATURES = (0.0, 0.3, 0.7, 1.0)  # one per temperature bucket
GROWING = ("counter", "histogram", "summary")
MOVING = ("specguard_relative_cost", "specguard_predicted_relative_cost", "specguard_pool_in_flight")


class StaticPlan:
    """A plan source that always answers the same plan (the follower in the template)."""

    def __init__(self, doc: state_mod.PlanDocument):
        self.doc = doc

    async def read_plan(self) -> state_mod.PlanDocument:
        return self.doc


def sidecar_config(urls: dict[str, str]) -> Any:
    data = yaml.safe_load(SIDECAR.read_text())
    for pool in data["pools"]:
        pool["url"] = urls[pool["name"]]
        pool.pop("api_key_file", None)  # the simulator asks for no engine key
    data["scrape"] = {"interval_seconds": 3600, "timeout_seconds": 5}
    data["actuators"] = {"router": True}
    return config_mod.parse_text(yaml.safe_dump(data), "specguard.yaml")


async def template_page(requests: int = 1200, seed: int = 0) -> str:
    """The /metrics page of one real follower after ``requests`` requests over every class."""
    async with SimCluster.from_config(None, seed=seed, time_scale=0.01, pools=["spec-k4", "nospec"]) as sim:
        cfg = sidecar_config(sim.urls)
        monitor = Monitor(cfg, rng=random.Random(seed))
        guard, _ = guard_wiring.build(monitor, cfg, cost := CostCollector())
        monitor.registry.register(cost)
        monitor.registry.register(GuardCollector(guard.counters, guard.view))
        url = await monitor.start("127.0.0.1", 0)
        try:
            mix = [
                loadgen.RequestClass(task, temperature=t, max_tokens=48)
                for task in TASKS
                for t in TEMPERATURES
            ]
            results = await loadgen.run_load(url, mix, 16, requests=requests, stream=True, seed=seed)
            assert all(r.status == 200 for r in results), "the template's traffic failed"
            for loop in monitor.loops:
                await loop.scrape_once()
            # a plan naming every class, as a decider on fleet-wide PromQL writes it
            states = {
                key: ClassState(key=key, pool="nospec" if key[0] == "creative" else "spec-k4")
                for key in guard.configured_keys
            }
            guard.follow = StaticPlan(state_mod.PlanDocument(1, time.time(), states, guard.policy.pools))
            await guard.evaluate()  # a follower's round: measures RC per class, follows the plan
            return generate_latest(monitor.registry).decode()
        finally:
            await monitor.stop()


class Targets:
    """``count`` replicas of ``page``, each on its own loopback port, changing as a live one does."""

    def __init__(self, page: str, count: int, *, seed: int = 0, clock=time.monotonic):
        self._clock = clock
        self._start = clock()
        self._families: list[tuple[str, str, list[tuple[str, float, bool, bool]]]] = []
        for family in text_string_to_metric_families(page):
            kind = family.type
            rows = []
            for s in family.samples:
                labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
                prefix = f"{s.name}{{{labels}}} " if labels else f"{s.name} "
                grows = kind in GROWING and not s.name.endswith("_created")
                rows.append((prefix, float(s.value), grows, s.name.startswith(MOVING)))
            self._families.append((family.name, kind, rows))
        rng = random.Random(seed)
        # each replica: its own traffic share (counter growth per second, relative) and RC noise phase
        self._growth = [rng.uniform(0.5, 1.5) / 300 for _ in range(count)]
        self._phase = [rng.uniform(0, 2 * math.pi) for _ in range(count)]
        self.count = count
        self.urls: list[str] = []
        self._runner: web.AppRunner | None = None
        self._index: dict[int, int] = {}

    @property
    def series(self) -> int:
        return sum(len(rows) for _, _, rows in self._families)

    def render(self, index: int) -> str:
        elapsed = self._clock() - self._start
        scale = 1.0 + self._growth[index] * elapsed
        wobble = 1.0 + 0.05 * math.sin(elapsed / 30 + self._phase[index])
        out = []
        for name, kind, rows in self._families:
            out.append(f"# TYPE {name} {'untyped' if kind == 'unknown' else kind}\n")
            for prefix, value, grows, moves in rows:
                if grows:
                    value *= scale
                elif moves:
                    value *= wobble
                out.append(f"{prefix}{value!r}\n")
        return "".join(out)

    async def metrics(self, request: web.Request) -> web.Response:
        port = request.transport.get_extra_info("sockname")[1]
        text = self.render(self._index[port])
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def start(self) -> list[str]:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        for index in range(self.count):
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._index[port] = index
            self.urls.append(f"127.0.0.1:{port}")
        return self.urls

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
