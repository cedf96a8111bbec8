"""SGLang 0.5.23's HTTP surface for one simulated pool.

Native ``/generate`` answers with ``meta_info`` (spec fields, 0.5.23 names, on the finished
output only; ``completion_tokens`` counts the prefill-produced first token, so
``spec_accept_length`` reads slightly high). The OpenAI endpoints add
``sglext.spec_tokens_details`` when the body sets ``return_spec_tokens_details``. Custom metric
labels come from the ``x-custom-labels`` header (JSON, allowed keys only) or ``/generate``'s
``custom_labels``. ``/server_info`` carries ``internal_states[0].step_time_dict``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from specguard.sim import server
from specguard.sim.engine import SimRequest
from specguard.sim.generation import Generation
from specguard.sim.openai_request import ApiError, GenerationSpec, parse_json
from specguard.sim.runtime import PoolRuntime
from specguard.sim.sglang_metrics import SglangMetrics
from specguard.sim.text import count_tokens

SGLANG_VERSION = "0.5.23"
LABELS_HEADER = "x-custom-labels"


def error_response(status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
    body = {"object": "error", "message": message, "type": err_type, "param": param, "code": status}
    return web.json_response(body, status=status)


def spec_fields(request: SimRequest) -> dict[str, Any]:
    """The 0.5.23 spec fields of one finished output (empty without a verify round)."""
    if not request.rounds:
        return {}
    proposed = request.rounds * request.k
    return {
        "spec_accept_rate": request.accepted_tokens / proposed,
        "spec_accept_length": request.generated / request.rounds,
        "spec_num_correct_drafts": request.accepted_tokens,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": request.rounds,
        "spec_correct_drafts_histogram": list(request.histogram),
    }


def finish_reason(request: SimRequest) -> dict[str, Any] | None:
    if request.state != "finished":
        return None
    if request.finish_reason == "length":
        return {"type": "length", "length": request.generated}
    if request.finish_reason == "abort":
        return {"type": "abort", "message": "client disconnected"}
    return {"type": "stop", "matched": 2}


class SglangServer(server.SimServer):
    error_response = staticmethod(error_response)

    def __init__(self, runtime: PoolRuntime, truth: Callable[[], dict[str, Any]]):
        super().__init__(runtime, truth, SglangMetrics(runtime.config, runtime.pool))

    metrics_content_type = "text/plain; version=0.0.4"

    def middlewares(self) -> list:
        return [server.fastapi_errors]

    def dialect_routes(self) -> list[web.RouteDef]:
        gets = [
            ("/health", self.health),
            ("/health_generate", self.health),
            ("/get_model_info", self.model_info),
            ("/server_info", self.server_info),
            ("/get_server_info", self.server_info),
        ]
        return [web.get(path, handler) for path, handler in gets] + [web.post("/generate", self.generate)]

    # ---- simple endpoints ------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "sglang",
            "root": self.config.model_name,
            "max_model_len": self.config.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.config.model_name, "is_generation": True})

    async def server_info(self, request: web.Request) -> web.Response:
        k = self.runtime.pool.num_speculative_tokens
        state = {
            "avg_spec_accept_length": self.metrics.avg_spec_accept_length(),
            "last_gen_throughput": self.metrics.last_gen_throughput,
            "effective_max_running_requests_per_dp": self.runtime.pool.max_num_seqs,
            "memory_usage": {"weight": 15.0, "kvcache": 4.0, "token_capacity": 524288, "graph": 0.5},
            "step_time_dict": {b: list(v) for b, v in self.metrics.step_time_dict.items()},
        }
        return web.json_response(
            {
                "model_path": self.config.model_name,
                "served_model_name": self.config.model_name,
                "speculative_algorithm": "EAGLE" if k else None,
                "speculative_num_steps": k or None,
                "speculative_eagle_topk": 1 if k else None,
                "speculative_num_draft_tokens": k + 1 if k else None,
                "max_running_requests": self.runtime.pool.max_num_seqs,
                "decode_log_interval": self.metrics.interval,
                "enable_metrics": True,
                "tokenizer_metrics_custom_labels_header": LABELS_HEADER,
                "tokenizer_metrics_allowed_custom_labels": list(self.config.custom_label_names),
                "internal_states": [state],
                "version": SGLANG_VERSION,
            }
        )

    # ---- labels and classes ------------------------------------------------------------------------
    def _header_labels(self, request: web.Request) -> dict[str, str]:
        raw = request.headers.get(LABELS_HEADER)
        if not raw:
            return {}
        try:
            labels = json.loads(raw)
        except ValueError:
            return {}
        if not isinstance(labels, dict):
            return {}
        return {k: str(v) for k, v in labels.items() if k in self.config.custom_label_names}

    def _start(self, spec: GenerationSpec, labels: dict[str, str]) -> Generation:
        generation = Generation(self.runtime, spec)
        for sim in generation.requests:
            sim.meta["labels"] = labels
        generation.start()
        return generation

    # ---- native /generate ------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = parse_json(await request.read())
            spec, labels = self._native_spec(body, request)
        except ApiError as exc:
            return self._api_error(exc)
        generation = self._start(spec, labels)
        return await self._serve(
            generation,
            (lambda: self._stream_native(request, generation)) if spec.stream else None,
            lambda: self._native_response(generation),
        )

    def _native_response(self, generation: Generation) -> web.Response:
        outputs = [self._native_output(generation, i) for i in range(len(generation.requests))]
        self.runtime.truth.observe_reported(sum("spec_verify_ct" in o["meta_info"] for o in outputs))
        return web.json_response(outputs[0] if len(outputs) == 1 else outputs)

    def _native_spec(
        self, body: dict[str, Any], request: web.Request
    ) -> tuple[GenerationSpec, dict[str, str]]:
        text = body.get("text")
        ids = body.get("input_ids")
        if text is None and ids is None:
            raise ApiError(400, "Either text or input_ids should be provided.")
        prompts = [text] if isinstance(text, str) else text if isinstance(text, list) else None
        if prompts is None:
            prompts = (
                [" ".join(map(str, ids))] if ids and isinstance(ids[0], int) else [str(i) for i in ids or []]
            )
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise ApiError(400, "sampling_params must be an object")
        max_new = params.get("max_new_tokens", 128)
        if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
            raise ApiError(400, f"max_new_tokens must be a non-negative integer, got {max_new!r}.")
        temperature = params.get("temperature", 1.0)
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
            raise ApiError(400, f"temperature must be non-negative, got {temperature!r}.")
        labels = body.get("custom_labels") or {}
        labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
        task = request.headers.get(server.TASK_HEADER) or labels.get("task")
        n = params.get("n", 1) if isinstance(params.get("n", 1), int) else 1
        spec = GenerationSpec(
            chat=False,
            model=self.config.model_name,
            prompts=tuple(str(p) for p in prompts),
            prompt_tokens=tuple(count_tokens(str(p)) for p in prompts),
            n=max(1, n),
            max_tokens=max(1, max_new),
            temperature=float(temperature),
            stream=bool(body.get("stream", False)),
            include_usage=False,
            continuous_usage=False,
            task=task,
            ignore_eos=bool(params.get("ignore_eos")),
            return_spec_tokens_details=False,
            body=body,
        )
        return spec, labels

    def _meta_info(self, generation: Generation, i: int) -> dict[str, Any]:
        sim = generation.requests[i]
        times = sim.times
        meta: dict[str, Any] = {
            "id": sim.meta.setdefault("rid", secrets.token_hex(16)),
            "finish_reason": finish_reason(sim),
            "prompt_tokens": sim.prompt_tokens,
            "weight_version": "default",
            "completion_tokens": sim.generated,
            "cached_tokens": 0,
        }
        if sim.state == "finished":
            meta["e2e_latency"] = times.get("finished", 0.0) - times.get("arrival", 0.0)
            meta.update(spec_fields(sim))
        return meta

    def _native_output(self, generation: Generation, i: int) -> dict[str, Any]:
        return {"text": generation.text(i), "meta_info": self._meta_info(generation, i)}

    async def _stream_native(self, request: web.Request, generation: Generation) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for sim in generation.requests:
            sim.meta["streaming"] = True
        async for chunk in generation.steps():
            payload = self._native_output(generation, chunk.choice)
            payload["index"] = chunk.choice
            if chunk.emission.finished and "spec_verify_ct" in payload["meta_info"]:
                self.runtime.truth.observe_reported()
            await server.send_event(response, payload)
        await server.end_events(response)
        return response

    # ---- OpenAI endpoints ------------------------------------------------------------------------
    async def _openai(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        labels = self._header_labels(request)
        try:
            task = request.headers.get(server.TASK_HEADER) or labels.get("task")
            spec = await self._parse_openai(request, chat=chat, task=task)
        except ApiError as exc:
            return self._api_error(exc)
        generation = self._start(spec, labels)
        for sim in generation.requests:
            sim.meta["streaming"] = spec.stream
        return await self._serve(
            generation,
            (lambda: self._stream_openai(request, spec, generation)) if spec.stream else None,
            lambda: web.json_response(self._openai_response(spec, generation)),
        )

    def _details(self, spec: GenerationSpec, generation: Generation) -> dict[str, Any] | None:
        if not spec.return_spec_tokens_details or not self.runtime.pool.num_speculative_tokens:
            return None
        details = [self._spec_details(sim) for sim in generation.requests]
        return {"spec_tokens_details": details[0] if len(details) == 1 else details}

    @staticmethod
    def _spec_details(sim: SimRequest) -> dict[str, Any]:
        fields = spec_fields(sim)
        return {
            "spec_accept_rate": fields.get("spec_accept_rate", 0.0),
            "spec_accept_length": fields.get("spec_accept_length", 0.0),
            "spec_cap_length": None,
            "spec_block_accept_length": None,
            "spec_num_correct_drafts": sim.accepted_tokens,
            "spec_num_proposed_drafts": sim.rounds * sim.k,
            "spec_verify_ct": sim.rounds,
            "spec_correct_drafts_histogram": list(sim.histogram),
            "spec_cap_lens_histogram": None,
        }

    def _usage(self, generation: Generation) -> dict[str, Any]:
        return {**server.usage(generation), "prompt_tokens_details": None, "reasoning_tokens": 0}

    def _openai_response(self, spec: GenerationSpec, generation: Generation) -> dict[str, Any]:
        choices = []
        for i, sim in enumerate(generation.requests):
            base = {"index": i, "logprobs": None, "finish_reason": sim.finish_reason, "matched_stop": None}
            if spec.chat:
                message = {
                    "role": "assistant",
                    "content": generation.text(i),
                    "reasoning_content": None,
                    "tool_calls": None,
                }
                choices.append({**base, "message": message})
            else:
                choices.append({**base, "text": generation.text(i)})
        payload: dict[str, Any] = {
            "id": secrets.token_hex(16),
            "object": "chat.completion" if spec.chat else "text_completion",
            "created": int(time.time()),
            "model": spec.model,
            "choices": choices,
            "usage": self._usage(generation),
        }
        details = self._details(spec, generation)
        if details is not None:
            payload["sglext"] = details
            self.runtime.truth.observe_reported(len(generation.requests))
        return payload

    async def _stream_openai(
        self, request: web.Request, spec: GenerationSpec, generation: Generation
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        head = server.stream_head(spec)
        sent_role: set[int] = set()
        async for chunk in generation.steps():
            e = chunk.emission
            finish = e.request.finish_reason if e.finished else None
            first = spec.chat and chunk.choice not in sent_role
            sent_role.add(chunk.choice)
            choice = server.chunk_choice(chunk.choice, chunk.text, finish, chat=spec.chat, role=first)
            payload: dict[str, Any] = {**head, "choices": [choice]}
            if finish and spec.return_spec_tokens_details and self.runtime.pool.num_speculative_tokens:
                payload["sglext"] = {"spec_tokens_details": self._spec_details(e.request)}
                self.runtime.truth.observe_reported()
            await server.send_event(response, payload)
        if spec.include_usage:
            await server.send_event(response, {**head, "choices": [], "usage": self._usage(generation)})
        await server.end_events(response)
        return response
