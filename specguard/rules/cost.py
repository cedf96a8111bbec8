"""Relative cost per token (RC) per (class, load bucket, pool): the number the guard decides on.

``RC = TPOT_spec(class, load, pool) / TPOT_base(class, load, pool)`` (docs/concepts.md), each TPOT
a ratio of sums (``sum decode seconds / sum (output tokens - 1)``), never an average of
per-request ratios. The baseline comes from ``rules.baseline`` for each (class, pool) cell: live
no-spec traffic read like for like at the cell's load and context (``rules.likebase``), else a
fresh calibration profile, else the step-cost model of ``rules.modelbase``, else none: RC unknown,
never 1.0. The interval is ``rules.confidence``
(delta method on the log scale by default, or a seeded bootstrap). Each result also carries the
class's acceptance on that pool and the what-if RC on the other speculative pools
(``rules.whatif``); moving a class to a no-spec pool costs RC 1.0 by definition.

Pure: values in, values out; ``now`` is passed in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from specguard.exporters import routing
from specguard.exporters.records import RequestRecord
from specguard.rules import baseline as baseline_mod
from specguard.rules import confidence, likebase, modelbase, onepool, whatif
from specguard.rules import profile as profile_mod
from specguard.rules.cost_config import CostSettings
from specguard.rules.stepfit import StepFit, StepObservation

STATUS_OK = "ok"  # enough spec samples and a baseline
STATUS_FEW_SAMPLES = "few_samples"  # an RC exists but rests on fewer than min_samples requests
STATUS_NO_SAMPLES = "no_samples"  # no usable request of the class on this pool
STATUS_NO_BASELINE = "no_baseline"  # no live baseline and no profile: RC unknown

ClassKey = tuple[str, str, str]  # (task_type, temperature_bucket, load_bucket)


@dataclass(frozen=True)
class ClassCost:
    """RC of one class at one load bucket on one speculative pool, with everything behind it."""

    task_type: str
    temperature_bucket: str
    load_bucket: str
    pool: str
    num_speculative_tokens: int
    status: str  # ok | few_samples | no_samples | no_baseline
    rc: float | None  # None = unknown (no samples or no baseline); never a default 1.0
    lower: float | None  # interval bounds at `confidence`; None with < 2 samples on a side
    upper: float | None
    confidence: float
    interval_method: str  # "jackknife" | "delta" | "bootstrap"
    n_spec: int  # usable requests of the class on this pool (plan + probe)
    n_base: int  # requests behind the baseline (live count, or the profile's sample count)
    spec_tpot_seconds: float | None
    base_tpot_seconds: float | None
    baseline_source: str  # "live" | "profile" | "model" | "none"
    baseline_detail: str
    n_probe: int = 0  # of n_spec, requests sent here as probes
    spec_stats_requests: int = 0  # requests that reported per-request speculative stats
    rounds: int = 0  # verify rounds summed over those requests
    accept_length: float | None = None  # 1 + accepted / rounds (bonus included)
    strict_accept_rate: float | None = None  # accepted / drafted (no bonus)
    full_rollback_round_ratio: float | None = None  # rounds accepting zero drafts / rounds
    full_rollback_request_ratio: float | None = None  # requests with rollback share > threshold / requests
    accepted_per_position: tuple[float, ...] = ()  # p_i, share of rounds with >= i accepted
    step_seconds: float | None = None  # live verify-round time: sum decode s / sum rounds
    predictions: tuple[whatif.WhatIf, ...] = ()  # what-if RC on the other speculative pools
    evaluated_at: float = 0.0
    baselines_available: tuple[str, ...] = ()  # every baseline source that could serve this bucket
    spec_spread: float | None = None  # log half-width of the spec side's TPOT alone (no baseline)

    @property
    def enough(self) -> bool:
        return self.status == STATUS_OK

    @property
    def verdict(self) -> str:
        """``pays`` (upper < 1), ``loses`` (lower > 1), ``unclear`` (interval spans 1), ``unknown``."""
        if self.rc is None or self.lower is None or self.upper is None:
            return "unknown"
        if self.upper < 1.0:
            return "pays"
        if self.lower > 1.0:
            return "loses"
        return "unclear"

    @property
    def speedup(self) -> float | None:
        return None if not self.rc else 1.0 / self.rc


def pool_ks(pools: Any) -> dict[str, int]:
    """``{pool name: K}`` from a mapping, ``(name, K)`` pairs, or pool objects.

    Pool objects have ``name`` and ``num_speculative_tokens`` (the tap's pool config).
    """
    if isinstance(pools, Mapping):
        return {str(name): int(k) for name, k in pools.items()}
    out: dict[str, int] = {}
    for item in pools:
        if isinstance(item, tuple | list):
            out[str(item[0])] = int(item[1])
        else:
            out[str(item.name)] = int(item.num_speculative_tokens)
    return out


def evaluate(*args: Any, **kwargs: Any) -> list[ClassCost]:
    """``evaluate_all`` (same arguments) without the per-bucket baselines: one ClassCost per
    (class, load bucket, speculative pool) seen in the records."""
    return evaluate_all(*args, **kwargs)[0]


def evaluate_all(
    records: Iterable[RequestRecord],
    pools: Any,
    profile: profile_mod.Profile | None,
    now: float,
    settings: CostSettings,
    stepfit: StepFit | None = None,
    *,
    model_records: Sequence[RequestRecord] | None = None,
    engine_steps: Sequence[tuple[str, StepObservation, float]] = (),
    stack: Mapping[str, str] | None = None,
) -> tuple[list[ClassCost], dict[str, baseline_mod.Baseline]]:
    """One ClassCost per (class, load bucket, speculative pool) seen in ``records``, and the
    baseline of every load bucket (configured or seen; all classes pooled).

    A class seen only off speculation gets one ``no_samples`` entry per speculative pool, so the
    guard sees "unknown" rather than nothing. Records of pools not in ``pools`` are ignored.
    The model baseline is fitted on ``model_records`` (default: ``records``; e.g. the tap's longer
    window) and the engines' page intervals ``engine_steps``; ``stack`` (``engine_version``,
    ``model`` of the pools now) decides whether the profile is fresh.
    """
    records = list(records)
    ks = pool_ks(pools)
    stale = profile_mod.staleness(profile, stack, ks)
    scheduled = onepool.of_pools(pools)
    fitted, fit_ks = onepool.baseline_records(  # a scheduled pool's K = 0 steps: its own baseline
        records if model_records is None else model_records, ks, scheduled
    )
    model = modelbase.Cache(fitted, fit_ks, engine_steps)
    nospec = sorted(name for name, k in ks.items() if k == 0)
    spec_pools = sorted(name for name, k in ks.items() if k > 0)
    since = now - settings.window_seconds if settings.window_seconds else None
    keys: set[ClassKey] = set()
    by_cell: dict[tuple[ClassKey, str], list[RequestRecord]] = defaultdict(list)
    base_by_load: dict[str, list[RequestRecord]] = defaultdict(list)
    by_pool_load: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    by_load_spec: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in records:
        if record.pool not in ks or (since is not None and record.started_at < since):
            continue
        key = (record.task_type, record.temperature_bucket, record.load_bucket)
        keys.add(key)
        if not 200 <= record.status < 300:
            continue
        if ks[record.pool] == 0:
            if baseline_mod.usable_for_tpot(record):
                base_by_load[record.load_bucket].append(record)
        else:
            by_cell[(key, record.pool)].append(record)
            by_pool_load[(record.pool, record.load_bucket)].append(record)
            by_load_spec[record.load_bucket].append(record)
    step_cache: dict[tuple[str, str], whatif.StepTime | None] = {}
    prepared: dict[str, likebase.NoSpec] = {}  # the no-spec requests of each bucket, walked once

    def choose(
        task_type: str, temperature_bucket: str, load_bucket: str, target: Sequence[RequestRecord]
    ) -> baseline_mod.Baseline:
        if load_bucket not in prepared:
            prepared[load_bucket] = likebase.NoSpec(base_by_load.get(load_bucket, []))
        return baseline_mod.choose(
            prepared[load_bucket],
            task_type=task_type,
            temperature_bucket=temperature_bucket,
            load_bucket=load_bucket,
            profile=profile,
            nospec_pools=nospec,
            settings=settings,
            model=lambda: model.at(load_bucket, target, settings),
            stale=stale,
            target=target,
        )

    results: list[ClassCost] = []
    for key in sorted(keys):
        task_type, temperature_bucket, load_bucket = key
        present = [p for p in spec_pools if by_cell.get((key, p))]
        at = onepool.ks_at(ks, scheduled, settings.bucket_range(load_bucket))
        for pool in present or spec_pools:
            steps = {
                other: _step_time(
                    other, at[other], load_bucket, by_pool_load, profile, stepfit, settings, step_cache
                )
                for other in spec_pools
                if other != pool and at[other] > 0  # a schedule off at this load: no speculation to predict
            }
            cell = [r for r in by_cell.get((key, pool), []) if baseline_mod.usable_for_tpot(r)]
            base = choose(task_type, temperature_bucket, load_bucket, cell)
            results.append(
                _class_cost(key, pool, ks[pool], by_cell.get((key, pool), []), base, steps, at, settings, now)
            )
    buckets = [b.name for b in settings.load_buckets] or []
    buckets += sorted({k[2] for k in keys} - set(buckets))
    per_bucket = {
        lb: choose("", "", lb, [r for r in by_load_spec.get(lb, ()) if baseline_mod.usable_for_tpot(r)])
        for lb in buckets
    }
    return results, per_bucket


def _class_cost(
    key: ClassKey,
    pool: str,
    k: int,
    records: Sequence[RequestRecord],
    base: baseline_mod.Baseline,
    steps: Mapping[str, whatif.StepTime | None],
    ks: Mapping[str, int],
    settings: CostSettings,
    now: float,
) -> ClassCost:
    usable = [r for r in records if baseline_mod.usable_for_tpot(r)]
    seconds, tokens = baseline_mod.tpot_arrays(usable)
    spec = confidence.ratio_of_sums(seconds, tokens)
    rc = lower = upper = None
    if spec is not None and base.tpot_seconds:
        rc = spec.value / base.tpot_seconds
        bounds = _interval(rc, spec, seconds, tokens, base, settings)
        if bounds is not None:
            lower, upper = bounds
    if not usable:
        status = STATUS_NO_SAMPLES
    elif base.source == baseline_mod.SOURCE_NONE:
        status = STATUS_NO_BASELINE
    elif len(usable) < settings.min_samples:
        status = STATUS_FEW_SAMPLES
    else:
        status = STATUS_OK
    accept = _acceptance(records, k, settings.full_rollback_request_threshold)
    z = confidence.z_value(settings.confidence)
    predictions = tuple(
        replace(
            whatif.predict(
                accept["acceptance"], pool=other, k=ks[other], step=step, base_tpot_seconds=base.tpot_seconds
            ),
            ratio_spread=_ratio_spread(records, k, ks[other], step, z),
        )
        for other, step in sorted(steps.items())
    )
    spec_variance = spec.variance(settings.interval_method) if spec is not None else None
    spec_spread = None if spec_variance is None else z * float(np.sqrt(spec_variance))
    return ClassCost(
        task_type=key[0],
        temperature_bucket=key[1],
        load_bucket=key[2],
        pool=pool,
        num_speculative_tokens=k,
        status=status,
        rc=rc,
        lower=lower,
        upper=upper,
        confidence=settings.confidence,
        interval_method=settings.interval_method,
        n_spec=len(usable),
        n_base=base.samples,
        spec_tpot_seconds=spec.value if spec is not None else None,
        base_tpot_seconds=base.tpot_seconds,
        baseline_source=base.source,
        baseline_detail=base.detail,
        n_probe=sum(1 for r in usable if r.route == routing.ROUTE_PROBE),
        spec_stats_requests=accept["requests"],
        rounds=accept["acceptance"].rounds,
        accept_length=accept["acceptance"].accept_length,
        strict_accept_rate=accept["strict"],
        full_rollback_round_ratio=accept["rollback_rounds"],
        full_rollback_request_ratio=accept["rollback_requests"],
        accepted_per_position=accept["acceptance"].positions,
        step_seconds=accept["step"],
        predictions=predictions,
        evaluated_at=now,
        baselines_available=base.available,
        spec_spread=spec_spread,
    )


def _ratio_spread(
    records: Sequence[RequestRecord], k: int, k_target: int, step: whatif.StepTime | None, z: float
) -> float | None:
    """Log half-width of a what-if's ratio to the measurement it is made from: the acceptance and
    TPOT of the same requests (jackknife) and the target pool's step time."""
    rows = [
        r
        for r in records
        if r.spec is not None
        and r.spec.accepted_histogram
        and len(r.spec.accepted_histogram) == k + 1
        and baseline_mod.usable_for_tpot(r)
    ]
    if step is None or not rows:
        return None
    histograms = np.array([r.spec.accepted_histogram for r in rows], dtype=float)  # type: ignore[union-attr]
    seconds, tokens = baseline_mod.tpot_arrays(rows)
    accept = whatif.acceptance_log_sd(histograms, seconds, tokens, k_target)
    return None if accept is None else z * float(np.hypot(accept, step.log_sd))


