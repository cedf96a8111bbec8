"""Simulator configuration: pools, the step-cost model, and per-task acceptance and length tables.

Read from YAML with ``specguard.configfile`` (every error located as file:line:col). The shipped
``default.yaml`` documents every key; a user file overrides whole top-level sections of it, except
``tasks`` (merged per task name), ``cost`` and ``truth`` (merged per key): a partial ``cost:`` keeps
the shipped values of the keys it does not name.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specguard import configfile, schedules

DEFAULT_FILE = Path(__file__).with_name("default.yaml")
DIALECTS = ("vllm", "sglang", "llamacpp")
FINGERPRINT_MODES = ("full", "hash", "none")  # vLLM --fingerprint-mode (no "custom")
MERGED_SECTIONS = ("tasks", "cost", "truth")  # a user file's keys replace the default's one by one
MODEL_NAME = "sim-llama-3.1-8b"  # served model name unless the config sets model_name


@dataclass(frozen=True)
class LengthDist:
    """Token-length distribution: log-normal around ``median`` (``sigma`` 0 = fixed), clipped."""

    median: float
    sigma: float = 0.0
    minimum: int = 1
    maximum: int = 4096

    def draw(self, rng: random.Random) -> int:
        value = self.median if self.sigma <= 0 else rng.lognormvariate(math.log(self.median), self.sigma)
        return int(min(self.maximum, max(self.minimum, round(value))))

    def mean(self) -> float:
        """Mean of the unclipped distribution (good enough for documentation and sizing)."""
        return self.median * math.exp(self.sigma**2 / 2)


@dataclass(frozen=True)
class AcceptancePoint:
    """At ``temperature``: ``conditional[i]`` = P(draft i+1 accepted | drafts 1..i accepted)."""

    temperature: float
    conditional: tuple[float, ...]


@dataclass(frozen=True)
class TaskProfile:
    """One task type: acceptance by temperature (linear between points) and length distributions.

    ``request_spread`` scales every conditional probability of one request by a factor drawn
    uniformly from [1 - spread, 1 + spread], so requests differ (and some mostly roll back).
    """

    name: str
    acceptance: tuple[AcceptancePoint, ...]
    output_tokens: LengthDist
    prompt_tokens: LengthDist
    request_spread: float = 0.0

    def conditional_at(self, temperature: float, k: int) -> tuple[float, ...]:
        """Conditional acceptance per position at ``temperature``, ``k`` positions long."""
        points = sorted(self.acceptance, key=lambda p: p.temperature)
        if temperature <= points[0].temperature:
            probs = points[0].conditional
        elif temperature >= points[-1].temperature:
            probs = points[-1].conditional
        else:
            probs = points[-1].conditional
            for low, high in zip(points, points[1:], strict=False):
                if low.temperature <= temperature <= high.temperature:
                    w = (temperature - low.temperature) / (high.temperature - low.temperature)
                    probs = tuple(
                        (1 - w) * a + w * b
                        for a, b in zip(
                            _extend(low.conditional, k), _extend(high.conditional, k), strict=True
                        )
                    )
                    break
        return _extend(probs, k)

    def expected_accept_length(self, temperature: float, k: int) -> float:
        """E[tokens per verify round] over the class's rounds (the harmonic mean over requests)."""
        return 1.0 + sum(self.expected_per_position(temperature, k))

    def expected_per_position(self, temperature: float, k: int) -> tuple[float, ...]:
        """p_i = share of the class's rounds whose first i+1 drafts were all accepted.

        Requests of equal length that accept more need fewer rounds, so each request's rates are
        weighted by its rounds (1 / its accept length), as engine counters weight them.
        """
        q = self.conditional_at(temperature, k)
        total = [0.0] * k
        weights = 0.0
        for u in spread_factors(self.request_spread):
            prod, rates = 1.0, []
            for i in range(k):
                prod *= clamp_probability(q[i] * u)
                rates.append(prod)
            weight = 1.0 / (1.0 + sum(rates))
            weights += weight
            for i in range(k):
                total[i] += weight * rates[i]
        return tuple(t / weights for t in total)


def _extend(probs: tuple[float, ...], k: int) -> tuple[float, ...]:
    if k <= len(probs):
        return tuple(probs[:k])
    return tuple(probs) + (probs[-1],) * (k - len(probs))


