"""vLLM (v1 engine): the ``vllm:`` page and ``metrics.speculative_decoding`` response fields.

The four ``vllm:spec_decode_*`` counter families are registered only when a speculative config
is set, so a vLLM page without them is a page from an engine running *without* speculation
(``speculation_enabled`` False, K = 0) — its spec counters stay ``None`` (not reported), never 0.
``inter_token_latency_seconds`` gets one sample per running request per engine step (a step emits
1..K+1 tokens): it is a step latency. ``request_time_per_output_token_seconds`` is per request and
per token. Label sets (DP ``engine``, several ``model_name``s) are summed; with more than one model
the per-model snapshots are in ``models``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specguard.errors import InputError
from specguard.exporters import promtext
from specguard.exporters.engines import base, fields
from specguard.exporters.records import SpecStats
from specguard.exporters.snapshot import EngineSnapshot

ENGINE = "vllm"
PREFIX = "vllm:"
METRICS_PATH = "/metrics"

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_PREFIX = "vllm:spec_decode_"
GENERATION = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
ITL = "vllm:inter_token_latency_seconds"
ITERATION = "vllm:iteration_tokens_total"  # a histogram whose name ends in _total: one sample per step
OLD_TPOT = "vllm:time_per_output_token_seconds"  # deprecated name of the per-step ITL
REQUEST_TPOT = "vllm:request_time_per_output_token_seconds"
TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
OLD_ACCEPT_RATE = "vllm:spec_decode_draft_acceptance_rate"  # v0 engine gauge


def snapshot(page: promtext.Page) -> EngineSnapshot:
    """Normalise a vLLM page; more than one ``model_name`` adds a per-model breakdown."""
    whole = _build(page, None)
    models = base.label_values(page, [GENERATION, RUNNING, DRAFTS, ITL + "_count"], "model_name")
    if len(models) <= 1:
        return whole
    per_model = {name: _build(page, base.label_is("model_name", name)) for name in models}
    ks = {snap.num_speculative_tokens for snap in per_model.values() if snap.speculation_enabled}
    if len(ks) > 1:  # models drafting with different K: a summed per-position vector means nothing
        series = {k: v for k, v in whole.series.items() if not k.startswith("accepted_per_position:")}
        whole = replace(whole, num_speculative_tokens=None, accepted_per_position=None, series=series)
    return replace(whole, models=per_model)


def _build(page: promtext.Page, where: base.LabelFilter | None) -> EngineSnapshot:
    read = base.Reader(page, where=where)
    spec_names = [name for name in page.by_name if name.startswith(SPEC_PREFIX) and read.samples(name)]
    ours = bool(spec_names) or any(name.startswith(PREFIX) and read.samples(name) for name in page.by_name)
    per_pos = read.counter_vector("accepted_per_position", PER_POS, "position")
    if spec_names:
        enabled: bool | None = True
        k = len(per_pos) if per_pos else None
    elif ours:
        enabled, k = False, 0  # spec families are registered only with a speculative config
    else:
        enabled, k = None, None
    step = read.histogram("step_latency", ITL) or read.histogram("step_latency", OLD_TPOT)
    return read.snapshot(
        ENGINE,
        METRICS_PATH,
        speculation_enabled=enabled,
        num_speculative_tokens=k,
        drafts=read.counter("drafts", DRAFTS),
        draft_tokens=read.counter("draft_tokens", DRAFT_TOKENS),
        accepted_tokens=read.counter("accepted_tokens", ACCEPTED),
        accepted_per_position=per_pos,
        generation_tokens=read.counter("generation_tokens", GENERATION),
        accept_rate_gauge=read.gauge(OLD_ACCEPT_RATE, "mean"),
        step_latency=step,
        iteration_tokens=read.histogram("iteration_tokens", ITERATION),
        time_per_output_token=read.histogram("time_per_output_token", REQUEST_TPOT),
        time_to_first_token=read.histogram("time_to_first_token", TTFT),
        e2e_latency=read.histogram("e2e_latency", E2E),
        running_requests=read.gauge(RUNNING),
        waiting_requests=read.gauge(WAITING),
    )


# --- per-request fields -------------------------------------------------------------------------

SPEC_PATH = "metrics.speculative_decoding"


def request_stats(body: Any) -> SpecStats | None:
    """``metrics.speculative_decoding`` of a non-streamed body or of a stream's final usage chunk.

    ``num_spec_steps == 0`` means the request ran no speculative round (nothing drafted), not a
    full rollback. None when the block is absent (see ``missing_reason``).
    """
    if not isinstance(body, dict):
        raise InputError(f"response body: expected a JSON object, got {type(body).__name__}")
    metrics = fields.obj(body.get("metrics"), "metrics")
    if metrics is None:
        return None
    spec = fields.obj(metrics.get("speculative_decoding"), SPEC_PATH)
    if spec is None:
        return None
    rounds = fields.count(spec, "num_spec_steps", SPEC_PATH)
    drafted = fields.count(spec, "num_draft_tokens", SPEC_PATH)
    accepted = fields.count(spec, "num_accepted_draft_tokens", SPEC_PATH)
    histogram = fields.histogram(spec, "acceptance_histogram", SPEC_PATH)
    k = fields.count(spec, "num_spec_tokens", SPEC_PATH)
    if accepted is None and histogram is not None:
        accepted = sum(j * n for j, n in enumerate(histogram))
    if k is None and histogram:
        k = len(histogram) - 1
    if histogram:
        full_rollbacks: int | None = histogram[0]
    else:
        full_rollbacks = 0 if rounds == 0 else None
    usage = fields.obj(body.get("usage"), "usage")
    output = fields.count(usage, "completion_tokens", "usage") if usage else None
    return SpecStats(
        source=ENGINE,
        rounds=rounds,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        accepted_histogram=histogram,
        full_rollback_rounds=full_rollbacks,
        output_tokens=output,
        num_speculative_tokens=k,
    )


def missing_reason(body: Any, request: dict | None = None) -> str | None:
    """Why ``request_stats`` gives None for this body (None when it does not).

    ``no_usage`` (stream without ``stream_options.include_usage``), ``n_gt_1`` (vLLM reports
    nothing for n > 1 or a list of prompts), ``stop_string`` (ended on a stop string),
    ``no_metrics`` (server runs without ``--per-request-spec-decode-metrics``),
    ``no_spec_metrics`` (metrics present but no speculative block), ``metrics_null``.
    """
    if not isinstance(body, dict):
        return "not_json"
    if request_stats(body) is not None:
        return None
    request = request if isinstance(request, dict) else {}
    choices = body.get("choices") if isinstance(body.get("choices"), list) else []
    n = request.get("n")
    prompt = request.get("prompt")
    several = isinstance(prompt, list) and len(prompt) > 1 and not all(isinstance(t, int) for t in prompt)
    if (isinstance(n, int) and n > 1) or len(choices) > 1 or several:
        return "n_gt_1"
    streamed = bool(request.get("stream")) or str(body.get("object", "")).endswith(".chunk")
    if streamed and body.get("usage") is None:
        return "no_usage"  # the spec block rides only on the final usage chunk
    first = choices[0] if choices and isinstance(choices[0], dict) else {}
    if first.get("finish_reason") == "stop" and isinstance(first.get("stop_reason"), str):
        return "stop_string"  # vLLM drops per-request metrics for stop-string endings
    if "metrics" not in body:
        return "no_metrics"  # server runs without --per-request-spec-decode-metrics
    if body.get("metrics") is None:
        return "metrics_null"
    return "no_spec_metrics"
