"""``specguard demo``: the product doing its job on the built-in simulator, no GPU, no setup.

Three steps, all on the simulator's engine core in virtual time (model seconds):

1. calibrate: a quick ``sweep`` of every pool over concurrency 1..128 writes the calibration
   profile the cost model falls back on where the live no-spec baseline is thin;
2. specguard: the scripted scenario runs through the tap's router and windowed statistics,
   ``rules.cost.evaluate`` and ``rules.guard.step`` (the shipped default policy, its timers
   scaled by ``timer_scale``), shown as it happens (paced to the wall clock by ``--duration``);
3. compare: the same scenario and seed replayed under always-speculate (K=4), never-speculate,
   every static single-pool config (the best one chosen in hindsight) and the per-phase per-class
   oracle; throughput, mean and p99 TPOT for each, overall and per phase.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from specguard.exporters.config import ExporterConfig
from specguard.lab import replay, sweep, sweep_drivers
from specguard.lab import replay_policies as rp
from specguard.lab import scenario as scenario_mod
from specguard.rules import policy as policy_mod
from specguard.rules import profile as profile_mod
from specguard.rules.cost_config import CostSettings
from specguard.sim.config import SimConfig

SPECGUARD_MODE = (
    "virtual-time replay driving the real exporters.routing.Router, exporters.stats.WindowedStats, "
    "rules.cost.evaluate and rules.guard.step"
)
CALIBRATION_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class DemoSetup:
    sim: SimConfig
    exporter: ExporterConfig
    policy: policy_mod.Policy
    scenario: scenario_mod.Scenario
    seed: int = 0
    fleet: int = 3
    timer_scale: float = 1 / 3
    policy_source: str = "rules/default-policy.yaml"
    gpu_scale: float = 1.0  # the simulated GPU is this many times smaller than the shipped one
    settings: CostSettings = field(default_factory=CostSettings)

    @property
    def buckets(self) -> replay.Buckets:
        return replay.Buckets.from_classes(self.exporter.classes)

    @property
    def pools(self) -> list[str]:
        return [p.name for p in self.exporter.pools]

    def k(self, pool: str) -> int:
        return self.exporter.pool(pool).num_speculative_tokens


def cost_settings(exporter: ExporterConfig, base: CostSettings | None = None) -> CostSettings:
    """The cost settings with the tap's load buckets and threshold, as monitor.config wires them."""
    buckets = [(b.name, None if math.isinf(b.max) else b.max) for b in exporter.classes.load_buckets]
    return (base or CostSettings()).with_traffic(buckets, exporter.tap.full_rollback_request_threshold)


def calibrate(
    setup: DemoSetup, progress: Callable[[int, int, str], None] | None = None
) -> profile_mod.Profile:
    """A quick virtual sweep over every pool with the scenario's mix -> calibration profile.

    Concurrency 1, 2, 4, ... up to 128 divided by the GPU scale (the same load range on a smaller GPU).
    """
    mix_weights: dict[tuple[str, float], float] = {}
    for phase in setup.scenario.phases:
        for load in phase.loads:
            total = sum(w for _, w in load.temperatures)
            for t, w in load.temperatures:
                mix_weights[(load.task_type, t)] = mix_weights.get((load.task_type, t), 0.0) + w / total
    mix = [sweep.MixEntry(task, t, w) for (task, t), w in sorted(mix_weights.items())]
    pools = [sweep.PoolSpec(p.name, p.num_speculative_tokens) for p in setup.exporter.pools]
    gpu = setup.gpu_scale
    levels = tuple(c for c in CALIBRATION_LEVELS if c <= max(1, CALIBRATION_LEVELS[-1] / gpu))
    samples = sweep.run_grid(
        pools,
        levels,
        mix,
        sweep_drivers.virtual_driver(setup.sim, seed=setup.seed + 1000),
        requests_per_level=lambda c: max(48, 4 * c),
        progress=progress,
    )
    frame = sweep.to_frame(samples, pools, setup.buckets.temperature_bucket)
    return sweep.to_profile(frame, stack=sweep.simulator_stack(setup.sim, "specguard demo"))


