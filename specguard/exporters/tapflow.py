"""One request's journey through the tap, and the ``RequestRecord`` it becomes.

``Flow`` collects what the tap learns while the request is in flight (class, pool, timings,
usage, spec stats, failure); ``to_record`` turns it into the record the statistics keep,
naming why a request could not be attributed when the engine reported no per-request stats.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specguard.exporters import tapstream
from specguard.exporters.classify import RequestClass
from specguard.exporters.config import PoolConfig
from specguard.exporters.records import RequestRecord, SpecStats


@dataclass
class Flow:
    """What the tap learns about one request while it is in flight."""

    pool: PoolConfig
    cls: RequestClass
    route: str
    load_bucket: str
    started_at: float
    t0: float
    body: dict[str, Any] | None
    load: float | None = None  # in-flight requests per replica of the pool, this one included
    replicas: int = 1  # of the pool when the request was sent
    first_area: float = 0.0  # the pool's in-flight integral (LoadMeter.area) at the first content chunk
    last_area: float = 0.0  # ... and at the last one
    additions: tapstream.Additions = field(default_factory=tapstream.Additions)
    status: int = 0
    streamed: bool = False
    first_at: float | None = None
    last_at: float | None = None
    chunks: int = 0
    usage_tokens: int | None = None
    prompt_tokens: int | None = None  # usage.prompt_tokens as the engine reported it
    spec: SpecStats | None = None
    failure: str | None = None  # unattributed reason forced by an error
    connect_failed: bool = False  # the pool could not be connected to: nothing was sent anywhere
    # no answer and nothing reached the client (a failed connect, a reset): it may go elsewhere
    resend: bool = False
    containers: int = 0  # JSON arrays and objects in the request body (exporters.bodyparse)
    done: bool = False  # the stream's ``data: [DONE]`` went to the client: it has the whole answer


def unattributed_reason(flow: Flow) -> str | None:
    """Why a finished request has no per-request spec stats (None when it has, or needs none)."""
    if flow.failure is not None:
        return flow.failure
    if flow.body is None:
        return "not_json"
    if flow.status != 200:
        return "error_status"
    if flow.spec is not None or not flow.pool.speculative:
        return None
    body = flow.body
    n = body.get("n", 1)
    if (isinstance(n, int) and n > 1) or (isinstance(body.get("best_of"), int) and body["best_of"] > 1):
        return "n_gt_1"
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) > 1:
        return "prompt_list"
    if body.get("stop"):
        return "stop_string"
    if flow.streamed and flow.usage_tokens is None:
        return "no_usage"
    return "no_spec_stats"


def to_record(flow: Flow, engine: str, end: float) -> RequestRecord:
    """The finished request as a RequestRecord; ``end`` is the monotonic time it ended."""
    output = flow.usage_tokens
    if output is None and flow.spec is not None and flow.spec.output_tokens is not None:
        output = flow.spec.output_tokens
    approximate = output is None and flow.chunks > 0
    if output is None:
        output = flow.chunks
    spec = flow.spec
    if (
        spec is None
        and flow.failure is None
        and flow.status == 200
        and flow.pool.speculative
        and flow.streamed
        and engine in ("trtllm", "tgi")
        and flow.chunks
        and flow.usage_tokens
    ):  # no engine-reported stats: one stream chunk ~ one verify round
        k = flow.pool.num_speculative_tokens
        spec = SpecStats(
            source="chunks",
            rounds=flow.chunks,
            draft_tokens=flow.chunks * k,
            accepted_tokens=max(0, flow.usage_tokens - flow.chunks),
            output_tokens=flow.usage_tokens,
            num_speculative_tokens=k,
            approximate=True,
        )
    elif spec is not None and approximate:
        spec = dataclasses.replace(spec, approximate=True)
    ttft = flow.first_at - flow.t0 if flow.first_at is not None else None
    # A decode phase is only observable across two or more content chunks: an engine (or its
    # output queue under load) that sends the whole answer in one chunk gives no per-token time.
    timed = flow.first_at is not None and flow.last_at is not None and flow.chunks >= 2
    decode = flow.last_at - flow.first_at if timed else None  # type: ignore[operator]
    decode_load = None
    if decode:  # mean in-flight requests per replica while the request decoded
        decode_load = (flow.last_area - flow.first_area) / decode / max(1, flow.replicas)
    return RequestRecord(
        pool=flow.pool.name,
        task_type=flow.cls.task_type,
        temperature_bucket=flow.cls.temperature_bucket,
        load_bucket=flow.load_bucket,
        route=flow.route,
        started_at=flow.started_at,
        status=flow.status,
        streamed=flow.streamed,
        temperature=flow.cls.temperature,
        top_p=flow.cls.top_p,
        output_tokens=output,
        ttft_seconds=ttft,
        decode_seconds=decode,
        e2e_seconds=end - flow.t0,
        spec=spec,
        unattributed_reason=None if spec is not None else unattributed_reason(flow),
        classified=flow.cls.classified,
        load=flow.load,
        decode_load=decode_load,
        prompt_tokens=flow.prompt_tokens,
        sequences=tapstream.sequences(flow.body),
    )
