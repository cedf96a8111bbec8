"""Probe traffic by expected cost: which speculative pool a class off speculation is probed on, and how much.

A class the plan routes to the no-spec pool keeps a small share on a speculative pool, so bringing
it back is decided on measurements (``tap.probe_share``). Probing the default pool only (K=4) has
two costs: when K=4 loses but K=2 would pay, nothing ever measures K=2, so the class
never comes back; and probes on a pool with rc about 2 are the slowest requests of the class, so a
few percent of them set its TPOT p99. So, per class:

- the pool: the speculative pool with the lowest expected rc (this window's measurement with
  ``min_samples``, the class's memory of one, an exact what-if, the calibration profile, and last
  this window's measurement on fewer requests, in that order of trust); the default pool when
  nothing is known. The thin measurement keeps probes where they went: a class's probes are a few
  percent of a small class, so on a shorter K they may never reach ``min_samples`` in one window,
  and the K=4 acceptance the what-if came from ages out meanwhile;
- the share: ``probe_share`` while the expected rc is at most ``1 + COST_BUDGET / probe_share``
  (probing costs the class at most ``COST_BUDGET`` of its time), less above that, so that
  ``share x (rc - 1) <= COST_BUDGET``; never below ``probe_share x MIN_FRACTION``, so the evidence
  keeps flowing.

Pure: the router (``exporters.routing``) reads the result as a per-class override of its probe pool
and share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from specguard.rules import bestpool
from specguard.rules import policy as policy_mod
from specguard.rules.evidence import ClassKey, Evidence

COST_BUDGET = 0.005
"""Expected slowdown of a class's tokens that its probes may cost (0.5%)."""
MIN_FRACTION = 0.1
"""A probe share never falls below this fraction of ``probe_share``."""
THIN = "measured (thin)"
"""The basis of a measurement on fewer than ``min_samples`` requests (the last resort)."""


@dataclass(frozen=True)
class Probe:
    """Where and how much one class off speculation is probed, and why."""

    pool: str
    share: float
    expected_rc: float | None
    basis: str

    @property
    def reason(self) -> str:
        rc = "unknown" if self.expected_rc is None else f"{self.expected_rc:.3f} ({self.basis})"
        return f"probe {self.pool} at {self.share:.2%}: expected rc {rc}"


def expected(
    evidence: Evidence, memory: Mapping[str, tuple[float, ...]], now: float, policy: policy_mod.Policy
) -> dict[str, bestpool.Estimate]:
    """Every speculative pool's expected rc for a class, whichever pool it is on now."""
    needed = bestpool.min_samples(policy)
    out: dict[str, bestpool.Estimate] = {}
    for name, (rc, samples) in bestpool.measured(evidence, policy).items():
        out[name] = bestpool.Estimate(name, rc, bestpool.MEASURED, samples)
    for name, (rc, at, *_) in memory.items():
        if name not in out and now - at < policy.memory_seconds and math.isfinite(rc):
            out[name] = bestpool.Estimate(name, rc, bestpool.MEMORY)
    for name, found in evidence.pools.items():
        rc = found.values.get("rc")
        exact = found.predicted and found.method == "histogram" and found.samples >= needed
        if name not in out and exact and rc is not None and math.isfinite(rc):
            out[name] = bestpool.Estimate(name, rc, bestpool.WHATIF, found.samples)
    if policy.prior == "profile":
        for name, rc in evidence.prior.items():
            if name not in out and math.isfinite(rc):
                out[name] = bestpool.Estimate(name, rc, bestpool.PROFILE)
    for name, found in evidence.pools.items():
        rc = found.values.get("rc")
        if (
            name not in out
            and not found.predicted
            and found.samples > 0
            and rc is not None
            and math.isfinite(rc)
        ):
            out[name] = bestpool.Estimate(name, rc, THIN, found.samples)
    return {name: e for name, e in out.items() if policy.pools.get(name, 0) > 0}


def share_for(expected_rc: float | None, probe_share: float) -> float:
    """The probe share for a pool expected at ``expected_rc`` (``probe_share`` when unknown)."""
    if expected_rc is None or expected_rc <= 1.0:
        return probe_share
    return max(probe_share * MIN_FRACTION, min(probe_share, COST_BUDGET / (expected_rc - 1.0)))


def choose(
    evidence: Evidence,
    memory: Mapping[str, tuple[float, ...]],
    now: float,
    policy: policy_mod.Policy,
    probe_share: float,
) -> Probe:
    """The probe of one class: the cheapest expected speculative pool and its share."""
    found = expected(evidence, memory, now, policy)
    if not found:
        default = policy.default_pool or next((p for p, k in policy.pools.items() if k > 0), "")
        return Probe(default, probe_share, None, "")
    best = min(found.values(), key=lambda e: (e.rc, -policy.pools.get(e.pool, 0), e.pool))
    return Probe(best.pool, share_for(best.rc, probe_share), best.rc, best.basis)


def plan(
    states: Mapping[ClassKey, object],
    evidence: Mapping[ClassKey, Evidence],
    now: float,
    policy: policy_mod.Policy,
    probe_share: float,
) -> dict[ClassKey, Probe]:
    """The probe of every class the plan sends to the no-spec pool (``states``: guard class states)."""
    out = {}
    for key, state in states.items():
        if getattr(state, "pool", None) != policy.nospec_pool:
            continue
        out[key] = choose(
            evidence.get(key, Evidence()), getattr(state, "memory", {}), now, policy, probe_share
        )
    return out
