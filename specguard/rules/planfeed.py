"""What the fleet planner reads (``rules.planner``), from the window and the guard's class states.

The planner decides per class (task type x temperature bucket), all classes in one problem: the
classes share the fleet at one moment whatever load bucket each pool's requests fall in (a heavy
class on a loaded K=4 pool is in ``high`` while the no-spec pool it could move to is in ``low``),
and a request's load bucket is that of the pool it joins, so a class's buckets are not demands of
their own (a plan that sends its ``medium`` bucket elsewhere changes which requests are
``medium``). One pool per class, every load bucket of it planned alike; a class with no request in
decode now is not planned. So:

- **Demand**: requests in decode over the last ``DEMAND_INTERVALS`` evaluation intervals, by
  Little's law (each finished request's decode time inside the span, over the span); requests
  still running are not in the window yet, so a class's first seconds are undercounted.
- **Cells**: per pool, the guard's estimate (``bestpool.estimates``: measured, memory, what-if,
  profile, no-spec by definition, each with its interval) from the class's busiest load bucket
  that has one with an interval, at the load it was measured at (the bucket's mean load per
  replica in the window, else its representative concurrency), which the planner moves to the
  plan's load on the step-cost fit.
- **Step cost**: ``rules.stepfit`` fitted on the window's records per (pool, load bucket) and the
  calibration profile's step times.
- **Pool now**: the guard state's of the class's busiest bucket; pinned, frozen or paused classes
  stay.

Pure: values in, a ``PlanInput`` (or the reason there is none) out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specguard.errors import InputError
from specguard.exporters.records import RequestRecord
from specguard.rules import bestpool, planner, planprobes, stepfit, swing
from specguard.rules import policy as policy_mod
from specguard.rules import profile as profile_mod
from specguard.rules.classstate import ClassState
from specguard.rules.cost_config import CostSettings
from specguard.rules.evidence import ClassKey, Evidence

DEMAND_INTERVALS = 2.0
LOCAL = 2.0
"""The step-cost fit reads the sweep's levels up to this many times the highest load in the window:
a line through a knee far away bends the line where the fleet runs."""
NOW = "now"
"""The load label of the planner's classes: one problem for the fleet as it runs now."""


def demand(records: Sequence[RequestRecord], now: float, span: float) -> dict[ClassKey, float]:
    """Requests in decode per (class, load bucket), averaged over ``[now - span, now]``."""
    out: dict[ClassKey, float] = defaultdict(float)
    start = now - span
    for r in records:
        if r.decode_seconds is None or r.decode_seconds <= 0:
            continue
        begin = r.started_at + (r.ttft_seconds or 0.0)
        inside = min(now, begin + r.decode_seconds) - max(start, begin)
        if inside > 0:
            out[(r.task_type, r.temperature_bucket, r.load_bucket)] += inside / span
    return dict(out)


def bucket_loads(records: Sequence[RequestRecord], settings: CostSettings) -> dict[str, float]:
    """Mean load per replica of each load bucket's requests (weighted by decode time), else the
    bucket's representative concurrency."""
    seconds: dict[str, float] = defaultdict(float)
    weighted: dict[str, float] = defaultdict(float)
    for r in records:
        load = r.decode_load if r.decode_load is not None else r.load
        if load is not None and r.decode_seconds:
            seconds[r.load_bucket] += r.decode_seconds
            weighted[r.load_bucket] += load * r.decode_seconds
    out = {b: weighted[b] / s for b, s in seconds.items() if s > 0}
    for bucket in settings.load_buckets:
        band = settings.bucket_range(bucket.name)
        if bucket.name not in out and band is not None:
            out[bucket.name] = profile_mod.representative_concurrency(*band)
    return out


def highest_load(records: Sequence[RequestRecord]) -> float:
    """The highest load per replica a request of the window ran at (0 without any)."""
    measured = [r.decode_load if r.decode_load is not None else r.load for r in records]
    return max((x for x in measured if x is not None), default=0.0)


def step_fit(
    records: Sequence[RequestRecord],
    policy: policy_mod.Policy,
    settings: CostSettings,
    profile: profile_mod.Profile | None,
    highest: float = 0.0,
) -> stepfit.StepFit | str:
    """The step-cost fit on the window's records and the sweep's levels up to ``LOCAL`` x ``highest``
    (the highest load per replica in the window; 0: every level)."""
    observations = stepfit.observations_from_records(records, policy.pools, settings, policy.k_schedules)
    if profile is not None:  # the sweep's levels near the loads the fleet runs at: the fit is a line
        near = LOCAL * highest
        observations += [o for o in stepfit.observations_from_profile(profile) if not near or o.batch <= near]
    try:
        fit = stepfit.fit(observations)
    except InputError as exc:
        return f"planner: no step-cost fit ({exc})"
    top = max(LOCAL * highest, max((o.batch for o in observations), default=1.0))
    ks = set(policy.pools.values()) | {k for s in policy.k_schedules.values() for *_, k in s.entries}
    for k in sorted(ks):
        for batch in (1.0, top):
            if not fit.predict(batch, k) > 0:  # all costs pinned at zero: no step to price
                where = f"B={batch:g}, K={k}"
                return f"planner: the step-cost fit ({fit.formula()}) predicts no positive step at {where}"
    return fit


