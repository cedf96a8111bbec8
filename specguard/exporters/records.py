"""Per-request value types shared by the adapters, the tap, the statistics and the cost model.

Leaf module: imports nothing from the project.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecStats:
    """One request's speculative-decoding numbers, normalised across engines.

    ``None`` means the engine did not report that number (never silently zero).
    ``accepted_histogram[j]`` counts verify rounds that accepted exactly ``j`` drafts
    (bonus excluded), so index 0 is the full-rollback rounds.
    """

    source: str  # "vllm", "sglang", "llamacpp", "trtllm", "chunks" (approximate fallback)
    rounds: int | None = None  # verify rounds (vLLM num_spec_steps, SGLang spec_verify_ct)
    draft_tokens: int | None = None  # proposed draft tokens
    accepted_tokens: int | None = None  # accepted draft tokens, bonus excluded
    accepted_histogram: tuple[int, ...] | None = None
    full_rollback_rounds: int | None = None  # rounds that accepted zero drafts
    output_tokens: int | None = None  # completion tokens of the request
    num_speculative_tokens: int | None = None  # K the engine drafted with
    approximate: bool = False  # True when inferred from stream chunks, not engine-reported

    @property
    def accept_length(self) -> float | None:
        """Output tokens per verify round, bonus included: ``1 + accepted / rounds``."""
        if not self.rounds or self.accepted_tokens is None:
            return None
        return 1.0 + self.accepted_tokens / self.rounds

    @property
    def strict_accept_rate(self) -> float | None:
        """Accepted drafts / proposed drafts (no bonus)."""
        if not self.draft_tokens or self.accepted_tokens is None:
            return None
        return self.accepted_tokens / self.draft_tokens


@dataclass(frozen=True)
class RequestRecord:
    """What the tap knows about one finished request: its class, where it went, what it cost."""

    pool: str
    task_type: str
    temperature_bucket: str
    load_bucket: str
    route: str  # "plan", "holdout" (to no-spec for the baseline), "probe" (kept on spec), "failover"
    started_at: float  # wall clock, seconds since the epoch
    status: int  # HTTP status the client got
    streamed: bool
    temperature: float | None = None
    top_p: float | None = None
    output_tokens: int = 0
    ttft_seconds: float | None = None
    decode_seconds: float | None = None  # first token to last token
    e2e_seconds: float | None = None
    spec: SpecStats | None = None  # None: the engine gave no per-request stats (unattributed)
    unattributed_reason: str | None = None  # why spec is None: "no_usage", "n_gt_1", "stop_string", ...
    classified: bool = True  # False when the body was not JSON
    load: float | None = None  # in-flight requests per replica of the pool when sent (itself included)
    decode_load: float | None = None  # mean in-flight requests per replica while it decoded
    prompt_tokens: int | None = None  # the engine's usage.prompt_tokens (None: not reported)
    sequences: int = 1  # sequences generated (n, best_of, a list of prompts); output_tokens sums them

    @property
    def tpot_seconds(self) -> float | None:
        """Time per output token after the first: ``decode_seconds / (output_tokens - 1)``.

        None for a request that generated several sequences: they decode side by side, so its
        time per token is not one sequence's, and it would read as a faster class.
        """
        if self.decode_seconds is None or self.output_tokens < 2 or self.sequences != 1:
            return None
        return self.decode_seconds / (self.output_tokens - 1)
