"""Prior evidence from the calibration profile: rc per class, load bucket and pool, before any traffic.

``specguard sweep`` measures every pool at concurrency 1, 2, 4, ... with the request mix and
writes, per level, each class's TPOT (``rules.profile``). Divided by the no-spec pool's TPOT in
the same load bucket, that is the class's rc on that pool as the sweep saw it: the plan a careful
operator would start from, with an interval from the profile's standard errors (a sweep's few
requests per class make it wide; the guard moves on a prior only where the interval clears). The
guard (``guard.prior: profile``) uses it only where live evidence is missing (``rules.bestpool``):
to plan a class before its first request and as the estimate of a pool the class has never been
measured on. Live evidence always overrides it.

Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from specguard import schedules
from specguard.rules import confidence as confidence_mod
from specguard.rules import onepool
from specguard.rules import profile as profile_mod
from specguard.rules.evidence import ClassKey, PriorRC


def class_pool(
    pool: profile_mod.ProfilePool, task_type: str, temperature_bucket: str
) -> profile_mod.ProfilePool:
    """The pool's levels as one class saw them: each level's TPOT is the class's (others dropped)."""
    levels = []
    for level in pool.levels:
        for cls in level.classes:
            if (cls.task_type, cls.temperature_bucket) == (
                task_type,
                temperature_bucket,
            ) and cls.tpot_seconds:
                levels.append(
                    replace(
                        level,
                        tpot_seconds=cls.tpot_seconds,
                        samples=max(cls.samples, 1),
                        tpot_stderr_seconds=cls.tpot_stderr_seconds,
                        classes=(),
                    )
                )
    return replace(pool, levels=tuple(levels))


PRIOR_CV = 0.5
"""Per-request coefficient of variation of TPOT assumed for a profile value without a standard
error (older profiles): its standard error is taken as ``PRIOR_CV / sqrt(samples)``. Generous on
purpose: a sweep's few requests per class and level are the weakest evidence the guard has."""


def _log_sd(value: profile_mod.LevelValue) -> float:
    if value.stderr is not None and value.value > 0:
        return value.stderr / value.value
    return PRIOR_CV / math.sqrt(max(value.samples, 1))


def prior_rcs(
    profile: profile_mod.Profile | None,
    pools: Mapping[str, int],
    load_buckets: Iterable[tuple[str, float, float]],
    confidence: float = 0.95,
    k_schedules: Mapping[str, schedules.Schedule] | None = None,
) -> dict[ClassKey, dict[str, PriorRC]]:
    """``{(task_type, temperature_bucket, load_bucket): {pool: PriorRC}}`` for every class the
    profile measured: the rc and its interval at ``confidence`` (log-normal; the class's TPOT and the
    no-spec pool's, each with its standard error, or ``PRIOR_CV`` per request without one).

    ``pools`` maps the configured pool names to K (a profile pool is matched by name, else by K);
    ``load_buckets`` are ``(name, low, high)`` concurrency ranges ``(low, high]``. A value is left
    out where the profile has no level in (or around) the bucket: never extrapolated. The open top
    bucket stands at its lowest swept level (load just past the bucket below), since the sweep's
    highest levels are usually far beyond any load the bucket sees. A pool in ``k_schedules`` runs
    its schedule's K at the bucket's representative concurrency: the profile pool of that K there,
    and 1.0 where the schedule turns speculation off.
    """
    if profile is None:
        return {}
    base_pool = profile.pool(k=0)
    if base_pool is None:
        return {}
    classes = sorted(
        {
            (cls.task_type, cls.temperature_bucket)
            for pool in profile.pools
            if pool.num_speculative_tokens > 0
            for level in pool.levels
            for cls in level.classes
        }
    )
    matched: dict[str, profile_mod.ProfilePool] = {}
    for name, k in pools.items():
        found = profile.pool(name=name)
        if found is None or found.num_speculative_tokens != k:
            found = profile.pool(k=k)
        if found is not None and k > 0:
            matched[name] = found
    scheduled = dict(k_schedules or {})
    z = confidence_mod.z_value(confidence)
    out: dict[ClassKey, dict[str, PriorRC]] = {}
    for bucket, low, high in load_buckets:
        at = onepool.ks_at(pools, scheduled, (low, high))
        ks = {name: at[name] for name in scheduled if name in at}
        here = {name: pool for name, pool in matched.items() if name not in ks}
        here.update({name: profile.pool(k=k) for name, k in ks.items() if k > 0})
        if math.isinf(high):  # open top bucket: its lowest swept level, not an average up to the sweep's end
            high = min((lv.concurrency for lv in base_pool.levels if lv.concurrency > low), default=high)
        base = profile_mod.lookup(base_pool, low, high, "tpot_seconds", profile.source)
        if base is None or base.value <= 0:
            continue
        for task_type, temperature_bucket in classes:
            rcs = {name: PriorRC(1.0, 1.0, 1.0) for name, k in ks.items() if k == 0}
            for name, pool in here.items():
                if pool is None:
                    continue
                value = profile_mod.lookup(
                    class_pool(pool, task_type, temperature_bucket), low, high, "tpot_seconds", profile.source
                )
                if value is not None:
                    rc = value.value / base.value
                    spread = z * math.hypot(_log_sd(value), _log_sd(base))
                    rcs[name] = PriorRC(rc, rc * math.exp(-spread), rc * math.exp(spread))
            if rcs:
                out[(task_type, temperature_bucket, bucket)] = rcs
    return out


def for_policy(
    profile: profile_mod.Profile | None, policy: Any, settings: Any
) -> dict[ClassKey, dict[str, PriorRC]]:
    """The prior the policy asks for (``guard.prior``), over the cost settings' load buckets."""
    if profile is None or getattr(policy, "prior", "none") != "profile":
        return {}
    ranges = []
    for bucket in getattr(settings, "load_buckets", ()):
        band = settings.bucket_range(bucket.name)
        if band is not None:
            ranges.append((bucket.name, band[0], band[1]))
    confidence = getattr(settings, "confidence", 0.95)
    return prior_rcs(profile, policy.pools, ranges, confidence, getattr(policy, "k_schedules", None))
