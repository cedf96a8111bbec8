"""The guard's RC per class, number against number: an interleaved A/B of the two engines and the
guard's own RC from the same requests sent through its tap (the vLLM tier; ``tests/abtiming.py``
times the requests).

Both sides see the same prompts at the same moments (``measure``). The A/B sends each one to the
speculative engine and to the no-spec engine directly, in ABBA order; beside each of those, at the
same time, the guard's traffic sends the same prompt through the tap, and the tap's holdout draw
(share 0.5) is scripted (``Scripted``) so it reaches the engine the A/B's request is on, after
one untimed request has put the prompt in the engine's prefix cache (``warm``). Both clients run
in processes of their own (sharing this one's interpreter with the tap, the A/B's client timed the
same steps up to 28% slower), and which of the two reaches the engine first alternates, so each
side leads on each engine half the time. The two requests then decode in the same engine steps:
the machine's timing noise (on a shared 2-core machine larger per request than the prompts' own
spread) falls on both alike, where with the requests one after the other it fell on each
independently and an interval missed the other's point about one class measurement in three by
noise alone. The guard then computes RC from its records as it always does (its baseline, its
load matching, its interval), and what is left to differ is the guard's number itself: which
baseline, which requests, which timing. A baseline pooled over both classes misses by half the gap
between their no-spec TPOTs (11% in both directions in one run). The truth is the A/B at two
requests in flight on each engine: both sides time the same engine steps.

Two levels of agreement, both asserted in every run. **Strict**: each interval covers the
other's point and the points are within 10% (docs/real-model.md reports it per run). **Gross**:
the points within ``GROSS`` or within their joint noise, and no verdict against an A/B interval
clear of 1.0; what a wrong baseline, a wrong request set or a wrong timing gives, reported apart
so a failure says which kind it is. A disagreement is measured again on fresh prompts once
(``ATTEMPTS``): noise goes away with fresh prompts, a bias does not.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import random
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from statistics import NormalDist

from specguard.lab import loadgen
from specguard.rules import cost
from specguard.rules.cost_config import BASELINE_SCOPES
from tests.abtiming import Ratio, Timed, ratio, timed

Key = tuple[str, str]
TOLERANCE = 0.10  # strict: the guard's point within 10% of the A/B's
GROSS = 0.25  # every run: the guard's point within 25% of the A/B's, or within their joint noise
JOINT_Z = NormalDist().inv_cdf(0.995)  # the joint noise: 99% of both intervals' log standard deviations
CONFIDENCE = 0.95  # the A/B's interval, at the guard's own level
ATTEMPTS = 2  # a disagreement is measured again on fresh prompts before it fails the test
LEAD = 0.05  # seconds the second of a pair starts after the first (the first is admitted alone)
DESIGN = (
    "side-by-side-alternating"  # how the runs kept in bench/results/real-ab.json timed (bench/real_ab.py)
)


class Scripted(random.Random):
    """The router's holdout draw, set before each request (``to``): with a holdout share of 0.5,
    0.25 holds the request out to the no-spec pool and 0.75 keeps it on the planned one."""

    def __init__(self) -> None:
        super().__init__(0)
        self.nospec = False

    def to(self, nospec: bool) -> None:
        self.nospec = nospec

    def random(self) -> float:
        return 0.25 if self.nospec else 0.75


@dataclass(frozen=True)
class Side:
    """One class's numbers from both measurements."""

    truth: Ratio  # the A/B: TPOT(spec) / TPOT(no-spec), bootstrap interval over pairs
    base_tpot: float  # the A/B's no-spec TPOT of the class, seconds
    guard: cost.ClassCost  # the guard's RC with the shipped cost settings
    scopes: Mapping[str, cost.ClassCost]  # the same records under every baseline scope

    def line(self, key: Key) -> str:
        g = self.guard
        spec = self.truth.point * self.base_tpot
        bounds = "" if g.lower is None or g.upper is None else f" [{g.lower:.3f}, {g.upper:.3f}]"
        scopes = ", ".join(f"{s} {c.rc:.3f}" if c.rc else f"{s} none" for s, c in self.scopes.items())
        return (
            f"{key[0]}/{key[1]}: A/B RC {self.truth} "
            f"(TPOT {spec * 1000:.1f} / {self.base_tpot * 1000:.1f} ms); "
            f"guard RC {g.rc:.3f}{bounds} (TPOT {(g.spec_tpot_seconds or 0) * 1000:.1f} / "
            f"{(g.base_tpot_seconds or 0) * 1000:.1f} ms; {g.baseline_source}: {g.baseline_detail}); "
            f"by scope: {scopes}"
        )


