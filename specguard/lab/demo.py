"""``specguard demo``: the product doing its job on the built-in simulator, no GPU, no setup.

Three steps, all on the simulator's engine core in virtual time (model seconds):

1. calibrate: a quick ``sweep`` of every pool over concurrency 1..128 writes the calibration
   profile the cost model falls back on. The sweep cannot see the scenario: it drives its own mix
   (every task type of the world at one temperature per temperature bucket, equal shares) with its
   own seed. A second sweep, on another simulator world, gives a stale profile;
2. specguard: the scripted scenario runs through the tap's router and windowed statistics,
   ``rules.cost.evaluate`` and ``rules.guard.step`` (the shipped default policy, its timers
   scaled by ``timer_scale``), with the fresh profile, with none and with the stale one;
3. compare: the same scenario and seed replayed under the rows of ``lab.rows`` (always and never
   speculate, the best single pool, the best in-engine K schedule, the best static plan per class,
   the best pool per phase on a fluid fleet, and the oracle), every row on the same engines: the
   fleet shape (``lab.shapes``: fixed replicas per pool by default, autoscaled, or fluid); the
   oracle's plan replayed with other acceptance draws gives the run-to-run noise, and the bound
   check says whether any row beat the oracle by more than that (``summary.bound``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from specguard import schedules
from specguard.exporters.config import ExporterConfig
from specguard.lab import hindsight, replay, rows, shapes, summary, sweep, sweep_drivers
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
CALIBRATION_SEED = 1000  # the sweep's own seed: demo seed + this
ROWS = (  # the comparison's rows, in the order they are printed (keys of the JSON's ``policies``)
    "always_speculate",
    "never_speculate",
    "best_single_pool",
    "best_in_engine_schedule",
    "best_per_phase",
    "best_per_class_static",
    "oracle",
    "specguard",
    "specguard_no_profile",
    "specguard_stale_profile",
)
KNOWS_SPECGUARD = {
    "fresh": "what it measured live, and a calibration sweep of this world with its own mix and seed",
    "none": "only what it measured live (guard.prior: none, no calibration profile)",
    "stale": "what it measured live, and a calibration sweep of another simulator world",
}


@dataclass
class DemoSetup:
    sim: SimConfig
    exporter: ExporterConfig
    policy: policy_mod.Policy
    scenario: scenario_mod.Scenario
    seed: int = 0
    fleet: int = 4
    timer_scale: float = 1 / 3
    policy_source: str = "rules/default-policy.yaml"
    gpu_scale: float = 1.0  # the simulated GPU is this many times smaller than the shipped one
    settings: CostSettings = field(default_factory=CostSettings)
    stale_sim: SimConfig | None = None  # the world the stale profile is swept on
    stale_world: str = ""
    shape: shapes.FleetShape | None = None  # None: a fluid fleet of ``fleet`` engines

    @property
    def fleet_shape(self) -> shapes.FleetShape:
        return self.case().fleet_shape

    @property
    def buckets(self) -> replay.Buckets:
        return replay.Buckets.from_classes(self.exporter.classes)

    @property
    def pools(self) -> list[str]:
        return [p.name for p in self.exporter.pools]

    @property
    def default_pool(self) -> str:
        return self.exporter.tap.default_pool or self.pools[0]

    @property
    def nospec_pool(self) -> str:
        return self.exporter.tap.nospec_pool or next(p for p in self.pools if self.k(p) == 0)

    def k(self, pool: str) -> int:
        return self.exporter.pool(pool).num_speculative_tokens

    def timed_policy(self) -> policy_mod.Policy:
        return rp.scaled_policy(self.policy, self.timer_scale) if self.timer_scale != 1 else self.policy

    def case(self) -> hindsight.Case:
        return hindsight.Case(
            sim=self.sim,
            scenario=self.scenario,
            buckets=self.buckets,
            pools=tuple(self.pools),
            default_pool=self.default_pool,
            nospec_pool=self.nospec_pool,
            fleet=self.fleet,
            seed=self.seed,
            interval=self.timed_policy().interval_seconds,
            shape=self.shape,
        )


def for_shape(exporter: ExporterConfig, shape: shapes.FleetShape) -> ExporterConfig:
    """The exporter's pools on ``shape``: only the pools it runs, each with its replicas (what the
    guard reads to bucket load per replica and size the holdout)."""
    if shape.kind == shapes.FLUID:
        return exporter
    missing = [p for p in shape.pools if p not in {q.name for q in exporter.pools}]
    if missing:
        raise ValueError(f"fleet shape pools {missing} are not configured")
    pools = tuple(
        replace(p, replicas=shape.replicas[p.name]) for p in exporter.pools if p.name in shape.pools
    )
    tap = exporter.tap
    for field_name in ("default_pool", "nospec_pool"):
        named = getattr(tap, field_name)
        if named and named not in shape.pools:
            raise ValueError(f"the fleet shape has no {named!r} ({field_name}): add it to the replicas")
    if not any(p.num_speculative_tokens == 0 for p in pools):
        raise ValueError("the fleet shape needs a no-speculation pool (never-speculate and the baseline)")
    return replace(exporter, pools=pools)


def with_k_schedules(
    setup: DemoSetup, launched: Mapping[str, schedules.Schedule], *, configured: bool = True
) -> DemoSetup:
    """The setup with each pool of ``launched`` running its in-engine K schedule (vLLM's
    ``num_speculative_tokens_per_batch_size``), in the world and in the tap's config alike: the
    fleet a team runs that routes and also lets an engine turn K down with its batch.
    ``configured=False``: in the world only, a config that does not name the schedules (the guard
    takes each pool at its launch K)."""
    ks = {p.name: p.num_speculative_tokens for p in setup.exporter.pools}
    wrong = [name for name, s in launched.items() if name not in ks or not 0 < s.max_k <= ks[name]]
    if wrong:
        raise ValueError(f"no speculative pool of K at least its schedule's for {', '.join(sorted(wrong))}")

    def with_them(pools):
        return tuple(replace(p, k_schedule=launched[p.name]) if p.name in launched else p for p in pools)

    exporter = setup.exporter
    if configured:
        exporter = replace(exporter, pools=with_them(exporter.pools))
    return replace(setup, sim=replace(setup.sim, pools=with_them(setup.sim.pools)), exporter=exporter)


def cost_settings(exporter: ExporterConfig, base: CostSettings | None = None) -> CostSettings:
    """The cost settings with the tap's load buckets and threshold, as monitor.config wires them."""
    buckets = [(b.name, None if math.isinf(b.max) else b.max) for b in exporter.classes.load_buckets]
    return (base or CostSettings()).with_traffic(buckets, exporter.tap.full_rollback_request_threshold)


