"""Holdout: how much of the speculating classes' traffic the no-spec pool gets for the live baseline.

``guard.holdout`` picks the mode (the router reads it; ``router_mode``):

- ``capacity_matched``: no share at all; the router sends a request planned on a
  speculative pool to the no-spec pool while that pool's load per replica is below the planned
  pool's (a tie: by replica share; ``exporters.routing``), so the no-spec replicas run at the fleet's
  per-replica load and the live baseline covers every load bucket the fleet runs at;
- ``on_demand``: per load bucket, just as much of ``tap.holdout_share`` as keeps the live baseline
  filled (``shares``, below);
- ``matched_on_demand`` (default): ``on_demand``, and capacity matched in a load bucket only while its
  live baseline is short (``short_buckets``): the no-spec replicas climb to the fleet's load there
  until the window holds ``cost.baseline_min_samples`` requests at that load, then fall back.
  Capacity matching all the time costs the no-spec replicas' share of the fleet (a quarter of a
  4-engine fleet in the demo's replays); refilling costs that share only while a bucket refills, and the model
  baseline (``rules.modelbase``) is still fitted on live points at every load;
- ``fixed``: ``tap.holdout_share`` everywhere.

On demand: the live baseline of a load bucket can pool every no-spec request in that bucket (every
``cost.baseline_scope`` but ``class_then_load``: a class short of its own is read at every
class's level, adjusted for its load and context). A class the plan already routes to the no-spec
pool feeds it for free; holdout requests of speculating classes feed it at a price (each runs
without the speculation that pays for its class: at 5% of traffic about 4% of throughput on the
simulator). So each load bucket's holdout share is just what tops the planned no-spec traffic up to 1.5 x
``cost.baseline_min_samples`` per window, between ``guard.holdout_min_share`` and
``tap.holdout_share``. Rates are taken over the recent quarter of the window, not the whole
window: when planned no-spec traffic stops (a class moved back to speculation) the share rises
before the old planned requests age out of the window, so the baseline never lapses while the
bucket carries traffic.

Pure: values in, values out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specguard.exporters import routing
from specguard.exporters.records import RequestRecord
from specguard.rules import baseline as baseline_mod
from specguard.rules.cost_config import POOLED_SCOPES

HEADROOM = 1.5
"""No-spec requests aimed for per load bucket and window, in units of ``baseline_min_samples``."""
RECENT = 0.25
"""Share of the window whose rates stand for the next window (on demand)."""
FEED_FOR_FREE = (routing.ROUTE_PLAN, routing.ROUTE_SPREAD)
"""Routes of no-spec requests the baseline gets without a holdout: the plan's and the spread's."""
NOT_DRAWN = (routing.ROUTE_PROBE, routing.ROUTE_SPREAD)
"""Routes the router takes before any holdout draw: their requests are never held out."""
CAPACITY_MATCHED = "capacity_matched"
MATCHED_ON_DEMAND = "matched_on_demand"
ON_DEMAND_MODES = ("on_demand", MATCHED_ON_DEMAND)


@dataclass(frozen=True)
class Holdout:
    """What the router holds out for the next interval: shares per load bucket, and the load buckets
    where it matches capacity instead (``matched_on_demand``: their live baseline is short)."""

    shares: dict[str, float] = field(default_factory=dict)
    matched: frozenset[str] = frozenset()


def router_mode(policy: Any) -> str:
    """The router's holdout mode for ``guard.holdout``: ``capacity_matched``, ``matched_on_demand``
    (capacity matched in the buckets ``Holdout.matched`` names, shares elsewhere) or ``share``."""
    mode = getattr(policy, "holdout", "")
    return mode if mode in (CAPACITY_MATCHED, MATCHED_ON_DEMAND) else "share"


def shares(
    records: Iterable[RequestRecord],
    pools: Mapping[str, int],
    *,
    baseline_min_samples: int,
    min_share: float,
    max_share: float,
    baseline_scope: str = "class_then_geometry",
    now: float | None = None,
    window_seconds: float | None = None,
) -> dict[str, float]:
    """The holdout share per load bucket seen in ``records``: just enough for the live baseline.

    Per bucket, no-spec requests the plan or the spread sends ``P`` already feed the baseline; the
    holdout draws from the other requests the router has not sent by the spread or a probe (``E``).
    The share is ``(HEADROOM x baseline_min_samples - P) / E``, clamped to ``[min_share, max_share]``
    (``max_share`` is the tap's ``holdout_share``), with ``P`` and ``E`` the rates over the recent
    ``RECENT`` part of the window (or since the oldest record, if later) projected to a whole
    window. A bucket whose window holds fewer than ``baseline_min_samples`` no-spec requests has no
    live baseline yet and gets ``max_share``: lowering starts once the baseline stands, so warm-up
    is as fast as with a fixed share. Without ``now`` and ``window_seconds`` the counts over all
    ``records`` are used as they are. With ``baseline_scope: class_then_load`` every class needs
    its own holdout, so nothing is lowered.
    """
    if baseline_scope not in POOLED_SCOPES:
        return {}
    usable = [r for r in records if pools.get(r.pool) is not None and baseline_mod.usable_for_tpot(r)]
    baseline: Counter[str] = Counter()  # no-spec requests in the window, planned or holdout
    for record in usable:
        if pools[record.pool] == 0:
            baseline[record.load_bucket] += 1
    since, scale = None, 1.0
    if now is not None and window_seconds and usable:
        oldest = min(r.started_at for r in usable)
        span = min(max(now - oldest, window_seconds / 10), window_seconds * RECENT)
        since, scale = now - span, window_seconds / span
    planned: Counter[str] = Counter()
    eligible: Counter[str] = Counter()
    seen: set[str] = set()
    for record in usable:
        seen.add(record.load_bucket)
        if since is not None and record.started_at < since:
            continue
        if pools[record.pool] == 0 and record.route in FEED_FOR_FREE:
            planned[record.load_bucket] += 1
        elif record.route not in NOT_DRAWN:
            eligible[record.load_bucket] += 1
    wanted = HEADROOM * max(baseline_min_samples, 1)
    out = {}
    for bucket in sorted(seen):
        if not (planned[bucket] or eligible[bucket]):
            continue  # nothing recent in this bucket: the tap's share stands
        if baseline[bucket] < baseline_min_samples or eligible[bucket] == 0:
            out[bucket] = max_share  # no live baseline yet: fill it as fast as the ceiling allows
            continue
        need = wanted - planned[bucket] * scale
        share = need / (eligible[bucket] * scale)
        out[bucket] = min(max(share, min_share), max_share)
    return out


def short_buckets(
    records: Iterable[RequestRecord],
    pools: Mapping[str, int],
    *,
    baseline_min_samples: int,
    since: float | None = None,
    lasting_from: float | None = None,
) -> frozenset[str]:
    """Load buckets where speculative traffic ran (since ``since``) and fewer than
    ``baseline_min_samples`` no-spec requests at that load will still be in the window soon (started
    at or after ``lasting_from``): the live baseline is short or about to lapse, so the router
    matches capacity there until it is filled again. A refill lands in a burst and ages out in one,
    so the refill starts before the old one leaves the window, not after. The threshold is the
    baseline's own minimum, not the on-demand share's ``HEADROOM``: a bucket the share keeps filled
    (the loads the no-spec pool reaches with it) is never refilled on top."""
    baseline: Counter[str] = Counter()
    speculating: set[str] = set()
    for record in records:
        k = pools.get(record.pool)
        if k is None or not baseline_mod.usable_for_tpot(record):
            continue
        if k == 0:
            if lasting_from is None or record.started_at >= lasting_from:
                baseline[record.load_bucket] += 1
        elif record.route != routing.ROUTE_PROBE and (since is None or record.started_at >= since):
            speculating.add(record.load_bucket)
    return frozenset(b for b in speculating if baseline[b] < max(baseline_min_samples, 1))


def for_policy(
    records: Iterable[RequestRecord],
    pools: Mapping[str, int],
    policy: Any,
    settings: Any,
    max_share: float,
    now: float | None = None,
) -> Holdout:
    """The holdout for ``guard.holdout``: shares for ``on_demand``, shares and short buckets for
    ``matched_on_demand``; nothing for ``fixed`` (the tap's share everywhere) or ``capacity_matched``
    (the router matches loads everywhere)."""
    mode = getattr(policy, "holdout", "fixed")
    if mode not in ON_DEMAND_MODES:
        return Holdout()
    records = list(records)
    found = shares(
        records,
        pools,
        baseline_min_samples=settings.baseline_min_samples,
        min_share=policy.holdout_min_share,
        max_share=max_share,
        baseline_scope=settings.baseline_scope,
        now=now,
        window_seconds=policy.window_seconds,
    )
    if mode != MATCHED_ON_DEMAND or settings.baseline_scope not in POOLED_SCOPES:
        return Holdout(found)
    since = lasting_from = None
    if now is not None:  # recent speculative traffic; no-spec requests still in the window in two intervals
        since = now - policy.window_seconds * RECENT
        lasting_from = now - policy.window_seconds + 2 * policy.interval_seconds
    matched = short_buckets(
        records,
        pools,
        baseline_min_samples=settings.baseline_min_samples,
        since=since,
        lasting_from=lasting_from,
    )
    return Holdout(found, matched)
