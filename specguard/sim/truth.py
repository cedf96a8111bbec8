"""Ground truth: what the simulated engines really did, and the model's true relative cost.

``TruthRecorder`` counts every step and every finished request of one pool exactly as the engine
produced them (the same numbers its /metrics exports), split by class = (task type, temperature).
``model_table`` is the true RC per class and concurrency from the cost model:
``RC = T_step(B, K) / (A_class(K) * T_step(B, 0))`` for a homogeneous batch of B requests.
The JSON (``/sim/truth``) is plain dicts and lists so tests compare it with what specguard measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specguard.sim.config import SimConfig
from specguard.sim.engine import SimRequest, StepOutcome


def class_key(task: str, temperature: float) -> str:
    """``task@temperature`` with the temperature rounded to 2 decimals (e.g. ``chat@0.7``)."""
    return f"{task}@{round(float(temperature), 2):g}"


@dataclass
class ClassCounts:
    k: int
    requests: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    full_rollback_rounds: int = 0
    full_rollback_requests: int = 0
    requests_with_rounds: int = 0
    histogram: list[int] = field(default_factory=list)
    per_position: list[int] = field(default_factory=list)

    def add(self, request: SimRequest, threshold: float) -> None:
        self.requests += 1
        self.output_tokens += request.generated
        self.prompt_tokens += request.prompt_tokens
        self.rounds += request.rounds
        self.draft_tokens += request.draft_tokens
        self.accepted_tokens += request.accepted_tokens
        self.full_rollback_rounds += request.full_rollback_rounds
        if request.rounds:
            self.requests_with_rounds += 1
            if request.full_rollback_rounds / request.rounds > threshold:
                self.full_rollback_requests += 1
        if not self.histogram:
            self.histogram = [0] * (self.k + 1)
            self.per_position = [0] * self.k
        for j, count in enumerate(request.histogram):
            self.histogram[j] += count
        for i, count in enumerate(request.per_position):
            self.per_position[i] += count

    def to_json(self) -> dict[str, Any]:
        rounds = self.rounds
        return {
            "requests": self.requests,
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "verify_rounds": rounds,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "strict_accept_rate": self.accepted_tokens / self.draft_tokens if self.draft_tokens else None,
            "accept_length": 1 + self.accepted_tokens / rounds if rounds else None,
            "per_position_accepted": list(self.per_position),
            "per_position_rate": [c / rounds for c in self.per_position] if rounds else None,
            "acceptance_histogram": list(self.histogram),
            "full_rollback_rounds": self.full_rollback_rounds,
            "full_rollback_round_ratio": self.full_rollback_rounds / rounds if rounds else None,
            "requests_with_rounds": self.requests_with_rounds,
            "full_rollback_requests": self.full_rollback_requests,
            "full_rollback_request_ratio": (
                self.full_rollback_requests / self.requests_with_rounds if self.requests_with_rounds else None
            ),
        }


@dataclass
class StepStats:
    steps: int = 0
    model_seconds: float = 0.0
    wall_seconds: float = 0.0
    wall_steps: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "mean_model_seconds": self.model_seconds / self.steps if self.steps else None,
            "mean_wall_seconds": self.wall_seconds / self.wall_steps if self.wall_steps else None,
        }


class TruthRecorder:
    """Everything one pool's engine did, exactly."""

    def __init__(self, config: SimConfig, pool_name: str):
        self.config = config
        self.pool = config.pool(pool_name)
        self.k = self.pool.num_speculative_tokens
        self.classes: dict[str, ClassCounts] = {}
        self.by_batch: dict[int, StepStats] = {}
        self.totals: dict[str, Any] = {
            "steps": 0,
            "model_seconds": 0.0,
            "generation_tokens": 0,
            "prompt_tokens": 0,
            "drafts": 0,  # (request, step) pairs that verified drafts = vLLM num_drafts
            "draft_tokens": 0,
            "accepted_tokens": 0,
            "accepted_per_position": [0] * self.k,
            "full_rollback_rounds": 0,
            "requests_admitted": 0,
            "requests_finished": 0,
            "requests_aborted": 0,
            "requests_with_spec_fields": 0,  # responses that carried per-request spec numbers
            "finished_reasons": {},
        }

    def observe_step(self, outcome: StepOutcome, wall_seconds: float | None = None) -> None:
        t = self.totals
        t["steps"] += 1
        t["model_seconds"] += outcome.duration
        t["generation_tokens"] += outcome.generated_tokens
        t["prompt_tokens"] += outcome.prefill_tokens
        t["requests_admitted"] += outcome.prefill_requests
        for e in outcome.emissions:
            if e.drafted:
                t["drafts"] += 1
                t["draft_tokens"] += e.drafted
                t["accepted_tokens"] += e.accepted
                if e.accepted == 0:
                    t["full_rollback_rounds"] += 1
                for i in range(e.accepted):
                    t["accepted_per_position"][i] += 1
        stats = self.by_batch.setdefault(outcome.batch_size, StepStats())
        stats.steps += 1
        stats.model_seconds += outcome.duration
        if wall_seconds is not None:
            stats.wall_steps += 1
            stats.wall_seconds += wall_seconds

    def observe_finished(self, request: SimRequest) -> None:
        t = self.totals
        reason = request.finish_reason or "stop"
        t["finished_reasons"][reason] = t["finished_reasons"].get(reason, 0) + 1
        if reason == "abort":
            t["requests_aborted"] += 1
            return
        t["requests_finished"] += 1
        key = class_key(request.task, request.temperature)
        counts = self.classes.setdefault(key, ClassCounts(self.k))
        counts.add(request, self.config.full_rollback_request_threshold)

    def observe_reported(self, count: int = 1) -> None:
        """``count`` responses carried the per-request spec block (vLLM metrics, SGLang fields)."""
        self.totals["requests_with_spec_fields"] += count

    def to_json(self) -> dict[str, Any]:
        t = dict(self.totals)
        t["finished_reasons"] = dict(t["finished_reasons"])
        t["accepted_per_position"] = list(t["accepted_per_position"])
        schedule = self.pool.k_schedule
        return {
            "num_speculative_tokens": self.k,
            "k_schedule": None if schedule is None else {"engine": schedule.engine, **schedule.to_json()},
            "max_num_seqs": self.pool.max_num_seqs,
            "totals": t,
            "classes": {key: counts.to_json() for key, counts in sorted(self.classes.items())},
            "step_times_by_batch_size": {
                str(b): {**s.to_json(), "model_seconds": self.config.cost.step_seconds(b, self.pool.k_at(b))}
                for b, s in sorted(self.by_batch.items())
            },
        }


