"""Replay a scenario in virtual time through the simulator's engine core, under one routing policy.

No HTTP and no clock: each pool is a ``sim.engine.EngineCore`` whose steps take their model
duration on a shared virtual timeline (a discrete-event loop). Closed-loop clients of each task
type send their next request as soon as one finishes; every request's lengths and temperature
depend only on (seed, client, request number), never on the policy, so every policy serves the
same traffic. A policy picks the pool for each request (``choose``) and may re-plan on a tick
(``tick``) from the finished requests it saw (``observe``).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specguard.exporters.loadmeter import LoadMeter
from specguard.exporters.records import RequestRecord
from specguard.lab.scenario import ClassLoad, Scenario
from specguard.sim.config import SimConfig
from specguard.sim.engine import EngineCore, SimRequest, StepOutcome

LoadBucketOf = Callable[[str], str]
LoadOf = Callable[[str], float]


class Policy(Protocol):
    name: str

    def choose(
        self,
        task_type: str,
        temperature_bucket: str,
        load_bucket_of: LoadBucketOf,
        load_of: LoadOf | None = None,
    ) -> tuple[str, str]:
        """(pool, route) for one request; route is "plan", "holdout" or "probe".

        ``load_of(pool)``: in-flight requests per replica of the pool if the request joined it."""

    def observe(self, record: RequestRecord) -> None: ...

    def tick(self, now: float) -> list[dict]:
        """Re-plan at virtual time ``now``; returns the decisions that changed the plan (JSON)."""

    def on_phase(self, index: int, now: float) -> None: ...

    @property
    def tick_seconds(self) -> float | None: ...


@dataclass(frozen=True)
class Buckets:
    """The tap's bucketing, as plain (name, max) pairs (``inf`` for open)."""

    temperature: tuple[tuple[str, float], ...]
    load: tuple[tuple[str, float], ...]

    @staticmethod
    def _of(value: float, buckets: tuple[tuple[str, float], ...]) -> str:
        for name, upper in buckets:
            if value <= upper:
                return name
        return buckets[-1][0]

    def temperature_bucket(self, t: float) -> str:
        return self._of(t, self.temperature)

    def load_bucket(self, in_flight: int) -> str:
        return self._of(float(in_flight), self.load)

    @classmethod
    def from_classes(cls, classes) -> Buckets:
        def pairs(items):
            return tuple((b.name, math.inf if b.max is None else float(b.max)) for b in items)

        return cls(pairs(classes.temperature_buckets), pairs(classes.load_buckets))


@dataclass
class Finished:
    """One request the replay completed (virtual seconds)."""

    task_type: str
    temperature: float
    temperature_bucket: str
    pool: str
    route: str
    started: float
    first_token: float
    ended: float
    output_tokens: int

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.ended - self.first_token) / (self.output_tokens - 1)


@dataclass
class ReplayResult:
    policy: str
    scenario: Scenario
    finished: list[Finished] = field(default_factory=list)
    # tokens emitted per (phase index, task_type), counted at the step that emitted them
    tokens: dict[tuple[int, str], int] = field(default_factory=lambda: defaultdict(int))
    decisions: list[dict] = field(default_factory=list)
    plans: list[tuple[float, dict]] = field(default_factory=list)


