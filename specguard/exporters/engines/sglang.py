"""SGLang: the ``sglang:`` page and ``meta_info`` / ``sglext.spec_tokens_details`` response fields.

SGLang exports acceptance as window-averaged gauges (``spec_accept_length``, ``spec_accept_rate``:
means over the last decode-log interval, stale when idle) and one counter,
``spec_verify_calls_total`` (verify rounds, added when a request finishes). The exact accept length
over any window is therefore ``generation_tokens / verify_calls`` (it counts the first,
prefill-produced token, so it reads slightly high). ``inter_token_latency_seconds`` is per TOKEN
(``_count`` = tokens). Custom tokenizer labels (``task`` ...) give a per-label breakdown.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from specguard.errors import InputError
from specguard.exporters import promtext
from specguard.exporters.engines import base, fields
from specguard.exporters.records import SpecStats
from specguard.exporters.snapshot import EngineSnapshot

ENGINE = "sglang"
PREFIX = "sglang:"
METRICS_PATH = "/metrics"

ACCEPT_LENGTH = "sglang:spec_accept_length"
ACCEPT_RATE = "sglang:spec_accept_rate"
NUM_STEPS = "sglang:spec_num_steps"
NUM_DRAFT_TOKENS = "sglang:spec_num_draft_tokens"
VERIFY_CALLS = "sglang:spec_verify_calls_total"
GENERATION = "sglang:generation_tokens_total"
RUNNING = "sglang:num_running_reqs"
QUEUE = "sglang:num_queue_reqs"
ITL = "sglang:inter_token_latency_seconds"
REQUEST_TPOT = "sglang:request_time_per_output_token_seconds"
TTFT = "sglang:time_to_first_token_seconds"
E2E = "sglang:e2e_request_latency_seconds"

# Labels SGLang sets itself; any other label on the tokenizer series is a custom (class) label.
BUILTIN_LABELS = frozenset(
    {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank", "priority"}
    | {"is_streaming", "cache_source", "pid", "le", "quantile"}
)
# Every TP/PP/EP rank of one scheduler reports the same numbers: take one, do not add them up.
REPLICA_LABELS = ("pid", "tp_rank", "pp_rank", "moe_ep_rank")


def snapshot(page: promtext.Page) -> EngineSnapshot:
    whole = _build(page, None, None)
    breakdown: dict[str, dict[str, EngineSnapshot]] = {}
    tokenizer_series = [VERIFY_CALLS, GENERATION, ITL + "_count", REQUEST_TPOT + "_count"]
    labels = {
        name
        for series in tokenizer_series
        for sample in page.samples(series)
        for name, _ in sample.labels
        if name not in BUILTIN_LABELS
    }
    for label in sorted(labels):
        values = base.label_values(page, tokenizer_series, label)
        breakdown[label] = {
            value: _build(page, base.label_is(label, value), whole.num_speculative_tokens) for value in values
        }
    models = base.label_values(page, [GENERATION, VERIFY_CALLS, RUNNING], "model_name")
    per_model = (
        {name: _build(page, base.label_is("model_name", name), None) for name in models}
        if len(models) > 1
        else {}
    )
    return replace(whole, breakdown=breakdown, models=per_model)


def _build(page: promtext.Page, where: base.LabelFilter | None, k_known: int | None) -> EngineSnapshot:
    read = base.Reader(page, where=where, replica_labels=REPLICA_LABELS)
    draft_tokens_gauge = read.gauge(NUM_DRAFT_TOKENS, "max")
    steps_gauge = read.gauge(NUM_STEPS, "max")
    if _count_like(draft_tokens_gauge) and draft_tokens_gauge > 0:
        k: int | None = int(draft_tokens_gauge) - 1  # drafts per round = num_draft_tokens - 1
    elif _count_like(steps_gauge):
        k = int(steps_gauge)
    else:
        k = k_known
    verify_calls = read.counter("drafts", VERIFY_CALLS)
    generation = read.counter("generation_tokens", GENERATION)
    round_tokens = read.counter("round_tokens", GENERATION) if verify_calls is not None else None
    if k is not None:
        enabled: bool | None = k > 0
    elif base.positive(verify_calls):
        enabled = True
    else:
        enabled = None
    return read.snapshot(
        ENGINE,
        METRICS_PATH,
        speculation_enabled=enabled,
        num_speculative_tokens=k,
        drafts=verify_calls,
        generation_tokens=generation,
        round_tokens=round_tokens,
        accept_length_gauge=read.gauge(ACCEPT_LENGTH, "mean"),
        accept_rate_gauge=read.gauge(ACCEPT_RATE, "mean"),
        token_latency=read.histogram("token_latency", ITL),
        time_per_output_token=read.histogram("time_per_output_token", REQUEST_TPOT),
        time_to_first_token=read.histogram("time_to_first_token", TTFT),
        e2e_latency=read.histogram("e2e_latency", E2E),
        running_requests=read.gauge(RUNNING),
        waiting_requests=read.gauge(QUEUE),
    )


def _count_like(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and 0 <= value <= 4096


# --- per-request fields -------------------------------------------------------------------------

# (accepted drafts, proposed drafts, histogram) in the three historical generations, newest first.
_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def details_stats(details: dict, path: str, output_tokens: int | None = None) -> SpecStats | None:
    """One ``meta_info`` or ``spec_tokens_details`` object -> SpecStats (None without spec fields)."""
    rounds = fields.count(details, "spec_verify_ct", path)
    accepted = fields.count(details, _ACCEPTED[0], path, *_ACCEPTED[1:])
    proposed = fields.count(details, _PROPOSED[0], path, *_PROPOSED[1:])
    histogram = fields.histogram(details, _HISTOGRAM[0], path, *_HISTOGRAM[1:])
    if rounds is None and accepted is None and proposed is None and histogram is None:
        return None
    if output_tokens is None:
        output_tokens = fields.count(details, "completion_tokens", path)
    if accepted is None and histogram is not None:
        accepted = sum(j * n for j, n in enumerate(histogram))
    k = None
    if rounds and proposed is not None and proposed % rounds == 0:
        k = proposed // rounds
    elif histogram:
        k = len(histogram) - 1
    full_rollbacks = histogram[0] if histogram else (0 if rounds == 0 else None)
    return SpecStats(
        source=ENGINE,
        rounds=rounds,
        draft_tokens=proposed,
        accepted_tokens=accepted,
        accepted_histogram=histogram,
        full_rollback_rounds=full_rollbacks,
        output_tokens=output_tokens,
        num_speculative_tokens=k,
    )


def request_stats(body: Any) -> SpecStats | None:
    """Native ``/generate`` (``meta_info``; a list for a batch or n > 1) or OpenAI ``sglext``.

    Several outputs (n > 1) are summed: rounds, drafts and histograms add up per request; if one
    output has no spec fields the request has none.
    """
    if isinstance(body, list):
        parts = []
        for i, item in enumerate(body):
            where = f"[{i}].meta_info"
            meta = fields.obj(item.get("meta_info") if isinstance(item, dict) else item, where)
            parts.append(details_stats(meta, where) if meta is not None else None)
        return _sum(parts, None)
    if not isinstance(body, dict):
        raise InputError(f"response body: expected a JSON object or list, got {type(body).__name__}")
    usage = fields.obj(body.get("usage"), "usage")
    output = fields.count(usage, "completion_tokens", "usage") if usage else None
    sglext = fields.obj(body.get("sglext"), "sglext")
    details = sglext.get("spec_tokens_details") if sglext else None
    if isinstance(details, list):
        wheres = [f"sglext.spec_tokens_details[{i}]" for i in range(len(details))]
        return _sum(
            [details_stats(fields.obj(d, w) or {}, w) for d, w in zip(details, wheres, strict=True)], output
        )
    if details is not None:
        where = "sglext.spec_tokens_details"
        one = details_stats(fields.obj(details, where) or {}, where)
        return replace(one, output_tokens=output) if one is not None and output is not None else one
    meta = fields.obj(body.get("meta_info"), "meta_info")
    return details_stats(meta, "meta_info") if meta is not None else None


def _sum(parts: list[SpecStats | None], output_tokens: int | None) -> SpecStats | None:
    if not parts or any(p is None for p in parts):
        return None
    stats = [p for p in parts if p is not None]

    def total(attr: str) -> int | None:
        values = [getattr(s, attr) for s in stats]
        return None if any(v is None for v in values) else sum(values)

    histograms = [s.accepted_histogram for s in stats]
    histogram = None
    if all(h is not None for h in histograms):
        width = max(len(h) for h in histograms)
        histogram = tuple(sum(h[j] if j < len(h) else 0 for h in histograms) for j in range(width))
    ks = {s.num_speculative_tokens for s in stats}
    return SpecStats(
        source=ENGINE,
        rounds=total("rounds"),
        draft_tokens=total("draft_tokens"),
        accepted_tokens=total("accepted_tokens"),
        accepted_histogram=histogram,
        full_rollback_rounds=total("full_rollback_rounds"),
        output_tokens=output_tokens if output_tokens is not None else total("output_tokens"),
        num_speculative_tokens=ks.pop() if len(ks) == 1 else None,
    )


def missing_reason(body: Any, request: dict | None = None) -> str | None:
    """``no_spec_details`` (OpenAI request without ``return_spec_tokens_details``), ``no_spec_fields``
    (no speculative algorithm, or the request ran no verify round), ``not_json``."""
    if not isinstance(body, (dict, list)):
        return "not_json"
    if request_stats(body) is not None:
        return None
    if isinstance(body, dict) and "meta_info" not in body and "sglext" not in body:
        return "no_spec_details"
    return "no_spec_fields"
