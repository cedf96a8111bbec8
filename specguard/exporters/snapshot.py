"""The normalised view of one engine /metrics page. Leaf module: imports nothing from the project.

Counters are cumulative as the engine exposes them; ``None`` means the engine does not
report the quantity (vLLM without speculation has no spec families at all), never zero.
Histograms are kept as (sum, count) pairs; gauges are the value at scrape time.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HistogramTotals:
    """Sum and count of one histogram (or summary) family, summed over label sets."""

    sum: float
    count: float


SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)


@dataclass(frozen=True)
class EngineSnapshot:
    engine: str  # "vllm", "sglang", "trtllm", "llamacpp", "tgi"
    families: tuple[str, ...] = ()  # metric family names seen on the page
    metrics_path: str = "/metrics"  # where this engine serves its Prometheus page
    speculation_enabled: bool | None = None
    num_speculative_tokens: int | None = None
    # speculative counters (cumulative)
    drafts: float | None = None  # verify rounds that carried drafts (vLLM num_drafts, SGLang verify calls)
    draft_tokens: float | None = None
    accepted_tokens: float | None = None  # bonus excluded
    accepted_per_position: tuple[float, ...] | None = None  # index i: rounds with >= i+1 accepted
    generation_tokens: float | None = None
    # output tokens emitted by verify rounds, bonus included, when the engine counts them per round
    # (SGLang generation_tokens_total, which also counts the first, prefill-produced token)
    round_tokens: float | None = None
    # window-averaged gauges some engines export instead of counters (SGLang, TRT-LLM)
    accept_length_gauge: float | None = None
    accept_rate_gauge: float | None = None
    draft_overhead_gauge: float | None = None  # TRT-LLM: draft time / iteration time
    # latency histograms
    step_latency: HistogramTotals | None = None  # one sample per request per engine step (vLLM ITL)
    iteration_tokens: HistogramTotals | None = None  # one sample per engine step (vLLM iteration_tokens)
    token_latency: HistogramTotals | None = None  # one sample per output token (SGLang ITL)
    time_per_output_token: HistogramTotals | None = None  # per-request TPOT histogram
    time_to_first_token: HistogramTotals | None = None
    e2e_latency: HistogramTotals | None = None
    # gauges
    running_requests: float | None = None
    waiting_requests: float | None = None
    # per-model breakdown (vLLM model_name); empty when there is one model
    models: dict[str, EngineSnapshot] = field(default_factory=dict)
    # per-label breakdown of custom labels (SGLang `task`): label -> value -> snapshot of the
    # series carrying that label (engine-wide gauges are None there)
    breakdown: dict[str, dict[str, EngineSnapshot]] = field(default_factory=dict)
    # raw cumulative counter series behind each counter field, for reset-aware deltas:
    # field key ("drafts", "accepted_per_position:0", "step_latency:sum", ...) -> series -> value
    series: dict[str, dict[SeriesKey, float]] = field(default_factory=dict, repr=False)
    # counter families that went backwards inside the window (set on window snapshots only)
    counter_resets: tuple[str, ...] | None = None
    # what is wrong with the page itself (a repeated series...), for ``inspect`` to show
    warnings: tuple[str, ...] = ()
    # NaN or infinite samples the page carried, dropped one by one (the rest of the page is used)
    non_finite: int = 0
