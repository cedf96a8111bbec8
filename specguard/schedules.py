"""In-engine speculation schedules: K by batch size, exactly as vLLM and TensorRT-LLM apply them.

A team with one pool of engines can turn speculation down with load inside the engine. Both
schedules key on a batch size only (never on a traffic class); they differ in which batch size,
which side of a boundary and what lies beyond the last entry:

- vLLM ``--speculative-config '{"num_speculative_tokens_per_batch_size": [[1, 64, 3], ...]}'``:
  inclusive ranges ``(start, end, K)``; the first must start at 1, none may overlap, K may be 0
  (no drafts). ``build_dynamic_sd_schedule_lookup`` (``vllm/v1/spec_decode/dynamic/utils.py``)
  expands them into a dense table: a gap between ranges and every batch size past the last range
  carry the previous range's K, and every K is capped at ``num_speculative_tokens``. The scheduler
  looks it up once per step with the number of requests it scheduled in that step
  (``dynamic_sd_lookup[len(num_scheduled_tokens)]``, ``vllm/v1/core/sched/scheduler.py``) and the
  model runner proposes that many drafts after the step's forward pass
  (``propose_draft_token_ids``, ``vllm/v1/worker/gpu_model_runner.py``): so the K a request
  verifies in a step is the one the *previous* step's batch size chose (``lag`` 1).
- TensorRT-LLM ``speculative_config: {draft_len_schedule: {4: 4, 8: 2, 32: 1}}`` (and
  ``max_concurrency``): a key is the largest batch size its draft length serves, so batch sizes 1-4
  draft 4, 5-8 draft 2, 9-32 draft 1 and above the last key speculation is off
  (``get_draft_len_for_batch_size``, ``bisect_left``, ``tensorrt_llm/_torch/speculative/utils.py``).
  The executor looks it up at the start of each iteration with ``len(self.active_requests)``
  (``PyExecutor._prepare_and_schedule_batch``) and drafts for that same iteration (``lag`` 0).
  ``max_concurrency`` (mutually exclusive with the schedule) becomes ``{max_concurrency:
  max_draft_len}``; the smallest key must map to ``max_draft_len`` and no draft length may exceed it
  (``DecodingBaseConfig`` validators, ``tensorrt_llm/llmapi/llm_args.py``). Releases before that
  change read a key as the *smallest* batch size of its length (``bisect_right``); this module
  follows the current one.

A leaf module: it imports nothing from the project, so the simulator, the config and the rules
share one reading of a schedule.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

VLLM = "vllm"
TRTLLM = "trtllm"
KEYS = ("num_speculative_tokens_per_batch_size", "draft_len_schedule", "max_concurrency")
"""A pool's configuration keys that give it a schedule (the engines' own names)."""


class ScheduleError(ValueError):
    """A schedule the engine would refuse; ``key`` names the configuration key at fault."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Schedule:
    """K by batch size for one engine's speculative configuration.

    ``entries``: vLLM ``(start, end, K)`` ranges sorted by start; TensorRT-LLM ``(key, K)`` pairs
    sorted by key (``end`` is the key, ``start`` the previous key + 1). ``max_k``: vLLM's
    ``num_speculative_tokens`` / TensorRT-LLM's ``max_draft_len``.
    """

    engine: str
    entries: tuple[tuple[int, int, int], ...]
    max_k: int

    @property
    def lag(self) -> int:
        """Steps between the batch size that picks K and the step whose drafts are verified."""
        return 1 if self.engine == VLLM else 0

    def k_at(self, batch: int) -> int:
        """The K the engine picks for a batch of ``batch`` requests."""
        if batch < 1:
            batch = 1
        if self.engine == VLLM:
            k = self.entries[0][2]
            for start, _, value in self.entries:  # the last range starting at or below the batch
                if start > batch:
                    break
                k = value
            return min(k, self.max_k)
        ends = [end for _, end, _ in self.entries]
        index = bisect_left(ends, batch)
        return self.entries[index][2] if index < len(ends) else 0

    def ranges(self, top: int) -> list[tuple[int, int, int]]:
        """Maximal (start, end, K) runs of equal K for batch sizes 1..``top``, inclusive."""
        out: list[tuple[int, int, int]] = []
        for b in range(1, max(1, top) + 1):
            k = self.k_at(b)
            if out and out[-1][2] == k:
                out[-1] = (out[-1][0], b, k)
            else:
                out.append((b, b, k))
        return out

    def to_json(self) -> dict:
        """The schedule in the engine's own configuration keys."""
        if self.engine == VLLM:
            return {
                "num_speculative_tokens": self.max_k,
                "num_speculative_tokens_per_batch_size": [list(e) for e in self.entries],
            }
        return {"max_draft_len": self.max_k, "draft_len_schedule": {end: k for _, end, k in self.entries}}

    def describe(self) -> str:
        """One line: ``vLLM K 1-8:4, 9-32:2, 33+:0``."""
        parts = []
        if self.engine == VLLM:
            for i, (start, end, k) in enumerate(self.entries):
                last = i == len(self.entries) - 1
                parts.append(
                    f"{start}+:{min(k, self.max_k)}" if last else f"{start}-{end}:{min(k, self.max_k)}"
                )
            return "vLLM K " + ", ".join(parts)
        start = 1
        for end, k in ((e, k) for _, e, k in self.entries):
            parts.append(f"{start}-{end}:{k}")
            start = end + 1
        return "TensorRT-LLM K " + ", ".join([*parts, f"{start}+:0"])


