"""Where the guard's evidence comes from: this process's tap + cost model, and PromQL.

Each source returns ``{class key: Evidence}`` for one evaluation; ``merge`` joins them pool by
pool. A source that fails outright raises (the daemon turns that into an error evaluation for
every class); a single failing PromQL query is kept as that rule's error on that pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from specguard.errors import SourceError
from specguard.monitor.promql import PromQL
from specguard.rules import holdout, prior, spread
from specguard.rules import policy as policy_mod
from specguard.rules.evidence import (
    ClassKey,
    Evidence,
    PoolEvidence,
    evidence_from_costs,
    load_order,
    with_prior,
)


class EvidenceSource(Protocol):
    async def collect(self, now: float, keys: Sequence[ClassKey]) -> dict[ClassKey, Evidence]: ...


class LocalSource:
    """Per-class numbers from this process: the tap's window of records through the cost model.

    With ``guard.prior: profile`` the calibration profile's rc per class and pool joins the
    evidence (``rules.prior``); with ``guard.holdout: on_demand`` or ``matched_on_demand`` each
    collection also hands the router its holdout per load bucket (``rules.holdout``) through
    ``on_holdout``. The model baseline (``rules.modelbase``) is fitted on the tap's whole window
    (``model_window_seconds``) and the engines' pages between scrapes (``watches``: pool ->
    ``PoolWatch``); ``stack()`` says what the no-spec pool serves now (the profile's freshness).
    """

    def __init__(
        self,
        stats: Any,
        pools: Any,
        settings: Any,
        *,
        profile: Any = None,
        window_seconds: float = 300,
        on_costs: Callable[[Sequence[Any], Mapping[str, Any]], None] | None = None,
        policy: policy_mod.Policy | None = None,
        on_holdout: Callable[[holdout.Holdout], None] | None = None,
        max_holdout_share: float = 0.0,
        model_window_seconds: float | None = None,
        watches: Mapping[str, Any] | None = None,
        stack: Callable[[], Mapping[str, str]] | None = None,
    ):
        self._stats, self._pools, self._settings = stats, pools, settings
        self._on_holdout, self._max_holdout = on_holdout, max_holdout_share
        self._prior: tuple[object, dict] = (None, {})  # (policy it was made for, prior)
        self.policy = policy  # kept current by Guard.set_policy (rc_rises_with_load lives there)
        self._profile = profile
        self._window = window_seconds
        self._on_costs = on_costs  # e.g. CostCollector.update, so /metrics shows what the guard saw
        self._model_window = max(model_window_seconds or window_seconds, window_seconds)
        self._watches = dict(watches or {})
        self._stack = stack
        self._spread_fit = spread.Held()

    def engine_steps(self, since: float) -> list[tuple[str, Any, float]]:
        """The engines' page intervals since ``since``: (pool, step observation, request-steps)."""
        from specguard.rules import cost, modelbase

        ks = cost.pool_ks(self._pools)
        replicas = {p.name: getattr(p, "replicas", 1) for p in self._pools if hasattr(p, "name")}
        out = []
        for name, watch in self._watches.items():
            history = watch.history(since)
            for (_, before), (_, after) in zip(history, history[1:], strict=False):
                found = modelbase.observation_from_engine(
                    before, after, ks.get(name, 0), replicas.get(name, 1)
                )
                if found is not None and name in ks:
                    out.append((name, *found))
        return out

    async def collect(self, now: float, keys: Sequence[ClassKey]) -> dict[ClassKey, Evidence]:
        from specguard.rules import cost

        model_records = self._stats.records(since=now - self._model_window)
        records = [r for r in model_records if r.started_at >= now - self._window]
        costs, baselines = await asyncio.to_thread(
            cost.evaluate_all,
            records,
            self._pools,
            self._profile,
            now,
            self._settings,
            model_records=model_records,
            engine_steps=self.engine_steps(now - self._model_window),
            stack=self._stack() if self._stack is not None else None,
        )
        if self._on_costs is not None:
            self._on_costs(costs, baselines)
        if self._on_holdout is not None and self.policy is not None:  # {} after a reload to `fixed`
            self._on_holdout(
                holdout.for_policy(
                    records, cost.pool_ks(self._pools), self.policy, self._settings, self._max_holdout, now
                )
            )
        order = load_order(getattr(self._settings, "load_buckets", ()))
        found = evidence_from_costs(costs, policy=self.policy, load_order=order)
        return with_prior(found, self._prior_for(self.policy))

    def plan(self, states: Any, evidence: Any, now: float, replicas: Mapping[str, int]) -> Any:
        """``guard.decider: planner``: the fleet plan from the window (``planfeed.decide``)."""
        from specguard.rules import planfeed

        if self.policy is None:
            return planfeed.Decided({}, reason="no policy")
        records = self._stats.records(since=now - self._window)
        return planfeed.decide(
            planfeed.build(
                records, states, evidence, now, self.policy, self._settings, replicas, self._profile
            )
        )

    def spread_model(self, now: float) -> Any:
        """``guard.spread``: the step-cost fit and bucket loads of the window (``rules.spread``), or
        why there is none."""
        if self.policy is None:
            return "no policy"
        records = self._stats.records(since=now - self._window)
        return self._spread_fit.model(records, self.policy, self._settings, self._profile, now)

    @property
    def has_prior(self) -> bool:
        """The policy takes the calibration profile's rc as evidence (``guard.prior: profile``)."""
        return bool(self._prior_for(self.policy))

    def _prior_for(self, policy: policy_mod.Policy | None) -> dict:
        """The profile prior, made again only when the policy changes (a reload may switch it off)."""
        if self._prior[0] is not policy:
            self._prior = (policy, prior.for_policy(self._profile, policy, self._settings))
        return self._prior[1]


class PromQLSource:
    """Values of the policy's PromQL rules per class and speculative pool; errors kept per rule."""

    def __init__(self, promql: PromQL, policy: policy_mod.Policy, *, concurrency: int = 4):
        self._promql = promql
        self._policy = policy
        self._limit = asyncio.Semaphore(concurrency)

    async def collect(self, now: float, keys: Sequence[ClassKey]) -> dict[ClassKey, Evidence]:
        rules = [r for r in self._policy.rules if r.query]
        pools = [name for name, k in self._policy.pools.items() if k > 0]
        down: list[str] = []  # once Prometheus is unreachable, fail the rest of the round at once
        window = policy_mod.window_text(self._policy.window_seconds)

        async def one(key: ClassKey, pool: str, rule: policy_mod.Rule) -> tuple[ClassKey, str, str, Any]:
            variables = dict(zip(("task_type", "temperature_bucket", "load_bucket"), key, strict=True))
            query = policy_mod.render_query(rule.query or "", {**variables, "pool": pool, "window": window})
            async with self._limit:
                # checked after the wait for a slot: queries queued behind the first timeouts
                # must not each wait their own full timeout
                if down:
                    return key, pool, rule.name, SourceError(down[0])
                try:
                    return key, pool, rule.name, await self._promql.scalar(query)
                except SourceError as exc:
                    if "unreachable" in str(exc) or "timed out" in str(exc):
                        down.append(str(exc))
                    return key, pool, rule.name, exc

        results = await asyncio.gather(*(one(k, p, r) for k in keys for p in pools for r in rules))
        values: dict[tuple[ClassKey, str], dict[str, float]] = {}
        errors: dict[tuple[ClassKey, str], dict[str, str]] = {}
        for key, pool, name, result in results:
            if isinstance(result, SourceError):
                errors.setdefault((key, pool), {})[name] = str(result)
            elif result is not None:
                values.setdefault((key, pool), {})[name] = result
        out: dict[ClassKey, Evidence] = {}
        for key in keys:
            found = {
                pool: PoolEvidence(pool, values.get((key, pool), {}), errors=errors.get((key, pool), {}))
                for pool in pools
                if (key, pool) in values or (key, pool) in errors
            }
            out[key] = Evidence(pools=found)
        return out


def merge(
    first: Mapping[ClassKey, Evidence], second: Mapping[ClassKey, Evidence]
) -> dict[ClassKey, Evidence]:
    """Evidence of two sources (local cost-model numbers, PromQL rule values), pool by pool."""
    out = dict(first)
    for key, ev in second.items():
        if key not in out:
            out[key] = ev
            continue
        pools = dict(out[key].pools)
        for name, extra in ev.pools.items():
            base = pools.get(name)
            pools[name] = (
                extra
                if base is None
                else replace(
                    base, values={**base.values, **extra.values}, errors={**base.errors, **extra.errors}
                )
            )
        out[key] = replace(out[key], pools=pools)
    return out
