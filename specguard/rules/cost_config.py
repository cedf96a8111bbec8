"""The ``cost:`` section of the main config file: how much evidence an RC needs and how it is bounded.

Parsed with ``configfile.Section`` so every bad value is reported with its file position.
Two inputs come from the tap's sections, not from ``cost:``: the load buckets
(``classes.load_buckets``) and the full-rollback request threshold
(``tap.full_rollback_request_threshold``); ``monitor.config`` copies them in with
``CostSettings.with_traffic(...)``.

Example::

    cost:
      min_samples: 30              # spec-side requests behind an RC before the guard may act on it
      baseline_min_samples: 30     # live no-spec requests in a load bucket before the live baseline is used
      confidence: 0.95             # two-sided level of the RC interval
      interval_method: jackknife   # jackknife | delta (log-scale t intervals) | bootstrap (seeded percentile)
      bootstrap_resamples: 1000
      seed: 0
      baseline_scope: class_then_geometry  # whose no-spec level, adjusted for what (rules.likebase):
                                   # class_then_geometry | class_then_load | geometry | load
      calibration_profile: null    # path to a profile written by `specguard sweep` (fallback baseline)
      model_baseline: true         # no live or fresh profile baseline: T_base from the step-cost fit
      window_seconds: null         # only records newer than now - window (null: all records given)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from specguard import configfile
from specguard.errors import ConfigError

INTERVAL_METHODS = ("jackknife", "delta", "bootstrap")
BASELINE_SCOPES = ("class_then_geometry", "class_then_load", "geometry", "load")
POOLED_SCOPES = ("class_then_geometry", "geometry", "load")
"""Scopes whose baseline every class's no-spec requests can give (so a bucket's count is enough)."""


@dataclass(frozen=True)
class LoadBucket:
    """A concurrency band ``(previous max, max]`` of in-flight requests on a pool; ``max=None`` is open."""

    name: str
    max: float | None


@dataclass(frozen=True)
class CostSettings:
    """Settings of the RC computation; every field has a safe default."""

    min_samples: int = 30  # spec-side requests (with >= 2 output tokens) before an RC is "ok"
    baseline_min_samples: int = 30  # live no-spec requests per load bucket before the live baseline counts
    confidence: float = 0.95  # two-sided confidence level of [lower, upper]
    interval_method: str = "jackknife"  # "jackknife", "delta" or "bootstrap"
    bootstrap_resamples: int = 1000  # resamples per side when interval_method is "bootstrap"
    seed: int = 0  # bootstrap seed: the same records give the same interval
    baseline_scope: str = "class_then_geometry"  # level and adjustment of the live baseline (BASELINE_SCOPES)
    calibration_profile: str | None = None  # path of the calibration profile (fallback baseline)
    model_baseline: bool = True  # the step-cost fit's T_base where no live or fresh profile one exists
    window_seconds: float | None = None  # ignore records older than now - window_seconds
    # filled from the tap's sections by monitor.config (not keys of `cost:`)
    load_buckets: tuple[LoadBucket, ...] = field(default_factory=tuple)
    full_rollback_request_threshold: float = 0.5  # full-rollback request: rollback round share > this

    def with_traffic(
        self,
        load_buckets: tuple[LoadBucket, ...] | list[tuple[str, float | None]] | None = None,
        full_rollback_request_threshold: float | None = None,
    ) -> CostSettings:
        """A copy with the tap's load buckets (objects with ``name``/``max`` or pairs) and threshold."""
        changes: dict[str, object] = {}
        if load_buckets is not None:
            changes["load_buckets"] = tuple(_as_bucket(b) for b in load_buckets)
        if full_rollback_request_threshold is not None:
            changes["full_rollback_request_threshold"] = float(full_rollback_request_threshold)
        return replace(self, **changes)

    def bucket_range(self, name: str) -> tuple[float, float] | None:
        """Concurrency range ``(low, high]`` of a load bucket; ``None`` when the bucket is unknown."""
        low = 0.0
        for bucket in sorted(self.load_buckets, key=lambda b: math.inf if b.max is None else b.max):
            high = math.inf if bucket.max is None else float(bucket.max)
            if bucket.name == name:
                return (low, high)
            low = high
        return None


def _as_bucket(value: object) -> LoadBucket:
    if isinstance(value, LoadBucket):
        return value
    if isinstance(value, tuple | list) and len(value) == 2:
        return LoadBucket(str(value[0]), None if value[1] is None else float(value[1]))
    name = getattr(value, "name", None)
    if name is None:
        raise ConfigError(f"load bucket {value!r} has no name")
    bucket_max = getattr(value, "max", None)
    return LoadBucket(str(name), None if bucket_max is None else float(bucket_max))


def parse_cost_section(section: configfile.Section) -> CostSettings:
    """Read ``cost:`` (all issues go to the section's document); unknown keys are errors."""
    defaults = CostSettings()
    settings = CostSettings(
        min_samples=section.get("min_samples", int, defaults.min_samples, minimum=2),
        baseline_min_samples=section.get(
            "baseline_min_samples", int, defaults.baseline_min_samples, minimum=2
        ),
        confidence=section.get("confidence", float, defaults.confidence, minimum=0.5, maximum=0.999),
        interval_method=section.get(
            "interval_method", str, defaults.interval_method, choices=INTERVAL_METHODS
        ),
        bootstrap_resamples=section.get(
            "bootstrap_resamples", int, defaults.bootstrap_resamples, minimum=100, maximum=100_000
        ),
        seed=section.get("seed", int, defaults.seed, minimum=0),
        baseline_scope=section.get("baseline_scope", str, defaults.baseline_scope, choices=BASELINE_SCOPES),
        calibration_profile=section.get("calibration_profile", str, None, nullable=True),
        model_baseline=section.get("model_baseline", bool, defaults.model_baseline),
        window_seconds=section.get("window_seconds", float, None, minimum=1.0, nullable=True),
    )
    if settings.calibration_profile is not None:
        section.check(bool(settings.calibration_profile.strip()), "calibration_profile", "must not be empty")
    section.reject_unknown()
    return settings


def resolve_profile_path(settings: CostSettings, config_file: str | Path | None) -> Path | None:
    """The profile path, relative paths taken from the config file's directory."""
    if not settings.calibration_profile:
        return None
    path = Path(settings.calibration_profile).expanduser()
    if not path.is_absolute() and config_file is not None:
        path = Path(config_file).resolve().parent / path
    return path


def parse_root(root: configfile.Section) -> CostSettings:
    """The ``cost:`` section of the main config (absent: defaults); for ``monitor.config.SECTIONS``."""
    return parse_cost_section(root.section("cost"))
