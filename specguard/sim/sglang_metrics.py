"""SGLang 0.5.23's /metrics for one simulated pool, and the step-time record behind /server_info.

Scheduler gauges (labels model_name, engine_type, tp_rank, pp_rank, moe_ep_rank) include the
window-averaged ``spec_accept_length`` / ``spec_accept_rate``: means over the last
``decode_log_interval`` (40) decode steps, refreshed only then (stale when idle; 0 without
speculation). Tokenizer metrics (labels model_name, engine_type + allowed custom labels such as
``task``) include ``spec_verify_calls_total`` (added when a request finishes) and a per-TOKEN
inter-token latency (``_count`` = tokens). SGLang runs prometheus_client in multiprocess mode, so
the page has no ``_created`` series.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specguard.sim.config import PoolConfig, SimConfig
from specguard.sim.engine import SimRequest, StepOutcome

SCHEDULER_LABELS = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = [
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
]
ITL_BUCKETS = [
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
]
MAX_TOTAL_TOKENS = 524288


class SglangMetrics:
    def __init__(self, config: SimConfig, pool: PoolConfig, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.k = pool.num_speculative_tokens
        self.interval = config.decode_log_interval
        self.custom = list(config.custom_label_names)
        self.model = config.model_name
        sched = [config.model_name, "unified", "0", "0", "0"]

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, SCHEDULER_LABELS, registry=r, multiprocess_mode="mostrecent").labels(
                *sched
            )

        self.running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.queue = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.accept_length = gauge(
            "sglang:spec_accept_length",
            "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
        )
        self.accept_rate = gauge(
            "sglang:spec_accept_rate",
            "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
        )
        gauge("sglang:spec_num_steps", "Currently active speculative_num_steps.").set(self.k)
        gauge(
            "sglang:spec_num_draft_tokens",
            "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
        ).set(self.k + 1 if self.k else 0)
        gauge("sglang:utilization", "The utilization.")
        tok = ["model_name", "engine_type", *self.custom]
        streaming = [*tok, "is_streaming"]
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", streaming, registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", streaming, registry=r
        )
        self.verify_calls = Counter(
            "sglang:spec_verify_calls", "Number of speculative decoding verification calls.", tok, registry=r
        )
        self.num_requests = Counter("sglang:num_requests", "Number of requests processed.", tok, registry=r)
        self.aborted = Counter("sglang:num_aborted_requests", "Number of requests aborted.", tok, registry=r)
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            streaming,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            tok,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            streaming,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            streaming,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        # decode-log window (reset every `interval` decode steps)
        self._decode_steps = 0
        self._window_tokens = 0
        self._window_forward = 0
        self._window_correct = 0
        self._window_start: float | None = None
        self.step_time_dict: dict[str, list[float]] = {}
        self.total_accept_tokens = 0
        self.total_forward = 0
        self.last_gen_throughput = 0.0

    def labels(self, request: SimRequest) -> list[str]:
        custom = request.meta.get("labels") or {}
        return [self.model, "unified", *(str(custom.get(name, "")) for name in self.custom)]

    # ---- feeding ------------------------------------------------------------------------------
    def observe_step(
        self, outcome: StepOutcome, end: float, running: int, waiting: int, kv_tokens: int
    ) -> None:
        for e in outcome.emissions:
            request = e.request
            labels = self.labels(request)
            streaming = "true" if request.meta.get("streaming") else "false"
            if e.prefill:
                self.ttft.labels(*labels, streaming).observe(end - request.times["arrival"])
            elif e.new_tokens:
                interval = end - request.times["previous_token"]
                histogram = self.itl.labels(*labels)
                histogram._sum.inc(interval)  # SGLang's own fast path: one interval, n tokens
                per_token = interval / e.new_tokens
                for i, bound in enumerate(histogram._upper_bounds):
                    if per_token <= bound:
                        histogram._buckets[i].inc(e.new_tokens)
                        break
        self.running.set(running)
        self.queue.set(waiting)
        self.used_tokens.set(kv_tokens)
        self.token_usage.set(kv_tokens / MAX_TOTAL_TOKENS)
        if outcome.decode_requests == 0:
            return
        if self._window_start is None:
            self._window_start = end - 0.0
        decode = [e for e in outcome.emissions if not e.prefill]
        self._window_tokens += sum(e.new_tokens for e in decode)
        self._window_forward += len(decode)
        self._window_correct += sum(e.accepted for e in decode)
        self._decode_steps += 1
        if self._decode_steps % self.interval == 0:
            self._log_window(end, outcome.batch_size)

    def _log_window(self, end: float, batch: int) -> None:
        elapsed = max(end - (self._window_start or end), 1e-9)
        self.last_gen_throughput = self._window_tokens / elapsed
        self.gen_throughput.set(self.last_gen_throughput)
        if self.k:
            self.accept_length.set(self._window_tokens / self._window_forward)
            self.accept_rate.set(self._window_correct / (self._window_forward * self.k))
            self.total_accept_tokens += self._window_tokens
            self.total_forward += self._window_forward
        self.step_time_dict.setdefault(str(batch), []).append(elapsed / self.interval)
        self._window_tokens = self._window_forward = self._window_correct = 0
        self._window_start = end

    def observe_finished(self, request: SimRequest) -> None:
        labels = self.labels(request)
        if request.finish_reason == "abort":
            self.aborted.labels(*labels).inc()
            return
        streaming = "true" if request.meta.get("streaming") else "false"
        times = request.times
        self.prompt_tokens.labels(*labels, streaming).inc(request.prompt_tokens)
        self.generation_tokens.labels(*labels, streaming).inc(request.generated)
        if request.rounds:
            self.verify_calls.labels(*labels).inc(request.rounds)
        self.num_requests.labels(*labels).inc()
        self.e2e.labels(*labels, streaming).observe(times["finished"] - times["arrival"])
        if request.generated > 1:
            tpot = (times["finished"] - times["first_token"]) / (request.generated - 1)
            self.tpot.labels(*labels, streaming).observe(tpot)

    def avg_spec_accept_length(self) -> float:
        return self.total_accept_tokens / self.total_forward if self.total_forward else 0.0

    def render(self) -> bytes:
        """The page without ``_created`` series (SGLang's registry is multiprocess)."""
        out = []
        skip = False
        for line in generate_latest(self.registry).decode().splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                skip = line.split(" ")[2].endswith("_created")
            elif not line.startswith("#"):
                name = line.split("{", 1)[0].split(" ", 1)[0]
                skip = name.endswith("_created")
            if not skip:
                out.append(line)
        return ("\n".join(out) + "\n").encode()