def relative_cost(config: SimConfig, task: str, temperature: float, k: int, batch: int) -> float:
    """The model's true RC for one class on a K-pool at B concurrent requests (1.0 for K = 0)."""
    if k == 0:
        return 1.0
    accept_length = config.task(task).expected_accept_length(temperature, k)
    cost = config.cost
    return cost.step_seconds(batch, k) / (accept_length * cost.step_seconds(batch, 0))


def model_table(config: SimConfig) -> dict[str, Any]:
    """True per-class acceptance and RC by pool and concurrency, from the model (not sampled)."""
    classes: dict[str, Any] = {}
    for name, profile in config.tasks.items():
        for point in profile.acceptance:
            key = class_key(name, point.temperature)
            entry: dict[str, Any] = {"task_type": name, "temperature": point.temperature, "pools": {}}
            for pool in config.pools:
                k = pool.num_speculative_tokens
                if k == 0:
                    continue
                per_pos = profile.expected_per_position(point.temperature, k)
                entry["pools"][pool.name] = {
                    "num_speculative_tokens": k,
                    "accept_length": 1 + sum(per_pos),
                    "strict_accept_rate": sum(per_pos) / k,
                    "per_position_rate": list(per_pos),
                    "full_rollback_round_ratio": 1 - per_pos[0],
                    "relative_cost": {  # a schedule's K at B for a steady batch of B requests
                        str(b): relative_cost(config, name, point.temperature, pool.k_at(b), b)
                        for b in config.truth_concurrency
                    },
                }
            classes[key] = entry
    cost = config.cost
    return {
        "classes": classes,
        "step_seconds": {
            pool.name: {str(b): cost.step_seconds(b, pool.k_at(b)) for b in config.truth_concurrency}
            for pool in config.pools
        },
        "nospec_step_seconds": {str(b): cost.step_seconds(b, 0) for b in config.truth_concurrency},
    }
