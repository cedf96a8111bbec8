"""llama.cpp server: the ``llamacpp:`` page (``--metrics``) and ``timings.draft_n*`` response fields.

The page has no labels except ``position``. Builds that carry the speculative counters (the vLLM
schema, ``llamacpp:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total``) register them
always, 0 without speculation; ``..._num_accepted_tokens_per_pos_total{position}`` appears only once
something was drafted, with one series per draft position (K = ``--spec-draft-n-max``). A draft
round (``num_drafts``) is a verification step that carried at least one draft token; position i
counts the rounds that accepted at least i + 1 drafts, so 1 - position 0 / rounds is the round-level
full rollback. All of them are added when a request *finishes*, never while it decodes.

Speculation is known to be on once a draft was made (or the per-position series exists); a page
whose counters are all 0 cannot tell "off" from "on but idle", so ``speculation_enabled`` stays
unknown there, and on older builds without the counters every spec field is ``None``. Time per
output token is the server's own decode seconds over predicted tokens
(``tokens_predicted_seconds_total / tokens_predicted_total``).
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
DRAFTS = "llamacpp:spec_decode_num_drafts_total"
DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"


def snapshot(page: promtext.Page) -> EngineSnapshot:
    read = base.Reader(page)
    drafts = read.counter("drafts", DRAFTS)
    per_pos = read.counter_vector("accepted_per_position", PER_POS, "position")
    enabled = True if per_pos is not None or base.positive(drafts) else None
    return read.snapshot(
        ENGINE,
        METRICS_PATH,
        speculation_enabled=enabled,
        num_speculative_tokens=len(per_pos) if per_pos else None,
        drafts=drafts,
        draft_tokens=read.counter("draft_tokens", DRAFT_TOKENS),
        accepted_tokens=read.counter("accepted_tokens", ACCEPTED),
        accepted_per_position=per_pos,
        generation_tokens=read.counter("generation_tokens", GENERATION),
        time_per_output_token=read.counter_totals("time_per_output_token", PREDICT_SECONDS, GENERATION),
        running_requests=read.gauge(RUNNING),
        waiting_requests=read.gauge(WAITING),
    )


def request_stats(body: Any) -> SpecStats | None:
    """``timings.draft_n`` / ``timings.draft_n_accepted`` of a non-streamed body or of a stream's
    last chunk (the usage chunk with ``stream_options.include_usage``, else the finishing one).

    The server writes them only when the request drafted something, so a ``timings`` object with
    ``predicted_n`` and no draft fields is a request that drafted nothing (0 and 0, not unknown).
    It gives totals per request, no rounds and no histogram: accept length and rollbacks come from
    the page's counters.
    """
    if not isinstance(body, dict):
        raise InputError(f"response body: expected a JSON object, got {type(body).__name__}")
    timings = fields.obj(body.get("timings"), "timings")
    if timings is None:
        return None
    drafted = fields.count(timings, "draft_n", "timings")
    accepted = fields.count(timings, "draft_n_accepted", "timings")
    output = fields.count(timings, "predicted_n", "timings")
    if drafted is None and accepted is None:
        if output is None:
            return None
        drafted = accepted = 0
    if drafted is not None and accepted is not None and accepted > drafted:
        raise InputError(f"timings.draft_n_accepted ({accepted}) must be <= timings.draft_n ({drafted})")
    usage = fields.obj(body.get("usage"), "usage")
    if usage is not None:
        output = fields.count(usage, "completion_tokens", "usage") or output
    return SpecStats(source=ENGINE, draft_tokens=drafted, accepted_tokens=accepted, output_tokens=output)


def missing_reason(body: Any, request: dict | None = None) -> str | None:
    """``no_timings`` (no timings object: not llama.cpp, or a stream chunk before the last),
    ``no_draft_fields`` (a timings object without draft fields or ``predicted_n``)."""
    if not isinstance(body, dict):
        return "not_json"
    if request_stats(body) is not None:
        return None
    return "no_timings" if body.get("timings") is None else "no_draft_fields"
