"""llama.cpp server (build 11434)'s HTTP surface for one simulated pool.

Shapes follow ``llama-server --metrics`` of that build, key order included (nlohmann's ordered
JSON, no spaces): ``system_fingerprint`` ``b11434-unknown``, ``timings`` on every non-streamed
response (``draft_n`` / ``draft_n_accepted`` only when the request drafted). A stream sends one
chunk per generated token whatever a verify round produced. A chat stream opens with a
``{"role": "assistant", "content": null}`` delta and ends with a chunk with the finish reason and
an empty delta, then with ``stream_options.include_usage`` a ``choices: []`` chunk with ``usage``;
a completions stream ends with one chunk carrying ``text: ""``, the finish reason and (asked for)
``usage``. The ``timings`` ride on the last chunk, then ``data: [DONE]``. Errors use llama.cpp's envelope
``{"error": {code, message, type}}``. One choice per request (``n`` > 1 is refused). ``/props``
carries only ``build_info``, ``model_alias``, ``model_path`` and ``total_slots`` of the real one.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from specguard.sim import server
from specguard.sim.generation import Generation
from specguard.sim.llamacpp_metrics import LlamacppMetrics, timings
from specguard.sim.openai_request import ApiError, GenerationSpec
from specguard.sim.runtime import PoolRuntime

BUILD = 11434
BUILD_INFO = f"b{BUILD}-unknown"  # "b<build number>-<commit>"; a build from the sdist has no git commit
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4"
_TOKEN = re.compile(r" [^ ]*")
_TYPES = {400: "invalid_request_error", 404: "not_found_error", 501: "not_supported_error"}


def dumps(payload: Any) -> bytes:
    """JSON as nlohmann's ordered JSON writes it: keys in insertion order, no spaces, UTF-8 as is."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(payload), status=status, content_type="application/json")


def error_response(status: int, message: str, err_type: str | None = None, param: str | None = None):
    del param  # llama.cpp does not name the parameter
    kind = _TYPES.get(status, "server_error") if err_type in (None, "BadRequestError") else err_type
    return json_response({"error": {"code": status, "message": message, "type": kind}}, status=status)


def usage(generation: Generation) -> dict[str, Any]:
    prompt, completion = generation.prompt_tokens, generation.completion_tokens
    return {
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


class LlamacppServer(server.SimServer):
    error_response = staticmethod(error_response)

    def __init__(self, runtime: PoolRuntime, truth: Callable[[], dict[str, Any]]):
        super().__init__(runtime, truth, LlamacppMetrics(runtime.config, runtime.pool))

    metrics_content_type = CONTENT_TYPE_METRICS

    def dialect_routes(self) -> list[web.RouteDef]:
        return [
            web.get("/health", self.health),
            web.get("/v1/health", self.health),
            web.get("/props", self.props),
        ]

    async def health(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        name = self.config.model_name
        card = {"id": name, "object": "model", "created": self.created, "owned_by": "llamacpp", "meta": None}
        return json_response({"object": "list", "data": [card]})

    async def props(self, request: web.Request) -> web.Response:
        name = self.config.model_name
        slots = self.runtime.pool.max_num_seqs
        return json_response(
            {"build_info": BUILD_INFO, "model_alias": name, "model_path": name, "total_slots": slots}
        )

    async def _openai(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            spec = await self._parse_openai(request, chat=chat, task=request.headers.get(server.TASK_HEADER))
            if spec.n != 1 or len(spec.prompts) != 1:
                raise ApiError(400, "Only one completion choice is allowed")
        except ApiError as exc:
            return self._api_error(exc)
        generation = Generation(self.runtime, spec)
        generation.start()
        return await self._serve(
            generation,
            (lambda: self._stream(request, spec, generation)) if spec.stream else None,
            lambda: json_response(self._full_response(spec, generation)),
        )

    @staticmethod
    def _head(spec: GenerationSpec) -> dict[str, Any]:
        """The envelope fields of a chunk or response, in the server's order (a completion puts
        ``id`` last, a chat chunk second)."""
        return {"created": int(time.time()), "model": spec.model, "system_fingerprint": BUILD_INFO}

    def _timings(self, generation: Generation) -> dict[str, Any]:
        stats = timings(generation.requests[0])
        if "draft_n" in stats:
            self.runtime.truth.observe_reported()
        return stats

    def _full_response(self, spec: GenerationSpec, generation: Generation) -> dict[str, Any]:
        sim = generation.requests[0]
        text = generation.text(0)
        if spec.chat:
            message = {"role": "assistant", "content": text}
            choice = {"finish_reason": sim.finish_reason, "index": 0, "message": message}
        else:
            choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": sim.finish_reason}
        return {
            "choices": [choice],
            **self._head(spec),
            "object": "chat.completion" if spec.chat else "text_completion",
            "usage": usage(generation),
            "id": "chatcmpl-" + secrets.token_hex(16),
            "timings": self._timings(generation),
        }

    async def _stream(
        self, request: web.Request, spec: GenerationSpec, generation: Generation
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        cmpl_id = "chatcmpl-" + secrets.token_hex(16)

        async def send(choices: list, **extra: Any) -> None:
            head = self._head(spec)
            if spec.chat:
                payload = {"choices": choices, "created": head["created"], "id": cmpl_id}
                payload.update(
                    model=spec.model, system_fingerprint=BUILD_INFO, object="chat.completion.chunk"
                )
                payload.update(extra)
            else:
                payload = {"choices": choices, **head, "object": "text_completion", **extra}
                payload = {**{k: v for k, v in payload.items() if k != "timings"}, "id": cmpl_id}
                if "timings" in extra:
                    payload["timings"] = extra["timings"]
            await response.write(b"data: " + dumps(payload) + b"\n\n")

        def piece(content: str | None, finish: str | None = None, role: bool = False) -> dict[str, Any]:
            if not spec.chat:
                return {"text": content or "", "index": 0, "logprobs": None, "finish_reason": finish}
            delta: dict[str, Any] = {"role": "assistant", "content": None} if role else {}
            if content is not None:
                delta["content"] = content
            return {"finish_reason": finish, "index": 0, "delta": delta}

        first = True
        finish = None
        async for chunk in generation.steps():
            for token in _TOKEN.findall(chunk.text):  # one event per token, as the server sends them
                if first and spec.chat:
                    await send([piece(None, role=True)])
                first = False
                await send([piece(token)])
            if chunk.emission.finished:
                finish = chunk.emission.request.finish_reason
        stats = self._timings(generation)
        if not spec.chat:
            extra = {"usage": usage(generation)} if spec.include_usage else {}
            await send([piece("", finish)], **extra, timings=stats)
        elif spec.include_usage:
            await send([piece(None, finish)])
            await send([], usage=usage(generation), timings=stats)
        else:
            await send([piece(None, finish)], timings=stats)
        await server.end_events(response)
        return response
