"""Ground truth for the guard on real engines: interleaved A/B timing of one class, and the A/A
bias of the two cores (the recipe's fairness section, /work/shared/research/real-model-recipe.md).

Independent of specguard's cost model: a request's TPOT here is (end - first text chunk) / (tokens
- 1) from loadgen's raw stream timing, an RC is a ratio of two ratio-of-sums TPOTs, and its
interval is a percentile bootstrap over request pairs.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specguard.lab import loadgen

CONFIDENCE = 0.90


@dataclass(frozen=True)
class Timed:
    tokens: int
    decode_seconds: float
    spec: dict | None


@dataclass(frozen=True)
class Ratio:
    """TPOT(A) / TPOT(B) over request pairs, with a bootstrap interval."""

    point: float
    lower: float
    upper: float
    pairs: int

    @property
    def verdict(self) -> str:
        """For an RC: "pays" (interval below 1), "loses" (above 1), else "undecided"."""
        return "pays" if self.upper < 1.0 else "loses" if self.lower > 1.0 else "undecided"

    def __str__(self) -> str:
        return f"{self.point:.3f} [{self.lower:.3f}, {self.upper:.3f}] ({self.pairs} pairs)"


def timed(url: str, cls: loadgen.RequestClass, seed: int) -> Timed:
    """One streamed request of ``cls`` (prompt fixed by ``seed``), alone on the engine."""
    (result,) = asyncio.run(loadgen.run_load(url, [cls], 1, requests=1, stream=True, seed=seed))
    assert result.ok and result.ttft_seconds is not None, result
    return Timed(result.output_tokens, result.e2e_seconds - result.ttft_seconds, result.spec)


def ratio(pairs: Sequence[tuple[Timed, Timed]], seed: int = 0, resamples: int = 2000) -> Ratio:
    def of(sample: Sequence[tuple[Timed, Timed]]) -> float:
        a = sum(x.decode_seconds for x, _ in sample) / sum(x.tokens - 1 for x, _ in sample)
        b = sum(y.decode_seconds for _, y in sample) / sum(y.tokens - 1 for _, y in sample)
        return a / b

    usable = [(a, b) for a, b in pairs if a.tokens > 1 and b.tokens > 1]
    rng = random.Random(seed)
    boot = sorted(of([rng.choice(usable) for _ in usable]) for _ in range(resamples))
    tail = (1 - CONFIDENCE) / 2
    return Ratio(of(usable), boot[int(tail * resamples)], boot[int((1 - tail) * resamples) - 1], len(usable))


def interleaved(url_a: str, url_b: str, cls: loadgen.RequestClass, pairs: int, seed: int) -> list:
    """``pairs`` pairs of the same request on A and on B, in ABBA order (drift cancels)."""
    out = []
    for i in range(pairs):
        if i % 2 == 0:
            a = timed(url_a, cls, seed + i)
            b = timed(url_b, cls, seed + i)
        else:
            b = timed(url_b, cls, seed + i)
            a = timed(url_a, cls, seed + i)
        out.append((a, b))
    return out


def group_pids(pgid: int) -> list[int]:
    """Every process in process group ``pgid`` (an engine: API server, EngineCore, worker)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid:
                out.append(int(entry.name))
    return out


def pinned_threads(pgid: int) -> dict[int, set[int]]:
    """The threads of an engine's process group that are bound to one CPU (the worker's OpenMP
    threads, bound by VLLM_CPU_OMP_THREADS_BIND), with their affinity. The API server and
    EngineCore float over every CPU and are left alone, as in the pair under test."""
    out = {}
    for pid in group_pids(pgid):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                affinity = os.sched_getaffinity(tid)
            except OSError:
                continue  # a thread that just ended
            if len(affinity) == 1:
                out[tid] = affinity
    return out


def pin(threads: dict[int, set[int]], cpu: int | None) -> None:
    """Move ``threads`` to ``cpu`` (None: back to their own affinity)."""
    for tid, own in threads.items():
        try:
            os.sched_setaffinity(tid, own if cpu is None else {cpu})
        except OSError:
            pass


def aa_bias(url: str, pgid: int, cpus: tuple[int, int], cls: loadgen.RequestClass, pairs: int, seed: int):
    """The same engine (one configuration) timed with its pinned threads on ``cpus[0]`` vs
    ``cpus[1]``, interleaved: TPOT(cpus[0]) / TPOT(cpus[1]). Its threads go back where they were."""
    threads = pinned_threads(pgid)
    assert threads, f"no thread bound to one CPU in process group {pgid}"
    out = []
    try:
        for i in range(pairs):
            order = cpus if i % 2 == 0 else cpus[::-1]
            got = {}
            for cpu in order:
                pin(threads, cpu)
                got[cpu] = timed(url, cls, seed + i)
            out.append((got[cpus[0]], got[cpus[1]]))
    finally:
        pin(threads, None)
    return ratio(out, seed=seed)