def sweep_mix(sim: SimConfig, buckets: replay.Buckets) -> list[sweep.MixEntry]:
    """The calibration sweep's own mix: every task type of the world at a representative temperature
    of every temperature bucket (its midpoint; 1.0 for the open top bucket), in equal shares.

    It depends on the world and the tap's buckets only, never on the scenario it will serve.
    """
    temperatures, low = [], 0.0
    for _, upper in buckets.temperature:
        if math.isinf(upper):
            value = max(1.0, low + 0.1)
        else:
            value = upper if upper <= low else (low + upper) / 2
        temperatures.append(round(min(value, 2.0), 3))
        low = upper if not math.isinf(upper) else low
    return [sweep.MixEntry(task, t, 1.0) for task in sorted(sim.tasks) for t in dict.fromkeys(temperatures)]


def calibrate(
    setup: DemoSetup,
    progress: Callable[[int, int, str], None] | None = None,
    sim: SimConfig | None = None,
) -> profile_mod.Profile:
    """A quick virtual sweep of every pool with the sweep's own mix and seed -> calibration profile.

    ``sim``: the world to sweep (default: the setup's; the stale profile sweeps another one).
    Concurrency 1, 2, 4, ... up to 128 divided by the GPU scale (the same load range on a smaller GPU).
    """
    world = sim or setup.sim
    mix = sweep_mix(world, setup.buckets)
    pools = [sweep.PoolSpec(p.name, p.num_speculative_tokens) for p in setup.exporter.pools]
    gpu = setup.gpu_scale
    levels = tuple(c for c in CALIBRATION_LEVELS if c <= max(1, CALIBRATION_LEVELS[-1] / gpu))
    samples = sweep.run_grid(
        pools,
        levels,
        mix,
        sweep_drivers.virtual_driver(world, seed=setup.seed + CALIBRATION_SEED),
        requests_per_level=lambda c: max(6 * len(mix), 4 * c),
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


# ---- the runs ------------------------------------------------------------------------------------


def run_specguard(
    setup: DemoSetup,
    profile: profile_mod.Profile | None,
    on_tick: Callable | None = None,
    policy: policy_mod.Policy | None = None,
    on_start: Callable[[rp.SpecguardPolicy], None] | None = None,
) -> tuple[replay.ReplayResult, rp.SpecguardPolicy]:
    """specguard on the scenario; ``profile`` None runs it with ``guard.prior: none`` as well.
    ``on_start(guard)`` before the run (a live display reads the guard's states on each tick)."""
    policy = policy or setup.timed_policy()
    if profile is None:
        policy = replace(policy, prior="none")
    guard = rp.SpecguardPolicy(setup.exporter, policy, setup.settings, profile=profile, seed=setup.seed)
    guard.on_tick = on_tick
    if on_start is not None:
        on_start(guard)
    result = replay.Replay(
        setup.sim,
        setup.scenario,
        guard,
        setup.buckets,
        seed=setup.seed,
        pools=setup.pools,
        fleet=setup.fleet,
        shape=setup.shape,
    ).run()
    return result, guard


def specguard_row(
    setup: DemoSetup, result: replay.ReplayResult, guard: rp.SpecguardPolicy, variant: str
) -> dict:
    label = {"fresh": "specguard", "none": "specguard, no profile", "stale": "specguard, stale profile"}
    return summary.summarize(
        result,
        f"{label[variant]} (default policy)",
        knows=KNOWS_SPECGUARD[variant],
        profile=variant,
        mode=SPECGUARD_MODE,
        decisions=result.decisions,
        actions=len(result.decisions),
        profile_actions=sum(d.get("cause") == "profile" for d in result.decisions),  # warm starts
        actions_in_stationary_phases=summary.stationary_actions(result.decisions, setup.scenario),
        max_changes_per_class_hour=summary.max_changes_per_class_hour(result.decisions),
        evaluations=guard.evaluations,
        routes=summary.routes(result),
    )


def compare(
    setup: DemoSetup,
    specguard: dict[str, dict],
    progress: Callable[[str], None] | None = None,
    noise_draws: tuple[int, ...] = (1, 2),
    realised: Mapping[str, rp.Choices] | None = None,
) -> dict:
    """Every row, the run-to-run noise and the bound check; ``specguard``: its rows by JSON key;
    ``realised``: their routing by the same key (``SpecguardPolicy.choices``), which the oracle
    replays as candidates so that it bounds them by construction."""
    case = setup.case()
    policies, oracle_plan = rows.rows(case, progress, realised)
    policies.update(specguard)
    if progress:
        progress("replaying the oracle's plan with other acceptance draws (run-to-run noise)")
    oracle = policies["oracle"]["throughput_tokens_per_second"]
    noise = hindsight.noise(case, oracle_plan.rerun, oracle, noise_draws)
    return {
        "policies": policies,
        "noise": noise,
        "bound": summary.bound(policies, noise["max_abs"]),
        "ratios": ratios(policies),
        "targets": targets(policies, setup.timed_policy().max_actions_per_hour),
    }


def ratios(policies: dict[str, dict]) -> dict[str, float | None]:
    sg = policies["specguard"]
    out: dict[str, float | None] = {
        f"specguard_vs_{name}_throughput": summary.ratio(sg, policies[name])
        for name in (
            "oracle",
            "best_single_pool",
            "best_in_engine_schedule",
            "best_per_phase",
            "best_per_class_static",
            "always_speculate",
            "never_speculate",
        )
        if name in policies
    }
    never = [r for r in summary.phase_ratios(sg, policies["never_speculate"]) if r is not None]
    out["specguard_vs_never_worst_phase_throughput"] = min(never) if never else None
    if "best_in_engine_schedule" in policies:
        sched = summary.phase_ratios(sg, policies["best_in_engine_schedule"])
        out["specguard_vs_best_in_engine_schedule_worst_phase_throughput"] = min(
            (r for r in sched if r is not None), default=None
        )
    out["specguard_vs_oracle_tpot_p99"] = summary.ratio(sg, policies["oracle"], "tpot_p99_ms")
    for name in ("specguard_no_profile", "specguard_stale_profile"):
        if name in policies:
            out[f"{name}_vs_oracle_throughput"] = summary.ratio(policies[name], policies["oracle"])
    return out


TARGETS = {
    "vs_oracle": 0.95,  # mean over runs; 0.90 in the worst run
    "worst_phase_vs_never": 1.0,
    "vs_best_single_pool": 1.0,
    "tpot_p99_vs_oracle": 1.15,
}


def targets(policies: dict[str, dict], cap: int) -> dict[str, dict]:
    """The controller's targets (docs/benchmarks.md) for this one run: each with its value and whether
    it is met."""
    r = ratios(policies)
    changes = policies["specguard"]["max_changes_per_class_hour"]
    values = {
        "vs_oracle": (r["specguard_vs_oracle_throughput"], ">=", TARGETS["vs_oracle"]),
        "worst_phase_vs_never": (
            r["specguard_vs_never_worst_phase_throughput"],
            ">=",
            TARGETS["worst_phase_vs_never"],
        ),
        "vs_best_single_pool": (
            r["specguard_vs_best_single_pool_throughput"],
            ">=",
            TARGETS["vs_best_single_pool"],
        ),
        "tpot_p99_vs_oracle": (r["specguard_vs_oracle_tpot_p99"], "<=", TARGETS["tpot_p99_vs_oracle"]),
        "changes_per_class_hour": (changes, "<=", cap),
    }
    out = {}
    for name, (value, op, goal) in values.items():
        met = value is not None and (value >= goal if op == ">=" else value <= goal)
        out[name] = {"value": value, "goal": f"{op} {goal}", "met": met}
    return out


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
                "loads": [
                    {
                        "task_type": load.task_type,
                        "clients": load.clients,
                        "temperatures": [list(t) for t in load.temperatures],
                    }
                    for load in phase.loads
                ],
            }
            for start, end, phase in scen.boundaries()
        ],
    }
