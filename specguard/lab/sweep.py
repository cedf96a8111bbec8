"""``specguard sweep``: CONCEPTS.md section 5 step 2 as a tool.

For every pool (K) and concurrency level, drive the request mix closed-loop and record what each
request did; then per (pool, concurrency, class) compute TPOT (ratio of sums), output throughput,
accept length, strict accept rate, full-rollback ratio and RC against the no-spec pool at the same
concurrency. Two drivers give the same per-request samples:

- ``virtual``: the simulator's engine core in virtual time (seconds for the whole grid);
- ``http``: ``monitor.loadgen`` against any OpenAI-compatible pools (the simulator over HTTP, or
  real engines), so the numbers come from the stack that serves the traffic.

Outputs: a tidy pandas frame (CSV), PNG plots (sweep_plots) and the calibration profile the cost
model reads as its fallback baseline (``rules.profile``).
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from specguard.errors import ConfigError, SourceError
from specguard.rules import profile as profile_mod

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)
ALL = "all"  # class label of the rows over the whole mix


@dataclass(frozen=True)
class MixEntry:
    task_type: str
    temperature: float
    weight: float = 1.0


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


Driver = Callable[[PoolSpec, int, Sequence[MixEntry], int], list[Sample]]


def simulator_stack(sim, source: str) -> dict[str, str]:
    """The profile header of a sweep on the simulator: what its HTTP surface reports as engine
    version and model, so the profile is fresh against the simulator (and stale against anything else)."""
    from specguard.sim.sglang_http import SGLANG_VERSION
    from specguard.sim.vllm_http import VLLM_VERSION

    version = VLLM_VERSION if sim.dialect == "vllm" else SGLANG_VERSION
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


# ---- drivers -------------------------------------------------------------------------------------


def virtual_driver(sim, seed: int = 0) -> Driver:
    """Cells on the simulator's engine core in virtual time (``sim``: a sim.config.SimConfig)."""
    from specguard.sim import virtual

    def run(pool: PoolSpec, concurrency: int, mix: Sequence[MixEntry], requests: int) -> list[Sample]:
        classes = [(m.task_type, m.temperature, m.weight) for m in mix]
        result = virtual.simulate_closed(sim, pool.name, classes, concurrency, requests, seed=seed)
        return [
            Sample(
                pool=pool.name,
                concurrency=concurrency,
                task_type=r.task_type,
                temperature=r.temperature,
                output_tokens=r.output_tokens,
                decode_seconds=r.decode_seconds,
                started=r.arrival,
                finished=r.finished,
                rounds=r.rounds if r.num_speculative_tokens else None,
                draft_tokens=r.draft_tokens if r.num_speculative_tokens else None,
                accepted_tokens=r.accepted_tokens if r.num_speculative_tokens else None,
                histogram=tuple(r.histogram) if r.num_speculative_tokens else None,
            )
            for r in result.results
        ]

    return run


def http_driver(
    *, seed: int = 0, max_tokens: int = 128, stream: bool = True, timeout_s: float = 300.0
) -> Driver:
    """Cells over HTTP with ``monitor.loadgen`` (one asyncio run per cell)."""
    from specguard.exporters.engines import vllm
    from specguard.lab import loadgen

    def run(pool: PoolSpec, concurrency: int, mix: Sequence[MixEntry], requests: int) -> list[Sample]:
        if not pool.url:
            raise ConfigError(f"pool {pool.name}: no url to sweep over HTTP")
        classes = [
            loadgen.RequestClass(m.task_type, m.weight, temperature=m.temperature, max_tokens=max_tokens)
            for m in mix
        ]
        results = asyncio.run(
            loadgen.run_load(
                pool.url,
                classes,
                concurrency,
                requests=requests,
                stream=stream,
                seed=seed,
                timeout_s=timeout_s,
            )
        )
        failed = [r for r in results if not r.ok]
        if failed and len(failed) == len(results):
            raise SourceError(
                f"pool {pool.name} at {pool.url}: every request failed "
                f"({failed[0].error or failed[0].status})"
            )
        samples = []
        for r in results:
            if not r.ok:
                continue
            spec = None
            if r.spec is not None:
                body = {
                    "metrics": {"speculative_decoding": r.spec},
                    "usage": {"completion_tokens": r.output_tokens},
                }
                try:
                    spec = vllm.request_stats(body)
                except Exception:  # noqa: BLE001 - an engine without vLLM's fields: no spec numbers
                    spec = None
            decode = (r.e2e_seconds - r.ttft_seconds) if r.ttft_seconds is not None else None
            samples.append(
                Sample(
                    pool=pool.name,
                    concurrency=concurrency,
                    task_type=r.task_type,
                    temperature=r.temperature if r.temperature is not None else 1.0,
                    output_tokens=r.output_tokens,
                    decode_seconds=decode,
                    started=r.started_at,
                    finished=r.started_at + r.e2e_seconds,
                    rounds=spec.rounds if spec else None,
                    draft_tokens=spec.draft_tokens if spec else None,
                    accepted_tokens=spec.accepted_tokens if spec else None,
                    histogram=spec.accepted_histogram if spec else None,
                )
            )
        return samples

    return run


