"""Calibration profile: TPOT and step time per pool (K) and concurrency, measured offline by a sweep.

It is the second baseline source (after live no-spec traffic) and a source of step times for the
K what-if. Format (YAML; JSON is valid YAML, so a JSON file loads too), version 1::

    format: specguard-calibration-profile
    version: 1
    created: "2026-11-29T13:00:00Z"        # optional, informational
    stack: {engine: vllm, engine_version: 0.32.0, model: ..., hardware: ...}   # optional strings
    pools:
      - name: nospec                       # pool name as in `pools:` of the main config
        num_speculative_tokens: 0          # K; 0 = the no-speculation baseline
        levels:
          - concurrency: 4                 # in-flight requests held during the measurement
            tpot_seconds: 0.0191           # sum(decode s) / sum(output tokens - 1)
            samples: 400                   # requests behind tpot_seconds
            tpot_stderr_seconds: 0.0002    # optional standard error of tpot_seconds
            step_seconds: 0.0191           # optional mean engine step (verify round) time
      - name: spec-k4
        num_speculative_tokens: 4
        levels:
          - concurrency: 4
            tpot_seconds: 0.0160
            samples: 400
            step_seconds: 0.052
            accept_length: 3.25            # optional, all classes
            classes:                       # optional per-class split
              - {task_type: code, temperature_bucket: cold, accept_length: 3.9, tpot_seconds: 0.0134,
                 samples: 100, accepted_per_position: [0.92, 0.81, 0.66, 0.50]}

Loading goes through ``specguard.configfile`` so every error reads ``file:line:col: path: message``.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specguard import configfile

FORMAT = "specguard-calibration-profile"
VERSION = 1


@dataclass(frozen=True)
class ClassLevel:
    """One traffic class at one (pool, concurrency) cell of the sweep."""

    task_type: str
    temperature_bucket: str
    accept_length: float | None = None
    tpot_seconds: float | None = None
    samples: int = 0
    accepted_per_position: tuple[float, ...] | None = None  # p_i: share of rounds with >= i accepted
    tpot_stderr_seconds: float | None = None  # standard error of tpot_seconds (optional)


@dataclass(frozen=True)
class ProfileLevel:
    """One concurrency level of one pool."""

    concurrency: int
    tpot_seconds: float
    samples: int
    tpot_stderr_seconds: float | None = None
    step_seconds: float | None = None
    accept_length: float | None = None
    classes: tuple[ClassLevel, ...] = ()


@dataclass(frozen=True)
class ProfilePool:
    name: str
    num_speculative_tokens: int
    levels: tuple[ProfileLevel, ...]


@dataclass(frozen=True)
class Profile:
    """A loaded calibration profile; ``source`` is where it came from (for messages)."""

    pools: tuple[ProfilePool, ...]
    version: int = VERSION
    created: str | None = None
    stack: dict[str, str] = field(default_factory=dict)
    source: str = "<profile>"
    schedule: dict[str, Any] | None = None  # the recommended in-engine K schedule (informational)

    def pool(self, name: str | None = None, k: int | None = None) -> ProfilePool | None:
        """The pool by name, else the first pool with K == ``k``."""
        for candidate in self.pools:
            if name is not None and candidate.name == name:
                return candidate
        if k is not None:
            for candidate in self.pools:
                if candidate.num_speculative_tokens == k:
                    return candidate
        return None


@dataclass(frozen=True)
class LevelValue:
    """A value read from the profile for a concurrency range, with how it was obtained."""

    value: float
    samples: int
    stderr: float | None
    detail: str


FRESHNESS_KEYS = ("engine_version", "model")
"""Header (``stack``) keys that must match what the pools serve now for the profile to be fresh."""


def staleness(
    profile: Profile | None, live: Mapping[str, str] | None, pools: Mapping[str, int] | None = None
) -> str | None:
    """Why ``profile`` no longer describes the stack serving the traffic, or None while it does.

    Stale when a header key of ``FRESHNESS_KEYS`` differs from the live value (a key unknown on
    either side is not held against it), or when a pool of the profile is configured now with
    another K (``pools``: name -> K).
    """
    if profile is None:
        return None
    reasons = []
    for key in FRESHNESS_KEYS:
        then, now = profile.stack.get(key), (live or {}).get(key)
        if then and now and then != now:
            reasons.append(f"{key} {then!r} in its header, {now!r} now")
    for pool in profile.pools:
        k = (pools or {}).get(pool.name)
        if k is not None and k != pool.num_speculative_tokens:
            reasons.append(f"pool {pool.name} has K={pool.num_speculative_tokens} in it, K={k} now")
    return "; ".join(reasons) or None


def representative_concurrency(low: float, high: float) -> float:
    """The concurrency standing for the bucket ``(low, high]``: its integer midpoint (open: low+1)."""
    first = math.floor(low) + 1
    if math.isinf(high):
        return float(first)
    return (first + math.floor(high)) / 2.0


def lookup(
    pool: ProfilePool, low: float, high: float, attribute: str, profile_source: str
) -> LevelValue | None:
    """``attribute`` of the pool for concurrencies in ``(low, high]``.

    Levels inside the range are averaged (weighted by samples). Without one inside, the value is
    interpolated linearly in log-concurrency at the bucket's representative concurrency between
    the neighbouring levels; never extrapolated beyond the swept range.
    """
    levels = [lv for lv in pool.levels if getattr(lv, attribute) is not None]
    if not levels:
        return None
    inside = [lv for lv in levels if low < lv.concurrency <= high]
    where = f"{profile_source} pool {pool.name}"
    if inside:
        weights = [max(lv.samples, 1) for lv in inside]
        total = float(sum(weights))
        value = sum(w * getattr(lv, attribute) for w, lv in zip(weights, inside, strict=True)) / total
        stderr = None
        if attribute == "tpot_seconds" and all(lv.tpot_stderr_seconds is not None for lv in inside):
            stderr = math.sqrt(
                sum((w * lv.tpot_stderr_seconds) ** 2 for w, lv in zip(weights, inside, strict=True))
            )
            stderr /= total
        concurrencies = ",".join(str(lv.concurrency) for lv in inside)
        return LevelValue(
            value, sum(lv.samples for lv in inside), stderr, f"{where} concurrency {concurrencies}"
        )
    target = representative_concurrency(low, high)
    below = [lv for lv in levels if lv.concurrency <= target]
    above = [lv for lv in levels if lv.concurrency >= target]
    if not below or not above:
        return None
    lo = max(below, key=lambda lv: lv.concurrency)
    hi = min(above, key=lambda lv: lv.concurrency)
    if lo.concurrency == hi.concurrency:
        fraction = 0.0
    else:
        fraction = (math.log(target) - math.log(lo.concurrency)) / (
            math.log(hi.concurrency) - math.log(lo.concurrency)
        )
    value = getattr(lo, attribute) + fraction * (getattr(hi, attribute) - getattr(lo, attribute))
    stderr = None
    if (
        attribute == "tpot_seconds"
        and lo.tpot_stderr_seconds is not None
        and hi.tpot_stderr_seconds is not None
    ):
        stderr = max(lo.tpot_stderr_seconds, hi.tpot_stderr_seconds)
    detail = f"{where} interpolated at concurrency {target:g} from {lo.concurrency} and {hi.concurrency}"
    return LevelValue(value, min(lo.samples, hi.samples), stderr, detail)


# --- reading ---------------------------------------------------------------------------------


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file; raises ConfigError listing every problem with its position."""
    doc = configfile.load_file(path)
    return configfile.parse_with(doc, lambda root: parse_profile(root, str(path)))


