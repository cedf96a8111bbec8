"""Replica counts of the pools in fleet mode: a PromQL count per pool, handed on with the plan.

The load bucket is in-flight requests per replica and capacity-matched holdout weighs pools by
their replicas, so every tap needs each pool's replica count. In standalone mode it is the
config's ``pools[].replicas``. In fleet mode the deciding guard counts the replicas that are up,
``guard.prometheus.replicas_query`` for each pool (``DEFAULT_QUERY`` counts the pool's
``specguard_engine_up`` series that are 1), stores the counts in the plan document (the ConfigMap
or plan file followers read) and the followers' routers take them from there. A pool the query
finds no replica of keeps its last count: it is down, which is failover's business, not a reason
to call it zero.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from specguard.errors import SourceError
from specguard.monitor.promql import PromQL
from specguard.rules import policy as policy_mod

log = logging.getLogger("specguard.replicas")

DEFAULT_QUERY = 'count(specguard_engine_up{pool="{{ pool }}"} == 1)'


class PromQLReplicas:
    """``counts()``: ``{pool: replicas up}`` for the pools the query finds at least one replica of."""

    def __init__(self, promql: PromQL, pools: Iterable[str], query: str = DEFAULT_QUERY):
        self._promql = promql
        self._pools = tuple(pools)
        self.query = query

    async def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for pool in self._pools:
            text = policy_mod.render_query(self.query, {"pool": pool})
            try:
                value = await self._promql.scalar(text)
            except SourceError as exc:
                log.warning("replica count of %s: %s (keeping the last count)", pool, exc)
                continue
            if value is not None and value >= 1:
                out[pool] = int(round(value))
        return out