def _interval(
    rc: float,
    spec: confidence.RatioEstimate,
    seconds: np.ndarray,
    tokens: np.ndarray,
    base: baseline_mod.Baseline,
    settings: CostSettings,
) -> tuple[float, float] | None:
    """RC's interval: the spec side's own spread and the baseline's ``Var(log)``, whatever its
    source (the live one's carries its step-line adjustment and the classes' spread)."""
    if settings.interval_method == "bootstrap":
        return confidence.bootstrap_interval(
            seconds,
            tokens,
            None,
            None,
            fixed_base=base.tpot_seconds,
            fixed_base_log_sd=float(np.sqrt(base.log_variance or 0.0)),
            confidence=settings.confidence,
            resamples=settings.bootstrap_resamples,
            seed=settings.seed,
        )
    return confidence.delta_interval(
        rc,
        spec.variance(settings.interval_method),
        base.log_variance,
        settings.confidence,
        spec_n=spec.n,
        base_n=base.samples if base.source == baseline_mod.SOURCE_LIVE else None,
    )


def _acceptance(records: Sequence[RequestRecord], k: int, request_threshold: float) -> dict[str, Any]:
    """Acceptance numbers of the class on its pool, all ratios of sums over requests with spec stats."""
    requests = rounds = accepted = drafted = 0
    rollback_rounds = rollback_requests = 0
    rollback_known = 0
    decode_seconds = 0.0
    timed_rounds = 0
    histogram = np.zeros(k + 1)
    histogram_rounds = 0
    for r in records:
        s = r.spec
        if s is None or not s.rounds or s.accepted_tokens is None:
            continue  # rounds == 0: never drafted, not a rollback
        requests += 1
        rounds += s.rounds
        accepted += s.accepted_tokens
        drafted += s.draft_tokens or 0
        full = s.full_rollback_rounds
        if full is None and s.accepted_histogram:
            full = s.accepted_histogram[0]
        if full is not None:
            rollback_known += 1
            rollback_rounds += full
            rollback_requests += 1 if full / s.rounds > request_threshold else 0
        if s.accepted_histogram and len(s.accepted_histogram) <= k + 1:
            histogram[: len(s.accepted_histogram)] += np.asarray(s.accepted_histogram, dtype=float)
            histogram_rounds += 1
        if r.decode_seconds is not None and r.output_tokens >= 2:
            decode_seconds += r.decode_seconds
            timed_rounds += s.rounds
    positions = whatif.per_position(histogram.tolist()) if histogram_rounds else ()
    acceptance = whatif.Acceptance(
        k=k,
        rounds=rounds,
        positions=positions,
        accept_length=(1.0 + accepted / rounds) if rounds else None,
    )
    return {
        "acceptance": acceptance,
        "requests": requests,
        "strict": accepted / drafted if drafted else None,
        "rollback_rounds": rollback_rounds / rounds if rollback_known and rounds else None,
        "rollback_requests": rollback_requests / rollback_known if rollback_known else None,
        "step": decode_seconds / timed_rounds if timed_rounds else None,
    }


