"""In-flight requests per pool and their integral over time: a request's mean load while it decodes.

The load bucket is the load a request joins (known when it is routed); the step-cost fit of the
model baseline (``rules.modelbase``) needs the load the request actually ran at, averaged over its
decode phase: ``(area(t_last) - area(t_first)) / (t_last - t_first)``. The load at admission
alone is a noisy stand-in for that, and regressing step time on it flattens the fitted slope.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable


class LoadMeter:
    """``in_flight[pool]`` (a plain dict others read) and the running integral of it in pool-seconds."""

    def __init__(self, pools: Iterable[Hashable]):
        self.in_flight: dict[Hashable, int] = {name: 0 for name in pools}
        self._area = dict.fromkeys(self.in_flight, 0.0)
        self._at: dict[Hashable, float | None] = dict.fromkeys(self.in_flight)

    def change(self, pool: Hashable, delta: int, now: float) -> None:
        """``delta`` requests join (+) or leave (-) ``pool`` at monotonic time ``now``."""
        self._area[pool] = self.area(pool, now)
        self._at[pool] = now
        self.in_flight[pool] += delta

    def area(self, pool: Hashable, now: float) -> float:
        """Integral of the pool's in-flight requests over time, up to ``now`` (request-seconds)."""
        at = self._at[pool]
        if at is None:
            return 0.0
        return self._area[pool] + self.in_flight[pool] * max(0.0, now - at)
