"""Parse and validate an OpenAI-style request body the way vLLM does, into a plain spec.

Shared by the vLLM and SGLang front ends. Errors carry the status, OpenAI error type and the
offending parameter, so each dialect renders them in its own envelope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specguard import untrusted
from specguard.errors import InputError
from specguard.sim.text import count_tokens


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


@dataclass(frozen=True)
class GenerationSpec:
    chat: bool
    model: str
    prompts: tuple[str, ...]  # one text per prompt (a list prompt gives several)
    prompt_tokens: tuple[int, ...]
    n: int
    max_tokens: int | None
    temperature: float
    stream: bool
    include_usage: bool
    continuous_usage: bool
    task: str | None
    ignore_eos: bool
    return_spec_tokens_details: bool  # SGLang extension
    body: dict[str, Any]
    stop: tuple[str, ...] = ()  # stop strings: a natural stop then ends "on a stop string"


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = untrusted.loads(raw or b"", "body")
    except InputError as exc:  # not JSON, nested too deep, a number of 5,000 digits...
        raise ApiError(400, f"JSON decode error: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "Input should be a valid dictionary or object to extract fields from")
    return body


def _number(body: dict[str, Any], key: str, default: float | None) -> float | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError(400, f"{key}: Input should be a valid number", param=key)
    return float(value)


_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})


def _flag(body: dict[str, Any], key: str, default: bool = False) -> bool:
    """A boolean field read as vLLM's pydantic models read it: true/false, 0/1 and the strings
    "yes"/"no", "on"/"off", "true"/"false"...; anything else is a 400 naming the field."""
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ApiError(400, f"{key}: Input should be a valid boolean", param=key)


def _integer(body: dict[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key}: Input should be a valid integer", param=key)
    return value


def _prompt_texts(body: dict[str, Any], chat: bool) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(
                400, "messages: Field required" if messages is None else "messages: invalid", param="messages"
            )
        parts = []
        tokens = 0
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise ApiError(400, f"messages.{index}: each message needs a role", param="messages")
            content = message.get("content") or ""
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"{message['role']}: {content}")
            tokens += 4 + count_tokens(str(content))
        return ("\n".join(parts),), (tokens,)
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError(400, "prompt: Field required", param="prompt")
    if isinstance(prompt, str):
        return (prompt,), (count_tokens(prompt),)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return (" ".join(map(str, prompt)),), (len(prompt),)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return tuple(prompt), tuple(count_tokens(p) for p in prompt)
    raise ApiError(400, "prompt must be a string, a list of strings or a list of token ids", param="prompt")


def parse_openai(
    body: dict[str, Any],
    *,
    chat: bool,
    served_model: str,
    max_model_len: int,
    default_temperature: float,
    task_header: str | None,
) -> GenerationSpec:
    """Validate as vLLM's OpenAI server does; unknown fields are ignored, as there."""
    model = body.get("model")
    if model is not None and model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    prompts, prompt_tokens = _prompt_texts(body, chat)
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, None)
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
    n = _integer(body, "n", 1) or 1
    if n < 1:
        raise ApiError(400, f"n must be at least 1, got {n}.", param="n")
    temperature = _number(body, "temperature", default_temperature)
    assert temperature is not None
    if temperature < 0:
        raise ApiError(400, f"temperature must be non-negative, got {temperature}.", param="temperature")
    top_p = _number(body, "top_p", 1.0)
    if top_p is not None and not 0 < top_p <= 1:
        raise ApiError(400, f"top_p must be in (0, 1], got {top_p}.", param="top_p")
    longest = max(prompt_tokens)
    if longest >= max_model_len or (max_tokens is not None and longest + max_tokens > max_model_len):
        requested = longest + (max_tokens or 0)
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{requested} tokens ({longest} in the messages, {max_tokens or 0} in the completion). "
            "Please reduce the length of the messages or completion.",
            param="max_tokens" if max_tokens else "messages" if chat else "prompt",
        )
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options: Input should be a valid dictionary", param="stream_options")
    options = options or {}
    if options and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    metadata = body.get("metadata")
    task = task_header
    if task is None and isinstance(metadata, dict) and isinstance(metadata.get("task"), str):
        task = metadata["task"]
    return GenerationSpec(
        chat=chat,
        model=served_model,
        prompts=prompts,
        prompt_tokens=prompt_tokens,
        n=n,
        max_tokens=max_tokens,
        temperature=temperature,
        stream=stream,
        include_usage=_flag(options, "include_usage"),
        continuous_usage=_flag(options, "continuous_usage_stats"),
        task=task,
        ignore_eos=_flag(body, "ignore_eos"),
        return_spec_tokens_details=_flag(body, "return_spec_tokens_details"),
        body=body,
        stop=_stop_strings(body),
    )


def _stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(s for s in stop if s)
    raise ApiError(400, "stop: Input should be a valid string or list of strings", param="stop")
