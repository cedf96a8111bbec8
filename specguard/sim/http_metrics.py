"""The ``http_*`` families prometheus-fastapi-instrumentator adds to a real vLLM /metrics page."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, Summary

HIGHR_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
]
EXCLUDED = ("/metrics", "/health", "/sim/truth")
_SUFFIX = "Only value of header is respected. Otherwise ignored. No percentile calculated. "


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ["method", "status", "handler"],
            registry=registry,
        )
        self.request_size = Summary(
            "http_request_size_bytes",
            f"Content length of incoming requests by handler. {_SUFFIX}",
            ["handler"],
            registry=registry,
        )
        self.response_size = Summary(
            "http_response_size_bytes",
            f"Content length of outgoing responses by handler. {_SUFFIX}",
            ["handler"],
            registry=registry,
        )
        self.highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. "
            "Made for more accurate percentile calculations. ",
            buckets=HIGHR_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. "
            "Made to be only used if aggregation by handler is important. ",
            ["handler", "method"],
            buckets=[0.1, 0.5, 1.0],
            registry=registry,
        )

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        response: web.StreamResponse | None = None
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            resource = request.match_info.route.resource
            path = resource.canonical if resource is not None else None
            if path is not None and path not in EXCLUDED:
                elapsed = time.perf_counter() - started
                self.requests.labels(request.method, f"{status // 100}xx", path).inc()
                self.request_size.labels(path).observe(request.content_length or 0)
                size = response.content_length if response is not None else None
                self.response_size.labels(path).observe(size or 0)
                self.highr.observe(elapsed)
                self.duration.labels(path, request.method).observe(elapsed)
