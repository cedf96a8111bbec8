"""Range and instant queries against a Prometheus server, as pandas DataFrames.

A thin boundary over prometheus-api-client: connection failures and PromQL errors become
``SourceError`` with the server and the query named; results become tidy frames
(one row per series and timestamp, one column per label, ``value`` as float).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pandas as pd
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from specguard.errors import SourceError


class PromData:
    """Queries one Prometheus server; ``timeout_s`` bounds every request."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, connect: PrometheusConnect | None = None):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._prom = connect or PrometheusConnect(
            url=self.url, disable_ssl=True, retry=Retry(total=1, backoff_factor=0.1), timeout=timeout_s
        )

    def close(self) -> None:
        self._prom.close()

    def check(self) -> None:
        """Raise SourceError unless the server answers a trivial query."""
        self.instant("vector(1)")

    def instant(self, query: str, at: float | None = None) -> pd.DataFrame:
        """Value of every series ``query`` returns, now or at epoch ``at`` (empty frame when none)."""
        params = {"time": f"{at:.3f}"} if at is not None else None
        result = self._call(lambda: self._prom.custom_query(query, params=params), query)
        rows = []
        for series in result:
            labels = dict(series.get("metric", {}))
            labels.pop("__name__", None)
            ts, value = series["value"]
            rows.append({**labels, "timestamp": _ts(ts), "value": _float(value)})
        return pd.DataFrame(rows)

    def range(self, query: str, start: float, end: float, step_s: float) -> pd.DataFrame:
        """Every series of ``query`` between ``start`` and ``end`` (epoch seconds) at ``step_s``."""
        result = self._call(
            lambda: self._prom.custom_query_range(
                query,
                start_time=datetime.fromtimestamp(start, UTC),
                end_time=datetime.fromtimestamp(end, UTC),
                step=f"{step_s:g}s",
            ),
            query,
        )
        rows = []
        for series in result:
            labels = dict(series.get("metric", {}))
            labels.pop("__name__", None)
            for ts, value in series.get("values", []):
                rows.append({**labels, "timestamp": _ts(ts), "value": _float(value)})
        return pd.DataFrame(rows)

    def _call(self, fn, query: str):
        try:
            return fn()
        except PrometheusApiClientException as exc:
            raise SourceError(f"Prometheus at {self.url} rejected query {query!r}: {exc}") from exc
        except requests.RequestException as exc:
            raise SourceError(f"cannot reach Prometheus at {self.url}: {type(exc).__name__}") from exc
        except (ValueError, KeyError) as exc:
            raise SourceError(f"Prometheus at {self.url} sent a malformed answer to {query!r}") from exc


def _ts(value) -> pd.Timestamp:
    return pd.Timestamp(float(value), unit="s", tz="UTC")


def _float(value) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out