def parse_profile_text(text: str, source: str = "<profile>") -> Profile:
    doc = configfile.parse_text(text, source)
    return configfile.parse_with(doc, lambda root: parse_profile(root, source))


def parse_profile(root: configfile.Section, source: str) -> Profile:
    """Build a Profile from the document root; problems are recorded on the document."""
    fmt = root.get("format", str)
    root.check(fmt is None or fmt == FORMAT, "format", f"must be {FORMAT!r}, got {fmt!r}")
    version = root.get("version", int)
    root.check(
        version is None or version == VERSION,
        "version",
        f"({version}) is not supported; this specguard reads version {VERSION}",
    )
    created = root.get("created", str, None, nullable=True)
    stack: dict[str, str] = {}
    stack_section = root.section("stack")
    for key, value in stack_section.data.items():
        stack_section.get(key, (str, int, float))
        stack[key] = str(value)
    pools: list[ProfilePool] = []
    names: set[str] = set()
    for pool in root.items("pools", required=True):
        name = pool.get("name", str)
        k = pool.get("num_speculative_tokens", int, minimum=0, maximum=64)
        if name is not None:
            pool.check(name not in names, "name", f"duplicate pool name {name!r}")
            names.add(name)
        levels = _parse_levels(pool, k or 0)
        pool.reject_unknown()
        if name is not None and k is not None:
            pools.append(ProfilePool(name, k, tuple(sorted(levels, key=lambda lv: lv.concurrency))))
    if isinstance(root.data.get("pools"), list):
        root.check(bool(root.data["pools"]), "pools", "must list at least one pool")
    schedule = root.get("schedule", dict, None, nullable=True)
    root.reject_unknown()
    return Profile(tuple(pools), VERSION, created, stack, source, schedule)


