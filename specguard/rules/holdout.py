"""Holdout on demand: send holdout traffic to the no-spec pool only where the baseline needs it.

The live baseline of a load bucket (``cost.baseline_scope: load``) pools every no-spec request
in that bucket. A class the plan already routes to the no-spec pool feeds it for free; holdout
requests of speculating classes feed it at a price (each runs without the speculation that pays
for its class: at 5% of traffic about 4% of throughput on the simulator). So each load bucket's
holdout share is just what tops the planned no-spec traffic in the window up to 1.5 x
``cost.baseline_min_samples``, between ``guard.holdout_min_share`` and ``tap.holdout_share``.
The router reads the shares per request (``Router.set_holdout_shares``).

Pure: values in, values out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from specguard.exporters.records import RequestRecord
from specguard.rules import baseline as baseline_mod

HEADROOM = 1.5
"""No-spec requests aimed for per load bucket and window, in units of ``baseline_min_samples``."""


def shares(
    records: Iterable[RequestRecord],
    pools: Mapping[str, int],
    *,
    baseline_min_samples: int,
    min_share: float,
    max_share: float,
    baseline_scope: str = "load",
    now: float | None = None,
    window_seconds: float | None = None,
) -> dict[str, float]:
    """The holdout share per load bucket seen in ``records``: just enough for the live baseline.

    Per bucket, planned no-spec requests ``P`` already feed the baseline; the holdout draws from
    the requests of classes planned on a speculative pool (``E``: their plan and holdout routes).
    The share is ``(HEADROOM x baseline_min_samples - P) / E``, clamped to ``[min_share, max_share]``
    (``max_share`` is the tap's ``holdout_share``). While the window is still filling (``now`` minus
    the oldest record is less than ``window_seconds``), ``P`` and ``E`` are projected to a whole
    window at their rates so far. A bucket whose window holds fewer than ``baseline_min_samples``
    no-spec requests has no live baseline yet and gets ``max_share``: lowering starts once the
    baseline stands, so warm-up is as fast as with a fixed share. With ``baseline_scope`` other
    than ``load`` every class needs its own holdout, so nothing is lowered.
    """
    if baseline_scope != "load":
        return {}
    planned: Counter[str] = Counter()
    eligible: Counter[str] = Counter()
    baseline: Counter[str] = Counter()  # no-spec requests in the window, planned or holdout
    oldest = None
    for record in records:
        k = pools.get(record.pool)
        if k is None or not baseline_mod.usable_for_tpot(record):
            continue
        oldest = record.started_at if oldest is None else min(oldest, record.started_at)
        if k == 0:
            baseline[record.load_bucket] += 1
        if k == 0 and record.route == baseline_mod.ROUTE_PLAN:
            planned[record.load_bucket] += 1
        elif record.route != baseline_mod.ROUTE_PROBE:
            eligible[record.load_bucket] += 1
    scale = 1.0
    if now is not None and window_seconds and oldest is not None:
        scale = window_seconds / min(max(now - oldest, window_seconds / 10), window_seconds)
    wanted = HEADROOM * max(baseline_min_samples, 1)
    out = {}
    for bucket in sorted(set(planned) | set(eligible)):
        if baseline[bucket] < baseline_min_samples or eligible[bucket] == 0:
            out[bucket] = max_share  # no live baseline yet: fill it as fast as the ceiling allows
            continue
        need = wanted - planned[bucket] * scale
        share = need / (eligible[bucket] * scale)
        out[bucket] = min(max(share, min_share), max_share)
    return out


def for_policy(
    records: Iterable[RequestRecord],
    pools: Mapping[str, int],
    policy: Any,
    settings: Any,
    max_share: float,
    now: float | None = None,
) -> dict[str, float]:
    """The shares for ``guard.holdout: on_demand``; none for ``fixed`` (the tap's share everywhere)."""
    if getattr(policy, "holdout", "fixed") != "on_demand":
        return {}
    return shares(
        records,
        pools,
        baseline_min_samples=settings.baseline_min_samples,
        min_share=policy.holdout_min_share,
        max_share=max_share,
        baseline_scope=settings.baseline_scope,
        now=now,
        window_seconds=policy.window_seconds,
    )
