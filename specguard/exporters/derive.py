"""Derived speculative-decoding metrics from one snapshot (cumulative) or the window between two.

Definitions (docs/concepts.md): strict accept rate = accepted drafts / proposed drafts; accept length
A = output tokens per verify round, bonus included (``1 + accepted / rounds``, or SGLang's
``generation tokens / verify calls``); CI acceptance proxy = A / (K + 1); per-position acceptance
p_i = rounds whose first i drafts were all accepted / rounds; full-rollback ratio (round level)
= 1 - p_1. Latency is normalised across engines: vLLM's ITL has one sample per running request
per step (a step time), SGLang's one per token, so ``mean_step_seconds`` and
``time_per_output_token_seconds`` are derived from whichever the engine has (see ``derive``).

Windows difference every counter series separately and treat a decrease as a restart from zero
(delta = current value), exactly as Prometheus ``rate()``/``increase()`` do; the families that
reset are reported. A series present only on the later page counts from zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from specguard.errors import InputError
from specguard.exporters.snapshot import EngineSnapshot, HistogramTotals, SeriesKey

KEYS = (
    "engine",
    "speculation_enabled",
    "num_speculative_tokens",
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "accepted_per_position",
    "per_position_acceptance",
    "strict_accept_rate",
    "accept_length",
    "ci_acceptance_proxy",
    "full_rollback_ratio",
    "mean_step_seconds",
    "time_per_output_token_seconds",
    "generation_tokens",
    "running_requests",
    "waiting_requests",
    "counter_resets",
    "warnings",
    "models",
)

_SCALARS = ("drafts", "draft_tokens", "accepted_tokens", "generation_tokens", "round_tokens")
_HISTOGRAMS = ("step_latency", "token_latency", "time_per_output_token", "time_to_first_token", "e2e_latency")
_VECTOR = "accepted_per_position"


@dataclass(frozen=True)
class Derived:
    """The numbers ``specguard inspect`` prints; ``None`` = the engine does not report it."""

    engine: str
    speculation_enabled: bool | None = None
    num_speculative_tokens: int | None = None
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    accepted_per_position: tuple[float, ...] | None = None
    per_position_acceptance: tuple[float, ...] | None = None
    strict_accept_rate: float | None = None
    accept_length: float | None = None
    ci_acceptance_proxy: float | None = None
    full_rollback_ratio: float | None = None
    mean_step_seconds: float | None = None
    time_per_output_token_seconds: float | None = None
    generation_tokens: float | None = None
    running_requests: float | None = None
    waiting_requests: float | None = None
    counter_resets: tuple[str, ...] | None = None  # None for one page (cumulative): not knowable
    warnings: tuple[str, ...] = ()  # impossible values and page defects: the numbers are suspect
    models: dict[str, Derived] = field(default_factory=dict)
    breakdown: dict[str, dict[str, Derived]] = field(default_factory=dict)  # SGLang custom labels

    def as_dict(self) -> dict[str, Any]:
        """The stable JSON form: exactly ``KEYS``, null where not reported."""
        out: dict[str, Any] = {}
        for key in KEYS:
            value = getattr(self, key)
            if key == "models":
                value = {name: model.as_dict() for name, model in value.items()}
            elif isinstance(value, tuple):
                value = [_plain(v) for v in value]
            else:
                value = _plain(value)
            out[key] = value
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value == int(value) and abs(value) < 2**53:
        return int(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0 or math.isnan(num):
        return None
    return num / den


def _mean(h: HistogramTotals | None) -> float | None:
    return _ratio(h.sum, h.count) if h is not None else None


def derive(snap: EngineSnapshot) -> Derived:
    """Derived metrics of one snapshot: cumulative for a page, or a window from ``window()``."""
    k = snap.num_speculative_tokens
    drafts = snap.drafts
    # window-averaged gauges (SGLang, TRT-LLM) only stand in for counters the engine lacks, and
    # never for a window whose counters show no verify round at all (the gauge would be stale)
    use_gauges = snap.speculation_enabled is not False and not (drafts is not None and drafts <= 0)
    strict = _ratio(snap.accepted_tokens, snap.draft_tokens)
    if strict is None and use_gauges and (snap.accepted_tokens is None or snap.draft_tokens is None):
        strict = snap.accept_rate_gauge
    accept_length = None
    if snap.round_tokens is not None:
        accept_length = _ratio(snap.round_tokens, drafts)
    elif snap.accepted_tokens is not None and _ratio(snap.accepted_tokens, drafts) is not None:
        accept_length = 1.0 + snap.accepted_tokens / drafts  # type: ignore[operator]
    if accept_length is None and use_gauges and drafts is None:
        accept_length = snap.accept_length_gauge
    ci_proxy = _ratio(accept_length, k + 1) if k is not None and k > 0 else None
    per_pos = snap.accepted_per_position
    per_position = tuple(a / drafts for a in per_pos) if per_pos and drafts and drafts > 0 else None
    rollback = 1.0 - per_position[0] if per_position else None
    # tokens one step emits per request: A with speculation, exactly 1 without
    tokens_per_step = (
        accept_length if accept_length is not None else (1.0 if snap.speculation_enabled is False else None)
    )
    token_mean = _mean(snap.token_latency)
    step = _mean(snap.step_latency)
    if step is None and token_mean is not None and tokens_per_step is not None:
        step = token_mean * tokens_per_step  # SGLang: per-token ITL x tokens per round
    # per-token ITL (SGLang) is already time per output token, token-weighted over the window;
    # otherwise the engine's per-request TPOT histogram (vLLM request_time_per_output_token)
    tpot = token_mean if token_mean is not None else _mean(snap.time_per_output_token)
    if tpot is None and step is not None and tokens_per_step:
        tpot = step / tokens_per_step  # vLLM without the per-request histogram: approximate
    return Derived(
        engine=snap.engine,
        speculation_enabled=snap.speculation_enabled,
        num_speculative_tokens=k,
        drafts=drafts,
        draft_tokens=snap.draft_tokens,
        accepted_tokens=snap.accepted_tokens,
        accepted_per_position=per_pos,
        per_position_acceptance=per_position,
        strict_accept_rate=strict,
        accept_length=accept_length,
        ci_acceptance_proxy=ci_proxy,
        full_rollback_ratio=rollback,
        mean_step_seconds=step,
        time_per_output_token_seconds=tpot,
        generation_tokens=snap.generation_tokens,
        running_requests=snap.running_requests,
        waiting_requests=snap.waiting_requests,
        counter_resets=snap.counter_resets,
        warnings=snap.warnings + impossible(snap),
        models={name: derive(model) for name, model in snap.models.items()},
        breakdown={
            label: {value: derive(sub) for value, sub in values.items()}
            for label, values in snap.breakdown.items()
        },
    )


_COUNTERS = {
    "drafts": "verify rounds",
    "draft_tokens": "draft tokens",
    "accepted_tokens": "accepted tokens",
    "generation_tokens": "generation tokens",
    "round_tokens": "round tokens",
}


def impossible(snap: EngineSnapshot) -> tuple[str, ...]:
    """Values no engine can report: negative or infinite counters, more accepted than drafted
    tokens, later positions accepted more often than earlier ones. Shown, never silently used."""
    found: list[str] = []
    for name, label in _COUNTERS.items():
        value = getattr(snap, name)
        if value is not None and (value < 0 or not math.isfinite(value)):
            found.append(f"{label} ({value:g}): a counter is finite and never negative")
    accepted, drafted = snap.accepted_tokens, snap.draft_tokens
    if accepted is not None and drafted is not None and accepted > drafted:
        found.append(f"accepted tokens ({accepted:g}) exceed draft tokens ({drafted:g})")
    rounds, k = snap.drafts, snap.num_speculative_tokens
    if drafted is not None and rounds is not None and k and drafted > rounds * k:
        found.append(f"draft tokens ({drafted:g}) exceed verify rounds x K ({rounds:g} x {k})")
    per_pos = snap.accepted_per_position or ()
    if any(v < 0 or not math.isfinite(v) for v in per_pos):
        found.append("accepted per position: a counter is finite and never negative")
    if per_pos and rounds is not None and per_pos[0] > rounds:
        found.append(f"accepted at position 1 ({per_pos[0]:g}) exceed verify rounds ({rounds:g})")
    for i in range(len(per_pos) - 1):
        if per_pos[i + 1] > per_pos[i]:
            found.append(
                f"accepted at position {i + 2} ({per_pos[i + 1]:g}) exceed position {i + 1} ({per_pos[i]:g})"
            )
            break
    return tuple(found)


def counter_delta(prev: dict[SeriesKey, float], cur: dict[SeriesKey, float]) -> tuple[float, set[str]]:
    """Sum over series of the increase, Prometheus style; returns (delta, names that reset)."""
    total = 0.0
    resets: set[str] = set()
    for key, value in cur.items():
        before = prev.get(key)
        if before is None or math.isnan(before):
            total += value  # a series born inside the window started from zero
        elif value < before:
            total += value  # a counter that went down restarted from zero
            resets.add(key[0])
        else:
            total += value - before
    return total, resets


def window(prev: EngineSnapshot, cur: EngineSnapshot) -> EngineSnapshot:
    """The snapshot of what happened between two pages of one engine: counter deltas, end gauges."""
    if prev.engine != cur.engine:
        raise InputError(f"the two pages come from different engines ({prev.engine} then {cur.engine})")
    deltas: dict[str, float] = {}
    resets: set[str] = set()
    for key, series in cur.series.items():
        deltas[key], reset = counter_delta(prev.series.get(key, {}), series)
        resets |= reset
    changes: dict[str, Any] = {}
    for name in _SCALARS:
        if getattr(cur, name) is not None:
            changes[name] = deltas.get(name)
    for name in _HISTOGRAMS:
        if getattr(cur, name) is not None and f"{name}:sum" in deltas:
            changes[name] = HistogramTotals(deltas[f"{name}:sum"], deltas[f"{name}:count"])
        elif getattr(cur, name) is not None:
            changes[name] = None
    if cur.accepted_per_position is not None:
        size = len(cur.accepted_per_position)
        changes[_VECTOR] = tuple(deltas.get(f"{_VECTOR}:{i}", 0.0) for i in range(size))
    empty = EngineSnapshot(engine=cur.engine)
    changes["models"] = {name: window(prev.models.get(name, empty), m) for name, m in cur.models.items()}
    changes["breakdown"] = {
        label: {v: window(prev.breakdown.get(label, {}).get(v, empty), s) for v, s in values.items()}
        for label, values in cur.breakdown.items()
    }
    for sub in [*changes["models"].values()] + [
        s for vs in changes["breakdown"].values() for s in vs.values()
    ]:
        resets |= set(sub.counter_resets or ())
    changes["counter_resets"] = tuple(sorted(resets))
    changes["warnings"] = tuple(dict.fromkeys(prev.warnings + cur.warnings))
    return replace(cur, **changes)


def summarize(cur: EngineSnapshot, prev: EngineSnapshot | None = None) -> Derived:
    """``derive`` of one page (cumulative) or of the window ``prev -> cur``."""
    return derive(cur if prev is None else window(prev, cur))
