"""The demo's live run: the standalone app (tap + exporter + guard daemon) in front of the simulator.

Everything a production ``specguard run`` starts, in this process: the simulator's pools over HTTP
(vLLM dialect, ``time_scale`` wall seconds per model second), the tap with its router and windowed
statistics, the scrape loops and ``/metrics``, and the guard daemon (APScheduler, cost model, state
machine, router actuator). The scenario's phases are driven through the tap by ``monitor.loadgen``
(closed-loop streaming clients). The guard's timers are the policy's, times ``timer_scale`` (model
time) times ``time_scale`` (to wall time); the calibration profile is converted to wall seconds the
same way, since the live stack runs ``time_scale`` times faster than the model.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from specguard.lab import loadgen, traffic
from specguard.lab.demo import DemoSetup
from specguard.lab.replay_policies import scaled_policy
from specguard.monitor import app as monitor_app
from specguard.monitor import config as monitor_config
from specguard.monitor import guard_config, guard_wiring
from specguard.rules import cost as cost_mod
from specguard.rules import profile as profile_mod
from specguard.sim.cluster import SimCluster
from specguard.sim.runtime import LATE_STRETCH

LIVE_MODE = "live: HTTP through the tap, scraped and guarded by the standalone app (guard daemon)"


def wall_profile(profile: profile_mod.Profile, time_scale: float) -> profile_mod.Profile:
    """The profile's seconds times ``time_scale`` (model seconds -> the live run's wall seconds)."""

    def level(lv: profile_mod.ProfileLevel) -> profile_mod.ProfileLevel:
        def s(x):
            return None if x is None else x * time_scale

        classes = tuple(replace(c, tpot_seconds=s(c.tpot_seconds)) for c in lv.classes)
        return replace(
            lv,
            tpot_seconds=lv.tpot_seconds * time_scale,
            tpot_stderr_seconds=s(lv.tpot_stderr_seconds),
            step_seconds=s(lv.step_seconds),
            classes=classes,
        )

    pools = tuple(replace(p, levels=tuple(level(lv) for lv in p.levels)) for p in profile.pools)
    return replace(profile, pools=pools)


async def run_live(
    setup: DemoSetup,
    profile: profile_mod.Profile,
    *,
    time_scale: float,
    on_status: Callable[[float, str, list, dict, dict], None] | None = None,
    on_decision: Callable[[dict], None] | None = None,
    status_every_s: float = 1.0,
) -> dict:
    """Run the scenario live; returns throughput and TPOT in model units plus the decisions."""
    policy = scaled_policy(setup.policy, setup.timer_scale * time_scale)
    with tempfile.TemporaryDirectory(prefix="specguard-demo-") as tmp:
        work = Path(tmp)
        profile_path = work / "profile.yaml"
        live_profile = wall_profile(profile, time_scale)
        profile_mod.write_profile(live_profile, profile_path)
        async with SimCluster.from_config(setup.sim, seed=setup.seed, time_scale=time_scale) as sim:
            ex = setup.exporter
            pools = tuple(replace(p, url=sim.urls[p.name], engine="vllm") for p in ex.pools)
            tap = replace(
                ex.tap,
                listen="127.0.0.1:0",
                window_seconds=max(ex.tap.window_seconds * time_scale, policy.window_seconds * 2),
            )
            scrape = replace(ex.scrape, interval_seconds=max(1.0, ex.scrape.interval_seconds * time_scale))
            exporter = replace(ex, pools=pools, tap=tap, scrape=scrape)
            cfg = monitor_config.SpecguardConfig(
                file=str(work / "demo-config.yaml"),
                exporter=exporter,
                sections={
                    "guard": policy,
                    "cost": replace(setup.settings, calibration_profile=str(profile_path)),
                    "actuators": guard_config.ActuatorSettings(audit_log=str(work / "audit.jsonl")),
                },
            )
            monitor = monitor_app.Monitor(cfg)
            guard = guard_wiring.configure(monitor, cfg)
            url = await monitor.start(port=0)
            try:
                return await _drive(
                    setup,
                    url,
                    sim,
                    monitor,
                    guard,
                    live_profile,
                    time_scale,
                    on_status,
                    on_decision,
                    status_every_s,
                )
            finally:
                await monitor.stop()


async def _drive(setup, url, sim, monitor, guard, profile, time_scale, on_status, on_decision, every) -> dict:
    scen = setup.scenario
    ks = {p.name: p.num_speculative_tokens for p in setup.exporter.pools}
    settings = setup.settings
    window = guard.policy.window_seconds
    t0 = time.time()
    seen: dict = {}
    decisions: list[dict] = []
    tasks: list[asyncio.Task] = []
    stop = asyncio.Event()
    schedule = {"checks": 0, "late_checks": 0, "worst_stretch": 1.0, "late_pools": set()}

    async def watch() -> None:
        while not stop.is_set():
            late = sim.late()  # the simulator behind its time scale: what it serves now is skewed
            schedule["checks"] += 1
            if late:
                schedule["late_checks"] += 1
                schedule["late_pools"].update(late)
                worst = max(s["stretch"] for s in late.values())
                schedule["worst_stretch"] = max(schedule["worst_stretch"], worst)
            now = time.time()
            model_now = (now - t0) / time_scale
            phase = scen.phases[scen.phase_at(model_now)].name
            for key, decision in list(guard.last_decisions.items()):
                if decision.action != "none" and seen.get(key) != decision.at:
                    seen[key] = decision.at
                    entry = decision.to_json()
                    # the warm start is evaluated as the guard starts, just before the traffic: t=0
                    entry["time"] = max(0.0, (decision.at - t0) / time_scale)
                    entry["phase"] = phase
                    decisions.append(entry)
                    if on_decision:
                        on_decision(entry)
            if on_status:
                records = monitor.stats.records(since=now - window)
                costs = await asyncio.to_thread(cost_mod.evaluate, records, ks, profile, now, settings)
                on_status(model_now, phase, costs, dict(guard.states), late)
            try:
                async with asyncio.timeout(every):
                    await stop.wait()
            except TimeoutError:
                pass

    watcher = asyncio.create_task(watch(), name="demo status")
    for index, (_, _, phase) in enumerate(scen.boundaries()):
        wall = phase.duration_s * time_scale
        for load in phase.loads:
            if not load.clients:
                continue
            tasks.append(
                asyncio.create_task(
                    loadgen.run_load(
                        url,
                        traffic.mix_of([load]),
                        load.clients,
                        duration_s=wall,
                        stream=True,
                        seed=setup.seed * 1000 + index,
                    ),
                    name=f"demo load {phase.name}/{load.task_type}",
                )
            )
        await asyncio.sleep(wall)
    results = [r for batch in await asyncio.gather(*tasks) for r in batch]
    elapsed = time.time() - t0
    stop.set()
    await watcher
    ok = [r for r in results if r.ok]
    tpots = [r.tpot_seconds / time_scale for r in ok if r.tpot_seconds is not None]
    tokens = sum(r.output_tokens for r in ok)
    return {
        "label": "specguard (live run)",
        "mode": LIVE_MODE,
        "time_scale": time_scale,
        "wall_seconds": elapsed,
        "throughput_tokens_per_second": tokens / (elapsed / time_scale),
        "tpot_mean_ms": float(np.mean(tpots) * 1000) if tpots else None,
        "tpot_p99_ms": float(np.percentile(tpots, 99) * 1000) if tpots else None,
        "requests": len(ok),
        "failed_requests": len(results) - len(ok),
        "decisions": decisions,
        "actions": len(decisions),
        "tap_requests": int(sum(t.requests for t in monitor.stats.totals().values())),
        "final_plan": {"/".join(k): s.pool for k, s in sorted(guard.states.items()) if s.pool},
        # status checks at which the simulator ran behind its time scale (PoolRuntime.schedule):
        # then the live run's times, and its RC, were skewed by the CPU, not by the model
        "simulator_schedule": {
            "checks": schedule["checks"],
            "late_checks": schedule["late_checks"],
            "worst_stretch": round(schedule["worst_stretch"], 3),
            "late_pools": sorted(schedule["late_pools"]),
            "late_stretch": LATE_STRETCH,
        },
        "time_units": "model seconds (wall / time_scale)",
        "note": "1 engine per pool over HTTP; not the replays' fleet capacity model, so compare within rows",
    }


def pick_time_scale(model_seconds: float, wall_budget: float, minimum: float = 0.1) -> float:
    """Wall seconds per model second so the live run fits ``wall_budget`` (never faster than 1/minimum)."""
    if wall_budget <= 0:
        return minimum
    return max(minimum, min(1.0, wall_budget / model_seconds)) if math.isfinite(model_seconds) else 1.0
