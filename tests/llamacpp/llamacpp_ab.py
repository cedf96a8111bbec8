"""Ground truth for the guard on real llama.cpp servers: interleaved A/B timing of one class.

The minimal part of the vLLM tier's A/B kit (tests/vllm/abkit.py), kept here so the two tiers do
not import each other. Independent of specguard's cost model: a request's TPOT is (end - first text
chunk) / (tokens - 1) from loadgen's raw stream timing, an RC is a ratio of two ratio-of-sums
TPOTs, and its interval is a percentile bootstrap over request pairs.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass

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
    """One streamed request of ``cls`` (prompt fixed by ``seed``), alone on the server."""
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
