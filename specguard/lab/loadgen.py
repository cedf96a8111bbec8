"""Async load generator: a request mix at a fixed concurrency, bounded, stopping by itself.

    results = await run_load("http://127.0.0.1:8000", [RequestClass("code", temperature=0.0)],
                             concurrency=8, requests=200, stream=True)

Each of ``concurrency`` closed-loop workers sends its next request when the previous one ends,
until ``requests`` were sent or ``duration_s`` passed (then in-flight requests finish). Classes
are drawn by weight from a seeded generator and prompts are reproducible, so the same seed sends
the same requests (the simulator then draws the same acceptance for them). The task type goes
in the ``x-task-type`` header; streams ask for usage so per-request spec stats arrive.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from specguard.errors import ConfigError
from specguard.lab import prompts

TASK_HEADER = "x-task-type"
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


@dataclass(frozen=True)
class RequestClass:
    """One kind of request in a mix. ``temperature`` None leaves it out of the body."""

    task_type: str
    weight: float = 1.0
    temperature: float | None = 0.0
    max_tokens: int | None = 128
    prompt_tokens: int = 64  # approximate prompt length (4 characters per token)
    chat: bool = True  # /v1/chat/completions (else /v1/completions)
    stream: bool | None = None  # None: the run's default
    ignore_eos: bool = False  # vLLM/SGLang extension: always generate max_tokens tokens
    prompts: str = "words"  # "words": reproducible word salad; "task": lab.prompts for a real model
    seeded: bool = False  # send a per-request sampling ``seed`` (from the run's seed and the index), so
    # a sampled request draws the same tokens each time it is sent


@dataclass(frozen=True)
class LoadResult:
    index: int
    url: str
    task_type: str
    temperature: float | None
    stream: bool
    status: int  # HTTP status; 0 when the connection failed
    started_at: float  # wall clock (time.time())
    e2e_seconds: float
    ttft_seconds: float | None = None  # streams: first chunk carrying text
    output_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str | None = None
    chunks: int = 0  # content chunks received (streams)
    # vLLM metrics.speculative_decoding / {"sglext": SGLang spec details} / {"timings": llama.cpp's}
    spec: dict[str, Any] | None = None
    error: str | None = None
    body: dict[str, Any] | None = field(default=None, repr=False)  # non-streamed response JSON

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and self.error is None

    @property
    def tpot_seconds(self) -> float | None:
        """(e2e - TTFT) / (output_tokens - 1) for streams with at least two tokens."""
        if self.ttft_seconds is None or self.output_tokens < 2:
            return None
        return (self.e2e_seconds - self.ttft_seconds) / (self.output_tokens - 1)


Mix = Sequence[RequestClass] | Mapping[str, float]
Targets = str | Sequence[str] | Mapping[str, str]


def _mix(mix: Mix) -> list[RequestClass]:
    classes = (
        [RequestClass(task, weight) for task, weight in mix.items()]
        if isinstance(mix, Mapping)
        else list(mix)
    )
    if not classes or sum(c.weight for c in classes) <= 0:
        raise ConfigError("the request mix needs at least one class with a positive weight")
    return classes


def prompt_for(cls: RequestClass, index: int, seed: int) -> str:
    """A reproducible prompt of about ``cls.prompt_tokens`` tokens."""
    if cls.prompts == "task":
        text = prompts.task_prompt(cls.task_type, index, seed, cls.prompt_tokens)
        if text is not None:
            return text
    rng = random.Random(f"{seed}/{cls.task_type}/{index}")
    text = f"[{cls.task_type} #{index}]"
    while len(text) < 4 * cls.prompt_tokens:
        text += " " + rng.choice(_WORDS)
    return text


async def run_load(
    urls: Targets,
    mix: Mix,
    concurrency: int,
    duration_s: float | None = None,
    requests: int | None = None,
    *,
    stream: bool = False,
    seed: int = 0,
    model: str | None = None,
    headers: Mapping[str, str] | None = None,
    route: Callable[[RequestClass, int], str] | None = None,
    timeout_s: float = 300.0,
    session: aiohttp.ClientSession | None = None,
    include_usage: bool = True,
    keep_body: bool = False,
    extra_body: Mapping[str, Any] | None = None,
    stop: asyncio.Event | None = None,
) -> list[LoadResult]:
    """Run the mix; returns one result per request sent, in send order.

    ``extra_body`` is merged into every request body (e.g. ``{"return_spec_tokens_details": True}``
    for SGLang); ``keep_body`` keeps each non-streamed response JSON on its result. ``stop``, once
    set, ends the load early (requests in flight finish; none is started after).
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency ({concurrency}) must be >= 1")
    if duration_s is None and requests is None:
        raise ConfigError("give duration_s or requests (the load must be bounded)")
    classes = _mix(mix)
    targets = (
        list(urls.values()) if isinstance(urls, Mapping) else [urls] if isinstance(urls, str) else list(urls)
    )
    if not targets and route is None:
        raise ConfigError("no target URL")
    rng = random.Random(seed)
    weights = [c.weight for c in classes]
    deadline = time.monotonic() + duration_s if duration_s is not None else None
    sent = 0
    results: list[LoadResult] = []

    def next_job() -> tuple[int, RequestClass, str] | None:
        nonlocal sent
        if requests is not None and sent >= requests:
            return None
        if deadline is not None and time.monotonic() >= deadline:
            return None
        if stop is not None and stop.is_set():
            return None
        index = sent
        sent += 1
        cls = rng.choices(classes, weights)[0]
        url = route(cls, index) if route else targets[index % len(targets)]
        return index, cls, url

    own = session is None
    client = session or aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        connector=aiohttp.TCPConnector(limit=0),
    )

    async def worker() -> None:
        while (job := next_job()) is not None:
            index, cls, url = job
            results.append(
                await _one(
                    client,
                    url,
                    cls,
                    index,
                    seed,
                    stream,
                    model,
                    headers,
                    include_usage,
                    keep_body,
                    extra_body,
                )
            )

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        if own:
            await client.close()
    return sorted(results, key=lambda r: r.index)


