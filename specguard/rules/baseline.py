"""Where T_base comes from, in order of trust; every RC says which one it used.

Order, per load bucket (RC compares the same operating point, docs/concepts.md):

1. ``live``: requests served by a no-speculation pool (K = 0) in the same load bucket, if at
   least ``cost.baseline_min_samples`` of them are in the window, read like for like
   (``rules.likebase``): at the load and context of the class's speculative requests, at the
   class's own level when it has enough no-spec requests of its own (``baseline_scope:
   class_then_geometry``, the default, or ``class_then_load``), else at every class's with the
   classes' spread in its interval.
2. ``profile``: the K = 0 pool of the calibration profile at the bucket's concurrency, when the
   profile is fresh: its header's engine version and model match what the no-spec pool serves
   now (``profile.staleness``) and its no-spec pool has K = 0.
3. ``model``: the step-cost fit over both kinds of pool (``rules.modelbase``) at the bucket's
   load, with the fit's interval (``cost.model_baseline``). The guard acts on it only through
   interval bounds (``rules.assess``).
4. ``none``: RC is unknown (``None``), never 1.0; the guard holds.

Route labels (set by the tap's router; the shares are tap config, this module only reads them):

- ``plan``: the request went where the routing plan sends its class.
- ``holdout``: a class planned on a speculative pool, but this request was sent to the no-spec
  pool (``tap.holdout_share`` of every class) so the live baseline keeps being measured.
- ``probe``: a class planned away from speculation (or to a shorter K), but this request was kept
  on a speculative pool (``tap.probe_share``) so the class's acceptance stays measured and
  re-enabling is decided on evidence.

So the baseline is every request on a no-spec pool (plan of disabled classes plus holdouts), and
the spec side of a (class, pool) is every request of that class on that pool (plan plus probes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specguard.exporters.records import RequestRecord
from specguard.rules import likebase
from specguard.rules import profile as profile_mod
from specguard.rules.cost_config import CostSettings

SOURCE_LIVE = "live"
SOURCE_PROFILE = "profile"
SOURCE_MODEL = "model"
SOURCE_NONE = "none"
SOURCES = (SOURCE_LIVE, SOURCE_PROFILE, SOURCE_MODEL, SOURCE_NONE)
HOW_TO_GET_ONE = (
    "traffic on the no-spec pool at this load (guard.holdout: matched_on_demand, the default, or "
    "capacity_matched sends it there), or a calibration profile: `specguard sweep --http` and "
    "cost.calibration_profile"
)


def usable_for_tpot(record: RequestRecord) -> bool:
    """A finished, successful request with a decode phase (at least 2 output tokens and a
    duration) of one sequence: n > 1 sequences decode side by side, so theirs is no class's TPOT."""
    return (
        200 <= record.status < 300
        and record.output_tokens >= 2
        and record.sequences == 1
        and record.decode_seconds is not None
        and record.decode_seconds >= 0
    )


