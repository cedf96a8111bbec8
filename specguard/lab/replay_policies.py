"""The routing policies a scenario is replayed under, for the demo's comparison and the benchmarks.

- ``StaticPolicy``: one fixed plan for the whole run (a single pool for everything = "always
  speculate" with the K=4 pool, "never speculate" with the no-spec pool, or a per-class plan);
- ``SlicedPolicy``: a plan per time slice fixed in advance (the hindsight rows and the oracle,
  ``lab.hindsight``), switched exactly at the slice boundaries;
- ``SpecguardPolicy``: the product. The tap's ``Router`` (holdout and probe shares included),
  the tap's ``WindowedStats``, ``rules.cost.evaluate`` and ``rules.guard.step`` on the same
  evaluation interval as the daemon, all on the replay's virtual clock.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Mapping
from dataclasses import replace

from specguard.exporters import routing, stats
from specguard.exporters.config import ExporterConfig
from specguard.exporters.records import RequestRecord
from specguard.lab.replay import LoadBucketOf, LoadOf
from specguard.rules import cost as cost_mod
from specguard.rules import desired, onepool, planfeed, planner, planprobes, probes
from specguard.rules import evidence as evidence_mod
from specguard.rules import guard as guard_mod
from specguard.rules import holdout as holdout_mod
from specguard.rules import policy as policy_mod
from specguard.rules import prior as prior_mod
from specguard.rules import spread as spread_mod
from specguard.rules.cost_config import CostSettings

Split = tuple[tuple[str, float], ...]  # (pool, share) pairs, shares summing to 1
ClassPlan = dict[tuple[str, str], str | Split]  # (task_type, temperature_bucket) -> pool, or a split


class Choices(dict[str, tuple[str, str]]):
    """A run's routing, request key -> (pool, route), and ``sizes``: the replicas per pool it asked
    an autoscaled fleet for at each HPA sync (``guard.scaling``; empty when it sized none)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sizes: dict[float, dict[str, int]] = {}


class StaticPolicy:
    """A plan that never changes; ``pool`` for every class not in ``plan``. A class split over
    pools gets each pool's share of its requests exactly, in a smooth weighted round robin."""

    tick_seconds = None

    def __init__(self, name: str, pool: str, plan: ClassPlan | None = None):
        self.name = name
        self.pool = pool
        self.plan = dict(plan or {})
        self._credit: dict[tuple[str, str], dict[str, float]] = {}

    def choose(
        self,
        task_type: str,
        temperature_bucket: str,
        load_bucket_of: LoadBucketOf,
        load_of: LoadOf | None = None,
        key: str = "",
    ) -> tuple[str, str]:
        target_key = (task_type, temperature_bucket)
        target = self.plan.get(target_key, self.pool)
        if isinstance(target, str):
            return target, "plan"
        credit = self._credit.setdefault(target_key, {})
        for pool, share in target:
            credit[pool] = credit.get(pool, 0.0) + share
        pool = max(target, key=lambda ps: (credit[ps[0]], ps[0]))[0]
        credit[pool] -= 1.0
        return pool, "plan"

    def observe(self, record: RequestRecord) -> None:
        pass

    def tick(self, now: float) -> list[dict]:
        return []

    def on_phase(self, index: int, now: float) -> None:
        pass


class SlicedPolicy(StaticPolicy):
    """A plan per time slice, known in advance (the hindsight rows of ``lab.hindsight``).

    ``slices``: ``(start seconds, plan)`` in time order; the plan of the last slice that started
    applies, switched exactly at its start (a tick every ``tick_seconds``, and at phase starts).
    """

    def __init__(
        self, name: str, default_pool: str, slices: list[tuple[float, ClassPlan]], tick_seconds: float | None
    ):
        super().__init__(name, default_pool)
        self.slices = slices
        self.starts = [start for start, _ in slices]
        self.tick_seconds = tick_seconds
        self._switch(0.0)

    def _switch(self, now: float) -> None:
        index = bisect.bisect_right(self.starts, now + 1e-9) - 1
        self.plan = dict(self.slices[max(index, 0)][1]) if self.slices else {}

    def on_phase(self, index: int, now: float) -> None:
        self._switch(now)

    def tick(self, now: float) -> list[dict]:
        self._switch(now)
        return []