def _parse_levels(pool: configfile.Section, k: int) -> list[ProfileLevel]:
    levels: list[ProfileLevel] = []
    seen: set[int] = set()
    for level in pool.items("levels", required=True):
        concurrency = level.get("concurrency", int, minimum=1)
        if concurrency is not None:
            level.check(concurrency not in seen, "concurrency", f"duplicate concurrency {concurrency}")
            seen.add(concurrency)
        tpot = level.get("tpot_seconds", float, minimum=0.0)
        level.check(tpot is None or tpot > 0, "tpot_seconds", "must be > 0")
        samples = level.get("samples", int, minimum=1)
        stderr = level.get("tpot_stderr_seconds", float, None, minimum=0.0, nullable=True)
        step = level.get("step_seconds", float, None, minimum=0.0, nullable=True)
        accept = level.get("accept_length", float, None, minimum=1.0, maximum=k + 1, nullable=True)
        classes = tuple(_parse_class(c, k) for c in level.items("classes"))
        level.reject_unknown()
        if concurrency is not None and tpot is not None and samples is not None:
            levels.append(ProfileLevel(concurrency, tpot, samples, stderr, step, accept, classes))
    return levels


def _parse_class(section: configfile.Section, k: int) -> ClassLevel:
    positions = None
    raw = section.data.get("accepted_per_position")
    values = list(section.values("accepted_per_position"))
    if raw is not None:
        good = all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1 for _, v in values)
        section.check(good, "accepted_per_position", "must be a list of shares between 0 and 1")
        section.check(len(values) <= k, "accepted_per_position", f"has {len(values)} entries but K is {k}")
        monotone = all(values[i][1] >= values[i + 1][1] for i in range(len(values) - 1)) if good else True
        section.check(monotone, "accepted_per_position", "must not increase with position")
        if good:
            positions = tuple(float(v) for _, v in values)
    accept = section.get("accept_length", float, None, minimum=1.0, maximum=k + 1, nullable=True)
    tpot = section.get("tpot_seconds", float, None, minimum=0.0, nullable=True)
    stderr = section.get("tpot_stderr_seconds", float, None, minimum=0.0, nullable=True)
    cls = ClassLevel(
        task_type=section.get("task_type", str) or "",
        temperature_bucket=section.get("temperature_bucket", str) or "",
        accept_length=accept,
        tpot_seconds=tpot,
        samples=section.get("samples", int, 0, minimum=0),
        accepted_per_position=positions,
        tpot_stderr_seconds=stderr,
    )
    section.reject_unknown()
    return cls


# --- writing ---------------------------------------------------------------------------------


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """Plain data in the file layout (``None`` fields left out)."""
    out: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    if profile.created:
        out["created"] = profile.created
    if profile.stack:
        out["stack"] = dict(profile.stack)
    out["pools"] = [
        {
            "name": pool.name,
            "num_speculative_tokens": pool.num_speculative_tokens,
            "levels": [_level_dict(level) for level in pool.levels],
        }
        for pool in profile.pools
    ]
    if profile.schedule:
        out["schedule"] = dict(profile.schedule)
    return out


def _level_dict(level: ProfileLevel) -> dict[str, Any]:
    out: dict[str, Any] = {
        "concurrency": level.concurrency,
        "tpot_seconds": level.tpot_seconds,
        "samples": level.samples,
    }
    for key in ("tpot_stderr_seconds", "step_seconds", "accept_length"):
        if getattr(level, key) is not None:
            out[key] = getattr(level, key)
    if level.classes:
        out["classes"] = []
        for cls in level.classes:
            entry: dict[str, Any] = {"task_type": cls.task_type, "temperature_bucket": cls.temperature_bucket}
            for key in ("accept_length", "tpot_seconds", "tpot_stderr_seconds"):
                if getattr(cls, key) is not None:
                    entry[key] = getattr(cls, key)
            entry["samples"] = cls.samples
            if cls.accepted_per_position is not None:
                entry["accepted_per_position"] = list(cls.accepted_per_position)
            out["classes"].append(entry)
    return out


def render_profile(profile: Profile) -> str:
    return yaml.safe_dump(profile_to_dict(profile), sort_keys=False, default_flow_style=False)


def write_profile(profile: Profile, path: str | Path) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a profile."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(target.parent or Path(".")))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(render_profile(profile))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
