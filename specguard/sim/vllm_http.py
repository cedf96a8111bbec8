"""vLLM's HTTP surface for one simulated pool (OpenAI completions and chat, /metrics, /health).

Shapes follow vLLM 0.32/0.33 with ``--per-request-spec-decode-metrics summary``: the per-request
``metrics.speculative_decoding`` block on non-streamed responses, and in streams only on the final
usage-only chunk (``choices: []``, needs ``stream_options.include_usage``); ``metrics`` is null for
n > 1 or several prompts. A stream sends one chunk per engine step per choice, carrying every
token of that step. Errors use vLLM's envelope ``{"error": {message, type, param, code}}``.
``system_fingerprint`` follows ``--fingerprint-mode`` (config ``fingerprint_mode``): on full
responses, and in a stream on the usage chunk, or on each choice's terminal chunk when the client
did not ask for usage.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from specguard.sim import server
from specguard.sim.engine import SimRequest
from specguard.sim.generation import Generation
from specguard.sim.http_metrics import HttpMetrics
from specguard.sim.openai_request import ApiError, GenerationSpec
from specguard.sim.runtime import PoolRuntime
from specguard.sim.vllm_metrics import VllmMetrics

VLLM_VERSION = "0.33.0"
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


def error_response(status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status)


def system_fingerprint(runtime: PoolRuntime) -> str | None:
    """vLLM's ``system_fingerprint`` under ``--fingerprint-mode``: ``vllm-<version>-<hash8>`` for
    ``full`` and ``hash`` (the same on one device), where hash8 starts the engine config's hash;
    here the hash covers what tells simulated engines apart (model, context, pool, K). ``none``:
    None (null on full responses, left out of stream chunks)."""
    config, pool = runtime.config, runtime.pool
    if config.fingerprint_mode == "none":
        return None
    identity = repr(
        (config.model_name, config.max_model_len, pool.name, pool.num_speculative_tokens, pool.method)
    )
    return f"vllm-{VLLM_VERSION}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"


def spec_decoding(request: SimRequest, *, streamed: bool = False) -> dict[str, Any]:
    """``metrics.speculative_decoding`` (vLLM ``SpeculativeDecodingMetrics``, summary level).

    The per-step arrays exist only at the ``detailed`` level: a non-streamed response carries
    them as null, a stream's usage chunk (serialised with ``exclude_none``) leaves them out."""
    steps = request.rounds
    block: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + request.accepted_tokens / steps if steps else 1.0,
        "draft_acceptance_rate": request.accepted_tokens / request.draft_tokens
        if request.draft_tokens
        else 0.0,
        "acceptance_histogram": list(request.histogram),
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": request.accepted_tokens,
        "num_draft_tokens": request.draft_tokens,
        "num_spec_tokens": request.k,
    }
    if not streamed:
        block.update(per_step_accepted=None, per_step_drafted=None)
    return block


def _stopped_on_string(spec: GenerationSpec, request: SimRequest) -> bool:
    return bool(spec.stop) and request.finish_reason == "stop"


def _stop_reason(spec: GenerationSpec, request: SimRequest) -> str | None:
    return spec.stop[0] if _stopped_on_string(spec, request) else None


