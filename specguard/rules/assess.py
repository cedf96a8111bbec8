"""One rule's verdict on one pool at one evaluation, in the guard's single phase vocabulary.

``ok / act / hold / error``, ordered best to worst by one precedence (error > act > hold > ok)
that every roll-up uses: a class's evaluation is the worst of its rules' verdicts. Too little
data is hold; a failing source is error (never a failure); only a value past a threshold is act.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from specguard.rules import policy as policy_mod
from specguard.rules.evidence import Evidence, PoolEvidence


class Phase(StrEnum):
    OK = "ok"
    HOLD = "hold"
    ACT = "act"
    ERROR = "error"


PRECEDENCE = (Phase.OK, Phase.HOLD, Phase.ACT, Phase.ERROR)  # best to worst; the worst wins


def worst(phases: Iterable[Phase]) -> Phase:
    return max(phases, key=PRECEDENCE.index, default=Phase.OK)


@dataclass(frozen=True)
class Assessment:
    """One rule's verdict on one pool at one evaluation."""

    rule: policy_mod.Rule
    pool: str
    phase: Phase
    reason: str
    value: float | None = None
    samples: int | None = None
    predicted: bool = False

    def numbers(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pool": self.pool, "phase": self.phase.value}
        if self.value is not None:
            out["value"] = round(self.value, 6)
        if self.samples is not None:
            out["samples"] = self.samples
        if self.predicted:
            out["predicted"] = True
        if self.rule.dry_run:
            out["dry_run"] = True
        return out


ALERT_NAMES_SHOWN = 5
"""A reason names at most this many alerts (a flood of alerts must not make every reason huge)."""


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:ALERT_NAMES_SHOWN])
    more = len(names) - ALERT_NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


RC_MEASURES = ("rc", "rc_lower", "rc_upper")


def bound_for(rule: policy_mod.Rule, restoring: bool) -> str:
    """The RC bound a rule on an RC measure reads, whatever it names and whatever the baseline:
    a move is made only when the interval's bound is past the threshold, never on a point
    estimate. Bad for ``above`` means the lower bound is above; good (restoring) means the upper
    bound is below (mirrored for ``below``)."""
    above = rule.direction == "above"
    if restoring:
        return "rc_upper" if above else "rc_lower"
    return "rc_lower" if above else "rc_upper"


def assess(
    rule: policy_mod.Rule,
    pool: str,
    evidence: Evidence,
    policy: policy_mod.Policy,
    *,
    restoring: bool,
    load_bucket: str = "",
) -> Assessment | None:
    """A rule's verdict on ``pool`` for a class at ``load_bucket``; None when the rule has no
    opinion (no alert applies)."""
    if rule.name == "alertmanager":
        relevant = [a for a in evidence.alerts if a.pool in (None, pool)]
        if not relevant:
            return None
        firing = sorted({a.alertname for a in relevant if a.firing})
        if firing:
            return Assessment(rule, pool, Phase.ACT, f"alert {_names(firing)} firing")
        return Assessment(
            rule, pool, Phase.OK, f"alert {_names(sorted({a.alertname for a in relevant}))} resolved"
        )
    if evidence.error is not None:
        return Assessment(rule, pool, Phase.ERROR, f"data source error: {evidence.error}")
    found: PoolEvidence | None = evidence.pools.get(pool)
    if found is None:
        return Assessment(rule, pool, Phase.HOLD, f"no data for pool {pool}")
    if rule.name in found.errors:
        return Assessment(rule, pool, Phase.ERROR, f"query failed: {found.errors[rule.name]}")
    exact = found.predicted and found.method == "histogram"  # acceptance measured at a longer K
    if found.predicted and restoring and not policy.restore_on_prediction and not exact:
        return Assessment(rule, pool, Phase.HOLD, f"only a prediction for pool {pool}", predicted=True)
    if found.predicted and not restoring:  # the pool the class is on: judged on measurements only
        return Assessment(
            rule, pool, Phase.HOLD, f"not measured on {pool} yet (only a prediction)", predicted=True
        )
    measure = (rule.restore_measure or rule.measure) if restoring else rule.measure
    if rule.query is None and found.samples < rule.limits.min_samples:
        return Assessment(
            rule,
            pool,
            Phase.HOLD,
            f"samples ({found.samples}) < min_samples ({rule.limits.min_samples})",
            samples=found.samples,
            predicted=found.predicted,
        )
    name = measure or rule.name
    note = ""
    if name in RC_MEASURES and rule.query is None:
        bound = bound_for(rule, restoring)
        if bound != name:
            note = f"judged on the interval bound {bound}, not {name} (no move on a point estimate)"
        name = bound
    value = found.values.get(name)
    if value is None or math.isnan(value):
        why = " (no baseline yet)" if found.baseline_source == "none" else ""
        why = why or (" (no interval)" if name in RC_MEASURES else "")
        return Assessment(rule, pool, Phase.HOLD, f"no value for {name}{why}", samples=found.samples)
    side = "<" if rule.direction == "above" else ">"
    if restoring:
        if rule.is_good(value):
            reason = f"{name} ({value:.3f}) {side} restore_threshold ({rule.restore_threshold})"
            phase = Phase.OK
        else:
            reason = f"{name} ({value:.3f}) not {side} restore_threshold ({rule.restore_threshold})"
            phase = Phase.ACT
    elif rule.is_bad(value):
        reason = (
            f"{name} ({value:.3f}) {'>' if rule.direction == 'above' else '<'} threshold ({rule.threshold})"
        )
        phase = Phase.ACT
    else:
        reason = f"{name} ({value:.3f}) within threshold ({rule.threshold})"
        phase = Phase.OK
    if rule.query is not None:
        reason = f"{reason} [PromQL for {pool} at load {load_bucket}, now]"
    else:  # every number says which measurement, when, at which load bucket, on which pool
        reason = f"{reason} [{found.provenance(load_bucket, policy.window_seconds)}]"
    if note:
        reason = f"{reason}; {note}"
    if found.note:  # e.g. a loss inherited from a lower load bucket: say where the number came from
        reason = f"{reason}; {found.note}"
    return Assessment(
        rule, pool, phase, reason, value=value, samples=found.samples, predicted=found.predicted
    )