def k_at_load(fixed: int, schedule: Schedule | None, load: float) -> int:
    """The K an engine runs with ``load`` requests on it: its schedule's at that batch when it was
    launched with one, else its fixed K."""
    return fixed if schedule is None else schedule.k_at(round(load))


def vllm(ranges: object, num_speculative_tokens: int) -> Schedule:
    """vLLM's ``num_speculative_tokens_per_batch_size``, validated as vLLM validates it."""
    if not isinstance(num_speculative_tokens, int) or num_speculative_tokens <= 0:
        raise ValueError(f"needs num_speculative_tokens > 0 (got {num_speculative_tokens!r})")
    if not isinstance(ranges, list | tuple) or not ranges:
        raise ValueError("must be a non-empty list of [range_start, range_end, num_speculative_tokens]")
    parsed = []
    for index, entry in enumerate(ranges):
        if not isinstance(entry, list | tuple) or len(entry) != 3 or not all(_is_int(x) for x in entry):
            raise ValueError(f"entry {index} ({entry!r}) must be [range_start, range_end, K], three integers")
        start, end, k = (int(x) for x in entry)
        if start <= 0 or end <= 0:
            raise ValueError(f"entry {index}: batch-size range ({start}, {end}) must be positive")
        if start > end:
            raise ValueError(f"entry {index}: range start ({start}) must be <= end ({end})")
        if k < 0:
            raise ValueError(f"entry {index}: K ({k}) must be >= 0")
        parsed.append((start, end, k))
    parsed.sort()
    previous = 0
    for start, end, _ in parsed:
        if start <= previous:
            raise ValueError("batch-size ranges must not overlap")
        previous = end
    if parsed[0][0] != 1:
        raise ValueError(f"the first batch-size range must start at 1 (it starts at {parsed[0][0]})")
    return Schedule(VLLM, tuple(parsed), num_speculative_tokens)