class ReplayedChoices(StaticPolicy):
    """A run's own routing, request by request, replayed: every request gets the pool and route the
    run gave the request of the same key (the same client's same request); one the run did not send
    (other acceptance draws pace the clients differently) gets the default pool. The oracle replays
    each specguard row's routing this way, so it bounds them by construction."""

    def __init__(self, name: str, default_pool: str, choices: Choices, tick_seconds: float | None):
        super().__init__(name, default_pool)
        self.choices = choices
        self.tick_seconds = tick_seconds  # the same ticks, so the same order of events

    def choose(
        self,
        task_type: str,
        temperature_bucket: str,
        load_bucket_of: LoadBucketOf,
        load_of: LoadOf | None = None,
        key: str = "",
    ) -> tuple[str, str]:
        found = self.choices.get(key)
        return found or super().choose(task_type, temperature_bucket, load_bucket_of, load_of, key)

    def desired_replicas_at(self, now: float) -> dict[str, int] | None:
        """The replicas the run asked for at this sync (None: it sized none; the HPA's own rule)."""
        sizes = getattr(self.choices, "sizes", None)
        return sizes.get(now, {}) if sizes else None


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
        self.policy = policy.with_pools(self.pools, default_pool, nospec, onepool.of_pools(exporter.pools))
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
        self.choices = Choices()  # every request's route by its key (the oracle replays them)
        self.on_tick = None  # optional callback(now, costs, changed decisions) for live display
        self.last_plan: planner.Plan | str | None = None  # guard.decider: planner
        self.sizer = desired.Sizer(self.policy.scaling) if self.policy.scaling is not None else None
        self.desired_replicas: dict[str, int] = {}  # guard.scaling: the sizes of the last plan
        self.planned_shares: planprobes.Shares | None = None  # the plan's price of probes and holdout
        self.spread_fit = spread_mod.Held()  # guard.spread

    @property
    def tick_seconds(self) -> float:
        return self.policy.interval_seconds

    def choose(
        self,
        task_type: str,
        temperature_bucket: str,
        load_bucket_of: LoadBucketOf,
        load_of: LoadOf | None = None,
        key: str = "",
    ) -> tuple[str, str]:
        choice = self.router.choose(task_type, temperature_bucket, load_bucket_of, load_of)
        self.choices[key] = (choice.pool, choice.route)
        return choice.pool, choice.route

    def observe(self, record: RequestRecord) -> None:
        self.stats.add(record)

    def on_replicas(self, counts: Mapping[str, int]) -> None:
        """Serving replicas per pool changed (an autoscaled fleet): the router buckets load per
        replica and sizes the holdout by them, as a fleet's guard learns them from Prometheus."""
        known = {pool: n for pool, n in counts.items() if pool in self.pools and n >= 1}
        if known:
            self.router.set_replicas(known)

    def on_phase(self, index: int, now: float) -> None:
        pass

    def desired_replicas_at(self, now: float) -> dict[str, int] | None:
        """``guard.scaling``: the replicas per pool an autoscaled fleet scales on at this HPA sync, as
        the shipped HPA does on ``specguard_pool_desired_replicas`` (None: the guard sizes none, and
        the HPA scales on requests in flight). Kept in ``choices.sizes`` for the oracle's replay."""
        if self.sizer is None:
            return None
        self.choices.sizes[now] = dict(self.desired_replicas)
        return self.choices.sizes[now]

    def collect(
        self, now: float
    ) -> tuple[list[cost_mod.ClassCost], dict[evidence_mod.ClassKey, evidence_mod.Evidence]]:
        """What the daemon's LocalSource does: the window through the cost model, the profile prior,
        and the router's holdout (``guard.holdout: on_demand`` or ``matched_on_demand``)."""
        records = self.stats.records(since=now - self.policy.window_seconds)
        costs = cost_mod.evaluate(records, self.pools, self.profile, now, self.settings)
        share = self.router.holdout_share
        held = holdout_mod.for_policy(records, self.pools, self.policy, self.settings, share, now)
        self.router.set_holdout_shares(held.shares, held.matched)
        evidence = evidence_mod.evidence_from_costs(costs, policy=self.policy, load_order=self.load_order)
        return costs, evidence_mod.with_prior(evidence, self.prior)

    def tick(self, now: float) -> list[dict]:
        """One evaluation of every class, as the daemon runs it; returns plan-changing decisions."""
        self.clock.now = now
        self.evaluations += 1
        costs, evidence = self.collect(now)
        planned = self.plan_fleet(evidence, now) if self.policy.decider == "planner" else {}
        self.spread(evidence, now)
        changed = []
        for key in sorted(set(evidence) | set(self.states)):
            state = self.states.get(key) or guard_mod.initial_state(key, self.policy)
            found = evidence.get(key, evidence_mod.Evidence())
            state, decision = guard_mod.step(state, found, now, self.policy, planned.get(key[:2]))
            self.states[key] = state
            if decision.changes_plan:
                changed.append(_explained(decision, found))
        self.route(evidence, now, bool(changed))
        self.last_costs = costs
        if self.on_tick is not None:
            self.on_tick(now, costs, changed)
        return changed

    def plan_fleet(
        self, evidence: Mapping[evidence_mod.ClassKey, evidence_mod.Evidence], now: float
    ) -> dict[tuple[str, str], tuple[str, str]]:
        """``guard.decider: planner``: the fleet plan's pool and reason per class (task type,
        temperature bucket), for every load bucket of it."""
        records = self.stats.records(since=now - self.policy.window_seconds)
        found = planfeed.decide(
            planfeed.build(
                records,
                self.states,
                evidence,
                now,
                self.policy,
                self.settings,
                self.router.replicas(),
                self.profile,
            )
        )
        self.last_plan = found.plan or found.reason
        self.planned_shares = found.shares(self.router.probe_share, self.router.holdout_share)
        if self.sizer is not None and found.plan is not None and found.input is not None:
            self.desired_replicas = self.sizer.desired(found.input, found.plan, now)  # else they stand
        return found.planned

    def spread(self, evidence: Mapping[evidence_mod.ClassKey, evidence_mod.Evidence], now: float) -> None:
        """``guard.spread``: each class over the pools where it adds least time at the loads now."""
        if not self.policy.spread:
            return
        records = self.stats.records(since=now - self.policy.window_seconds)
        found = self.spread_fit.model(records, self.policy, self.settings, self.profile, now)
        if isinstance(found, str):
            self.router.set_spread(None)
            return
        units = spread_mod.units(self.states, evidence, now, self.policy, found)
        self.router.set_spread(routing.Spread(units, spread_mod.stepper(found, self.policy)))

    def route(
        self, evidence: Mapping[evidence_mod.ClassKey, evidence_mod.Evidence], now: float, changed: bool
    ) -> None:
        """The router after an evaluation, as the daemon leaves it: every class off speculation probed
        by expected cost (``rules.probes``), and the plan when a decision changed it."""
        expected = probes.plan(self.states, evidence, now, self.policy, self.router.probe_share)
        found = planprobes.merged(expected, self.planned_shares)
        self.router.set_probes({key: (p.pool, p.share) for key, p in found.items()})
        self.router.set_class_holdouts(planprobes.class_holdouts(self.planned_shares))
        if changed:
            self.router.set_plan(
                {
                    key: s.pool
                    for key, s in self.states.items()
                    if s.pool and s.pool != self.policy.default_pool
                }
            )


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
