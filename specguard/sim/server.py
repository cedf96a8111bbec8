"""What the simulated vLLM, SGLang and llama.cpp servers share: the pool runtime, the routes
every one serves (the OpenAI API, ``/metrics``, ``/sim/truth``), OpenAI request parsing, the
run-or-stream flow that cancels a generation when its client goes away, and server-sent-event
framing."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from specguard.sim.generation import Generation
from specguard.sim.openai_request import ApiError, GenerationSpec, parse_json, parse_openai
from specguard.sim.runtime import PoolRuntime

TASK_HEADER = "x-task-type"
MAX_BODY_BYTES = 16 * 1024 * 1024


@web.middleware
async def fastapi_errors(request: web.Request, handler) -> web.StreamResponse:
    """Unknown routes and methods answer like a FastAPI app: ``{"detail": "Not Found"}``."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return web.json_response({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return web.json_response({"detail": "Method Not Allowed"}, status=405)


async def send_event(response: web.StreamResponse, payload: Any, *, compact: bool = False) -> None:
    """Write one ``data: <json>`` server-sent event."""
    text = json.dumps(payload, separators=(",", ":")) if compact else json.dumps(payload)
    await response.write(b"data: " + text.encode() + b"\n\n")


def stream_head(spec: GenerationSpec, id_prefix: str = "") -> dict[str, Any]:
    """The fields every chunk of one OpenAI stream repeats."""
    return {
        "id": id_prefix + secrets.token_hex(16),
        "object": "chat.completion.chunk" if spec.chat else "text_completion",
        "created": int(time.time()),
        "model": spec.model,
    }


def chunk_choice(
    index: int, text: str, finish: str | None, *, chat: bool, role: bool = False
) -> dict[str, Any]:
    """One choice of an OpenAI stream chunk: a chat ``delta`` (carrying the role when ``role``)
    or a completion's ``text``."""
    if chat:
        body: dict[str, Any] = {
            "delta": {"role": "assistant", "content": text} if role else {"content": text}
        }
    else:
        body = {"text": text}
    return {"index": index, **body, "logprobs": None, "finish_reason": finish}


def usage(generation: Generation) -> dict[str, Any]:
    """OpenAI ``usage`` counts of a generation (all its choices)."""
    prompt, completion = generation.prompt_tokens, generation.completion_tokens
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


async def end_events(response: web.StreamResponse) -> None:
    """End a stream the OpenAI way: ``data: [DONE]``."""
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()


def client_gone() -> web.Response:
    """What a handler returns for a client that went away: aiohttp's write of it fails quietly."""
    return web.Response(status=499, reason="Client Closed Request")


class SimServer:
    """Base of one engine's simulated HTTP surface; subclasses add their routes and shapes."""

    def __init__(self, runtime: PoolRuntime, truth: Callable[[], dict[str, Any]], metrics: Any):
        self.runtime = runtime
        self.config = runtime.config
        self.truth = truth
        self.metrics = metrics
        runtime.sinks.append(metrics)
        self.created = int(time.time())

    metrics_content_type = "text/plain; version=0.0.4; charset=utf-8"

    @staticmethod
    def error_response(status: int, message: str, err_type: str, param: str | None) -> web.Response:
        raise NotImplementedError

    def middlewares(self) -> list:
        return []

    def dialect_routes(self) -> list[web.RouteDef]:
        """The engine's own routes beside the common ones (health, version, server info...)."""
        return []

    def app(self) -> web.Application:
        app = web.Application(middlewares=self.middlewares(), client_max_size=MAX_BODY_BYTES)
        app.router.add_routes(
            [
                *self.dialect_routes(),
                web.get("/v1/models", self.models),
                web.get("/metrics", self.metrics_page),
                web.get("/sim/truth", self.truth_page),
                web.post("/v1/completions", self.completions),
                web.post("/v1/chat/completions", self.chat_completions),
            ]
        )
        return app

    async def models(self, request: web.Request) -> web.Response:
        raise NotImplementedError

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics_content_type})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def truth_page(self, request: web.Request) -> web.Response:
        return web.json_response(self.truth())

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        raise NotImplementedError

    async def _parse_openai(self, request: web.Request, *, chat: bool, task: str | None) -> GenerationSpec:
        """The request's OpenAI body as a spec; raises ``ApiError`` for a bad one."""
        body = parse_json(await request.read())
        return parse_openai(
            body,
            chat=chat,
            served_model=self.config.model_name,
            max_model_len=self.config.max_model_len,
            default_temperature=self.config.default_temperature,
            task_header=task,
        )

    def _api_error(self, exc: ApiError) -> web.Response:
        return self.error_response(exc.status, exc.message, exc.err_type, exc.param)

    @staticmethod
    async def _serve(
        generation: Generation,
        stream: Callable[[], Awaitable[web.StreamResponse]] | None,
        respond: Callable[[], web.StreamResponse],
    ) -> web.StreamResponse:
        """Stream (``stream`` given) or run to the end and ``respond``; a client that goes away
        cancels the generation (as vLLM aborts the request), quietly: that is no server error."""
        try:
            if stream is not None:
                return await stream()
            await generation.run()
        except asyncio.CancelledError:
            generation.cancel()
            raise
        except ConnectionError:  # a write found the client gone: nothing left to answer to
            generation.cancel()
            return client_gone()
        return respond()
