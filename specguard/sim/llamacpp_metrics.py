"""llama.cpp server (build 11434)'s ``/metrics`` (``--metrics``) and per-request ``timings``.

The page is written by hand, as the server does: no labels except ``position``, counters first and
then gauges, each with ``# HELP`` and ``# TYPE``, values printed the way a C++ stream prints a
double (six significant digits: ``1.23457e+06``), the per-position counter last and only once
something was drafted. The request counters (tokens, seconds, drafts) are added when a request
finishes; ``n_decode_total`` counts engine steps; the two throughput gauges are averages over the
window since the previous scrape (the server resets them on every ``/metrics``).
"""

from __future__ import annotations

from typing import Any

from specguard.sim.config import PoolConfig, SimConfig
from specguard.sim.engine import SimRequest, StepOutcome

COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    (
        "n_decode_total",
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    ),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
GAUGES = (
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
)
PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"
PER_POS_HELP = "Accepted tokens per draft position"


def cpp_double(value: float) -> str:
    """A double as ``std::ostream << double`` prints it (``%g``, six significant digits)."""
    return f"{value:g}"


def timings(request: SimRequest) -> dict[str, Any]:
    """The ``timings`` object of one finished (or running) request, with the draft fields only when
    it drafted, as the server writes them; times in milliseconds of the simulator's clock."""
    times = request.times
    start = times.get("scheduled", times.get("arrival", 0.0))
    first = times.get("first_token", start)
    last = times.get("last_token", first)
    prompt_ms = (first - start) * 1000.0
    gen_ms = max(0.001, (last - first) * 1000.0) if request.generated else 0.0
    steps = max(0, request.generated - 1)  # the first token comes from the prompt's logits
    out: dict[str, Any] = {
        "cache_n": 0,
        "prompt_n": request.prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / request.prompt_tokens if request.prompt_tokens else 0.0,
        "prompt_per_second": 1e3 / prompt_ms * request.prompt_tokens if prompt_ms > 0 else 0.0,
        "predicted_n": request.generated,
        "predicted_ms": gen_ms,
        "predicted_per_token_ms": gen_ms / steps if steps else 0.0,
        "predicted_per_second": 1e3 / gen_ms * steps if gen_ms > 0 else 0.0,
    }
    if request.draft_tokens > 0:
        out["draft_n"] = request.draft_tokens
        out["draft_n_accepted"] = request.accepted_tokens
    return out


class LlamacppMetrics:
    """Counters and gauges of one simulated llama-server, fed by the pool runtime."""

    def __init__(self, config: SimConfig, pool: PoolConfig):
        self.k = pool.num_speculative_tokens
        self.values = {name: 0.0 for name, _ in COUNTERS}
        self.per_pos: list[int] = []
        self.processing = 0
        self.deferred = 0
        self._busy = 0
        # the window since the last scrape: (prompt tokens, prompt s, decode steps, generation s)
        self._bucket = [0, 0.0, 0, 0.0]

    def observe_step(
        self, outcome: StepOutcome, end: float, running: int, waiting: int, kv_tokens: int
    ) -> None:
        self.values["n_decode_total"] += 1
        self._busy += outcome.batch_size
        self.processing = running
        self.deferred = waiting

    def observe_finished(self, request: SimRequest) -> None:
        if request.finish_reason == "abort" and not request.generated:
            return
        t = timings(request)
        v = self.values
        v["prompt_tokens_total"] += request.prompt_tokens
        v["prompt_seconds_total"] += t["prompt_ms"] / 1000.0
        v["tokens_predicted_total"] += request.generated
        v["tokens_predicted_seconds_total"] += t["predicted_ms"] / 1000.0
        v["n_tokens_max"] = max(v["n_tokens_max"], request.prompt_tokens + request.generated)
        v["spec_decode_num_draft_tokens_total"] += request.draft_tokens
        v["spec_decode_num_accepted_tokens_total"] += request.accepted_tokens
        v["spec_decode_num_drafts_total"] += request.rounds
        if request.rounds:
            positions = request.per_position
            if len(self.per_pos) < self.k:
                self.per_pos.extend([0] * (self.k - len(self.per_pos)))
            for i, count in enumerate(positions[: self.k]):
                self.per_pos[i] += count
        bucket = self._bucket
        bucket[0] += request.prompt_tokens
        bucket[1] += t["prompt_ms"] / 1000.0
        bucket[2] += max(0, request.generated - 1)
        bucket[3] += t["predicted_ms"] / 1000.0

    def render(self) -> bytes:
        """The page as the server writes it; resets the throughput window, as a scrape does."""
        prompt_n, prompt_s, steps, gen_s = self._bucket
        gauges = {
            "prompt_tokens_seconds": prompt_n / prompt_s if prompt_s > 0 else 0.0,
            "predicted_tokens_seconds": steps / gen_s if gen_s > 0 else 0.0,
            "requests_processing": float(self.processing),
            "requests_deferred": float(self.deferred),
            "n_busy_slots_per_decode": self._busy / max(self.values["n_decode_total"], 1.0),
        }
        self._bucket = [0, 0.0, 0, 0.0]
        lines = []
        for kind, items in (("counter", COUNTERS), ("gauge", GAUGES)):
            for name, help_text in items:
                value = self.values[name] if kind == "counter" else gauges[name]
                lines += [
                    f"# HELP llamacpp:{name} {help_text}",
                    f"# TYPE llamacpp:{name} {kind}",
                    f"llamacpp:{name} {cpp_double(value)}",
                ]
        if self.per_pos:
            lines += [f"# HELP llamacpp:{PER_POS} {PER_POS_HELP}", f"# TYPE llamacpp:{PER_POS} counter"]
            lines += [f'llamacpp:{PER_POS}{{position="{i}"}} {n}' for i, n in enumerate(self.per_pos)]
        return ("\n".join(lines) + "\n").encode()
