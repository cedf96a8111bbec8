"""Engine dialects at the tap: what to add to a request, what to read back, what to hide again.

The tap asks each engine for its per-request speculative numbers (vLLM: stream usage;
SGLang: ``return_spec_tokens_details``) and removes exactly what it asked for, so the client
receives the engine's bytes. Removal is textual (one key span cut out of the JSON text), so
everything else keeps the engine's own serialisation.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specguard.errors import InputError
from specguard.exporters import engines
from specguard.exporters.records import SpecStats


@dataclass(frozen=True)
class Additions:
    """What the tap added to a request body (and must hide from the client)."""

    usage: bool = False  # vLLM/SGLang stream: stream_options.include_usage set by the tap
    spec_details: bool = False  # SGLang: return_spec_tokens_details set by the tap
    # n = 1 stream with added usage: vLLM then moves ``system_fingerprint`` from the terminal
    # chunk to the usage chunk, so the tap holds the terminal chunk and moves it back
    hold_finish: bool = False

    @property
    def any(self) -> bool:
        return self.usage or self.spec_details


def single_choice(body: Mapping[str, Any]) -> bool:
    """False for requests that produce several sequences (n > 1, best_of > 1, several prompts).

    vLLM reports no per-request speculative metrics for those, so the tap asks it for nothing.
    """
    n = body.get("n")
    best_of = body.get("best_of")
    if (isinstance(n, int) and n > 1) or (isinstance(best_of, int) and best_of > 1):
        return False
    prompt = body.get("prompt")
    return not (isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int))


def sequences(body: Mapping[str, Any] | None) -> int:
    """Sequences a request generates: ``n`` (or ``best_of``, if larger) per prompt, times the
    prompts of a legacy completion's list; 1 for anything unreadable."""
    if body is None:
        return 1
    count = 1
    for key in ("n", "best_of"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > count:
            count = min(value, 1 << 16)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int):
        count *= min(len(prompt), 1 << 16)
    return count


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def prompt_tokens(obj: Mapping[str, Any]) -> int | None:
    """The prompt length a response object (or stream chunk) reports: ``usage.prompt_tokens`` in
    every OpenAI-compatible dialect, else llama.cpp's ``timings`` (``prompt_n`` evaluated plus
    ``cache_n`` reused from its cache, which is what its usage reports)."""
    usage = obj.get("usage")
    if isinstance(usage, Mapping) and (found := _count(usage.get("prompt_tokens"))) is not None:
        return found
    timings = obj.get("timings")
    if isinstance(timings, Mapping) and (evaluated := _count(timings.get("prompt_n"))) is not None:
        return evaluated + (_count(timings.get("cache_n")) or 0)
    return None


def prepare(
    engine: str, body: dict[str, Any], *, force_include_usage: bool = False
) -> tuple[dict[str, Any] | None, Additions]:
    """The body to send upstream (None = unchanged) and the additions to undo on the way back.

    ``force_include_usage``: the pool's server runs with ``--enable-force-include-usage`` and
    sends usage unasked, so the tap neither adds nor strips it.
    """
    usage = False
    details = False
    new = None
    stream = body.get("stream") is True
    options = body.get("stream_options")
    asked_usage = isinstance(options, Mapping) and options.get("include_usage") is True
    if not _plain_options(options):
        # not a shape the tap understands (stream_options: "x", include_usage: "no"): the engine
        # must judge the request as the client sent it, so the tap adds nothing to it
        return None, Additions()
    single = single_choice(body)
    wanted = engine == "sglang" or (engine == "vllm" and single)
    if wanted and stream and not asked_usage and not force_include_usage:
        new = dict(body)
        extra: dict[str, Any] = {"include_usage": True}
        if isinstance(options, Mapping) and "continuous_usage_stats" in options:
            # without include_usage the client's continuous_usage_stats had no effect: keep it so
            extra["continuous_usage_stats"] = False
        new["stream_options"] = {**(options if isinstance(options, Mapping) else {}), **extra}
        usage = True
    if engine == "sglang" and body.get("return_spec_tokens_details") is not True:
        new = dict(new or body)
        new["return_spec_tokens_details"] = True
        details = True
    return new, Additions(usage, details, hold_finish=usage and single)


def _plain_options(options: Any) -> bool:
    """``stream_options`` absent, or an object whose usage flags are absent, null or booleans."""
    if options is None:
        return True
    if not isinstance(options, Mapping):
        return False
    return all(options.get(k) is None or isinstance(options[k], bool) for k in _USAGE_FLAGS)


_USAGE_FLAGS = ("include_usage", "continuous_usage_stats")
_WS = re.compile(rb"\s*")


