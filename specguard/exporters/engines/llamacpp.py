"""llama.cpp server: the ``llamacpp:`` page (``--metrics``) and ``timings.draft_n*`` response fields.

The page has no labels and no speculative metrics upstream, so every spec field is ``None`` and
``speculation_enabled`` is unknown. Time per output token is the server's own decode seconds over
predicted tokens (``tokens_predicted_seconds_total / tokens_predicted_total``).
"""

from __future__ import annotations

from typing import Any

from specguard.errors import InputError
from specguard.exporters import promtext
from specguard.exporters.engines import base, fields
from specguard.exporters.records import SpecStats
from specguard.exporters.snapshot import EngineSnapshot

ENGINE = "llamacpp"
PREFIX = "llamacpp:"
METRICS_PATH = "/metrics"

GENERATION = "llamacpp:tokens_predicted_total"
PREDICT_SECONDS = "llamacpp:tokens_predicted_seconds_total"
RUNNING = "llamacpp:requests_processing"
WAITING = "llamacpp:requests_deferred"


def snapshot(page: promtext.Page) -> EngineSnapshot:
    read = base.Reader(page)
    return read.snapshot(
        ENGINE,
        METRICS_PATH,
        generation_tokens=read.counter("generation_tokens", GENERATION),
        time_per_output_token=read.counter_totals("time_per_output_token", PREDICT_SECONDS, GENERATION),
        running_requests=read.gauge(RUNNING),
        waiting_requests=read.gauge(WAITING),
    )


def request_stats(body: Any) -> SpecStats | None:
    """``timings.draft_n`` / ``timings.draft_n_accepted`` (present only when the request drafted).

    llama.cpp gives totals only: no rounds and no histogram, so no accept length or rollbacks.
    """
    if not isinstance(body, dict):
        raise InputError(f"response body: expected a JSON object, got {type(body).__name__}")
    timings = fields.obj(body.get("timings"), "timings")
    if timings is None:
        return None
    drafted = fields.count(timings, "draft_n", "timings")
    accepted = fields.count(timings, "draft_n_accepted", "timings")
    if drafted is None and accepted is None:
        return None
    if drafted is not None and accepted is not None and accepted > drafted:
        raise InputError(f"timings.draft_n_accepted ({accepted}) must be <= timings.draft_n ({drafted})")
    output = fields.count(timings, "predicted_n", "timings")
    usage = fields.obj(body.get("usage"), "usage")
    if usage is not None:
        output = fields.count(usage, "completion_tokens", "usage") or output
    return SpecStats(source=ENGINE, draft_tokens=drafted, accepted_tokens=accepted, output_tokens=output)


def missing_reason(body: Any, request: dict | None = None) -> str | None:
    """``no_timings`` (no timings object: not llama.cpp, or a stream chunk before the last),
    ``no_draft_fields`` (nothing drafted: speculation off or no draft this request)."""
    if not isinstance(body, dict):
        return "not_json"
    if request_stats(body) is not None:
        return None
    return "no_timings" if body.get("timings") is None else "no_draft_fields"