class VllmServer(server.SimServer):
    error_response = staticmethod(error_response)

    def __init__(self, runtime: PoolRuntime, truth: Callable[[], dict[str, Any]]):
        super().__init__(runtime, truth, VllmMetrics(runtime.config, runtime.pool))
        self.http_metrics = HttpMetrics(self.metrics.registry)
        self.system_fingerprint = system_fingerprint(runtime)

    metrics_content_type = CONTENT_TYPE_METRICS

    def middlewares(self) -> list:
        return [self.http_metrics.middleware, server.fastapi_errors]

    def dialect_routes(self) -> list[web.RouteDef]:
        return [
            web.get("/health", self.health),
            web.get("/ping", self.health),
            web.get("/version", self.version),
        ]

    # ---- simple endpoints ------------------------------------------------------------------------
    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def models(self, request: web.Request) -> web.Response:
        name = self.config.model_name
        card = {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": name,
            "parent": None,
            "max_model_len": self.config.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{secrets.token_hex(16)}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return web.json_response({"object": "list", "data": [card]})

    # ---- generation ------------------------------------------------------------------------------
    async def _openai(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            spec = await self._parse_openai(request, chat=chat, task=request.headers.get(server.TASK_HEADER))
        except ApiError as exc:
            return self._api_error(exc)
        generation = Generation(self.runtime, spec)
        generation.start()
        return await self._serve(
            generation,
            (lambda: self._stream(request, spec, generation)) if spec.stream else None,
            lambda: web.json_response(self._full_response(spec, generation)),
        )

    def _per_request_metrics(
        self, spec: GenerationSpec, generation: Generation, *, streamed: bool = False
    ) -> dict[str, Any] | None:
        """The spec block, or None where vLLM gives none: K = 0, flag off, n > 1 or several prompts,
        or a request that ended on a stop string (its drafts still count in /metrics)."""
        if self.runtime.pool.num_speculative_tokens == 0 or not self.runtime.pool.per_request_spec_metrics:
            return None
        if len(generation.requests) != 1 or _stopped_on_string(spec, generation.requests[0]):
            return None
        return {"speculative_decoding": spec_decoding(generation.requests[0], streamed=streamed)}

    def _full_response(self, spec: GenerationSpec, generation: Generation) -> dict[str, Any]:
        choices = []
        for i, sim in enumerate(generation.requests):
            if spec.chat:
                message = {
                    "role": "assistant",
                    "content": generation.text(i),
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                }
                choices.append(
                    {
                        "index": i,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": sim.finish_reason,
                        "stop_reason": _stop_reason(spec, sim),
                        "token_ids": None,
                    }
                )
            else:
                choices.append(
                    {
                        "index": i,
                        "text": generation.text(i),
                        "logprobs": None,
                        "finish_reason": sim.finish_reason,
                        "stop_reason": _stop_reason(spec, sim),
                        "token_ids": None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": None,
                    }
                )
        metrics = self._per_request_metrics(spec, generation)
        if metrics is not None:
            self.runtime.truth.observe_reported()
            metrics = {
                "time_to_first_token_ms": None,
                "generation_time_ms": None,
                "queue_time_ms": None,
                "mean_itl_ms": None,
                "tokens_per_second": None,
                **metrics,
            }
        counts = {**server.usage(generation), "prompt_tokens_details": None}
        body: dict[str, Any] = {
            "id": ("chatcmpl-" if spec.chat else "cmpl-") + secrets.token_hex(16),
            "object": "chat.completion" if spec.chat else "text_completion",
            "created": int(time.time()),
            "model": spec.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": self.system_fingerprint,
            "usage": counts,
        }
        if spec.chat:  # a completion has these inside each choice only
            body.update(prompt_logprobs=None, prompt_token_ids=None)
        body.update(kv_transfer_params=None, metrics=metrics)
        return body

    async def _stream(
        self, request: web.Request, spec: GenerationSpec, generation: Generation
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        head = server.stream_head(spec, "chatcmpl-" if spec.chat else "cmpl-")
        sent_role: set[int] = set()

        async def send(payload: dict[str, Any]) -> None:
            await server.send_event(response, payload, compact=True)

        async for chunk in generation.steps():
            e = chunk.emission
            finish = e.request.finish_reason if e.finished else None
            parts = []
            if spec.chat and chunk.choice not in sent_role:
                sent_role.add(chunk.choice)
                parts.append(server.chunk_choice(chunk.choice, "", None, chat=True, role=True))
            choice = server.chunk_choice(chunk.choice, chunk.text, finish, chat=spec.chat)
            if not spec.chat:
                choice["stop_reason"] = None
            if finish is not None:
                choice["stop_reason"] = _stop_reason(spec, e.request)
            parts.append(choice)
            for part in parts:
                payload = {**head, "choices": [part]}
                if spec.include_usage and spec.continuous_usage:
                    payload["usage"] = server.usage(generation)
                if (
                    not spec.include_usage
                    and self.system_fingerprint is not None
                    and part["finish_reason"] is not None
                ):
                    # vLLM stamps the fingerprint on a choice's terminal chunk only when no
                    # usage chunk follows; otherwise the usage chunk carries it.
                    payload["system_fingerprint"] = self.system_fingerprint
                await send(payload)
        if spec.include_usage:
            final: dict[str, Any] = {**head, "choices": [], "usage": server.usage(generation)}
            if self.system_fingerprint is not None:  # vLLM serialises this chunk without nulls
                final["system_fingerprint"] = self.system_fingerprint
            metrics = self._per_request_metrics(spec, generation, streamed=True)
            if metrics is not None:
                self.runtime.truth.observe_reported()
                final["metrics"] = metrics
            await send(final)
        await server.end_events(response)
        return response