def smaller_gpu(sim: SimConfig, factor: float) -> SimConfig:
    """The simulator's cost model for a GPU ``factor`` times smaller: step(B / factor) = old step(B).

    Every load-dependent cost is multiplied by ``factor`` and the knee, graph tiers and batch
    capacity are divided by it; the per-step base cost and the acceptance tables are unchanged,
    so every true RC at concurrency B / factor equals the original at B.
    """
    if factor == 1:
        return sim
    c = sim.cost
    cost = replace(
        c,
        per_request_seconds=c.per_request_seconds * factor,
        per_token_seconds=c.per_token_seconds * factor,
        knee_tokens=max(1, round(c.knee_tokens / factor)),
        above_knee_per_token_seconds=c.above_knee_per_token_seconds * factor,
        draft_per_token_seconds=c.draft_per_token_seconds * factor,
        prefill_per_token_seconds=c.prefill_per_token_seconds * factor,
        graph_tiers=tuple(sorted({max(1, round(t / factor)) for t in c.graph_tiers})),
    )
    pools = tuple(replace(p, max_num_seqs=max(1, round(p.max_num_seqs / factor))) for p in sim.pools)
    return replace(sim, cost=cost, pools=pools)


def smaller_buckets(exporter: ExporterConfig, factor: float) -> ExporterConfig:
    """Load buckets divided by ``factor`` (they are concurrency per pool, which shrinks with the GPU)."""
    if factor == 1:
        return exporter
    loads = tuple(replace(b, max=b.max / factor) for b in exporter.classes.load_buckets)
    return replace(exporter, classes=replace(exporter.classes, load_buckets=loads))


# ---- summaries -----------------------------------------------------------------------------------


