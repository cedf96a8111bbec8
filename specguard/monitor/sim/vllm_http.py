"""vLLM's HTTP surface for one simulated pool (OpenAI completions and chat, /metrics, /health).

Shapes follow vLLM 0.32/0.33 with ``--per-request-spec-decode-metrics summary``: the per-request
``metrics.speculative_decoding`` block on non-streamed responses, and in streams only on the final
usage-only chunk (``choices: []``, needs ``stream_options.include_usage``); ``metrics`` is null for
n > 1 or several prompts. A stream sends one chunk per engine step per choice, carrying every
token of that step. Errors use vLLM's envelope ``{"error": {message, type, param, code}}``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from specguard.monitor.sim.engine import SimRequest
from specguard.monitor.sim.generation import Generation
from specguard.monitor.sim.http_metrics import HttpMetrics
from specguard.monitor.sim.openai_request import ApiError, GenerationSpec, parse_json, parse_openai
from specguard.monitor.sim.runtime import PoolRuntime
from specguard.monitor.sim.vllm_metrics import VllmMetrics

VLLM_VERSION = "0.33.0"
TASK_HEADER = "x-task-type"
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


def error_response(status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status)


def spec_decoding(request: SimRequest) -> dict[str, Any]:
    """``metrics.speculative_decoding`` (vLLM ``SpeculativeDecodingMetrics``, summary level)."""
    steps = request.rounds
    return {
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


@web.middleware
async def fastapi_errors(request: web.Request, handler) -> web.StreamResponse:
    """Unknown routes and methods answer like vLLM's FastAPI app: ``{"detail": "Not Found"}``."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return web.json_response({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return web.json_response({"detail": "Method Not Allowed"}, status=405)


def _stopped_on_string(spec: GenerationSpec, request: SimRequest) -> bool:
    return bool(spec.stop) and request.finish_reason == "stop"


def _stop_reason(spec: GenerationSpec, request: SimRequest) -> str | None:
    return spec.stop[0] if _stopped_on_string(spec, request) else None


class VllmServer:
    def __init__(self, runtime: PoolRuntime, truth: Callable[[], dict[str, Any]]):
        self.runtime = runtime
        self.config = runtime.config
        self.truth = truth
        self.metrics = VllmMetrics(runtime.config, runtime.pool)
        self.http_metrics = HttpMetrics(self.metrics.registry)
        runtime.sinks.append(self.metrics)
        self.created = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self.http_metrics.middleware, fastapi_errors], client_max_size=16 * 1024 * 1024
        )
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/sim/truth", self.truth_page)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    # ---- simple endpoints ------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

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

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_METRICS})

    async def truth_page(self, request: web.Request) -> web.Response:
        return web.json_response(self.truth())

    # ---- generation ------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = parse_json(await request.read())
            spec = parse_openai(
                body,
                chat=chat,
                served_model=self.config.model_name,
                max_model_len=self.config.max_model_len,
                default_temperature=self.config.default_temperature,
                task_header=request.headers.get(TASK_HEADER),
            )
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.err_type, exc.param)
        generation = Generation(self.runtime, spec)
        generation.start()
        try:
            if spec.stream:
                return await self._stream(request, spec, generation)
            await generation.run()
        except (asyncio.CancelledError, ConnectionError):
            generation.cancel()
            raise
        return web.json_response(self._full_response(spec, generation))

    def _per_request_metrics(self, spec: GenerationSpec, generation: Generation) -> dict[str, Any] | None:
        """The spec block, or None where vLLM gives none: K = 0, flag off, n > 1 or several prompts,
        or a request that ended on a stop string (its drafts still count in /metrics)."""
        if self.runtime.pool.num_speculative_tokens == 0 or not self.runtime.pool.per_request_spec_metrics:
            return None
        if len(generation.requests) != 1 or _stopped_on_string(spec, generation.requests[0]):
            return None
        return {"speculative_decoding": spec_decoding(generation.requests[0])}

    def _usage(self, generation: Generation) -> dict[str, Any]:
        prompt, completion = generation.prompt_tokens, generation.completion_tokens
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}

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
        usage = {**self._usage(generation), "prompt_tokens_details": None}
        return {
            "id": ("chatcmpl-" if spec.chat else "cmpl-") + secrets.token_hex(16),
            "object": "chat.completion" if spec.chat else "text_completion",
            "created": int(time.time()),
            "model": spec.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
            "metrics": metrics,
        }

    async def _stream(
        self, request: web.Request, spec: GenerationSpec, generation: Generation
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        rid = ("chatcmpl-" if spec.chat else "cmpl-") + secrets.token_hex(16)
        created = int(time.time())
        obj = "chat.completion.chunk" if spec.chat else "text_completion"
        head = {"id": rid, "object": obj, "created": created, "model": spec.model}
        sent_role: set[int] = set()

        async def send(payload: dict[str, Any]) -> None:
            await response.write(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")

        async for chunk in generation.steps():
            e = chunk.emission
            finish = e.request.finish_reason if e.finished else None
            parts = []
            if spec.chat and chunk.choice not in sent_role:
                sent_role.add(chunk.choice)
                parts.append(
                    {
                        "index": chunk.choice,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                )
            if spec.chat:
                choice: dict[str, Any] = {
                    "index": chunk.choice,
                    "delta": {"content": chunk.text},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            else:
                choice = {
                    "index": chunk.choice,
                    "text": chunk.text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            if finish is not None:
                choice["stop_reason"] = _stop_reason(spec, e.request)
            parts.append(choice)
            for part in parts:
                payload = {**head, "choices": [part]}
                if spec.include_usage and spec.continuous_usage:
                    payload["usage"] = self._usage(generation)
                await send(payload)
        if spec.include_usage:
            final: dict[str, Any] = {**head, "choices": [], "usage": self._usage(generation)}
            metrics = self._per_request_metrics(spec, generation)
            if metrics is not None:
                self.runtime.truth.observe_reported()
                final["metrics"] = metrics
            await send(final)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