def remove_key(raw: bytes, key: str) -> bytes:
    """Cut the top-level ``"key": value`` pair out of a JSON object's text, keeping all other bytes.

    Falls back to a compact re-serialisation only if the text cannot be cut cleanly.
    """
    span = _value_span(raw, key)
    if span is not None:
        at, _, end = span
        after = _WS.match(raw, end).end()
        if raw[after : after + 1] == b",":
            cut = raw[:at] + raw[_WS.match(raw, after + 1).end() :]
        else:
            before = raw[:at].rstrip()
            cut = before[:-1] + raw[after:] if before.endswith(b",") else raw[:at] + raw[after:]
        try:
            original = json.loads(raw)
            if isinstance(original, dict) and key in original:
                original.pop(key)
                if json.loads(cut) == original:
                    return cut
        except ValueError:
            pass
    obj = json.loads(raw)
    if isinstance(obj, dict):
        obj.pop(key, None)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _value_span(raw: bytes, key: str) -> tuple[int, int, int] | None:
    """(key start, value start, value end) byte offsets of a top-level key of a JSON object text."""
    needle = json.dumps(key).encode()
    decoder = json.JSONDecoder()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    depth = 0
    pos = 0
    start = 0
    while True:
        at = raw.find(needle, start)
        if at < 0:
            return None
        start = at + 1
        if at > 0 and raw[at - 1 : at] == b"\\":
            continue
        colon = _WS.match(raw, at + len(needle)).end()
        if raw[colon : colon + 1] != b":":
            continue
        # top level only: the key must sit at nesting depth 1 (outside strings)
        depth += _depth_change(raw[pos:at])
        pos = at
        if depth != 1:
            continue
        value_at = _WS.match(raw, colon + 1).end()
        char_at = len(raw[:value_at].decode("utf-8", errors="replace"))
        try:
            _, char_end = decoder.raw_decode(text, char_at)
        except ValueError:
            return None
        return at, value_at, len(text[:char_end].encode("utf-8"))


def _depth_change(segment: bytes) -> int:
    """Net ``{``/``[`` nesting change over ``segment``, which starts outside a JSON string."""
    depth = 0
    in_string = False
    escaped = False
    for byte in segment:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x7B, 0x5B):
            depth += 1
        elif byte in (0x7D, 0x5D):
            depth -= 1
    return depth


def raw_value(raw: bytes, key: str) -> bytes | None:
    """The exact JSON text of a top-level key's value in an object's text (None if absent)."""
    span = _value_span(raw, key)
    return None if span is None else raw[span[1] : span[2]]


def append_key(raw: bytes, key: str, value: bytes) -> bytes:
    """``raw`` (a non-empty JSON object's text) with ``"key":value`` added as its last key.

    Textual: every other byte stays; returns ``raw`` unchanged if it is not such an object
    or already has ``key``.
    """
    end = raw.rstrip()
    if not end.endswith(b"}") or _value_span(raw, key) is not None:
        return raw
    body = end[:-1].rstrip()
    if body.endswith(b"{"):
        return raw
    cut = len(end) - 1
    return raw[:cut] + b"," + json.dumps(key).encode() + b":" + value + raw[cut:]


def has_finish(chunk: Mapping[str, Any]) -> bool:
    """True when a stream chunk ends a choice (some choice has a ``finish_reason``)."""
    choices = chunk.get("choices")
    return isinstance(choices, list) and any(
        isinstance(c, Mapping) and c.get("finish_reason") is not None for c in choices
    )


_AUTO_ORDER = ("vllm", "sglang", "llamacpp")


def spec_from(engine: str, obj: Mapping[str, Any], k: int | None = None) -> SpecStats | None:
    """Per-request spec stats of one response object (or stream chunk), via the engine adapters.

    ``auto`` tries the OpenAI-compatible dialects in turn. A malformed block counts as absent
    (the request is then unattributed), never as an error for the client.
    """
    for name in _AUTO_ORDER if engine == "auto" else (engine,):
        if name == "trtllm":  # per-request numbers live on /perf_metrics, not in responses
            return None
        try:
            found = engines.request_stats(name, obj)
        except (InputError, KeyError, TypeError, AttributeError):
            found = None
        if found is not None:
            if found.num_speculative_tokens is None and k:
                found = dataclasses.replace(found, num_speculative_tokens=k)
            return found
    return None


def has_content(chunk: Mapping[str, Any]) -> bool:
    """True when a stream chunk carries generated text (not just a role or usage)."""
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, Mapping):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, Mapping) and (
            delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
        ):
            return True
    return False


def is_usage_only(chunk: Mapping[str, Any]) -> bool:
    """The final usage chunk of an OpenAI stream: ``choices`` empty and ``usage`` set."""
    return chunk.get("choices") == [] and isinstance(chunk.get("usage"), Mapping)