async def measure(
    url_spec: str,
    url_nospec: str,
    tap: str,
    route: Scripted,
    mix: Sequence[loadgen.RequestClass],
    pairs: int,
    seed: int,
) -> dict[str, tuple[Ratio, float]]:
    """Per class, ``pairs`` prompts, each timed directly on both engines (the A/B, spec first and
    no-spec first in turn), with the same prompt sent through the tap at ``tap`` beside each,
    routed by ``route`` to the engine the A/B's request is on (the guard's traffic), after the
    prompt has warmed the engine's prefix cache (``warm``). The clients run in processes of their
    own (this one serves the tap), and which of the two arrives first alternates (``LEAD``).
    Returns the A/B's RC and no-spec TPOT per task type; the guard's records are in its tap."""
    out = {}
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as clients:

        async def client(url: str, delay: float, cls: loadgen.RequestClass, n: int) -> Timed:
            await asyncio.sleep(delay)
            return await loop.run_in_executor(clients, timed, url, cls, n)

        for cls in mix:
            timed_pairs = []
            for i in range(pairs):
                order = (url_spec, url_nospec) if i % 2 == 0 else (url_nospec, url_spec)
                found = {}
                for j, url in enumerate(order):
                    await asyncio.to_thread(warm, url, cls, seed + i)
                    route.to(nospec=url == url_nospec)
                    direct_first = (i // 2 + j) % 2 == 0  # each side leads on each engine half the time
                    found[url], _ = await asyncio.gather(
                        client(url, 0.0 if direct_first else LEAD, cls, seed + i),
                        client(tap, LEAD if direct_first else 0.0, cls, seed + i),
                    )
                timed_pairs.append((found[url_spec], found[url_nospec]))
            base = sum(b.decode_seconds for _, b in timed_pairs) / sum(b.tokens - 1 for _, b in timed_pairs)
            out[cls.task_type] = (ratio(timed_pairs, seed=seed, confidence=CONFIDENCE), base)
    return out


def warm(url: str, cls: loadgen.RequestClass, seed: int) -> None:
    """The prompt once on the engine, one token, untimed: both timed requests then find its prefix
    cached, so neither one's decode runs beside the other's whole prefill (which fell on whichever
    arrived first, the A/B's: up to 12% on its TPOT in a run without it)."""
    (result,) = asyncio.run(loadgen.run_load(url, [replace(cls, max_tokens=1)], 1, requests=1, seed=seed))
    assert result.ok, result


def guard_costs(records, ks: Mapping[str, int], settings, now: float) -> dict[str, dict[Key, cost.ClassCost]]:
    """The guard's RC per class on pool ``spec`` under every baseline scope, from one set of records."""
    out: dict[str, dict[Key, cost.ClassCost]] = {}
    for scope in BASELINE_SCOPES:
        found = cost.evaluate(records, ks, None, now, replace(settings, baseline_scope=scope))
        out[scope] = {(c.task_type, c.temperature_bucket): c for c in found if c.pool == "spec"}
    return out


def joint_sd(g: cost.ClassCost, t: Ratio) -> float:
    """The log standard deviation of the two points' ratio, from both intervals (at ``CONFIDENCE``,
    independent)."""
    z = 2 * NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
    return math.hypot(math.log(g.upper / g.lower) / z, math.log(t.upper / t.lower) / z)


def misses(sides: Mapping[Key, Side], report: list[str]) -> tuple[list[str], list[str]]:
    """Where the numbers disagree, strictly (an interval that misses the other's point, points more
    than ``TOLERANCE`` apart) and grossly (no live RC with an interval, points more than ``GROSS``
    apart, a side of 1.0 the A/B's interval rules out); each line says which."""
    strict, gross = [], []
    for key, side in sides.items():
        report.append(side.line(key))
        g, t = side.guard, side.truth
        name = f"{key[0]}/{key[1]}"
        if g.rc is None or g.lower is None or g.upper is None or g.baseline_source != "live":
            gross.append(f"{name}: no live RC with an interval")
            continue
        if not g.lower <= t.point <= g.upper:
            strict.append(f"{name}: the guard's interval misses the A/B's RC")
        if not t.lower <= g.rc <= t.upper:
            strict.append(f"{name}: the A/B's interval misses the guard's RC")
        if not abs(g.rc / t.point - 1.0) < TOLERANCE:
            strict.append(f"{name}: more than 10% apart")
        if not abs(g.rc / t.point - 1.0) < GROSS and abs(math.log(g.rc / t.point)) > JOINT_Z * joint_sd(g, t):
            gross.append(f"{name}: more than 25% apart, beyond both intervals' noise")
        if (t.lower > 1.0 and g.upper < 1.0) or (t.upper < 1.0 and g.lower > 1.0):
            gross.append(f"{name}: the guard's interval is on the other side of 1.0 from the A/B's")
    return strict, gross