def build(
    records: Sequence[RequestRecord],
    states: Mapping[ClassKey, ClassState],
    evidence: Mapping[ClassKey, Evidence],
    now: float,
    policy: policy_mod.Policy,
    settings: CostSettings,
    replicas: Mapping[str, int],
    profile: profile_mod.Profile | None = None,
) -> planner.PlanInput | str:
    """The planner's input for the fleet now, one problem for every class with requests in decode,
    keyed ``(task type, temperature bucket, NOW)``; or why there is none."""
    loads = bucket_loads(records, settings)
    fit = step_fit(records, policy, settings, profile, highest_load(records))
    if isinstance(fit, str):
        return fit
    span = max(DEMAND_INTERVALS * policy.interval_seconds, 1e-9)
    by_key = demand(records, now, span)
    counts = {name: max(1, int(replicas.get(name, 1))) for name in policy.pools}
    pools = tuple(planner.Pool(name, k, counts[name]) for name, k in policy.pools.items())
    per_class: dict[tuple[str, str], list[ClassKey]] = defaultdict(list)
    for key, flight in by_key.items():
        if flight > 0 and key[2] in loads:
            per_class[key[:2]].append(key)
    out_demand, current, cells, measured_at, fixed = {}, {}, {}, {}, set()
    for cls, keys in sorted(per_class.items()):
        keys.sort(key=lambda k: (-by_key[k], k))  # the busiest load bucket first
        state = states.get(keys[0])
        here = (state.pool if state is not None else "") or policy.default_pool or ""
        if here not in policy.pools:
            continue
        unit = (*cls, NOW)
        out_demand[unit] = planner.Demand(sum(by_key[k] for k in keys))
        current[unit] = here
        if state is not None and (state.pin is not None or state.frozen or state.paused):
            fixed.add(unit)
        found: dict[str, bestpool.Estimate] = {}
        for key in keys:  # each pool's estimate from the busiest bucket that has one with an interval
            own = states.get(key)
            pool_now = (own.pool if own is not None else "") or here
            memory = own.memory if own is not None else {}
            for pool, e in bestpool.estimates(
                pool_now, evidence.get(key, Evidence()), memory, now, policy, key[2]
            ).items():
                if pool not in found or (found[pool].lower is None and e.lower is not None):
                    found[pool] = e
                    measured_at[(unit, pool)] = loads[key[2]]
        cells[unit] = found
    if not out_demand:
        return "planner: no class has requests in the window"
    planned = {cls: keys for cls, keys in per_class.items() if (*cls, NOW) in out_demand}
    scenarios = swing_loads(records, now, policy.interval_seconds, planned)
    return planner.PlanInput(
        pools,
        fit,
        {NOW: max(loads.values(), default=1.0)},  # (every cell says its own load: measured_at)
        out_demand,
        current,
        cells,
        frozenset(fixed),
        min_samples=bestpool.min_samples(policy),
        together=NOW,
        measured_at=measured_at,
        scenarios=scenarios,
    )


def swing_loads(
    records: Sequence[RequestRecord],
    now: float,
    interval: float,
    per_class: Mapping[tuple[str, str], Sequence[ClassKey]],
) -> tuple[tuple[float, dict[ClassKey, planner.Demand]], ...]:
    """The two loads of a swing faster than the evaluation interval (``rules.swing``), each with its
    time share and every planned class's demand at it (its load buckets summed); () without one."""
    width = interval / swing.SLICES
    count = swing.INTERVALS * swing.SLICES
    found = swing.detect([demand(records, now - (count - 1 - i) * width, width) for i in range(count - 1)])
    if found is None:
        return ()
    return tuple(
        (
            share,
            {
                (*cls, NOW): planner.Demand(sum(at.get(k, 0.0) for k in keys))
                for cls, keys in per_class.items()
            },
        )
        for share, at in ((found.high_share, found.high), (1 - found.high_share, found.low))
    )


Planned = dict[tuple[str, str], tuple[str, str]]
"""Per class (task type, temperature bucket): the plan's pool and why, what ``guard.step`` takes."""


@dataclass(frozen=True)
class Decided:
    """One evaluation's fleet plan: per class as ``guard.step`` takes it, the plan and its input
    (what ``rules.desired`` sizes the pools from), or why there is none (then nothing is planned)."""

    planned: Planned
    plan: planner.Plan | None = None
    input: planner.PlanInput | None = None
    reason: str = ""

    def shares(self, probe_cap: float, holdout_cap: float) -> planprobes.Shares | None:
        """What the plan prices each class's probe and holdout at (``rules.planprobes``; None
        without a plan, or when its model cannot price them: the expected-cost probes stand)."""
        if self.plan is None or self.input is None:
            return None
        try:
            return planprobes.shares(self.input, self.plan, probe_cap, holdout_cap)
        except InputError:
            return None


def decide(found: planner.PlanInput | str) -> Decided:
    """The fleet plan for ``guard.decider: planner`` from what ``build`` gave (fails safe: no plan,
    and why)."""
    if isinstance(found, str):
        return Decided({}, reason=found)
    try:
        plan = planner.plan(found)
        if found.scenarios:
            plan = swing.hold(found, plan)
    except InputError as exc:
        return Decided({}, reason=str(exc))
    out: Planned = {}
    for key, pool in plan.pools.items():  # a bucket of the class on another pool joins the rest
        why = plan.reasons[key]
        out[key[:2]] = (pool, why if why.startswith("move") else f"the class's plan is {pool} ({why})")
    return Decided(out, plan, found)
