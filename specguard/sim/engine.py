"""The engine model: continuous batching with speculative verify rounds, no clock and no I/O.

``EngineCore.step()`` runs one engine iteration and returns what happened (a ``StepOutcome``)
including its duration in model seconds; the caller owns time. The virtual runner adds the
durations up; the HTTP runtime sleeps them against an absolute clock. Both see the same steps.

Per step, every running request that already has its first token verifies K drafts + 1; the
number accepted is drawn from the request's per-position conditional probabilities (by task type
and temperature). Newly admitted requests are prefilled and emit their first token. Like vLLM,
accepted drafts are counted even when max_tokens or the stop length truncates the emitted tokens.

A pool with an in-engine schedule (``PoolConfig.k_schedule``) picks K per step by batch size, as
its engine does: vLLM from the number of requests scheduled in the *previous* step (its drafts
were proposed after that step's forward pass), TensorRT-LLM from the requests active at the start
of this one. A step at K = 0 verifies no drafts: its requests count no verify round, no drafts
and no histogram entry, as vLLM counts them (only steps that carried drafts are observed).
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from specguard.exporters.records import SpecStats
from specguard.sim.config import PoolConfig, SimConfig, clamp_probability


def request_rng(seed: int, pool: str, key: str) -> random.Random:
    """A request's own random stream: the same request gets the same draws whatever the batch."""
    digest = hashlib.blake2b(f"{seed}\x00{pool}\x00{key}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


@dataclass(eq=False, slots=True)  # identity: never "equal" (list.remove stays cheap); slots: fast fields
class SimRequest:
    """One sequence inside the engine (mutable engine state; read, do not modify, from outside)."""

    request_id: str
    task: str
    temperature: float
    prompt_tokens: int
    max_tokens: int
    target_tokens: int  # the drawn natural length: the request stops ("stop") here
    k: int
    conditional: tuple[float, ...]  # this request's per-position conditional acceptance
    rng: random.Random
    ignore_eos: bool = False
    generated: int = 0
    rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    histogram: list[int] = field(default_factory=list)  # index j: rounds accepting exactly j drafts
    state: str = "waiting"  # waiting | running | finished
    finish_reason: str | None = None
    steps_run: int = 0
    # timestamps in the caller's clock (model or wall seconds), set by the runner
    times: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # request parameters the front end keeps

    @property
    def per_position(self) -> list[int]:
        """Index i: rounds accepting >= i+1 drafts (from the histogram)."""
        out, tail = [], 0
        for count in reversed(self.histogram[1:]):
            tail += count
            out.append(tail)
        return out[::-1]

    @property
    def full_rollback_rounds(self) -> int:
        return self.histogram[0] if self.histogram else 0

    def spec_stats(self) -> SpecStats | None:
        """What vLLM's per-request summary would report (None on a K = 0 pool), as the tap reads it."""
        if not self.k:
            return None
        return SpecStats(
            source="vllm",
            rounds=self.rounds,
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
            accepted_histogram=tuple(self.histogram),
            full_rollback_rounds=self.full_rollback_rounds,
            output_tokens=self.generated,
            num_speculative_tokens=self.k,
        )

    stop_at: int = 0  # tokens after which the request finishes (set from the above at creation)

    def __post_init__(self) -> None:
        self.stop_at = self.max_tokens if self.ignore_eos else min(self.max_tokens, self.target_tokens)


class Emission(NamedTuple):
    """What one request got from one step (a named tuple: one is made per request per step)."""

    request: SimRequest
    new_tokens: int
    drafted: int  # draft tokens verified for it this step (0 on its prefill step)
    accepted: int  # drafts accepted (before truncation)
    prefill: bool
    finished: bool


@dataclass(frozen=True)
class StepOutcome:
    index: int
    duration: float  # model seconds
    decode_requests: int
    prefill_requests: int
    prefill_tokens: int
    verify_tokens: int  # M = decode_requests * (K + 1)
    padded_tokens: int  # M after graph-tier padding
    emissions: tuple[Emission, ...]
    waiting: int  # queue length after admission
    k: int = 0  # drafts each decoding request verified in this step

    @property
    def batch_size(self) -> int:
        return self.decode_requests + self.prefill_requests

    @property
    def generated_tokens(self) -> int:
        return sum(e.new_tokens for e in self.emissions)


class EngineCore:
    """One pool's engine: a waiting queue, a running batch of at most ``max_num_seqs``, steps."""

    def __init__(self, config: SimConfig, pool: PoolConfig, *, seed: int | None = None):
        self.config = config
        self.pool = pool
        self.k = pool.num_speculative_tokens  # the largest K (vLLM num_speculative_tokens)
        self.schedule = pool.k_schedule
        self._next_k = self.k  # vLLM schedule: the K the last step's batch size picked
        self.seed = config.seed if seed is None else seed
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.steps = 0
        self._ids = 0

    # ---- requests -------------------------------------------------------------------------
    def new_request(
        self,
        *,
        task: str | None,
        temperature: float,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
        key: str | None = None,
        request_id: str | None = None,
        ignore_eos: bool = False,
    ) -> SimRequest:
        """Build a request whose random draws depend only on (seed, pool, key)."""
        self._ids += 1
        key = key if key is not None else f"#{self._ids}"
        rng = request_rng(self.seed, self.pool.name, key)
        profile = self.config.task(task)
        if prompt_tokens is None:
            prompt_tokens = profile.prompt_tokens.draw(rng)
        target = profile.output_tokens.draw(rng)
        limit = max(1, self.config.max_model_len - prompt_tokens)
        max_tokens = limit if max_tokens is None else max(1, min(max_tokens, limit))
        base = profile.conditional_at(temperature, max(self.k, 1))
        spread = profile.request_spread
        factor = rng.uniform(1 - spread, 1 + spread) if spread > 0 else 1.0
        return SimRequest(
            request_id=request_id or f"req-{self._ids}",
            task=profile.name,
            temperature=temperature,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            target_tokens=target,
            k=self.k,
            conditional=tuple(clamp_probability(q * factor) for q in base[: self.k]),
            rng=rng,
            ignore_eos=ignore_eos,
            histogram=[0] * (self.k + 1),
        )

    def add(self, request: SimRequest) -> None:
        request.state = "waiting"
        self.waiting.append(request)

    def abort(self, request: SimRequest) -> bool:
        """Drop a request (client went away); True when it was still in the engine."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        else:
            return False
        request.state = "finished"
        request.finish_reason = "abort"
        return True

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    # ---- one iteration ----------------------------------------------------------------------
    def step(self) -> StepOutcome | None:
        """Admit, verify, emit; None when there is nothing to run."""
        if self.idle:
            return None
        decoding = list(self.running)
        admitted: list[SimRequest] = []
        while self.waiting and len(self.running) < self.pool.max_num_seqs:
            request = self.waiting.popleft()
            request.state = "running"
            self.running.append(request)
            admitted.append(request)
        k = self._step_k(len(decoding) + len(admitted))
        emissions: list[Emission] = [self._decode(request, k) for request in decoding]
        prefill_tokens = 0
        for request in admitted:
            prefill_tokens += request.prompt_tokens
            request.generated = 1
            request.steps_run += 1
            done = request.generated >= request.stop_at
            emissions.append(Emission(request, 1, 0, 0, True, done))
        for emission in emissions:
            if emission.finished:
                self._finish(emission.request)
        m = len(decoding) * (k + 1)
        cost = self.config.cost
        duration = cost.step_seconds(len(decoding), k, len(admitted), prefill_tokens)
        self.steps += 1
        return StepOutcome(
            index=self.steps,
            duration=duration,
            decode_requests=len(decoding),
            prefill_requests=len(admitted),
            prefill_tokens=prefill_tokens,
            verify_tokens=m,
            padded_tokens=cost.padded(m) if m else 0,
            emissions=tuple(emissions),
            waiting=len(self.waiting),
            k=k if decoding else 0,
        )

    def _step_k(self, batch: int) -> int:
        """The K this step's decoding requests verify; ``batch``: the requests this step schedules."""
        schedule = self.schedule
        if schedule is None:
            return self.k
        if schedule.lag:  # vLLM: drafts were proposed after the last step, at its batch size
            k, self._next_k = self._next_k, schedule.k_at(batch)
            return k
        return schedule.k_at(batch)  # TensorRT-LLM: this iteration's active requests

    def _decode(self, request: SimRequest, k: int) -> Emission:
        accepted = 0
        if k:
            draw = request.rng.random
            for q in request.conditional if k == request.k else request.conditional[:k]:
                if draw() < q:
                    accepted += 1
                else:
                    break
            request.rounds += 1
            request.draft_tokens += k
            request.accepted_tokens += accepted
            request.histogram[accepted] += 1
        generated = request.generated
        stop_at = request.stop_at
        new = accepted + 1 if generated + accepted + 1 < stop_at else stop_at - generated
        generated += new
        request.generated = generated
        request.steps_run += 1
        return Emission(request, new, k, accepted, False, generated >= stop_at)

    def _finish(self, request: SimRequest) -> None:
        request.state = "finished"
        stopped = not request.ignore_eos and request.generated >= request.target_tokens
        request.finish_reason = "stop" if stopped else "length"
        self.running.remove(request)