def trtllm(
    draft_len_schedule: Mapping[object, object] | None, max_draft_len: int, max_concurrency: int | None = None
) -> Schedule:
    """TensorRT-LLM's ``draft_len_schedule`` or ``max_concurrency``, validated as TensorRT-LLM does."""
    if not isinstance(max_draft_len, int) or max_draft_len <= 0:
        raise ValueError(f"needs max_draft_len > 0 (got {max_draft_len!r})")
    if draft_len_schedule is not None and max_concurrency is not None:
        raise ValueError("max_concurrency and draft_len_schedule are mutually exclusive")
    if max_concurrency is not None:
        if not _is_int(max_concurrency) or int(max_concurrency) < 1:
            raise ValueError(f"max_concurrency ({max_concurrency!r}) must be a positive integer")
        return Schedule(TRTLLM, ((1, int(max_concurrency), max_draft_len),), max_draft_len)
    if not isinstance(draft_len_schedule, Mapping) or not draft_len_schedule:
        raise ValueError("draft_len_schedule must be a non-empty mapping {batch size: draft length}")
    pairs = []
    for raw, value in draft_len_schedule.items():
        # JSON and YAML text keys ("4") are read as integers, as TensorRT-LLM's pydantic model does
        key = int(raw) if isinstance(raw, str) and raw.strip().isdigit() else raw
        if not _is_int(key) or not _is_int(value):
            raise ValueError(f"entry {key!r}: {value!r}: batch size and draft length must be integers")
        if int(key) < 1:
            raise ValueError(f"batch size threshold must be >= 1, got {key}")
        if int(value) < 0:
            raise ValueError(f"draft length must be >= 0, got {value}")
        if int(value) > max_draft_len:
            raise ValueError(
                f"draft length {value} for batch size {key} exceeds max_draft_len ({max_draft_len})"
            )
        pairs.append((int(key), int(value)))
    pairs.sort()
    if pairs[0][1] != max_draft_len:
        raise ValueError(
            f"draft_len_schedule[{pairs[0][0]}] ({pairs[0][1]}) must equal max_draft_len ({max_draft_len}): "
            "it is the smallest batch-size key"
        )
    entries, start = [], 1
    for key, value in pairs:
        entries.append((start, key, value))
        start = key + 1
    return Schedule(TRTLLM, tuple(entries), max_draft_len)


def from_runs(engine: str, runs: Sequence[tuple[int, int, int]], top: int) -> Schedule | None:
    """A schedule from (start, end, K) runs covering 1..``top`` in order (a K per batch-size range).

    vLLM takes them as they are (the last run's K carries on past ``top``). TensorRT-LLM needs the
    first run's K to be the largest and ends speculation above its last key, so a last run with
    K > 0 gets the key ``top``; ``None`` when the runs cannot be written for it (K rising with load).
    """
    runs = [r for r in runs if r[0] <= r[1]]
    if not runs:
        return None
    max_k = max(k for _, _, k in runs)
    if engine == VLLM:
        return vllm([list(r) for r in runs], max(1, max_k)) if max_k else None
    if not max_k or runs[0][2] != max_k:
        return None
    while runs and runs[-1][2] == 0:
        runs = runs[:-1]
    return trtllm({end: k for _, end, k in runs}, max_k)


def from_pool_keys(data: Mapping[str, object], k: int) -> Schedule | None:
    """The schedule a pool's configuration gives it (``KEYS``; ``k``: its num_speculative_tokens /
    max_draft_len), or None. Raises ``ScheduleError`` naming the key at fault."""
    given = [key for key in KEYS if data.get(key) is not None]
    if not given:
        return None
    if KEYS[0] in given and len(given) > 1:
        raise ScheduleError(given[1], f"is TensorRT-LLM's; {KEYS[0]} is vLLM's: give one engine's schedule")
    key = given[0]
    try:
        if key == KEYS[0]:
            return vllm(data[key], k)
        return trtllm(data.get(KEYS[1]), k, data.get(KEYS[2]))  # type: ignore[arg-type]
    except ValueError as exc:
        raise ScheduleError(given[-1], str(exc)) from exc


def vllm_speculative_config(schedule: Schedule, method: str = "ngram", **extra: object) -> str:
    """The ``--speculative-config`` JSON that runs ``schedule`` on vLLM."""
    return json.dumps({"method": method, **schedule.to_json(), **extra})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
