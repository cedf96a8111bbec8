"""TensorRT-LLM (``trtllm-serve``): the ``trtllm_`` page at ``/prometheus/metrics`` and ``/perf_metrics``.

Plain ``/metrics`` on trtllm-serve returns JSON iteration stats, not Prometheus text: the page
lives at ``/prometheus/metrics`` (only with ``return_perf_metrics: true``). Spec counters come in
two kinds: iteration-level totals (``trtllm_spec_decode_num_{draft,accepted}_tokens_total``) and
per-request per-position counters with label ``token_position`` (added when a request finishes,
emitted up to the last position that ever drafted); the latter are used when present.
``drafted{token_position="0"}`` counts the rounds that carried drafts, so ``accepted[i] /
drafted[0]`` is p_(i+1) as for vLLM.
Gauges carry ``pid`` (multiprocess registry without a mode): the largest is taken per label set.
"""

from __future__ import annotations

from typing import Any

from specguard.errors import InputError
from specguard.exporters import promtext
from specguard.exporters.engines import base, fields
from specguard.exporters.records import SpecStats
from specguard.exporters.snapshot import EngineSnapshot

ENGINE = "trtllm"
PREFIX = "trtllm_"
METRICS_PATH = "/prometheus/metrics"

DRAFT_TOKENS = "trtllm_spec_decode_num_draft_tokens_total"
ACCEPTED = "trtllm_spec_decode_num_accepted_tokens_total"
DRAFTED_PER_POS = "trtllm_spec_decode_drafted_tokens_total"
ACCEPTED_PER_POS = "trtllm_spec_decode_accepted_tokens_total"
ACCEPT_LENGTH = "trtllm_spec_decode_acceptance_length"
DRAFT_OVERHEAD = "trtllm_spec_decode_draft_overhead"
CONFIG_INFO = "trtllm_speculative_config_info"
GENERATION = "trtllm_generation_tokens_total"
RUNNING = "trtllm_num_requests_running"
WAITING = "trtllm_num_requests_waiting"
TPOT = "trtllm_time_per_output_token_seconds"
TTFT = "trtllm_time_to_first_token_seconds"
E2E = "trtllm_e2e_request_latency_seconds"
POSITION = "token_position"
_K_LABELS = ("max_draft_len", "num_speculative_tokens", "max_draft_tokens", "draft_len")


def snapshot(page: promtext.Page) -> EngineSnapshot:
    read = base.Reader(page)
    drafted = read.counter_vector("drafted_per_position", DRAFTED_PER_POS, POSITION)
    read.series.clear()  # only position 0 of the drafted vector is used, as `drafts` below
    drafts = read.counter("drafts", DRAFTED_PER_POS, base.label_is(POSITION, "0"))
    per_pos = read.counter_vector("accepted_per_position", ACCEPTED_PER_POS, POSITION)
    # Prefer the per-request per-position counters: they are added at the same moment as `drafts`
    # and the per-position vector, so every ratio of a window is self-consistent.
    if drafted and per_pos:
        draft_tokens = read.counter("draft_tokens", DRAFTED_PER_POS)
        accepted = read.counter("accepted_tokens", ACCEPTED_PER_POS)
    else:
        draft_tokens = read.counter("draft_tokens", DRAFT_TOKENS)
        accepted = read.counter("accepted_tokens", ACCEPTED)
    k = _configured_k(page)
    if k is None and drafted:
        k = len(drafted)  # a lower bound: positions that ever drafted
    spec_seen = any(base.positive(v) for v in (drafts, draft_tokens, accepted))
    return read.snapshot(
        ENGINE,
        METRICS_PATH,
        speculation_enabled=True if spec_seen or base.positive(k) else None,
        num_speculative_tokens=k,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        accepted_per_position=per_pos,
        generation_tokens=read.counter("generation_tokens", GENERATION),
        accept_length_gauge=read.gauge(ACCEPT_LENGTH, "mean"),
        draft_overhead_gauge=read.gauge(DRAFT_OVERHEAD, "mean"),
        time_per_output_token=read.histogram("time_per_output_token", TPOT),
        time_to_first_token=read.histogram("time_to_first_token", TTFT),
        e2e_latency=read.histogram("e2e_latency", E2E),
        running_requests=read.gauge(RUNNING),
        waiting_requests=read.gauge(WAITING),
    )


def _configured_k(page: promtext.Page) -> int | None:
    for sample in page.samples(CONFIG_INFO):
        for label in _K_LABELS:
            raw = sample.label(label)
            if raw is not None and raw.isdigit():
                return int(raw)
    return None


# --- /perf_metrics ------------------------------------------------------------------------------


def request_stats(entry: Any, where: str = "perf_metrics entry") -> SpecStats | None:
    """One ``/perf_metrics`` entry: ``perf_metrics.speculative_decoding`` -> SpecStats.

    TRT-LLM reports totals only: no rounds, no per-round histogram, so no full-rollback count.
    """
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(entry).__name__}")
    perf = fields.obj(entry.get("perf_metrics"), f"{where}.perf_metrics") or entry
    path = (
        f"{where}.perf_metrics.speculative_decoding" if perf is not entry else f"{where}.speculative_decoding"
    )
    spec = fields.obj(perf.get("speculative_decoding"), path)
    if spec is None:
        return None
    drafted = fields.count(spec, "total_draft_tokens", path)
    accepted = fields.count(spec, "total_accepted_draft_tokens", path)
    if drafted is None and accepted is None:
        return None
    return SpecStats(source=ENGINE, draft_tokens=drafted, accepted_tokens=accepted)


def perf_metrics_stats(payload: Any) -> dict[str, SpecStats]:
    """The whole ``GET /perf_metrics`` answer (a list of entries) -> ``{request_id: SpecStats}``."""
    if not isinstance(payload, list):
        raise InputError(f"/perf_metrics: expected a JSON list of entries, got {type(payload).__name__}")
    result: dict[str, SpecStats] = {}
    for i, entry in enumerate(payload):
        where = f"/perf_metrics[{i}]"
        if not isinstance(entry, dict) or entry.get("request_id") is None:
            raise InputError(f"{where}.request_id: expected every entry to carry a request_id")
        stats = request_stats(entry, where)
        if stats is not None:
            result[str(entry["request_id"])] = stats
    return result


def missing_reason(entry: Any, request: dict | None = None) -> str | None:
    if not isinstance(entry, dict):
        return "not_json"
    if request_stats(entry) is not None:
        return None
    return "no_perf_metrics" if "perf_metrics" not in entry else "no_spec_metrics"