def _rng(seed: int, *parts: object) -> random.Random:
    text = "\x00".join(str(p) for p in (seed, *parts))
    return random.Random(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big"))


class _Client:
    def __init__(self, task: str, index: int):
        self.task = task
        self.index = index
        self.sent = 0
        self.load: ClassLoad | None = None
        self.retiring = False
        self.busy = False


class Replay:
    """One scenario under one policy on fresh engines (same seed -> same traffic)."""

    def __init__(
        self,
        sim: SimConfig,
        scenario: Scenario,
        policy: Policy,
        buckets: Buckets,
        *,
        seed: int = 0,
        pools: Sequence[str] | None = None,
        fleet: int = 3,
        replicas: Mapping[str, int] | None = None,
        fixed: bool = False,
    ):
        self.sim = sim
        self.scenario = scenario
        self.policy = policy
        self.buckets = buckets
        self.seed = seed
        names = list(pools) if pools is not None else [p.name for p in sim.pools]
        # Capacity model: every policy gets the same fleet of ``fleet`` engines' worth of capacity.
        # Each pool may use up to ``fleet`` engines; requests are packed onto a pool's engines at
        # the fleet-wide per-engine concurrency (ceil(in flight / fleet)), so a pool's capacity
        # follows its traffic, as pools autoscaled on in-flight requests would.
        # ``replicas``: pools with a replica count of their own (default: each no-spec pool, 1).
        # Their load per replica (what the router's capacity-matched holdout compares) is the load
        # of the replica a request joins with the pool's in-flight requests spread evenly, as the
        # tap computes it; with ``fixed`` they also have exactly that
        # many engines, and a request joins the least loaded one (a Service in front of a fixed
        # fleet) instead of the packing above.
        self.fleet = fleet
        if replicas is None:  # a no-spec pool counts as one replica (capacity-matched holdout fills one)
            replicas = {name: 1 for name in names if sim.pool(name).num_speculative_tokens == 0}
        self.replicas = dict(replicas)
        self.fixed = fixed
        self.engines = {
            name: [
                EngineCore(sim, sim.pool(name), seed=seed)
                for _ in range(self.replicas[name] if fixed and name in self.replicas else fleet)
            ]
            for name in names
        }
        self.in_flight = dict.fromkeys(names, 0)
        self._replica_load = {name: [0] * len(self.engines[name]) for name in names}
        # each engine's load integral over virtual time (a request's mean load while it decodes)
        self._meters = {name: LoadMeter(range(len(self.engines[name]))) for name in names}
        self._busy = {(name, i): False for name in names for i in range(len(self.engines[name]))}
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self._clients: dict[str, list[_Client]] = defaultdict(list)
        self._meta: dict[int, tuple[_Client, str, str, float]] = {}
        self.now = 0.0
        self.phase = 0
        self.result = ReplayResult(policy.name, scenario)

    def mean_loads(self) -> dict[str, list[float]]:
        """Each engine's in-flight requests averaged over the run so far (virtual time)."""
        now = max(self.now, 1e-9)
        return {
            pool: [meter.area(i, self.now) / now for i in range(len(self.engines[pool]))]
            for pool, meter in self._meters.items()
        }

    # ---- events ---------------------------------------------------------------------------------
    def _push(self, at: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, payload))

    def run(self) -> ReplayResult:
        end = self.scenario.duration_s
        for index, (start, _, _) in enumerate(self.scenario.boundaries()):
            self._push(start, "phase", index)
        tick = self.policy.tick_seconds
        if tick:
            t = tick
            while t < end:
                self._push(t, "tick")
                t += tick
        while self._events:
            at, _, kind, payload = heapq.heappop(self._events)
            if at >= end:
                break
            self.now = at
            if kind == "step":
                self._step_done(payload)  # type: ignore[arg-type]
            elif kind == "phase":
                self._enter_phase(payload)  # type: ignore[arg-type]
            elif kind == "tick":
                changes = self.policy.tick(at)
                for decision in changes:
                    decision.setdefault("phase", self.scenario.phases[self.phase].name)
                self.result.decisions.extend(changes)
        return self.result

    def _enter_phase(self, index: int) -> None:
        self.phase = index
        self.policy.on_phase(index, self.now)
        phase = self.scenario.phases[index]
        wanted = {load.task_type: load for load in phase.loads}
        for task in sorted(set(self._clients) | set(wanted)):  # sorted: same order, same run
            load = wanted.get(task)
            clients = self._clients[task]
            active = [c for c in clients if not c.retiring]
            target = load.clients if load else 0
            for client in active[target:]:
                client.retiring = True
            for client in active[:target]:
                client.load = load
            # bring retiring clients back first, then new ones
            missing = target - min(target, len(active))
            for client in clients:
                if missing <= 0:
                    break
                if client.retiring:
                    client.retiring, client.load, missing = False, load, missing - 1
                    if not client.busy:
                        self._send(client)
            while missing > 0:
                client = _Client(task, len(clients))
                client.load = load
                clients.append(client)
                self._send(client)
                missing -= 1

    # ---- requests -------------------------------------------------------------------------------
    def _send(self, client: _Client) -> None:
        assert client.load is not None
        rng = _rng(self.seed, "req", client.task, client.index, client.sent)
        client.sent += 1
        temperature = client.load.temperature_at(rng.random())
        tbucket = self.buckets.temperature_bucket(temperature)
        profile = self.sim.task(client.task)
        prompt = profile.prompt_tokens.draw(rng)
        length = profile.output_tokens.draw(rng)

        def load_bucket_of(pool: str) -> str:
            # the tap's load bucket: live concurrency of the engine the request would join
            return self.buckets.load_bucket(self._replica_load[pool][self._pick(pool)] + 1)

        def load_of(pool: str) -> float:
            if pool in self.replicas:  # as the tap's router: the replica it joins, evenly spread
                return float(self.in_flight[pool] // self.replicas[pool] + 1)
            return float(self._replica_load[pool][self._pick(pool)] + 1)

        pool, route = self.policy.choose(client.task, tbucket, load_bucket_of, load_of)
        loads = self._replica_load[pool]
        replica = self._pick(pool)
        engine = self.engines[pool][replica]
        request = engine.new_request(
            task=client.task,
            temperature=temperature,
            prompt_tokens=prompt,
            max_tokens=length,
            key=f"{client.task}/{client.index}/{client.sent}",
            ignore_eos=True,  # the length drawn above, identical under every policy
        )
        self.in_flight[pool] += 1
        loads[replica] += 1
        self._meters[pool].change(replica, 1, self.now)
        request.times["arrival"] = self.now
        request.meta["load"] = float(loads[replica])
        request.meta["load_bucket"] = self.buckets.load_bucket(loads[replica])
        self._meta[id(request)] = (client, pool, route, temperature, replica)
        client.busy = True
        engine.add(request)
        if not self._busy[(pool, replica)]:
            self._start_step((pool, replica))

    def _pick(self, pool: str) -> int:
        """The fullest engine of the pool still below the fleet-wide per-engine concurrency
        (a fixed pool: its least loaded engine)."""
        loads = self._replica_load[pool]
        if self.fixed and pool in self.replicas:
            return loads.index(min(loads))
        cap = math.ceil((sum(self.in_flight.values()) + 1) / self.fleet)
        below = [i for i, n in enumerate(loads) if n < cap]
        if below:
            return max(below, key=lambda i: (loads[i], -i))
        return loads.index(min(loads))

    def _start_step(self, where: tuple[str, int]) -> None:
        outcome = self.engines[where[0]][where[1]].step()
        if outcome is None:
            self._busy[where] = False
            return
        self._busy[where] = True
        self._push(self.now + outcome.duration, "step", (where, outcome))

    def _step_done(self, payload: tuple[tuple[str, int], StepOutcome]) -> None:
        where, outcome = payload
        pool = where[0]
        again: list[_Client] = []
        for emission in outcome.emissions:
            request = emission.request
            self.result.tokens[(self.phase, request.task)] += emission.new_tokens
            if emission.prefill:
                request.times["first_token"] = self.now
                request.meta["first_area"] = self._meters[pool].area(where[1], self.now)
            if emission.finished:
                client = self._finish(pool, request)
                if client is not None:
                    again.append(client)
        self._start_step(where)
        for client in again:
            self._send(client)

    def _finish(self, pool: str, request: SimRequest) -> _Client | None:
        client, _, route, temperature, replica = self._meta.pop(id(request))
        self.in_flight[pool] -= 1
        area = self._meters[pool].area(replica, self.now)
        self._meters[pool].change(replica, -1, self.now)
        self._replica_load[pool][replica] -= 1
        started = request.times["arrival"]
        if self.now > request.times.get("first_token", self.now):
            decode = self.now - request.times["first_token"]
            request.meta["decode_load"] = (area - request.meta["first_area"]) / decode
        first = request.times.get("first_token", self.now)
        done = Finished(
            task_type=request.task,
            temperature=temperature,
            temperature_bucket=self.buckets.temperature_bucket(temperature),
            pool=pool,
            route=route,
            started=started,
            first_token=first,
            ended=self.now,
            output_tokens=request.generated,
        )
        self.result.finished.append(done)
        self.policy.observe(
            to_record(
                request,
                done,
                request.meta["load_bucket"],
                request.meta["load"],
                request.meta.get("decode_load"),
            )
        )
        client.busy = False
        return None if client.retiring else client


def to_record(
    request: SimRequest,
    done: Finished,
    load_bucket: str,
    load: float | None = None,
    decode_load: float | None = None,
) -> RequestRecord:
    """What the tap would have recorded for this request (vLLM per-request summary fields)."""
    spec = request.spec_stats()
    return RequestRecord(
        pool=done.pool,
        task_type=done.task_type,
        temperature_bucket=done.temperature_bucket,
        load_bucket=load_bucket,
        route=done.route,
        started_at=done.started,
        status=200,
        streamed=True,
        temperature=done.temperature,
        output_tokens=done.output_tokens,
        ttft_seconds=done.first_token - done.started,
        decode_seconds=done.ended - done.first_token,
        e2e_seconds=done.ended - done.started,
        spec=spec,
        load=load,
        decode_load=decode_load,
    )
