"""Fleet shapes: how many engines each pool has and whether that changes (``lab.fleet`` runs them).

- ``fixed``: replicas per pool, never moved: one Deployment of fixed replicas behind a Service per
  pool, as ``deploy/kubernetes`` ships. An engine's speculative configuration is fixed at launch
  (vLLM, SGLang, TensorRT-LLM and llama.cpp all read it from the command line), so moving capacity
  between K means new replicas;
- ``autoscaled``: each pool scaled on its requests in flight by a rule like the Kubernetes HPA
  (``lab.autoscale``): a new replica serves only after a start delay (the model loading) and one
  leaves only after the scale-down stabilisation window, within a total engine budget;
- ``fluid``: one fleet of N engines shared by every pool, an empty engine given to another pool at
  once. No engine can change K without a restart: this is an idealisation, kept to compare with
  earlier results.

Every row of a comparison runs on the same shape: the routing rows on the shape's pools, the rows
that use one pool (always, never, an in-engine schedule) on one pool of all its engines
(``single``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from specguard.errors import ConfigError

FIXED, AUTOSCALED, FLUID = "fixed", "autoscaled", "fluid"
KINDS = (FIXED, AUTOSCALED, FLUID)
START_DELAY_S = 120.0  # a new replica loads the model before it serves
STABILIZATION_S = 300.0  # the HPA's default scale-down stabilisation window
SYNC_S = 15.0  # the HPA's default sync period
TARGET_IN_FLIGHT = 32.0  # requests in flight per replica the HPA aims at (at GPU scale 1)
BUDGET = 8  # engines an autoscaled fleet may run at once

# Fixed fleets offered by name (pools of the shipped example config).
NAMED = {
    "2xK4+1xK2+1xnospec": {"spec-k4": 2, "spec-k2": 1, "nospec": 1},
    "3xK4+1xnospec": {"spec-k4": 3, "nospec": 1},
    "4xK4+2xK2+2xnospec": {"spec-k4": 4, "spec-k2": 2, "nospec": 2},
}
DEFAULT_FIXED = "2xK4+1xK2+1xnospec"


@dataclass(frozen=True)
class FleetShape:
    """One fleet shape. ``replicas``: per pool, the fixed count (``fixed``) or the starting count and
    minimum (``autoscaled``); ``engines``: the fleet (``fluid``) or the budget (``autoscaled``)."""

    kind: str
    replicas: Mapping[str, int] = field(default_factory=dict)
    engines: int = 4
    start_delay_s: float = START_DELAY_S
    stabilization_s: float = STABILIZATION_S
    sync_s: float = SYNC_S
    target_in_flight: float = TARGET_IN_FLIGHT

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(p for p, n in self.replicas.items() if n > 0)

    @property
    def size(self) -> int:
        """Engine slots: the fleet, the fixed replicas or the budget."""
        return sum(self.replicas.values()) if self.kind == FIXED else self.engines

    def single(self, pool: str) -> FleetShape:
        """The same engines as one pool: all fixed replicas; autoscaled, the same budget and the same
        floor (one pool keeps as many replicas as the shape's pools keep together)."""
        if self.kind in (FIXED, AUTOSCALED):
            return replace(self, replicas={pool: sum(self.replicas.values())})
        return self

    def scaled(self, gpu_scale: float) -> FleetShape:
        """On a GPU ``gpu_scale`` times smaller the HPA's target in flight shrinks alike."""
        return replace(self, target_in_flight=self.target_in_flight / gpu_scale)

    def label(self) -> str:
        if self.kind == FIXED:
            return "fixed: " + " + ".join(f"{n}x {p}" for p, n in self.replicas.items() if n)
        if self.kind == AUTOSCALED:
            floor = " + ".join(f"{n}x {p}" for p, n in self.replicas.items() if n)
            return (
                f"autoscaled: from {floor} (the minimum), up to {self.engines} engines, "
                f"HPA on {self.target_in_flight:g} requests in flight per replica, start delay "
                f"{self.start_delay_s:g} s, scale-down stabilisation {self.stabilization_s:g} s"
            )
        return f"fluid (an idealisation): {self.engines} engines shared by every pool, moved at once"

    def to_json(self) -> dict:
        out: dict = {"kind": self.kind, "label": self.label(), "engines": self.size}
        if self.kind != FLUID:
            out["replicas"] = dict(self.replicas)
        if self.kind == AUTOSCALED:
            out.update(
                start_delay_seconds=self.start_delay_s,
                stabilization_seconds=self.stabilization_s,
                sync_seconds=self.sync_s,
                target_in_flight=self.target_in_flight,
            )
        return out


def parse_replicas(text: str, pools: Sequence[str]) -> dict[str, int]:
    """``spec-k4=2,spec-k2=1,nospec=1`` or a name of ``NAMED``; every pool named must be configured."""
    if text in NAMED:
        out = dict(NAMED[text])
    else:
        out = {}
        for item in (x.strip() for x in text.split(",") if x.strip()):
            name, sep, count = item.partition("=")
            if not sep or not count.strip().isdigit():
                raise ConfigError(
                    f"--replicas entry {item!r}: expected POOL=COUNT (or one of {', '.join(NAMED)})"
                )
            out[name.strip()] = int(count)
    unknown = sorted(set(out) - set(pools))
    if unknown:
        raise ConfigError(f"--replicas: pools {unknown} are not configured ({', '.join(pools)})")
    if not any(out.values()):
        raise ConfigError(f"--replicas {text!r}: no pool has a replica")
    return {p: out[p] for p in pools if out.get(p)}


def build(
    kind: str,
    pools: Sequence[str],
    *,
    replicas: str | None = None,
    engines: int | None = None,
    start_delay_s: float = START_DELAY_S,
    stabilization_s: float = STABILIZATION_S,
) -> FleetShape:
    """The shape for ``--fleet-shape`` and its options (``replicas`` text, ``engines``)."""
    if kind not in KINDS:
        raise ConfigError(f"--fleet-shape {kind!r}: expected one of {', '.join(KINDS)}")
    if kind == FIXED:
        counts = parse_replicas(replicas or DEFAULT_FIXED, pools)
        return FleetShape(FIXED, counts, sum(counts.values()))
    if kind == AUTOSCALED:
        counts = parse_replicas(replicas, pools) if replicas else dict.fromkeys(pools, 1)
        budget = engines or BUDGET
        if budget < len(counts):
            raise ConfigError(
                f"--fleet ({budget}) must be >= the pools ({len(counts)}): each keeps a replica"
            )
        if start_delay_s < 0 or stabilization_s < 0:
            raise ConfigError("--start-delay and --scale-down-stabilisation must be >= 0")
        return FleetShape(
            AUTOSCALED,
            dict.fromkeys(counts, 1),
            budget,
            start_delay_s=start_delay_s,
            stabilization_s=stabilization_s,
        )
    size = engines or 4
    if size < len(pools):
        raise ConfigError(
            f"--fleet ({size}) must be >= the number of pools ({len(pools)}): "
            "every pool needs an engine of its own"
        )
    return FleetShape(FLUID, dict.fromkeys(pools, 1), size)