def tpot_arrays(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Per-request decode seconds and decode tokens (output tokens - 1), for ratio-of-sums TPOT."""
    seconds = np.fromiter((r.decode_seconds or 0.0 for r in records), dtype=float, count=len(records))
    tokens = np.fromiter((r.output_tokens - 1 for r in records), dtype=float, count=len(records))
    return seconds, tokens


@dataclass(frozen=True)
class Baseline:
    """T_base for one load bucket (and class, with class scope), and what stands behind it."""

    source: str  # "live" | "profile" | "model" | "none"
    tpot_seconds: float | None
    samples: int  # requests behind tpot_seconds (live or the profile's count); 0 for none
    detail: str  # provenance, e.g. "all classes (80 requests) on nospec in load bucket low, ..."
    log_variance: float | None = None  # Var(log T_base); 0 for a profile without a standard error
    live_samples: int = 0  # live no-spec requests seen in the bucket, even when too few to use
    available: tuple[str, ...] = ()  # every source that could give T_base here (trust order)


def choose(
    live: Sequence[RequestRecord] | likebase.NoSpec,
    *,
    task_type: str,
    temperature_bucket: str,
    load_bucket: str,
    profile: profile_mod.Profile | None,
    nospec_pools: Sequence[str],
    settings: CostSettings,
    model: Callable[[], tuple[float, float, str] | str] | None = None,
    stale: str | None = None,
    target: Sequence[RequestRecord] = (),
) -> Baseline:
    """Pick the baseline for one (class, load bucket) from usable no-spec records of that bucket.

    ``target`` are the usable speculative requests the baseline is for (one class on one pool):
    the live baseline is read at their load and geometry (``rules.likebase``). ``model()`` gives
    the model baseline's ``(TPOT_base, Var(log TPOT_base), detail)`` at their load, or why there
    is none; ``stale`` is why the profile may not be used (None: fresh).
    """
    live = live if isinstance(live, likebase.NoSpec) else likebase.NoSpec(live)
    pools = ",".join(live.pools) or ",".join(nospec_pools) or "-"
    method = "delta" if settings.interval_method == "delta" else "jackknife"
    found: list[Baseline] = []
    why_not: list[str] = []
    like = likebase.baseline(
        live,
        target,
        cls=(task_type, temperature_bucket),
        scope=settings.baseline_scope,
        min_samples=settings.baseline_min_samples,
        method=method,
        where=f" on {pools} in load bucket {load_bucket}",
    )
    if isinstance(like, str):
        why_not.append(like)
    else:
        found.append(
            Baseline(
                source=SOURCE_LIVE,
                tpot_seconds=like.tpot_seconds,
                samples=like.own or like.samples,
                detail=like.detail,
                log_variance=like.log_variance,
                live_samples=len(live),
            )
        )
    from_profile = profile_baseline(profile, load_bucket, nospec_pools, settings)
    if isinstance(from_profile, profile_mod.LevelValue) and stale is not None:
        from_profile = f"calibration profile {profile.source if profile else ''} is stale: {stale}"
    if isinstance(from_profile, profile_mod.LevelValue):
        sd = (from_profile.stderr / from_profile.value) if from_profile.stderr else 0.0
        found.append(
            Baseline(
                source=SOURCE_PROFILE,
                tpot_seconds=from_profile.value,
                samples=from_profile.samples,
                detail=f"{from_profile.detail}; {'; '.join(why_not)}".rstrip("; "),
                log_variance=sd**2,
                live_samples=len(live),
            )
        )
    else:
        why_not.append(from_profile)
    if model is not None and settings.model_baseline:
        predicted = model()
        if isinstance(predicted, str):
            why_not.append(predicted)
        else:
            value, log_variance, detail = predicted
            found.append(
                Baseline(
                    source=SOURCE_MODEL,
                    tpot_seconds=value,
                    samples=0,
                    detail=f"{detail}; {'; '.join(why_not)}",
                    log_variance=log_variance,
                    live_samples=len(live),
                )
            )
    elif not settings.model_baseline:
        why_not.append("model baseline off (cost.model_baseline: false)")
    available = tuple(b.source for b in found)
    if found:
        return replace(found[0], available=available)
    return Baseline(
        source=SOURCE_NONE,
        tpot_seconds=None,
        samples=0,
        detail=f"{'; '.join(why_not)}; to get one: {HOW_TO_GET_ONE}",
        live_samples=len(live),
        available=(SOURCE_NONE,),
    )


def profile_baseline(
    profile: profile_mod.Profile | None,
    load_bucket: str,
    nospec_pools: Sequence[str],
    settings: CostSettings,
) -> profile_mod.LevelValue | str:
    """The profile's no-spec TPOT for the bucket, or the reason there is none."""
    if profile is None:
        return "no calibration profile"
    pool = None
    for name in nospec_pools:
        pool = profile.pool(name=name)
        if pool is not None and pool.num_speculative_tokens == 0:
            break
        pool = None
    pool = pool or profile.pool(k=0)
    if pool is None:
        return f"calibration profile {profile.source} has no pool with num_speculative_tokens 0"
    bucket = settings.bucket_range(load_bucket)
    if bucket is None:
        return f"load bucket {load_bucket!r} is not configured, so its concurrency is unknown"
    value = profile_mod.lookup(pool, bucket[0], bucket[1], "tpot_seconds", profile.source)
    if value is None:
        return (
            f"calibration profile {profile.source} pool {pool.name} does not cover load bucket {load_bucket}"
        )
    return value