def clamp_probability(p: float) -> float:
    return min(0.98, max(0.0, p))


def spread_factors(spread: float, points: int = 41) -> tuple[float, ...]:
    """Midpoint quadrature nodes of Uniform[1 - spread, 1 + spread]."""
    if spread <= 0:
        return (1.0,)
    return tuple(1 - spread + 2 * spread * (i + 0.5) / points for i in range(points))


@dataclass(frozen=True)
class CostModel:
    """Step time of one engine iteration (model seconds).

    ``base + per_request * B + verify(pad(M)) + K * (draft_per_position + draft_per_token * B_dec)
    + prefill_per_token * prefill_tokens`` where M = B_dec * (K + 1) verify tokens, padded up to the
    next graph tier, and ``verify`` is linear in M up to ``knee_tokens`` and steeper above it
    (compute-bound: speculative tokens now compete with real requests).
    """

    base_seconds: float = 0.016
    per_request_seconds: float = 0.00005
    per_token_seconds: float = 0.00003
    knee_tokens: int = 128
    above_knee_per_token_seconds: float = 0.0003
    draft_per_position_seconds: float = 0.0015
    draft_per_token_seconds: float = 0.00001
    prefill_per_token_seconds: float = 0.00001
    graph_tiers: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512)

    def padded(self, tokens: int) -> int:
        """Verify tokens actually executed: the next graph tier (beyond the largest tier: eager)."""
        for tier in self.graph_tiers:
            if tokens <= tier:
                return tier
        return tokens

    def verify_seconds(self, tokens: int) -> float:
        if tokens <= self.knee_tokens:
            return self.per_token_seconds * tokens
        return self.per_token_seconds * self.knee_tokens + self.above_knee_per_token_seconds * (
            tokens - self.knee_tokens
        )

    def step_seconds(
        self, decode_requests: int, k: int, prefill_requests: int = 0, prefill_tokens: int = 0
    ) -> float:
        """One step with ``decode_requests`` verifying K+1 tokens each plus some prefills."""
        batch = decode_requests + prefill_requests
        if batch == 0:
            return 0.0
        m = decode_requests * (k + 1)
        seconds = self.base_seconds + self.per_request_seconds * batch
        seconds += self.verify_seconds(self.padded(m)) if m else 0.0
        if k and decode_requests:
            seconds += k * (self.draft_per_position_seconds + self.draft_per_token_seconds * decode_requests)
        seconds += self.prefill_per_token_seconds * prefill_tokens
        return seconds


@dataclass(frozen=True)
class PoolConfig:
    """One engine: its name, K (0 = no speculation), batch capacity and port (0 = ephemeral).

    ``k_schedule``: an in-engine schedule (vLLM ``num_speculative_tokens_per_batch_size`` or
    TensorRT-LLM ``draft_len_schedule`` / ``max_concurrency``, ``specguard.schedules``) that picks
    each step's K by batch size; ``num_speculative_tokens`` is then its largest K.
    """

    name: str
    num_speculative_tokens: int = 0
    max_num_seqs: int = 256
    port: int = 0
    per_request_spec_metrics: bool = True  # vLLM --per-request-spec-decode-metrics summary
    method: str = "ngram"
    k_schedule: schedules.Schedule | None = None

    def k_at(self, batch: int) -> int:
        """The K of a step whose K was picked at ``batch`` requests (the fixed K without a schedule)."""
        return self.k_schedule.k_at(batch) if self.k_schedule is not None else self.num_speculative_tokens


