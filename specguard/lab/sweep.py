"""``specguard sweep``: sweep K and concurrency on the real request mix, recording RC per cell.

For every pool (K), workload geometry and concurrency level, drive the request mix closed-loop and
record what each request did; then per (pool, geometry, concurrency, class) compute TPOT (ratio of
sums, p50, p99), output throughput, end-to-end latency, mean verify length, accept length, strict
accept rate, full-rollback ratio and RC against the no-spec pool at the same geometry and
concurrency. Two drivers give the same per-request samples:

- ``virtual``: the simulator's engine core in virtual time (seconds for the whole grid);
- ``http``: ``monitor.loadgen`` against any OpenAI-compatible pools (the simulator over HTTP, or
  real engines), so the numbers come from the stack that serves the traffic. ``sweep_launch``
  starts each K's engine from a command template and drives it the same way.

Outputs: a tidy pandas frame (CSV), PNG plots (sweep_plots) and the calibration profile the cost
model reads as its fallback baseline (``rules.profile``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from specguard.errors import ConfigError
from specguard.rules import profile as profile_mod

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)
ALL = "all"  # class label of the rows over the whole mix


@dataclass(frozen=True)
class MixEntry:
    task_type: str
    temperature: float
    weight: float = 1.0
    prompt_tokens: int | None = None  # None: the driver's default (the simulator draws its own)
    max_tokens: int | None = None


@dataclass(frozen=True)
class Geometry:
    """Prompt and decode lengths of every request of a run (None: the driver's own default)."""

    name: str
    prompt_tokens: int | None = None
    decode_tokens: int | None = None

    def apply(self, mix: Sequence[MixEntry]) -> list[MixEntry]:
        return [replace(m, prompt_tokens=self.prompt_tokens, max_tokens=self.decode_tokens) for m in mix]


MIX_GEOMETRY = Geometry("mix")  # the drivers' own lengths (no --geometry)
GEOMETRIES = {
    "short-prompt-long-decode": Geometry("short-prompt-long-decode", 64, 256),
    "short-prompt-short-decode": Geometry("short-prompt-short-decode", 64, 32),
    "long-prompt-short-decode": Geometry("long-prompt-short-decode", 1024, 32),
    "long-prompt-long-decode": Geometry("long-prompt-long-decode", 1024, 256),
}


def parse_geometries(text: str) -> tuple[Geometry, ...]:
    """``name`` (one of GEOMETRIES) or ``PROMPTxDECODE`` tokens (``512x64``), comma separated."""
    out: list[Geometry] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if item in GEOMETRIES:
            out.append(GEOMETRIES[item])
            continue
        prompt, sep, decode = item.partition("x")
        if not (sep and prompt.isdigit() and decode.isdigit() and int(prompt) > 0 and int(decode) > 0):
            raise ConfigError(
                f"--geometry entry {item!r}: expected one of {', '.join(GEOMETRIES)} "
                "or PROMPTxDECODE token counts such as 512x64"
            )
        out.append(Geometry(item, int(prompt), int(decode)))
    if not out:
        raise ConfigError(f"--geometry {text!r}: no geometry given")
    if len({g.name for g in out}) != len(out):
        raise ConfigError(f"--geometry {text!r}: a geometry is listed twice")
    return tuple(out)


@dataclass(frozen=True)
class PoolSpec:
    name: str
    num_speculative_tokens: int
    url: str | None = None


@dataclass(frozen=True)
class Sample:
    """One finished request of one sweep cell."""

    pool: str
    concurrency: int
    task_type: str
    temperature: float
    output_tokens: int
    decode_seconds: float | None
    started: float
    finished: float
    rounds: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    histogram: tuple[int, ...] | None = None
    geometry: str = MIX_GEOMETRY.name


Driver = Callable[[PoolSpec, int, Sequence[MixEntry], int], list[Sample]]


def simulator_stack(sim, source: str) -> dict[str, str]:
    """The profile header of a sweep on the simulator: what its HTTP surface reports as engine
    version and model, so the profile is fresh against the simulator (and stale against anything else)."""
    from specguard.sim.llamacpp_http import BUILD_INFO
    from specguard.sim.sglang_http import SGLANG_VERSION
    from specguard.sim.vllm_http import VLLM_VERSION

    version = {"vllm": VLLM_VERSION, "llamacpp": BUILD_INFO}.get(sim.dialect, SGLANG_VERSION)
    return {
        "engine": "specguard-simulator",
        "engine_version": version,
        "model": sim.model_name,
        "source": source,
    }


async def http_stack(pools: Sequence[PoolSpec], engine: str, timeout: float = 5.0) -> dict[str, str]:
    """The profile header of an HTTP sweep: engine version and model as the no-spec pool reports them
    (``exporters.stackinfo``; the first pool without a no-spec one)."""
    import aiohttp

    from specguard.exporters import stackinfo

    target = next((p for p in pools if p.num_speculative_tokens == 0 and p.url), None)
    target = target or next((p for p in pools if p.url), None)
    if target is None:
        return {}
    async with aiohttp.ClientSession() as session:
        return await stackinfo.fetch(session, target.url or "", engine, timeout)


def levels_up_to(maximum: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``maximum`` (inclusive when it is a power of two)."""
    out, c = [], 1
    while c <= maximum:
        out.append(c)
        c *= 2
    return tuple(out)


def steady(samples: list[Sample], concurrency: int) -> list[Sample]:
    """Drop the warm-up (the first ``concurrency`` finishers) and the drain (after the last start)."""
    if len(samples) <= 2 * concurrency:
        return samples
    last_start = max(s.started for s in samples)
    ordered = sorted(samples, key=lambda s: s.finished)[concurrency:]
    kept = [s for s in ordered if s.finished <= last_start]
    return kept if len(kept) >= max(4, len(samples) // 4) else ordered


def check_pools(pools: Sequence[PoolSpec]) -> None:
    if not pools:
        raise ConfigError("sweep: no pools selected")
    if not any(p.num_speculative_tokens == 0 for p in pools):
        raise ConfigError("sweep: RC needs a no-speculation pool (num_speculative_tokens 0) in the grid")


def run_pool(
    pool: PoolSpec,
    levels: Sequence[int],
    mix: Sequence[MixEntry],
    driver: Driver,
    *,
    geometries: Sequence[Geometry] = (MIX_GEOMETRY,),
    requests_per_level: Callable[[int], int] = lambda c: max(64, 8 * c),
    step: Callable[[str], None] | None = None,
) -> list[Sample]:
    """One pool's (geometry, concurrency) cells, in order; ``step(label)`` after each."""
    out: list[Sample] = []
    for geometry in geometries:
        shaped = geometry.apply(mix) if geometry is not MIX_GEOMETRY else list(mix)
        for level in levels:
            samples = driver(pool, level, shaped, requests_per_level(level))
            out.extend(replace(s, geometry=geometry.name) for s in steady(samples, level))
            if step:
                where = f" {geometry.name}" if geometry is not MIX_GEOMETRY else ""
                step(f"{pool.name}{where} c={level}")
    return out


def run_grid(
    pools: Sequence[PoolSpec],
    levels: Sequence[int],
    mix: Sequence[MixEntry],
    driver: Driver,
    *,
    geometries: Sequence[Geometry] = (MIX_GEOMETRY,),
    requests_per_level: Callable[[int], int] = lambda c: max(64, 8 * c),
    progress: Callable[[int, int, str], None] | None = None,
) -> list[Sample]:
    """Every (pool, geometry, concurrency) cell, in order; ``progress(done, total, label)`` after each."""
    check_pools(pools)
    counter = Counter(len(pools) * len(geometries) * len(levels), progress)
    cells = {"geometries": geometries, "requests_per_level": requests_per_level, "step": counter}
    out: list[Sample] = []
    for pool in pools:
        out.extend(run_pool(pool, levels, mix, driver, **cells))
    return out


class Counter:
    """Turns per-cell steps into ``progress(done, total, label)`` calls."""

    def __init__(self, total: int, progress: Callable[[int, int, str], None] | None):
        self.total, self.done, self.progress = total, 0, progress

    def __call__(self, label: str) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, self.total, label)


# ---- aggregation ---------------------------------------------------------------------------------


def _cell(samples: list[Sample], k: int) -> dict:
    decode_s = sum(s.decode_seconds for s in samples if s.decode_seconds is not None and s.output_tokens > 1)
    decode_t = sum(
        s.output_tokens - 1 for s in samples if s.decode_seconds is not None and s.output_tokens > 1
    )
    tokens = sum(s.output_tokens for s in samples)
    span = max(s.finished for s in samples) - min(s.started for s in samples) if samples else 0.0
    tpots = _tpots(samples)
    e2e = [s.finished - s.started for s in samples]
    row = {
        "requests": len(samples),
        "output_tokens": tokens,
        "tpot_seconds": decode_s / decode_t if decode_t else math.nan,
        "tpot_stderr_seconds": _stderr(samples),
        "tpot_p50_seconds": _quantile(tpots, 0.5),
        "tpot_p99_seconds": _quantile(tpots, 0.99),
        "throughput_tokens_per_second": tokens / span if span > 0 else math.nan,
        "e2e_mean_seconds": statistics.fmean(e2e) if e2e else math.nan,
        "e2e_p50_seconds": _quantile(e2e, 0.5),
        "e2e_p99_seconds": _quantile(e2e, 0.99),
        "mean_verify_length": 1.0 if not k else math.nan,  # 1 + drafts/rounds: n-gram may draft < K
        "accept_length": math.nan,
        "strict_accept_rate": math.nan,
        "full_rollback_ratio": math.nan,
        "step_seconds": math.nan,
        "accepted_per_position": "",
    }
    spec = [s for s in samples if s.rounds]
    rounds = sum(s.rounds or 0 for s in spec)
    if k and rounds:
        accepted = sum(s.accepted_tokens or 0 for s in spec)
        drafted = sum(s.draft_tokens or 0 for s in spec)
        rollback = sum(s.histogram[0] for s in spec if s.histogram)
        row["accept_length"] = 1 + accepted / rounds
        row["mean_verify_length"] = 1 + drafted / rounds
        row["strict_accept_rate"] = accepted / drafted if drafted else math.nan
        row["full_rollback_ratio"] = rollback / rounds
        row["step_seconds"] = sum(s.decode_seconds or 0 for s in spec) / rounds
        hist = np.zeros(k + 1)
        for s in spec:
            if s.histogram and len(s.histogram) == k + 1:
                hist += np.asarray(s.histogram)
        if hist.sum():
            # p_i = share of rounds with >= i accepted drafts
            per_pos = [float(hist[i:].sum() / hist.sum()) for i in range(1, k + 1)]
            row["accepted_per_position"] = " ".join(f"{p:.4f}" for p in per_pos)
    elif k:
        # an engine reporting drafts per request but no rounds (llama.cpp): acceptance only
        drafted = sum(s.draft_tokens or 0 for s in samples)
        if drafted:
            row["strict_accept_rate"] = sum(s.accepted_tokens or 0 for s in samples) / drafted
    else:
        row["step_seconds"] = row["tpot_seconds"]
    return row


def _tpots(samples: list[Sample]) -> list[float]:
    return [
        s.decode_seconds / (s.output_tokens - 1) for s in samples if s.decode_seconds and s.output_tokens > 1
    ]


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else math.nan


def _stderr(samples: list[Sample]) -> float:
    values = _tpots(samples)
    if len(values) < 2:
        return math.nan
    return statistics.stdev(values) / math.sqrt(len(values))


def to_frame(
    samples: Sequence[Sample], pools: Sequence[PoolSpec], temperature_bucket: Callable[[float], str]
) -> pd.DataFrame:
    """One row per (pool, geometry, concurrency, class) plus a class ``all`` row per (pool,
    geometry, concurrency)."""
    ks = {p.name: p.num_speculative_tokens for p in pools}
    groups: dict[tuple, list[Sample]] = {}
    for s in samples:
        cls = (s.task_type, temperature_bucket(s.temperature))
        groups.setdefault((s.pool, s.geometry, s.concurrency, cls), []).append(s)
        groups.setdefault((s.pool, s.geometry, s.concurrency, (ALL, ALL)), []).append(s)
    rows = []
    for (pool, geometry, c, (task, tb)), group in groups.items():
        row = {"pool": pool, "num_speculative_tokens": ks[pool], "geometry": geometry, "concurrency": c}
        row["task_type"] = task
        row["temperature_bucket"] = tb
        row.update(_cell(group, ks[pool]))
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame = frame.sort_values(
        ["num_speculative_tokens", "pool", "geometry", "concurrency", "task_type", "temperature_bucket"]
    )
    nospec = [p.name for p in pools if p.num_speculative_tokens == 0][0]
    base = frame[frame["pool"] == nospec].set_index(
        ["geometry", "concurrency", "task_type", "temperature_bucket"]
    )["tpot_seconds"]
    base_all = frame[(frame["pool"] == nospec) & (frame["task_type"] == ALL)].set_index(
        ["geometry", "concurrency"]
    )["tpot_seconds"]

    def rc(row) -> float:
        # the class's own no-spec TPOT at the same geometry and concurrency, else the whole mix's
        at = (row["geometry"], row["concurrency"])
        b = base.get((*at, row["task_type"], row["temperature_bucket"]))
        if b is None or not b > 0:
            b = base_all.get(at)
        return row["tpot_seconds"] / b if b and b > 0 else math.nan

    frame["relative_cost"] = frame.apply(rc, axis=1)
    return frame.reset_index(drop=True)


def to_profile(
    frame: pd.DataFrame, stack: dict[str, str] | None = None, geometry: str | None = None
) -> profile_mod.Profile:
    """The calibration profile (rules.profile format) from a sweep frame's rows of one geometry
    (default: the first row's). The profile has no geometry axis: pick the one of the traffic it
    will serve."""
    if "geometry" in frame.columns and len(frame):
        frame = frame[frame["geometry"] == (geometry or frame["geometry"].iloc[0])]
    pools = []
    for (pool, k), part in frame.groupby(["pool", "num_speculative_tokens"], sort=False):
        levels = []
        for c, cell in part.groupby("concurrency"):
            whole = cell[cell["task_type"] == ALL].iloc[0]
            classes = []
            for _, row in cell[cell["task_type"] != ALL].iterrows():
                per_pos = tuple(float(x) for x in str(row["accepted_per_position"]).split()) or None
                classes.append(
                    profile_mod.ClassLevel(
                        task_type=str(row["task_type"]),
                        temperature_bucket=str(row["temperature_bucket"]),
                        accept_length=_opt(row["accept_length"]),
                        tpot_seconds=_opt(row["tpot_seconds"]),
                        samples=int(row["requests"]),
                        accepted_per_position=per_pos if k else None,
                        tpot_stderr_seconds=_opt(row["tpot_stderr_seconds"]),
                    )
                )
            levels.append(
                profile_mod.ProfileLevel(
                    concurrency=int(c),
                    tpot_seconds=float(whole["tpot_seconds"]),
                    samples=int(whole["requests"]),
                    tpot_stderr_seconds=_opt(whole["tpot_stderr_seconds"]),
                    step_seconds=_opt(whole["step_seconds"]),
                    accept_length=_opt(whole["accept_length"]) if k else None,
                    classes=tuple(classes),
                )
            )
        pools.append(profile_mod.ProfilePool(str(pool), int(k), tuple(levels)))
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return profile_mod.Profile(tuple(pools), created=created, stack=dict(stack or {}))


def _opt(value) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None
