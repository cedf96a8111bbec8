"""What a pool serves: its engine version and model, read from the engine's own endpoints.

A calibration profile is fresh only while the stack it was measured on still serves the traffic
(``rules.profile.staleness``): the same engine version and model as in its header. vLLM answers
``GET /version`` (``{"version": ...}``), SGLang ``GET /get_server_info`` (``version``,
``served_model_name``), TGI ``GET /info`` (``version``, ``model_id``), llama.cpp ``GET /props``
(``build_info``, e.g. ``b11434-unknown``: build number and commit); every OpenAI-compatible
server lists its models at ``GET /v1/models``. Anything unreadable is left out, never guessed.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

VERSION_PATHS = {"vllm": "/version", "sglang": "/get_server_info", "tgi": "/info", "llamacpp": "/props"}
MAX_BYTES = 256 * 1024  # these answers are small; a larger one is not what we asked for


async def _json(session: aiohttp.ClientSession, url: str, timeout: float) -> Any:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                return None
            body = await resp.content.read(MAX_BYTES + 1)
            if len(body) > MAX_BYTES:
                return None
            return json.loads(body)
    except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError):
        return None


async def fetch(
    session: aiohttp.ClientSession, base_url: str, engine: str, timeout: float = 5.0
) -> dict[str, str]:
    """``{"engine": ..., "engine_version": ..., "model": ...}`` with whatever the pool told."""
    out: dict[str, str] = {}
    if engine in VERSION_PATHS:
        out["engine"] = engine
        info = await _json(session, base_url + VERSION_PATHS[engine], timeout)
        if isinstance(info, dict):
            for key in ("version", "build_info"):
                if isinstance(info.get(key), str):
                    out["engine_version"] = info[key]
            for key in ("served_model_name", "model_id"):
                if isinstance(info.get(key), str):
                    out["model"] = info[key]
    models = await _json(session, base_url + "/v1/models", timeout)
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict):
        if isinstance(data[0].get("id"), str):
            out["model"] = data[0]["id"]
    return out
