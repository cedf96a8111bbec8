"""Replay a scenario in virtual time through the simulator's engine core, under one routing policy.

No HTTP and no clock: a fleet of N engines (``lab.fleet``; the same N for every policy, whichever
pools it uses), each a ``sim.engine.EngineCore`` of the pool it serves, whose steps take their model
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
from specguard.lab import fleet as fleet_mod
from specguard.lab import shapes
from specguard.lab.scenario import ClassLoad, Scenario
from specguard.sim.config import SimConfig
from specguard.sim.engine import SimRequest, StepOutcome

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
        key: str = "",
    ) -> tuple[str, str]:
        """(pool, route) for one request; route is "plan", "holdout" or "probe".

        ``load_of(pool)``: in-flight requests per replica of the pool if the request joined it;
        ``key``: the request's identity (its client and how many it sent before), the same under
        every policy and acceptance draw."""

    def observe(self, record: RequestRecord) -> None: ...

    def tick(self, now: float) -> list[dict]:
        """Re-plan at virtual time ``now``; returns the decisions that changed the plan (JSON)."""

    def on_phase(self, index: int, now: float) -> None: ...

    @property
    def tick_seconds(self) -> float | None: ...

    # optional: ``desired_replicas_at(now) -> dict[str, int] | None``, the replicas per pool an
    # autoscaled fleet's HPA scales on at that sync (None: on requests in flight)


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
    engines: int = 0  # the fleet every policy gets (lab.fleet)
    busy_engine_seconds: float = 0.0  # engine-seconds with at least one request
    engine_seconds: float = 0.0  # engine-seconds allocated (an autoscaled fleet's vary)
    fleet_stats: object = None

    @property
    def mean_engines_busy(self) -> float:
        return self.busy_engine_seconds / self.scenario.duration_s if self.scenario.duration_s else 0.0

    @property
    def mean_engines(self) -> float:
        return self.engine_seconds / self.scenario.duration_s if self.scenario.duration_s else 0.0


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
        engine_seed: int | None = None,
        replicas: Mapping[str, int] | None = None,
        fixed: bool = False,
        shape: shapes.FleetShape | None = None,
    ):
        self.sim = sim
        self.scenario = scenario
        self.policy = policy
        self.buckets = buckets
        self.seed = seed
        names = list(pools) if pools is not None else [p.name for p in sim.pools]
        # Capacity model (lab.fleet): every policy gets the same ``fleet`` engines, whichever pools it
        # uses; an engine runs one pool at a time and an empty one can be given to any pool.
        # ``engine_seed`` (default: ``seed``) draws acceptance; the traffic depends on ``seed`` only.
        # With ``fixed``, each pool has exactly ``replicas[pool]`` engines instead, never moved (a
        # Deployment of fixed replicas behind a Service; ``fleet`` is then their sum). ``shape``
        # (lab.shapes) instead: fixed, autoscaled or fluid, for the pools it names.
        if shape is not None and pools is None:
            names = list(shape.pools)
        self.fleet = fleet_mod.Fleet(
            sim,
            names,
            fleet,
            seed=seed if engine_seed is None else engine_seed,
            fixed=(replicas or {}) if fixed else None,
            shape=shape,
        )
        # each engine's load integral over virtual time (a request's mean load while it decodes,
        # for the model baseline's step-cost fit)
        self._meter = LoadMeter(range(self.fleet.size))
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self._clients: dict[str, list[_Client]] = defaultdict(list)
        self._meta: dict[int, tuple[_Client, str, str, float]] = {}
        self._slot_of: dict[int, fleet_mod.Slot] = {}
        self.now = 0.0
        self.phase = 0
        self.result = ReplayResult(policy.name, scenario)

    def mean_loads(self) -> dict[str, list[float]]:
        """Each engine's in-flight requests averaged over the run so far (virtual time), per pool
        it serves now (a fixed fleet's engines never change pools)."""
        now = max(self.now, 1e-9)
        out: dict[str, list[float]] = {}
        for slot in self.fleet.slots:
            if slot.pool is not None:
                out.setdefault(slot.pool, []).append(self._meter.area(slot.index, self.now) / now)
        return out

    # ---- events ---------------------------------------------------------------------------------
    def _push(self, at: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, payload))

    def run(self) -> ReplayResult:
        end = self.scenario.duration_s
        tick = self.policy.tick_seconds
        if tick:  # an evaluation before the first request, as the daemon's at start (the warm start)
            self._push(0.0, "tick")
        for index, (start, _, _) in enumerate(self.scenario.boundaries()):
            self._push(start, "phase", index)
        if tick:
            t = tick
            while t < end:
                self._push(t, "tick")
                t += tick
        if self.fleet.autoscaled:
            assert self.fleet.shape is not None
            sync = self.fleet.shape.sync_s
            t = sync
            while t < end:
                self._push(t, "autoscale")
                t += sync
        while self._events:
            at, _, kind, payload = heapq.heappop(self._events)
            if at >= end:
                break
            self.now = at
            if kind == "step":
                self._step_done(payload)  # type: ignore[arg-type]
            elif kind == "phase":
                self._enter_phase(payload)  # type: ignore[arg-type]
            elif kind == "autoscale":  # on the guard's desired replicas when it sizes the pools
                sizes = getattr(self.policy, "desired_replicas_at", None)
                for ready in self.fleet.autoscale(at, sizes(at) if sizes is not None else None):
                    self._push(ready, "ready")
                self._replicas_changed()
            elif kind == "ready":
                self.fleet.activate(at)
                self._replicas_changed()
            elif kind == "tick":
                changes = self.policy.tick(at)
                for decision in changes:
                    decision.setdefault("phase", self.scenario.phases[self.phase].name)
                self.result.decisions.extend(changes)
        self.fleet.close(end)
        self.result.engines = self.fleet.size
        self.result.busy_engine_seconds = self.fleet.stats.busy_engine_seconds
        self.result.engine_seconds = self.fleet.stats.engine_seconds
        self.result.fleet_stats = self.fleet.stats
        return self.result

    def _replicas_changed(self) -> None:
        """Tell a policy that follows replica counts (as the fleet's guard counts the engines up)."""
        hook = getattr(self.policy, "on_replicas", None)
        if hook is not None:
            hook(self.fleet.replicas())

    def _enter_phase(self, index: int) -> None:
        self.phase = index
        self.policy.on_phase(index, self.now)
        phase = self.scenario.phases[index]
        wanted: dict[str, list[ClassLoad]] = {}
        for load in phase.loads:  # a task type may come with several loads (temperature mixes)
            wanted.setdefault(load.task_type, []).extend([load] * load.clients)
        for task in sorted(set(self._clients) | set(wanted)):  # sorted: same order, same run
            loads = wanted.get(task, [])  # one entry per client, in the phase's order
            target = len(loads)
            clients = self._clients[task]
            active = [c for c in clients if not c.retiring]
            for client in active[target:]:
                client.retiring = True
            for client, load in zip(active, loads, strict=False):
                client.load = load
            assigned = min(target, len(active))
            # bring retiring clients back first, then new ones
            for client in clients:
                if assigned >= target:
                    break
                if client.retiring:
                    client.retiring, client.load = False, loads[assigned]
                    assigned += 1
                    if not client.busy:
                        self._send(client)
            while assigned < target:
                client = _Client(task, len(clients))
                client.load = loads[assigned]
                clients.append(client)
                self._send(client)
                assigned += 1

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
            return self.buckets.load_bucket(self.fleet.peek_load(pool))

        def load_of(pool: str) -> float:
            # as the tap's router: the load of the replica it joins (the pool's engines now)
            return float(self.fleet.peek_load(pool))

        key = f"{client.task}/{client.index}/{client.sent}"
        pool, route = self.policy.choose(client.task, tbucket, load_bucket_of, load_of, key)
        template = self.fleet.engine_for(pool)
        request = template.new_request(
            task=client.task,
            temperature=temperature,
            prompt_tokens=prompt,
            max_tokens=length,
            key=key,
            ignore_eos=True,  # the length drawn above, identical under every policy
        )
        request.times["arrival"] = self.now
        self._meta[id(request)] = (client, pool, route, temperature)
        client.busy = True
        slot = self.fleet.place(pool, request, self.now)
        if slot is not None:
            self._placed(slot, request)
            if not slot.busy:
                self._start_step(slot)

    def _placed(self, slot: fleet_mod.Slot, request: SimRequest) -> None:
        self._slot_of[id(request)] = slot
        self._meter.change(slot.index, 1, self.now)
        request.meta["load"] = float(slot.load)
        request.meta["load_bucket"] = self.buckets.load_bucket(slot.load)

    def _start_step(self, slot: fleet_mod.Slot) -> None:
        if slot.engine is None:  # scaled down: it left when its last request finished
            slot.busy = False
            return
        outcome = slot.engine.step()
        if outcome is None:
            slot.busy = False
            return
        slot.busy = True
        self._push(self.now + outcome.duration, "step", (slot, outcome))

    def _step_done(self, payload: tuple[fleet_mod.Slot, StepOutcome]) -> None:
        slot, outcome = payload
        again: list[_Client] = []
        for emission in outcome.emissions:
            request = emission.request
            self.result.tokens[(self.phase, request.task)] += emission.new_tokens
            if emission.prefill:
                request.times["first_token"] = self.now
                request.meta["first_area"] = self._meter.area(slot.index, self.now)
            if emission.finished:
                client = self._finish(request)
                if client is not None:
                    again.append(client)
        self._start_step(slot)
        for client in again:
            self._send(client)

    def _finish(self, request: SimRequest) -> _Client | None:
        client, pool, route, temperature = self._meta.pop(id(request))
        slot = self._slot_of.pop(id(request))
        area = self._meter.area(slot.index, self.now)
        self._meter.change(slot.index, -1, self.now)
        for moved in self.fleet.release(slot, self.now):
            self._placed(slot, moved)
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
        prompt_tokens=request.prompt_tokens,
    )