def steady(samples: list[Sample], concurrency: int) -> list[Sample]:
    """Drop the warm-up (the first ``concurrency`` finishers) and the drain (after the last start)."""
    if len(samples) <= 2 * concurrency:
        return samples
    last_start = max(s.started for s in samples)
    ordered = sorted(samples, key=lambda s: s.finished)[concurrency:]
    kept = [s for s in ordered if s.finished <= last_start]
    return kept if len(kept) >= max(4, len(samples) // 4) else ordered


def run_grid(
    pools: Sequence[PoolSpec],
    levels: Sequence[int],
    mix: Sequence[MixEntry],
    driver: Driver,
    *,
    requests_per_level: Callable[[int], int] = lambda c: max(64, 8 * c),
    progress: Callable[[int, int, str], None] | None = None,
) -> list[Sample]:
    """Every (pool, concurrency) cell, in order; ``progress(done, total, label)`` after each."""
    if not pools:
        raise ConfigError("sweep: no pools selected")
    if not any(p.num_speculative_tokens == 0 for p in pools):
        raise ConfigError("sweep: RC needs a no-speculation pool (num_speculative_tokens 0) in the grid")
    total = len(pools) * len(levels)
    out: list[Sample] = []
    done = 0
    for pool in pools:
        for level in levels:
            samples = driver(pool, level, mix, requests_per_level(level))
            out.extend(steady(samples, level))
            done += 1
            if progress:
                progress(done, total, f"{pool.name} c={level}")
    return out


# ---- aggregation ---------------------------------------------------------------------------------


def _cell(samples: list[Sample], k: int) -> dict:
    decode_s = sum(s.decode_seconds for s in samples if s.decode_seconds is not None and s.output_tokens > 1)
    decode_t = sum(
        s.output_tokens - 1 for s in samples if s.decode_seconds is not None and s.output_tokens > 1
    )
    tokens = sum(s.output_tokens for s in samples)
    span = max(s.finished for s in samples) - min(s.started for s in samples) if samples else 0.0
    row = {
        "requests": len(samples),
        "output_tokens": tokens,
        "tpot_seconds": decode_s / decode_t if decode_t else math.nan,
        "tpot_stderr_seconds": _stderr(samples),
        "throughput_tokens_per_second": tokens / span if span > 0 else math.nan,
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
    elif not k:
        row["step_seconds"] = row["tpot_seconds"]
    return row


def _stderr(samples: list[Sample]) -> float:
    values = [
        s.decode_seconds / (s.output_tokens - 1) for s in samples if s.decode_seconds and s.output_tokens > 1
    ]
    if len(values) < 2:
        return math.nan
    return statistics.stdev(values) / math.sqrt(len(values))


def to_frame(
    samples: Sequence[Sample], pools: Sequence[PoolSpec], temperature_bucket: Callable[[float], str]
) -> pd.DataFrame:
    """One row per (pool, concurrency, class) plus a class ``all`` row per (pool, concurrency)."""
    ks = {p.name: p.num_speculative_tokens for p in pools}
    groups: dict[tuple, list[Sample]] = {}
    for s in samples:
        cls = (s.task_type, temperature_bucket(s.temperature))
        groups.setdefault((s.pool, s.concurrency, cls), []).append(s)
        groups.setdefault((s.pool, s.concurrency, (ALL, ALL)), []).append(s)
    rows = []
    for (pool, c, (task, tb)), group in groups.items():
        row = {"pool": pool, "num_speculative_tokens": ks[pool], "concurrency": c, "task_type": task}
        row["temperature_bucket"] = tb
        row.update(_cell(group, ks[pool]))
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame = frame.sort_values(
        ["num_speculative_tokens", "pool", "concurrency", "task_type", "temperature_bucket"]
    )
    nospec = [p.name for p in pools if p.num_speculative_tokens == 0][0]
    base = frame[frame["pool"] == nospec].set_index(["concurrency", "task_type", "temperature_bucket"])[
        "tpot_seconds"
    ]
    base_all = frame[(frame["pool"] == nospec) & (frame["task_type"] == ALL)].set_index("concurrency")[
        "tpot_seconds"
    ]

    def rc(row) -> float:
        # the class's own no-spec TPOT at the same concurrency, else the whole mix's
        b = base.get((row["concurrency"], row["task_type"], row["temperature_bucket"]))
        if b is None or not b > 0:
            b = base_all.get(row["concurrency"])
        return row["tpot_seconds"] / b if b and b > 0 else math.nan

    frame["relative_cost"] = frame.apply(rc, axis=1)
    return frame.reset_index(drop=True)


def to_profile(frame: pd.DataFrame, stack: dict[str, str] | None = None) -> profile_mod.Profile:
    """The calibration profile (rules.profile format) from a sweep frame."""
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
