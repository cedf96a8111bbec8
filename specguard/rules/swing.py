"""A load that swings faster than the evaluation interval: detected, and one plan held for both loads.

The planner's demand is the mean over the last few evaluation intervals (``rules.planfeed``). A
load that jumps between two levels faster than that is planned for a level it never runs at, and
the next evaluation's plan may differ only by where the window cut the swing. So:

- **Detection** (``detect``): the window's requests in decode, fleet-wide, over the last
  ``INTERVALS`` evaluation intervals in slices of a ``SLICES``-th of an interval (the newest slice
  left out: requests still running are not in the window yet, so it always reads low). A swing
  crosses the middle between its highest and lowest slice at least ``CROSSINGS`` times, the highest
  at least ``RATIO`` times the lowest, and holds each level between two crossings for at least
  ``MIN_RUN`` slices: a step or a ramp crosses once, a burst twice, a stall of the machine for a
  slice is no level.
- **Two loads**: each class's demand averaged over the slices above the middle (the high load) and
  over those below (the low load), weighted by the share of slices at each.
- **One plan held** (``hold``): the planner's plans for the mean, the high and the low load, and
  the plan now, each priced on both loads (tokens per second, weighted by time at each). The
  candidate with the fewest classes above their SLO at either load, then the most tokens, is held;
  it replaces the plan now only when it gains the planner's margin. Every move in it passed the
  planner's worst-case test at the load it was planned for.

Pure: values in, a plan out.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from specguard.rules import planner
from specguard.rules.evidence import ClassKey

INTERVALS = 4
SLICES = 4
RATIO = 2.0
CROSSINGS = 3
MIN_RUN = 2


@dataclass(frozen=True)
class Swing:
    """Two loads a fleet swings between: requests in decode per key at each, and the time share high."""

    high: Mapping[ClassKey, float]
    low: Mapping[ClassKey, float]
    high_share: float
    peak: float  # the fleet's requests in decode, highest slice
    trough: float  # and lowest


def detect(slices: Sequence[Mapping[ClassKey, float]]) -> Swing | None:
    """A swing in per-slice demand, oldest first (the newest slice already left out), or None."""
    totals = [sum(s.values()) for s in slices]
    if len(totals) < CROSSINGS + 1:
        return None
    peak, trough = max(totals), min(totals)
    if peak <= 0 or peak < RATIO * trough:
        return None
    middle = (peak + trough) / 2
    high = [t > middle for t in totals]
    runs = [len(list(group)) for _, group in itertools.groupby(high)]
    if len(runs) - 1 < CROSSINGS or min(runs[1:-1], default=MIN_RUN) < MIN_RUN:
        return None  # too few crossings, or a level held for less than MIN_RUN slices: jitter
    return Swing(
        _mean([s for s, h in zip(slices, high, strict=True) if h]),
        _mean([s for s, h in zip(slices, high, strict=True) if not h]),
        sum(high) / len(high),
        peak,
        trough,
    )


def _mean(slices: Sequence[Mapping[ClassKey, float]]) -> dict[ClassKey, float]:
    out: dict[ClassKey, float] = {}
    for s in slices:
        for key, n in s.items():
            out[key] = out.get(key, 0.0) + n / len(slices)
    return out


def hold(inp: planner.PlanInput, planned: planner.Plan) -> planner.Plan:
    """The one plan held for both loads of a swing (``inp.scenarios``: the time share and demand of
    the high load, then the low), given the planner's plan for the mean load."""
    loads = [(weight, replace(inp, demand=demand, scenarios=())) for weight, demand in inp.scenarios]
    candidates: dict[str, tuple[Mapping[ClassKey, str], planner.Plan | None]] = {
        "now": (dict(inp.current), None),
        "the mean load's": (planned.pools, planned),
    }
    for label, (_, sub) in zip(("the high load's", "the low load's"), loads, strict=False):
        found = planner.plan(sub)
        candidates[label] = (found.pools, found)

    def score(assignment: Mapping[ClassKey, str]) -> tuple[int, float]:
        breaks, tokens = 0, 0.0
        for weight, sub in loads:
            got, _ = planner.tokens_of(sub, assignment)
            tokens += weight * got
            breaks += len(planner.slo_breaks(sub, assignment))
        return breaks, tokens

    scores = {label: score(pools) for label, (pools, _) in candidates.items()}
    label = min(scores, key=lambda name: (scores[name][0], -scores[name][1], name != "now"))
    breaks_now, tokens_now = scores["now"]
    breaks, tokens = scores[label]
    if breaks == breaks_now and tokens <= tokens_now * (1 + inp.margin):
        label, breaks, tokens = "now", breaks_now, tokens_now
    pools, source = candidates[label]
    (share, high), (_, low) = inp.scenarios
    peak, trough = (sum(d.in_flight for d in demand.values()) for demand in (high, low))
    what = (
        f"one plan held for a load swinging between {trough:.1f} and {peak:.1f} requests in decode, "
        f"faster than the evaluation interval ({share:.0%} of the time high)"
    )
    reasons = {}
    for key in inp.current:
        pool = pools.get(key, inp.current[key])
        if pool != inp.current[key]:
            reasons[key] = (
                f"move {inp.current[key]} -> {pool}: {what}: {label} plan gains "
                f"{tokens - tokens_now:.1f} tokens/s over the plan now at both loads"
            )
        else:
            reasons[key] = f"stays on {pool}: {what}"
    return planner.Plan(
        {key: pools.get(key, here) for key, here in inp.current.items()},
        reasons,
        source.benefit_lower if source is not None else 0.0,
        tokens,
        tokens_now,
        dict(source.exact) if source is not None else {},
        sum(p.nodes for _, p in candidates.values() if p is not None),
    )
