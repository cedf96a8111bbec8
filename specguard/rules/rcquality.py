"""How much an RC number says: enough evidence, too little (an interval too wide to be a number),
or a model-baseline RC that contradicts what was measured at the neighbouring loads.

- **Not enough evidence**: the interval holds 1.0 and spans more than ``MAX_SPREAD`` (its upper
  bound over its lower, e.g. ``[0.40, 1.70]``: the RC is not known within a factor of 2 either
  way, and whether speculation pays is open), or it has no interval at all. Then the point estimate
  is no number to show or export; the bounds still are. A wide interval wholly on one side of 1.0
  (``[0.18, 0.98]``) is evidence enough for the verdict, and is shown as a number with it.
- **Contradicted**: an RC on the ``model`` baseline at one load bucket that sits on the other side
  of 1.0 from a measured (live or profile) RC of the same class and pool at the nearest bucket
  below or above with one,
  against the direction load moves RC: a loss measured at the lower load while the model says it
  pays at the higher one, or a gain measured at the higher load while the model says it loses at
  the lower one. On a speculative pool extra verify tokens ride along almost free at low load and
  compete with real requests at high load, so a measured loss does not turn into a gain as load
  rises (docs/guard.md). A flag, not a correction: the number is shown with its contradiction.

Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

MAX_SPREAD = 4.0
"""An interval holding 1.0 with upper / lower above this is not enough evidence for a number."""

ENOUGH = "enough"
NOT_ENOUGH = "not_enough_evidence"
CONTRADICTED = "contradicted"
UNKNOWN = "unknown"
STATES = (ENOUGH, NOT_ENOUGH, CONTRADICTED, UNKNOWN)
WORDS = {NOT_ENOUGH: "not enough evidence", UNKNOWN: "unknown"}
MEASURED = ("live", "profile")


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def enough(rc: float | None, lower: float | None, upper: float | None) -> str:
    """``ENOUGH``, ``NOT_ENOUGH`` (too wide to tell whether it pays, or no interval) or ``UNKNOWN``."""
    if not _finite(rc):
        return UNKNOWN
    if not (_finite(lower) and _finite(upper)):
        return NOT_ENOUGH
    wide = lower <= 0 or upper / lower > MAX_SPREAD
    return NOT_ENOUGH if wide and lower <= 1.0 <= upper else ENOUGH


def _key(c: Any) -> tuple[str, str, str]:
    return (c.task_type, c.temperature_bucket, c.pool)


def contradiction(cost: Any, costs: Iterable[Any], order: Sequence[str]) -> str | None:
    """Why ``cost`` (a ``ClassCost``) on the model baseline contradicts a measured neighbour, or None."""
    if cost.baseline_source != "model" or not _finite(cost.rc) or cost.load_bucket not in order:
        return None
    here = order.index(cost.load_bucket)
    same = {c.load_bucket: c for c in costs if _key(c) == _key(cost) and c.baseline_source in MEASURED}

    def measured(c: Any) -> bool:
        return enough(c.rc, c.lower, c.upper) == ENOUGH and getattr(c, "status", "ok") == "ok"

    below = [same[b] for b in reversed(order[:here]) if b in same and measured(same[b])]
    above = [same[b] for b in order[here + 1 :] if b in same and measured(same[b])]
    for step, nearest in ((-1, below[:1]), (1, above[:1])):
        if not nearest:
            continue
        other = nearest[0]
        if step < 0 and cost.rc < 1.0 and other.lower > 1.0:
            return (
                f"the model baseline says it pays here ({cost.rc:.2f}), but at the lower load "
                f"{other.load_bucket} it measured a loss ({other.rc:.2f} [{other.lower:.2f}, "
                f"{other.upper:.2f}], {other.baseline_source}): a loss does not turn into a gain as "
                "load rises"
            )
        if step > 0 and cost.rc > 1.0 and other.upper < 1.0:
            return (
                f"the model baseline says it loses here ({cost.rc:.2f}), but at the higher load "
                f"{other.load_bucket} it measured a gain ({other.rc:.2f} [{other.lower:.2f}, "
                f"{other.upper:.2f}], {other.baseline_source}): a gain there means one at lower load too"
            )
    return None


def grade(cost: Any, costs: Iterable[Any] = (), order: Sequence[str] = ()) -> tuple[str, str | None]:
    """(state, why) of one ``ClassCost``: too wide first, then contradicted, else enough/unknown."""
    state = enough(cost.rc, cost.lower, cost.upper)
    if state == ENOUGH:
        why = contradiction(cost, list(costs), order)
        if why is not None:
            return CONTRADICTED, why
    return state, None


def shown(
    rc: float | None, lower: float | None, upper: float | None, digits: int = 2, state: str | None = None
) -> str:
    """An RC as a person reads it: ``1.37 [1.13, 1.66]``, ``not enough evidence [0.00, 141.14]``,
    ``unknown``; a space always stands between the number and its interval. ``state`` (from
    ``grade``) is used when given: the number may already have been withheld."""
    state = state or enough(rc, lower, upper)
    interval = f" [{lower:.{digits}f}, {upper:.{digits}f}]" if _finite(lower) and _finite(upper) else ""
    if state == NOT_ENOUGH:
        return WORDS[NOT_ENOUGH] + interval
    if state == UNKNOWN or not _finite(rc):
        return WORDS[UNKNOWN]
    return f"{rc:.{digits}f}{interval}"