@dataclass(frozen=True)
class SimConfig:
    pools: tuple[PoolConfig, ...]
    tasks: dict[str, TaskProfile]
    cost: CostModel = field(default_factory=CostModel)
    default_task: str = "chat"
    default_temperature: float = 1.0  # vLLM's default when the body has none
    seed: int = 0
    dialect: str = "vllm"
    time_scale: float = 1.0  # wall seconds per model second (0.1 = ten times faster)
    host: str = "127.0.0.1"
    model_name: str = MODEL_NAME
    max_model_len: int = 4096
    decode_log_interval: int = 40  # SGLang gauge window, in decode steps
    full_rollback_request_threshold: float = 0.5
    truth_concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 200, 256)
    custom_label_names: tuple[str, ...] = ("task",)  # SGLang --tokenizer-metrics-allowed-custom-labels
    # vLLM --fingerprint-mode: "full"/"hash" send system_fingerprint "vllm-<version>-<hash8>"
    # (vLLM's default, and the simulator's); "none" sends null / leaves it out, as vLLM does.
    fingerprint_mode: str = "full"

    def pool(self, name: str) -> PoolConfig:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool named {name!r} (pools: {', '.join(p.name for p in self.pools)})")

    def task(self, name: str | None) -> TaskProfile:
        """The task profile for ``name``; unknown or missing names get the default task."""
        return self.tasks.get(name or "", self.tasks[self.default_task])

    def with_overrides(self, **changes: Any) -> SimConfig:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def load(path: str | Path | None = None) -> SimConfig:
    """The shipped default, with ``path``'s sections on top (None: the default alone)."""
    base = configfile.load_file(DEFAULT_FILE)
    data = dict(base.data)
    doc = base
    if path is not None:
        doc = configfile.load_file(path)
        doc.raise_if_issues()
        user = doc.data or {}
        merged = {key: dict(data.get(key) or {}) for key in MERGED_SECTIONS}
        for key in MERGED_SECTIONS:
            if isinstance(user.get(key), dict):
                merged[key].update(user[key])
        data.update(user)
        for key, value in merged.items():
            if isinstance(user.get(key, {}), dict):  # a non-mapping is the user's error to report
                data[key] = value
    # Positions come from the user file; keys only in the default keep the default's (valid) values.
    doc = configfile.Document(doc.file, data, doc.positions)
    return configfile.parse_with(doc, parse)


def parse_text(text: str, file: str = "<sim-config>") -> SimConfig:
    """Parse a complete simulator config (no merging with the default)."""
    return configfile.parse_with(configfile.parse_text(text, file), parse)


def parse(root: configfile.Section) -> SimConfig:
    pools = tuple(_pool(s) for s in root.items("pools", required=True))
    names = [p.name for p in pools]
    root.check(len(set(names)) == len(names), "pools", f"pool names must be unique, got {names}")
    ports = [p.port for p in pools if p.port]
    root.check(len(set(ports)) == len(ports), "pools", f"pool ports must be unique, got {ports}")
    tasks_section = root.section("tasks", required=True)
    tasks = {}
    for name in list(tasks_section.data):
        tasks[name] = _task(name, tasks_section.section(name))
    default_task = root.get("default_task", str, "chat")
    root.check(
        default_task in tasks, "default_task", f"({default_task!r}) must name a task ({', '.join(tasks)})"
    )
    cost = _cost(root.section("cost"))
    truth = root.section("truth")
    concurrency = tuple(v for _, v in truth.values("concurrency")) or SimConfig.truth_concurrency
    truth.check(
        all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in concurrency),
        "concurrency",
        "must be a list of positive integers",
    )
    truth.reject_unknown()
    dialect = root.get("dialect", str, "vllm", choices=DIALECTS)
    for index, pool in enumerate(pools):
        root.check(
            pool.k_schedule is None or dialect == "vllm",
            f"pools[{index}]",
            f"an in-engine K schedule is simulated in the vllm dialect only (dialect: {dialect})",
        )
    labels = tuple(v for _, v in root.values("custom_label_names")) or ("task",)
    config = SimConfig(
        pools=pools,
        tasks=tasks,
        cost=cost,
        default_task=default_task,
        default_temperature=root.get("default_temperature", float, 1.0, minimum=0.0, maximum=2.0),
        seed=root.get("seed", int, 0),
        dialect=dialect,
        time_scale=root.get("time_scale", float, 1.0, minimum=0.001, maximum=1000.0),
        host=root.get("host", str, "127.0.0.1"),
        model_name=root.get("model_name", str, MODEL_NAME),
        max_model_len=root.get("max_model_len", int, 4096, minimum=16),
        decode_log_interval=root.get("decode_log_interval", int, 40, minimum=1),
        full_rollback_request_threshold=root.get(
            "full_rollback_request_threshold", float, 0.5, minimum=0.0, maximum=1.0
        ),
        truth_concurrency=tuple(int(v) for v in concurrency if isinstance(v, int)),
        custom_label_names=tuple(str(v) for v in labels),
        fingerprint_mode=root.get("fingerprint_mode", str, "full", choices=FINGERPRINT_MODES),
    )
    root.reject_unknown()
    return config


