"""One pool, no routing: RC per class on a pool that runs an in-engine K schedule, and where it loses.

A team with one pool turns speculation down with load inside the engine (``specguard.schedules``).
There is no second pool to route a class to and no no-spec pool to hold out to, so the baseline
is the step-cost model (``rules.modelbase``) fitted on the pool's own steps: the requests that
verified no draft at all (the schedule ran K = 0 at their loads) are that engine's steps without
speculation, and stand for a no-spec pool in the fit (``baseline_records``); the speculating
requests give its speculative line. A fresh calibration profile, when there is one, comes first
(``rules.baseline``).

A schedule cuts K for every class at a batch size; a class whose RC's lower bound is above 1.0 at a
load where the schedule speculates loses there, and only routing could spare it (``losses``): the
guard says so in ``status``, in ``specguard_schedule_class_loses`` and the alert on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from specguard import schedules
from specguard.exporters.records import RequestRecord
from specguard.rules import profile as profile_mod

NOSPEC_SUFFIX = "@K=0"  # the pseudo pool a scheduled pool's K = 0 requests stand in for the fit


def of_pools(pools: Any) -> dict[str, schedules.Schedule]:
    """``{pool: schedule}`` of the pool objects (``k_schedule``) that run one; {} for anything else."""
    if isinstance(pools, Mapping):
        return {}
    return {str(p.name): p.k_schedule for p in pools if getattr(p, "k_schedule", None) is not None}


def baseline_records(
    records: Sequence[RequestRecord], ks: Mapping[str, int], scheduled: Mapping[str, schedules.Schedule]
) -> tuple[list[RequestRecord], dict[str, int]]:
    """The records and pool Ks the model baseline is fitted on: a scheduled pool's requests that
    verified no draft (per-request stats with zero verify rounds) as its engine's no-spec steps."""
    if not scheduled:
        return list(records), dict(ks)
    out, kinds = [], dict(ks)
    for r in records:
        if r.pool in scheduled and r.spec is not None and r.spec.rounds == 0 and r.output_tokens >= 2:
            pseudo = r.pool + NOSPEC_SUFFIX
            kinds[pseudo] = 0
            out.append(replace(r, pool=pseudo))
        else:
            out.append(r)
    return out, kinds


def ks_at(
    ks: Mapping[str, int], scheduled: Mapping[str, schedules.Schedule], band: tuple[float, float] | None
) -> dict[str, int]:
    """Each pool's K in the load bucket ``band``: a scheduled pool's at the bucket's representative
    concurrency (what a what-if onto it predicts at), the others' fixed K."""
    if band is None or not scheduled:
        return dict(ks)
    at = profile_mod.representative_concurrency(*band)
    return {name: schedules.k_at_load(k, scheduled.get(name), at) for name, k in ks.items()}


def k_range(schedule: schedules.Schedule, low: float, high: float, top: int = 4096) -> tuple[int, int]:
    """(lowest, highest) K the schedule runs for batch sizes in ``(low, high]`` (an open bucket up
    to ``top``)."""
    first = int(low) + 1
    last = int(min(high, top))
    ks = [schedule.k_at(b) for b in range(first, max(first, last) + 1)]
    return min(ks), max(ks)


@dataclass(frozen=True)
class Loss:
    """A class that loses on a scheduled pool at a load bucket where the schedule speculates."""

    task_type: str
    temperature_bucket: str
    load_bucket: str
    pool: str
    rc: float | None
    lower: float
    k: tuple[int, int]  # the schedule's K range in the bucket
    baseline_source: str

    def to_json(self) -> dict:
        return {
            "task_type": self.task_type,
            "temperature_bucket": self.temperature_bucket,
            "load_bucket": self.load_bucket,
            "pool": self.pool,
            "rc": self.rc,
            "rc_lower": self.lower,
            "schedule_k": list(self.k),
            "baseline_source": self.baseline_source,
        }

    def line(self) -> str:
        k = f"K={self.k[1]}" if self.k[0] == self.k[1] else f"K={self.k[0]}-{self.k[1]}"
        return (
            f"{self.task_type}/{self.temperature_bucket} loses at load {self.load_bucket} on {self.pool}, "
            f"where its schedule runs {k}: RC lower bound {self.lower:.2f} "
            f"({self.baseline_source} baseline); "
            "a batch-size schedule cannot spare one class: route it to a pool without speculation"
        )


def losses(
    costs: Iterable[Any],
    scheduled: Mapping[str, schedules.Schedule],
    bucket_range: Any,
) -> list[Loss]:
    """Every (class, load bucket) on a scheduled pool whose RC interval is above 1.0 where the
    schedule speculates. ``costs``: ``rules.cost.ClassCost``; ``bucket_range(name)``: its load band."""
    out = []
    for c in costs:
        schedule = scheduled.get(c.pool)
        band = bucket_range(c.load_bucket) if schedule is not None else None
        if schedule is None or band is None or c.lower is None or c.lower <= 1.0:
            continue
        k = k_range(schedule, *band)
        if k[1] > 0:
            out.append(
                Loss(
                    c.task_type,
                    c.temperature_bucket,
                    c.load_bucket,
                    c.pool,
                    c.rc,
                    c.lower,
                    k,
                    c.baseline_source,
                )
            )
    return sorted(out, key=lambda x: (x.pool, x.task_type, x.temperature_bucket, x.load_bucket))
