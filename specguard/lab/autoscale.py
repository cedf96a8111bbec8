"""The replica count an HPA would want for a pool, from its requests in flight.

The Kubernetes HorizontalPodAutoscaler's rule for an ``AverageValue`` target, as documented for
``autoscaling/v2``: ``desired = ceil(in flight / target per replica)``, left alone within a 10%
tolerance of the target; scaling up at once by at most ``max(100% of current, 4)`` replicas per sync
period (the default ``scaleUp`` policies), scaling down only to the highest recommendation of the
stabilisation window (default 300 s) so a dip in traffic does not take replicas away; never below
``min_replicas``. The fleet (``lab.fleet``) applies it within its engine budget and delays a new
replica's first request by the start delay.
"""

from __future__ import annotations

import math
from collections import deque

TOLERANCE = 0.1
SCALE_UP_PODS = 4


class Recommender:
    """Desired replicas per pool, with each pool's window of recommendations."""

    def __init__(self, target: float, stabilization_s: float, min_replicas: int | dict[str, int] = 1):
        if target <= 0:
            raise ValueError(f"target in flight per replica ({target}) must be > 0")
        self.target = target
        self.stabilization_s = stabilization_s
        self.min_replicas = min_replicas
        self._history: dict[str, deque[tuple[float, int]]] = {}

    def minimum(self, pool: str) -> int:
        m = self.min_replicas
        return m.get(pool, 1) if isinstance(m, dict) else m

    def raw(self, pool: str, in_flight: float, current: int) -> int:
        """This sync's recommendation: ``ceil(in flight / target)``, or ``current`` within tolerance."""
        if current and abs(in_flight / (current * self.target) - 1.0) <= TOLERANCE:
            return current
        return max(self.minimum(pool), math.ceil(in_flight / self.target))

    def desired(self, pool: str, in_flight: float, current: int, now: float) -> int:
        """The replica count to scale ``pool`` to at ``now`` (``current``: ready plus starting)."""
        raw = self.raw(pool, in_flight, current)
        history = self._history.setdefault(pool, deque())
        history.append((now, raw))
        while history and history[0][0] < now - self.stabilization_s:
            history.popleft()
        if raw > current:
            return min(raw, current + max(current, SCALE_UP_PODS))
        stable = max(r for _, r in history)  # scale down no lower than the window's highest
        return max(self.minimum(pool), min(current, stable))