async def _one(
    session: aiohttp.ClientSession,
    base: str,
    cls: RequestClass,
    index: int,
    seed: int,
    default_stream: bool,
    model: str | None,
    extra_headers: Mapping[str, str] | None,
    include_usage: bool,
    keep_body: bool,
    extra_body: Mapping[str, Any] | None = None,
) -> LoadResult:
    streaming = default_stream if cls.stream is None else cls.stream
    prompt = prompt_for(cls, index, seed)
    body: dict[str, Any] = {"stream": streaming}
    if cls.chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if model:
        body["model"] = model
    if cls.max_tokens is not None:
        body["max_tokens"] = cls.max_tokens
    if cls.temperature is not None:
        body["temperature"] = cls.temperature
    if cls.ignore_eos:
        body["ignore_eos"] = True
    if cls.seeded:
        body["seed"] = (seed * 1_000_003 + index) % (1 << 31)
    if streaming and include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(extra_body or {})
    headers = {TASK_HEADER: cls.task_type, **(extra_headers or {})}
    url = base.rstrip("/") + ("/v1/chat/completions" if cls.chat else "/v1/completions")
    common = {"index": index, "url": base, "task_type": cls.task_type, "temperature": cls.temperature}
    started_wall = time.time()
    started = time.perf_counter()
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status >= 400 or not streaming:
                payload = await response.read()
                e2e = time.perf_counter() - started
                return _finish_plain(
                    common, streaming, response.status, started_wall, e2e, payload, keep_body
                )
            return await _read_stream(common, response, started_wall, started)
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        return LoadResult(
            **common,
            stream=streaming,
            status=0,
            started_at=started_wall,
            e2e_seconds=time.perf_counter() - started,
            error=f"{type(exc).__name__}: {exc}",
        )


def _spec_of(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    metrics = payload.get("metrics")
    if isinstance(metrics, Mapping) and isinstance(metrics.get("speculative_decoding"), Mapping):
        return dict(metrics["speculative_decoding"])
    ext = payload.get("sglext")
    if isinstance(ext, Mapping) and ext.get("spec_tokens_details") is not None:
        return {"sglext": ext["spec_tokens_details"]}
    timings = payload.get("timings")  # llama.cpp: the whole response's or the last chunk's
    if isinstance(timings, Mapping) and "predicted_n" in timings:
        return {"timings": dict(timings)}
    return None


def _finish_plain(
    common: dict[str, Any],
    streaming: bool,
    status: int,
    started_wall: float,
    e2e: float,
    raw: bytes,
    keep: bool,
) -> LoadResult:
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    if status >= 400 or not isinstance(payload, dict):
        message = raw[:300].decode(errors="replace")
        if isinstance(payload, dict) and isinstance(payload.get("error"), Mapping):
            message = str(payload["error"].get("message"))
        return LoadResult(
            **common,
            stream=streaming,
            status=status,
            started_at=started_wall,
            e2e_seconds=e2e,
            error=f"HTTP {status}: {message}",
        )
    usage = payload.get("usage") or {}
    choices = payload.get("choices") or [{}]
    return LoadResult(
        **common,
        stream=streaming,
        status=status,
        started_at=started_wall,
        e2e_seconds=e2e,
        output_tokens=int(usage.get("completion_tokens") or 0),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        finish_reason=choices[0].get("finish_reason"),
        spec=_spec_of(payload),
        body=payload if keep else None,
    )


async def _read_stream(
    common: dict[str, Any], response: aiohttp.ClientResponse, started_wall: float, started: float
) -> LoadResult:
    ttft = None
    chunks = 0
    finish = None
    usage: Mapping[str, Any] = {}
    spec = None
    error = None
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                text = line[5:].strip()
                if text == b"[DONE]":
                    continue
                try:
                    payload = json.loads(text)
                except ValueError:
                    error = "malformed stream chunk"
                    continue
                if isinstance(payload.get("error"), Mapping):
                    error = str(payload["error"].get("message"))
                for choice in payload.get("choices") or ():
                    piece = choice.get("text")
                    if piece is None:
                        piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        chunks += 1
                        if ttft is None:
                            ttft = time.perf_counter() - started
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                if payload.get("usage"):
                    usage = payload["usage"]
                spec = _spec_of(payload) or spec
    e2e = time.perf_counter() - started
    return LoadResult(
        **common,
        stream=True,
        status=response.status,
        started_at=started_wall,
        e2e_seconds=e2e,
        ttft_seconds=ttft,
        output_tokens=int(usage.get("completion_tokens") or chunks),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        finish_reason=finish,
        chunks=chunks,
        spec=spec,
        error=error,
    )
