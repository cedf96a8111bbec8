"""PromQL queries through prometheus-api-client, made safe for a scheduler job.

The client is blocking and has no timeout by default, so every query runs in a worker thread
with the client's own request timeout *and* an asyncio deadline. Errors are separated from
"no data": a failing Prometheus raises SourceError (an *error* evaluation); an empty vector or
NaN returns None (too little data, a *hold*). A query that returns several series is an error
too (Flagger's ErrMultipleValuesReturned): the template must select one class.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from specguard.errors import SourceError


class PromQL:
    """One Prometheus endpoint; ``connect`` builds the client lazily so tests can pass their own."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        headers: dict[str, str] | None = None,
        client_factory: Callable[[], Any] | None = None,
    ):
        self.url = url
        self.timeout = timeout
        self._headers = headers
        self._factory = client_factory
        self._client: Any = None

    def _connect(self) -> Any:
        if self._client is None:
            if self._factory is not None:
                self._client = self._factory()
            else:
                from prometheus_api_client import PrometheusConnect
                from urllib3.util.retry import Retry

                # no status retries: a slow Prometheus must not multiply the deadline
                self._client = PrometheusConnect(
                    url=self.url, headers=self._headers, retry=Retry(total=0), timeout=self.timeout
                )
        return self._client

    def _query_blocking(self, query: str) -> Any:
        from prometheus_api_client import PrometheusApiClientException
        from requests import RequestException

        try:
            return self._connect().custom_query(query, timeout=self.timeout)
        except PrometheusApiClientException as exc:
            raise SourceError(f"Prometheus at {self.url} rejected the query: {exc}") from exc
        except RequestException as exc:
            raise SourceError(f"Prometheus at {self.url} unreachable: {type(exc).__name__}") from exc
        except ValueError as exc:  # a body that is not JSON
            raise SourceError(f"Prometheus at {self.url} answered badly: {exc}") from exc

    async def scalar(self, query: str) -> float | None:
        """The single value of an instant query; None for no data (empty vector or NaN)."""
        try:
            async with asyncio.timeout(self.timeout + 1.0):
                result = await asyncio.to_thread(self._query_blocking, query)
        except TimeoutError as exc:
            raise SourceError(f"Prometheus at {self.url}: query timed out after {self.timeout:g} s") from exc
        return parse_result(result)


def parse_result(result: Any) -> float | None:
    """One number from ``data.result`` of an instant query (vector of one sample, or a scalar)."""
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        sample = result  # a scalar result: [ts, "value"]
    elif isinstance(result, list):
        if not result:
            return None
        if len(result) > 1:
            raise SourceError(f"query returned {len(result)} series; it must select exactly one")
        sample = result[0].get("value") if isinstance(result[0], dict) else None
    else:
        raise SourceError(f"unexpected query result {type(result).__name__}")
    try:
        value = float(sample[1])
    except (TypeError, ValueError, IndexError) as exc:
        raise SourceError(f"unexpected sample {sample!r}") from exc
    return None if math.isnan(value) else value
