"""Where a class goes when a rule moves it: the pool to leave a hurting pool for (a shorter K whose
rc is good even at its interval's upper bound, else no speculation), and the pool to restore
towards (up to the default pool's K; a shorter K also on an exact what-if, so a class turned off
can come back to K=2 when K=4 loses).
Pure functions of the class state, its evidence and the policy (``rules.guard`` calls them).
"""

from __future__ import annotations

import math
from typing import Any

from specguard.rules import policy as policy_mod
from specguard.rules.classstate import ClassState
from specguard.rules.evidence import Evidence


def k_of(policy: policy_mod.Policy, pool: str) -> int:
    return policy.pools.get(pool, 0)


def _estimate(evidence: Evidence, pool: str) -> tuple[float, bool, int, float | None] | None:
    """``(rc, predicted, samples, upper bound or None)`` of ``pool``'s evidence."""
    found = evidence.pools.get(pool)
    if found is None or found.values.get("rc") is None or math.isnan(found.values["rc"]):
        return None
    upper = found.values.get("rc_upper")
    return (
        found.values["rc"],
        found.predicted,
        found.samples,
        None if upper is None or math.isnan(upper) else upper,
    )


def lower_target(
    state: ClassState, evidence: Evidence, policy: policy_mod.Policy
) -> tuple[str, str, dict[str, Any]] | None:
    """(action, pool, numbers) when a watched pool must be left; None if there is nowhere to go."""
    nospec = policy.nospec_pool
    if state.pending is not None:
        return ("revert", nospec, {"predicted_rc": state.pending.predicted_rc}) if nospec else None
    current_k = k_of(policy, state.pool)
    best: tuple[float, str, bool] | None = None
    if policy.shorten:
        min_samples = min((r.limits.min_samples for r in policy.rules), default=0)
        for pool, k in policy.pools.items():
            if not 0 < k < current_k:
                continue
            estimate = _estimate(evidence, pool)
            # a shorter K on its interval's upper bound, never its point: else off
            if estimate is None or estimate[2] < min_samples or estimate[3] is None:
                continue
            if not estimate[3] < policy.shorten_max_rc:
                continue
            if best is None or estimate[0] < best[0]:
                best = (estimate[0], pool, estimate[1])
    if best is not None:
        return "shorten", best[1], {"target_rc": round(best[0], 6), "target_predicted": best[2]}
    if nospec and nospec != state.pool:
        return "off", nospec, {}
    return None


def exact_prediction(evidence: Evidence, pool: str, policy: policy_mod.Policy) -> bool:
    """Whether ``pool``'s evidence is a what-if whose acceptance was measured, not modelled.

    A shorter K's accept length follows exactly from the per-position acceptance measured on a
    longer K (``method: histogram``); with at least ``min_samples`` requests behind it (an off
    class's probes, say) it may restore a class, pending a measurement there.
    """
    found = evidence.pools.get(pool)
    needed = min((r.limits.min_samples for r in policy.rules if r.query is None), default=0)
    return found is not None and found.predicted and found.method == "histogram" and found.samples >= needed


def recover_candidate(state: ClassState, evidence: Evidence, policy: policy_mod.Policy) -> str | None:
    """The pool to restore towards: the lowest-rc spec pool above the current K, up to the default's K.

    A pool's rc is its measurement, or an exact what-if (``exact_prediction``) unless the class's
    memory holds a measurement of that pool (which then wins); other predictions only with
    ``restore_on_prediction``.
    """
    default = policy.default_pool
    if not default or state.pool == default or state.pending is not None:
        return None
    current_k, default_k = k_of(policy, state.pool), k_of(policy, default)
    best: tuple[float, str] | None = None
    for pool, k in policy.pools.items():
        if not current_k < k <= default_k:
            continue
        estimate = _estimate(evidence, pool)
        if estimate is None:
            continue
        if estimate[1] and not policy.restore_on_prediction:
            remembered = pool in state.memory
            if remembered or not exact_prediction(evidence, pool, policy):
                continue
        if best is None or estimate[0] < best[0]:
            best = (estimate[0], pool)
    return best[1] if best is not None else default
