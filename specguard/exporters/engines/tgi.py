"""Text Generation Inference: the ``tgi_`` page; the only spec metric is ``tgi_request_skipped_tokens``.

``tgi_request_skipped_tokens`` records ``n - 1`` per generation step per request (n = tokens
emitted that step), i.e. accepted drafts per verify round; the exporter renders it as a summary.
So ``_count`` = rounds, ``_sum`` = accepted drafts, accept length = ``1 + sum / count``. K
(``--speculate``) is not on the page, so draft tokens and the strict rate are not reported.
TGI counters carry no ``_total`` suffix (metrics-exporter-prometheus). No per-request spec fields.
"""

from __future__ import annotations

from typing import Any

from specguard.exporters import promtext
from specguard.exporters.engines import base
from specguard.exporters.records import SpecStats
from specguard.exporters.snapshot import EngineSnapshot

ENGINE = "tgi"
PREFIX = "tgi_"
METRICS_PATH = "/metrics"

SKIPPED = "tgi_request_skipped_tokens"
GENERATED = "tgi_request_generated_tokens"
RUNNING = "tgi_batch_current_size"
WAITING = "tgi_queue_size"
TPOT = "tgi_request_mean_time_per_token_duration"
E2E = "tgi_request_duration"
FORWARD = "tgi_batch_forward_duration"


def snapshot(page: promtext.Page) -> EngineSnapshot:
    read = base.Reader(page)
    rounds = read.counter("drafts", SKIPPED + "_count")
    accepted = read.counter("accepted_tokens", SKIPPED + "_sum")
    return read.snapshot(
        ENGINE,
        METRICS_PATH,
        speculation_enabled=True if base.positive(accepted) else None,
        drafts=rounds,
        accepted_tokens=accepted,
        generation_tokens=read.counter("generation_tokens", GENERATED + "_sum"),
        step_latency=read.histogram("step_latency", FORWARD, base.label_is("method", "decode")),
        time_per_output_token=read.histogram("time_per_output_token", TPOT),
        e2e_latency=read.histogram("e2e_latency", E2E),
        running_requests=read.gauge(RUNNING),
        waiting_requests=read.gauge(WAITING),
    )


def request_stats(body: Any) -> SpecStats | None:
    """TGI puts no speculative numbers in its responses."""
    return None


def missing_reason(body: Any, request: dict | None = None) -> str | None:
    return "engine_reports_none"