def _step_time(
    pool: str,
    k: int,
    load_bucket: str,
    by_pool_load: Mapping[tuple[str, str], Sequence[RequestRecord]],
    profile: profile_mod.Profile | None,
    stepfit: StepFit | None,
    settings: CostSettings,
    cache: dict[tuple[str, str], whatif.StepTime | None],
) -> whatif.StepTime | None:
    """Verify-round time of ``pool`` in ``load_bucket``: live traffic, else the step fit, else the profile."""
    if (pool, load_bucket) in cache:
        return cache[(pool, load_bucket)]
    result = None
    seconds = 0.0
    rounds = requests = 0
    for r in by_pool_load.get((pool, load_bucket), ()):
        if r.spec is not None and r.spec.rounds and r.decode_seconds is not None and r.output_tokens >= 2:
            seconds += r.decode_seconds
            rounds += r.spec.rounds
            requests += 1
    band = settings.bucket_range(load_bucket)
    if requests >= settings.min_samples and rounds:
        rows = [
            r
            for r in by_pool_load.get((pool, load_bucket), ())
            if r.spec is not None and r.spec.rounds and r.decode_seconds is not None and r.output_tokens >= 2
        ]
        estimate = confidence.ratio_of_sums(
            np.array([r.decode_seconds for r in rows], dtype=float),
            np.array([r.spec.rounds for r in rows], dtype=float),  # type: ignore[union-attr]
        )
        variance = estimate.variance(settings.interval_method) if estimate is not None else None
        sd = float(np.sqrt(variance)) if variance is not None else whatif.STEP_LOG_SD
        result = whatif.StepTime(seconds / rounds, "live", f"live, {requests} requests on {pool}", sd)
    elif stepfit is not None and band is not None:
        batch = profile_mod.representative_concurrency(*band)
        result = whatif.StepTime(stepfit.predict(batch, k), "stepfit", f"step fit at B={batch:g}, K={k}")
    elif profile is not None and band is not None:
        target = profile.pool(name=pool)
        if target is None or target.num_speculative_tokens != k:
            target = profile.pool(k=k)
        if target is not None:
            value = profile_mod.lookup(target, band[0], band[1], "step_seconds", profile.source)
            if value is not None:
                result = whatif.StepTime(value.value, "profile", value.detail)
    cache[(pool, load_bucket)] = result
    return result