def _tpot_stats(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    arr = np.asarray(values)
    return float(arr.mean() * 1000), float(np.percentile(arr, 99) * 1000)


def summarize(result: replay.ReplayResult, label: str, **extra) -> dict:
    """Throughput and TPOT of one replay, overall and per phase (stable keys)."""
    scen = result.scenario
    bounds = scen.boundaries()
    tokens = sum(result.tokens.values())
    tpots = [f.tpot for f in result.finished if f.tpot is not None]
    mean, p99 = _tpot_stats(tpots)
    phases = []
    for index, (start, end, phase) in enumerate(bounds):
        phase_tokens = sum(v for (i, _), v in result.tokens.items() if i == index)
        in_phase = [f.tpot for f in result.finished if f.tpot is not None and start <= f.ended < end]
        pm, pp = _tpot_stats(in_phase)
        phases.append(
            {
                "name": phase.name,
                "throughput_tokens_per_second": phase_tokens / phase.duration_s,
                "tpot_mean_ms": pm,
                "tpot_p99_ms": pp,
                "requests": len(in_phase),
            }
        )
    return {
        "label": label,
        "throughput_tokens_per_second": tokens / scen.duration_s,
        "tpot_mean_ms": mean,
        "tpot_p99_ms": p99,
        "requests": len(result.finished),
        "output_tokens": tokens,
        "phases": phases,
        **extra,
    }


def stationary_actions(decisions: list[dict], scen: scenario_mod.Scenario) -> int:
    """Plan changes made during phases whose traffic equals the previous phase's."""
    stationary = {scen.phases[i].name for i in scen.stationary_phases()}
    return sum(1 for d in decisions if d.get("phase") in stationary)


# ---- the run -------------------------------------------------------------------------------------


def run_specguard(
    setup: DemoSetup,
    profile: profile_mod.Profile | None,
    on_tick: Callable | None = None,
) -> tuple[replay.ReplayResult, rp.SpecguardPolicy]:
    policy = rp.scaled_policy(setup.policy, setup.timer_scale) if setup.timer_scale != 1 else setup.policy
    guard = rp.SpecguardPolicy(setup.exporter, policy, setup.settings, profile=profile, seed=setup.seed)
    guard.on_tick = on_tick
    result = replay.Replay(
        setup.sim,
        setup.scenario,
        guard,
        setup.buckets,
        seed=setup.seed,
        fleet=setup.fleet,
        replicas=nospec_replicas(setup.exporter),
    ).run()
    return result, guard


def nospec_replicas(exporter: ExporterConfig) -> dict[str, int]:
    """The no-spec pool's replica count (capacity-matched holdout fills that many engines to the
    fleet's per-engine load; its planned traffic still gets the engines it needs)."""
    name = exporter.tap.nospec_pool or next((p.name for p in exporter.pools if not p.speculative), None)
    return {} if name is None else {name: exporter.pool(name).replicas}


def run_baselines(setup: DemoSetup, progress: Callable[[str], None] | None = None) -> dict[str, dict]:
    """Always (K of the default pool), every single-pool static config, and the oracle."""
    out: dict[str, dict] = {}
    statics: dict[str, dict] = {}
    for pool in setup.pools:
        if progress:
            progress(f"replaying static: every class on {pool} (K={setup.k(pool)})")
        policy = rp.StaticPolicy(f"static-{pool}", pool)
        result = replay.Replay(
            setup.sim, setup.scenario, policy, setup.buckets, seed=setup.seed, pools=[pool], fleet=setup.fleet
        ).run()
        statics[pool] = summarize(result, f"every class on {pool} (K={setup.k(pool)})", config=pool)
    default_pool = setup.exporter.tap.default_pool or setup.pools[0]
    nospec = setup.exporter.tap.nospec_pool or next(p for p in setup.pools if setup.k(p) == 0)
    out["always_speculate"] = statics[default_pool]
    out["never_speculate"] = statics[nospec]
    best = max(statics.values(), key=lambda s: s["throughput_tokens_per_second"])
    out["best_static"] = {**best, "label": f"best static (hindsight): {best['label']}"}
    out["static_configs"] = {pool: s["throughput_tokens_per_second"] for pool, s in statics.items()}
    if progress:
        progress("replaying the per-phase per-class oracle")
    plans = rp.oracle_plans(setup.sim, setup.scenario, setup.buckets, setup.pools, setup.fleet)
    oracle = rp.OraclePolicy("oracle", default_pool, plans)
    result = replay.Replay(
        setup.sim, setup.scenario, oracle, setup.buckets, seed=setup.seed, fleet=setup.fleet
    ).run()
    out["oracle"] = summarize(
        result,
        "per-phase per-class oracle (hindsight, true cost model)",
        plans=[
            {"phase": ph.name, "plan": {f"{t}/{b}": pool for (t, b), pool in sorted(plan.items())}}
            for ph, plan in zip(setup.scenario.phases, plans, strict=True)
        ],
    )
    return out


def ratios(policies: dict[str, dict]) -> dict[str, float | None]:
    sg = policies["specguard"]["throughput_tokens_per_second"]

    def r(name: str) -> float | None:
        other = policies[name]["throughput_tokens_per_second"]
        return sg / other if other else None

    per_phase_vs_never = [
        a["throughput_tokens_per_second"] / b["throughput_tokens_per_second"]
        for a, b in zip(policies["specguard"]["phases"], policies["never_speculate"]["phases"], strict=True)
        if b["throughput_tokens_per_second"]
    ]
    return {
        "specguard_vs_oracle_throughput": r("oracle"),
        "specguard_vs_best_static_throughput": r("best_static"),
        "specguard_vs_always_throughput": r("always_speculate"),
        "specguard_vs_never_throughput": r("never_speculate"),
        "specguard_vs_never_worst_phase_throughput": min(per_phase_vs_never) if per_phase_vs_never else None,
    }


def scenario_json(scen: scenario_mod.Scenario) -> dict:
    return {
        "name": scen.name,
        "description": scen.description,
        "duration_seconds": scen.duration_s,
        "phases": [
            {
                "name": phase.name,
                "start_seconds": start,
                "end_seconds": end,
                "clients": {load.task_type: load.clients for load in phase.loads},
                "temperatures": {
                    load.task_type: [list(t) for t in load.temperatures] for load in phase.loads
                },
            }
            for start, end, phase in scen.boundaries()
        ],
    }