def _pool(s: configfile.Section) -> PoolConfig:
    pool = PoolConfig(
        name=s.get("name", str),
        num_speculative_tokens=s.get("num_speculative_tokens", int, 0, minimum=0, maximum=16),
        max_num_seqs=s.get("max_num_seqs", int, 256, minimum=1),
        port=s.get("port", int, 0, minimum=0, maximum=65535),
        per_request_spec_metrics=s.get("per_request_spec_metrics", bool, True),
        method=s.get("method", str, "ngram"),
    )
    try:
        pool = replace(pool, k_schedule=schedules.from_pool_keys(s.data, pool.num_speculative_tokens))
    except schedules.ScheduleError as exc:
        s.error(exc.key, str(exc))
    s.reject_unknown(also_allowed=schedules.KEYS)
    return pool


def _length(s: configfile.Section, default_max: int) -> LengthDist:
    dist = LengthDist(
        median=s.get("median", float, minimum=1.0) or 1.0,
        sigma=s.get("sigma", float, 0.0, minimum=0.0, maximum=3.0),
        minimum=s.get("min", int, 1, minimum=1),
        maximum=s.get("max", int, default_max, minimum=1),
    )
    s.check(dist.minimum <= dist.maximum, "min", f"({dist.minimum}) must be <= max ({dist.maximum})")
    s.reject_unknown()
    return dist


def _task(name: str, s: configfile.Section) -> TaskProfile:
    points = []
    for p in s.items("acceptance", required=True):
        temperature = p.get("temperature", float, minimum=0.0, maximum=2.0)
        probs = []
        for index, value in p.values("conditional", required=True):
            ok = isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0
            p.check(ok, f"conditional[{index}]", f"({value!r}) must be a probability in [0, 1]")
            probs.append(float(value) if ok else 0.0)
        p.check(bool(probs), "conditional", "needs at least one probability")
        p.reject_unknown()
        if temperature is not None and probs:
            points.append(AcceptancePoint(temperature, tuple(probs)))
    s.check(bool(points), "acceptance", "needs at least one temperature point")
    profile = TaskProfile(
        name=name,
        acceptance=tuple(points) or (AcceptancePoint(0.0, (0.0,)),),
        output_tokens=_length(s.section("output_tokens", required=True), 4096),
        prompt_tokens=_length(s.section("prompt_tokens", required=True), 4096),
        request_spread=s.get("request_spread", float, 0.0, minimum=0.0, maximum=0.9),
    )
    s.reject_unknown()
    return profile


def _cost(s: configfile.Section) -> CostModel:
    d = CostModel()
    tiers = tuple(v for _, v in s.values("graph_tiers")) or d.graph_tiers
    s.check(
        all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tiers)
        and list(tiers) == sorted(tiers),
        "graph_tiers",
        "must be an increasing list of positive integers",
    )
    model = CostModel(
        base_seconds=s.get("base_seconds", float, d.base_seconds, minimum=0.0),
        per_request_seconds=s.get("per_request_seconds", float, d.per_request_seconds, minimum=0.0),
        per_token_seconds=s.get("per_token_seconds", float, d.per_token_seconds, minimum=0.0),
        knee_tokens=s.get("knee_tokens", int, d.knee_tokens, minimum=1),
        above_knee_per_token_seconds=s.get(
            "above_knee_per_token_seconds", float, d.above_knee_per_token_seconds, minimum=0.0
        ),
        draft_per_position_seconds=s.get(
            "draft_per_position_seconds", float, d.draft_per_position_seconds, minimum=0.0
        ),
        draft_per_token_seconds=s.get(
            "draft_per_token_seconds", float, d.draft_per_token_seconds, minimum=0.0
        ),
        prefill_per_token_seconds=s.get(
            "prefill_per_token_seconds", float, d.prefill_per_token_seconds, minimum=0.0
        ),
        graph_tiers=tuple(int(t) for t in tiers if isinstance(t, int)),
    )
    s.reject_unknown()
    return model
