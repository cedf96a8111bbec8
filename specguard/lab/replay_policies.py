"""The routing policies a scenario is replayed under, for the demo's comparison and the benchmarks.

- ``StaticPolicy``: one fixed plan for the whole run (a single pool for everything = "always
  speculate" with the K=4 pool, "never speculate" with the no-spec pool, or a per-class plan);
- ``OraclePolicy``: a different plan per phase, chosen in hindsight per class from the
  simulator's true cost model (``oracle_plans``), switched exactly at the phase boundaries;
- ``SpecguardPolicy``: the product. The tap's ``Router`` (holdout and probe shares included),
  the tap's ``WindowedStats``, ``rules.cost.evaluate`` and ``rules.guard.step`` on the same
  evaluation interval as the daemon, all on the replay's virtual clock.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from specguard.exporters import routing, stats
from specguard.exporters.config import ExporterConfig
from specguard.exporters.records import RequestRecord
from specguard.lab.replay import Buckets, LoadBucketOf, LoadOf
from specguard.lab.scenario import Phase, Scenario
from specguard.rules import cost as cost_mod
from specguard.rules import evidence as evidence_mod
from specguard.rules import guard as guard_mod
from specguard.rules import holdout as holdout_mod
from specguard.rules import policy as policy_mod
from specguard.rules import prior as prior_mod
from specguard.rules.cost_config import CostSettings
from specguard.sim.config import SimConfig

ClassPlan = dict[tuple[str, str], str]  # (task_type, temperature_bucket) -> pool


class StaticPolicy:
    """A plan that never changes; ``pool`` for every class not in ``plan``."""

    tick_seconds = None

    def __init__(self, name: str, pool: str, plan: ClassPlan | None = None):
        self.name = name
        self.pool = pool
        self.plan = dict(plan or {})

    def choose(
        self,
        task_type: str,
        temperature_bucket: str,
        load_bucket_of: LoadBucketOf,
        load_of: LoadOf | None = None,
    ) -> tuple[str, str]:
        return self.plan.get((task_type, temperature_bucket), self.pool), "plan"

    def observe(self, record: RequestRecord) -> None:
        pass

    def tick(self, now: float) -> list[dict]:
        return []

    def on_phase(self, index: int, now: float) -> None:
        pass


class OraclePolicy(StaticPolicy):
    """Per phase, the per-class plan chosen in hindsight (``plans[i]`` for phase i)."""

    def __init__(self, name: str, default_pool: str, plans: list[ClassPlan]):
        super().__init__(name, default_pool)
        self.plans = plans

    def on_phase(self, index: int, now: float) -> None:
        self.plan = dict(self.plans[index])


# ---- the oracle's choice ------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """Clients of one class in one phase (a task type's temperature mix split by bucket)."""

    task_type: str
    temperature_bucket: str
    clients: float
    temperatures: tuple[tuple[float, float], ...]  # (temperature, weight) inside this bucket


def phase_groups(phase: Phase, buckets: Buckets) -> list[Group]:
    out: dict[tuple[str, str], list] = {}
    for load in phase.loads:
        total = sum(w for _, w in load.temperatures)
        for t, w in load.temperatures:
            key = (load.task_type, buckets.temperature_bucket(t))
            entry = out.setdefault(key, [0.0, []])
            entry[0] += load.clients * w / total
            entry[1].append((t, w))
    return [Group(k[0], k[1], v[0], tuple(v[1])) for k, v in out.items() if v[0] > 0]


def class_tpot(sim: SimConfig, group: Group, pool_name: str, batch: int) -> float:
    """Model TPOT of a class on a pool at ``batch`` requests per engine: T_step(B, K) / A_c(K)."""
    pool = sim.pool(pool_name)
    k = pool.num_speculative_tokens
    profile = sim.task(group.task_type)
    weight = sum(w for _, w in group.temperatures)
    accept = (
        sum(w * profile.expected_accept_length(t, k) for t, w in group.temperatures) / weight if k else 1.0
    )
    return sim.cost.step_seconds(max(1, batch), k) / accept


def oracle_plans(
    sim: SimConfig, scenario: Scenario, buckets: Buckets, pools: list[str], fleet: int = 3
) -> list[ClassPlan]:
    """Per phase and class, the pool with the lowest true TPOT at the phase's per-engine load.

    Hindsight: it knows each phase's traffic and the simulator's true acceptance and step-cost
    model. With capacity following traffic (replay's fleet model) every engine runs at about
    ``clients / fleet`` requests whatever the plan, so each class's best pool is independent.
    """
    plans = []
    for phase in scenario.phases:
        batch = math.ceil(phase.clients / fleet)
        plan: ClassPlan = {}
        for group in phase_groups(phase, buckets):
            plan[(group.task_type, group.temperature_bucket)] = min(
                pools, key=lambda p, g=group: class_tpot(sim, g, p, batch)
            )
        plans.append(plan)
    return plans


def rule_plans(
    sim: SimConfig,
    scenario: Scenario,
    buckets: Buckets,
    default_pool: str,
    nospec_pool: str,
    fleet: int = 3,
    shorten_max_rc: float = 0.95,
) -> list[ClassPlan]:
    """What the default policy's rule would pick with perfect, instant knowledge of the true RC.

    Per phase and class: stay on the default pool while its true RC < 1; else the shorter-K pool
    with the lowest true RC below ``shorten_max_rc``; else no speculation. The gap between this
    and the oracle is the rule's; the gap between specguard and this is measurement and delay.
    """
    nospec_step = sim.cost.step_seconds
    plans = []
    for phase in scenario.phases:
        batch = math.ceil(phase.clients / fleet)
        plan: ClassPlan = {}
        for group in phase_groups(phase, buckets):
            base = nospec_step(max(1, batch), 0)

            def rc(pool: str, g: Group = group, b: int = batch, t_base: float = base) -> float:
                return class_tpot(sim, g, pool, b) / t_base

            k_default = sim.pool(default_pool).num_speculative_tokens
            choice = default_pool
            if rc(default_pool) >= 1.0:
                shorter = [
                    p.name
                    for p in sim.pools
                    if 0 < p.num_speculative_tokens < k_default and rc(p.name) < shorten_max_rc
                ]
                choice = min(shorter, key=rc) if shorter else nospec_pool
            plan[(group.task_type, group.temperature_bucket)] = choice
        plans.append(plan)
    return plans


# ---- specguard itself ---------------------------------------------------------------------------


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SpecguardPolicy:
    """Router + windowed stats + cost model + guard state machine, on virtual time."""

    name = "specguard"

    def __init__(
        self,
        exporter: ExporterConfig,
        policy: policy_mod.Policy,
        settings: CostSettings,
        *,
        profile=None,
        seed: int = 0,
    ):
        tap = exporter.tap
        default_pool = tap.default_pool or exporter.pools[0].name
        nospec = tap.nospec_pool or next((p.name for p in exporter.pools if not p.speculative), None)
        self.pools = {p.name: p.num_speculative_tokens for p in exporter.pools}
        self.policy = policy.with_pools(self.pools, default_pool, nospec)
        self.settings = settings
        self.profile = profile
        self.prior = prior_mod.for_policy(profile, self.policy, settings)
        self.load_order = evidence_mod.load_order(exporter.classes.load_buckets)
        self.clock = VirtualClock()
        self.router = routing.Router(
            exporter.pools,
            default_pool=default_pool,
            nospec_pool=nospec,
            holdout_share=tap.holdout_share,
            probe_share=tap.probe_share,
            rng=random.Random(seed),
            holdout_mode=holdout_mod.router_mode(self.policy),
        )
        self.stats = stats.WindowedStats(
            window_seconds=max(tap.window_seconds, self.policy.window_seconds),
            max_records=tap.max_window_records,
            full_rollback_request_threshold=tap.full_rollback_request_threshold,
            clock=self.clock,
        )
        self.states: dict[tuple[str, str, str], guard_mod.ClassState] = {}
        self.evaluations = 0
        self.last_costs: list[cost_mod.ClassCost] = []
        self.on_tick = None  # optional callback(now, costs, changed decisions) for live display

    @property
    def tick_seconds(self) -> float:
        return self.policy.interval_seconds

    def choose(
        self,
        task_type: str,
        temperature_bucket: str,
        load_bucket_of: LoadBucketOf,
        load_of: LoadOf | None = None,
    ) -> tuple[str, str]:
        choice = self.router.choose(task_type, temperature_bucket, load_bucket_of, load_of)
        return choice.pool, choice.route

    def observe(self, record: RequestRecord) -> None:
        self.stats.add(record)

    def on_phase(self, index: int, now: float) -> None:
        pass

    def collect(
        self, now: float
    ) -> tuple[list[cost_mod.ClassCost], dict[evidence_mod.ClassKey, evidence_mod.Evidence]]:
        """What the daemon's LocalSource does: the window through the cost model, the profile prior,
        and the router's holdout shares (``guard.holdout: on_demand``)."""
        records = self.stats.records(since=now - self.policy.window_seconds)
        costs = cost_mod.evaluate(records, self.pools, self.profile, now, self.settings)
        self.router.set_holdout_shares(
            holdout_mod.for_policy(
                records, self.pools, self.policy, self.settings, self.router.holdout_share, now
            )
        )
        evidence = evidence_mod.evidence_from_costs(costs, policy=self.policy, load_order=self.load_order)
        return costs, evidence_mod.with_prior(evidence, self.prior)

    def tick(self, now: float) -> list[dict]:
        """One evaluation of every class, as the daemon runs it; returns plan-changing decisions."""
        self.clock.now = now
        self.evaluations += 1
        costs, evidence = self.collect(now)
        changed = []
        for key in sorted(set(evidence) | set(self.states)):
            state = self.states.get(key) or guard_mod.initial_state(key, self.policy)
            found = evidence.get(key, evidence_mod.Evidence())
            state, decision = guard_mod.step(state, found, now, self.policy)
            self.states[key] = state
            if decision.changes_plan:
                changed.append(_explained(decision, found))
        if changed:
            self.router.set_plan(
                {
                    key: s.pool
                    for key, s in self.states.items()
                    if s.pool and s.pool != self.policy.default_pool
                }
            )
        self.last_costs = costs
        if self.on_tick is not None:
            self.on_tick(now, costs, changed)
        return changed


def _explained(decision: guard_mod.Decision, evidence: evidence_mod.Evidence) -> dict:
    """The decision as JSON, with the load bucket of inherited evidence it acted on.

    (The reason itself already carries the evidence's note: ``rules.assess`` appends it.)
    """
    out = decision.to_json()
    watched = evidence.pools.get(decision.from_pool)
    if watched is not None and watched.inherited_from is not None:
        out["numbers"]["inherited_from"] = watched.inherited_from
    return out


def scaled_policy(policy: policy_mod.Policy, factor: float) -> policy_mod.Policy:
    """Every timer of the policy times ``factor`` (for a run whose clock is sped up by 1/factor)."""

    def limits(lim: policy_mod.Limits) -> policy_mod.Limits:
        return replace(
            lim,
            failure_window_seconds=lim.failure_window_seconds * factor,
            stabilization_window_seconds=lim.stabilization_window_seconds * factor,
            interval_seconds=lim.interval_seconds * factor,
        )

    return replace(
        policy,
        window_seconds=policy.window_seconds * factor,
        cooldown_seconds=policy.cooldown_seconds * factor,
        memory_seconds=policy.memory_seconds * factor,
        rules=tuple(replace(rule, limits=limits(rule.limits)) for rule in policy.rules),
        alerts=replace(policy.alerts, limits=limits(policy.alerts.limits)),
    )
