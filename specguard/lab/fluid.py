"""Steady-state throughput of a routing plan on a fleet shape's engines, from the simulator's truth.

The hindsight policies (``lab.hindsight``) search plans with this model and then replay the best
ones through the engine core itself, so the model only proposes: every number a row reports comes
from a replay. It knows what specguard cannot: each class's true acceptance per K and temperature,
its true length and prompt distributions, the step-cost model, and the traffic of every phase.

Per engine with ``m_c`` closed-loop clients of class ``c`` on K: a client's cycle is one step
waiting (it re-joins after the next step started), one prefill step and ``R_c`` verify rounds,
``R_c = (E[L_c] - 1) / A_c(K) + 1/2``; so per step ``sum m_c R_c / S_c`` requests decode and
``sum m_c / S_c`` are prefilled (``S_c = R_c + 2``), with their prompts. The step time is the
simulator's ``CostModel.step_seconds`` averaged over a binomial number of decoding requests (graph
padding and the knee make it non-linear). Class ``c`` gets ``m_c E[L_c] / S_c`` tokens per step.
Co-location is in it (every class on an engine shares its steps), and so is prefill.

Engines are split between pools as the fleet shape (``lab.shapes``) splits them at steady state:
a fluid fleet in proportion to each pool's clients, at least one each (``lab.fleet``); a fixed one
by its replicas; an autoscaled one by what the HPA rule wants for each pool's clients
(``lab.autoscale``), within the budget. The clients spread evenly over a pool's engines.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from specguard import schedules
from specguard.lab import fleet as fleet_mod
from specguard.lab import shapes
from specguard.sim.config import LengthDist, SimConfig

ClassKey = tuple[str, str]  # (task_type, temperature_bucket)
Assignment = str | tuple[tuple[str, float], ...]  # a pool, or (pool, share) pairs summing to 1
Plan = Mapping[ClassKey, Assignment]
EPS = 1e-9


def shares(assignment: Assignment) -> dict[str, float]:
    """``{pool: share}`` of a class's assignment."""
    return {assignment: 1.0} if isinstance(assignment, str) else dict(assignment)


def assignment(split: Mapping[str, float]) -> Assignment:
    """A split as a plan value: one pool's name when it holds the class whole."""
    kept = {p: s for p, s in split.items() if s > EPS}
    if len(kept) == 1:
        return next(iter(kept))
    return tuple(sorted((p, round(s, 6)) for p, s in kept.items()))


@dataclass(frozen=True)
class ClassTraffic:
    """Closed-loop clients of one class in a stretch of traffic, with their temperature mix."""

    key: ClassKey
    clients: float
    temperatures: tuple[tuple[float, float], ...]  # (temperature, weight)


def clipped_mean(dist: LengthDist, points: int = 400) -> float:
    """E[length] as ``LengthDist.draw`` draws it (rounded, clipped log-normal), by quadrature."""
    if dist.sigma <= 0:
        return float(min(dist.maximum, max(dist.minimum, round(dist.median))))
    normal = statistics.NormalDist()
    mu = math.log(dist.median)
    total = 0.0
    for i in range(points):
        z = normal.inv_cdf((i + 0.5) / points)
        total += min(dist.maximum, max(dist.minimum, round(math.exp(mu + dist.sigma * z))))
    return total / points


class Model:
    """The fluid model for one simulator world and fleet size."""

    def __init__(self, sim: SimConfig, fleet: int, shape: shapes.FleetShape | None = None):
        self.sim = sim
        self.fleet = fleet
        self.shape = shape
        self.ks = {p.name: p.num_speculative_tokens for p in sim.pools}
        self.schedules = {p.name: p.k_schedule for p in sim.pools if p.k_schedule is not None}
        self._lengths: dict[str, tuple[float, float]] = {}
        self._cycles = lru_cache(maxsize=4096)(self._cycle)

    def lengths(self, task: str) -> tuple[float, float]:
        """(mean output tokens, mean prompt tokens) of a task type."""
        if task not in self._lengths:
            profile = self.sim.task(task)
            self._lengths[task] = (clipped_mean(profile.output_tokens), clipped_mean(profile.prompt_tokens))
        return self._lengths[task]

    def _cycle(self, task: str, temperatures: tuple[tuple[float, float], ...], k: int) -> tuple[float, float]:
        """(verify rounds R, accept length A) of one request of the class on a K pool."""
        out_len, _ = self.lengths(task)
        profile = self.sim.task(task)
        total = sum(w for _, w in temperatures)
        inv = 0.0
        for t, w in temperatures:
            inv += w / (profile.expected_accept_length(t, k) if k else 1.0)
        inv /= total
        return (out_len - 1.0) * inv + 0.5, 1.0 / inv

    def engine(self, k: int, classes: Sequence[tuple[ClassTraffic, float]]) -> tuple[float, dict]:
        """(step seconds, {class: (tokens per second, tpot seconds)}) of one engine on K.

        ``classes``: (traffic, clients of that class on this engine).
        """
        cost = self.sim.cost
        n = 0.0
        decode = prefill = prompt = 0.0
        rows = []
        for traffic, m in classes:
            if m <= 0:
                continue
            rounds, accept = self._cycles(traffic.key[0], traffic.temperatures, k)
            cycle = rounds + 2.0
            out_len, prompt_len = self.lengths(traffic.key[0])
            n += m
            decode += m * rounds / cycle
            prefill += m / cycle
            prompt += m * prompt_len / cycle
            rows.append((traffic.key, m * out_len / cycle, accept))
        if n <= 0:
            return 0.0, {}
        count = max(1, round(n))
        q = min(1.0, decode / n)
        per_prefill = prompt / prefill if prefill else 0.0
        mean_step = decode_step = weight_decode = 0.0
        for d, p in _binomial(count, q):
            rest = count - d
            seconds = cost.step_seconds(d, k, rest / 2.0, rest / 2.0 * per_prefill) if (d or rest) else 0.0
            mean_step += p * seconds
            if d:
                decode_step += p * d * seconds
                weight_decode += p * d
        decode_step = decode_step / weight_decode if weight_decode else mean_step
        out = {key: (tokens / mean_step, decode_step / accept) for key, tokens, accept in rows}
        return mean_step, out

    def replicas_for(self, loads: Mapping[str, float]) -> dict[str, int]:
        """Engines per pool at steady state for the pools' clients ``loads`` (see the module doc)."""
        shape = self.shape
        if shape is None or shape.kind == shapes.FLUID:
            return fleet_mod.allocation(loads, self.fleet)
        if shape.kind == shapes.FIXED:
            return dict(shape.replicas)
        floor = shape.replicas
        want = {p: max(floor[p], math.ceil(loads.get(p, 0.0) / shape.target_in_flight)) for p in shape.pools}
        while sum(want.values()) > shape.engines and any(want[p] > floor[p] for p in want):
            top = max((p for p in want if want[p] > floor[p]), key=lambda p: (want[p], p))
            want[top] -= 1
        return want

    def layout(
        self, loads: Mapping[str, float], replicas: Mapping[str, int] | None = None
    ) -> dict[str, list[float]]:
        """Clients per engine of every pool with traffic: the pool's clients spread evenly over its
        engines (``replicas``, default ``replicas_for(loads)``)."""
        counts = self.replicas_for(loads) if replicas is None else replicas
        return {pool: [loads[pool] / n] * n for pool, n in counts.items() if n and loads.get(pool, 0.0) > 0}

    def k_for(self, pool: str, clients: float) -> int:
        """The K an engine of ``pool`` runs with ``clients`` on it: a scheduled pool's at that batch."""
        return schedules.k_at_load(self.ks[pool], self.schedules.get(pool), clients)

    def evaluate_k(self, traffic: Sequence[ClassTraffic], k: int, engines: int) -> float:
        """Throughput of every class on one pool of ``engines`` engines that all run K = ``k``."""
        if engines < 1:
            return 0.0
        _, rows = self.engine(k, [(t, t.clients / engines) for t in traffic])
        return engines * sum(tokens for tokens, _ in rows.values())

    def evaluate(
        self,
        traffic: Sequence[ClassTraffic],
        plan: Plan,
        default: str,
        replicas: Mapping[str, int] | None = None,
    ) -> Evaluation:
        """Throughput (tokens/s) and per-class numbers of ``plan`` for ``traffic`` (``replicas``:
        engines per pool, default the shape's steady state). A split class puts its share of
        clients on each of its pools."""
        by_pool: dict[str, list[ClassTraffic]] = {}
        for t in traffic:
            for pool, share in shares(plan.get(t.key, default)).items():
                scaled = t if share >= 1.0 else ClassTraffic(t.key, t.clients * share, t.temperatures)
                by_pool.setdefault(pool, []).append(scaled)
        loads = {pool: sum(t.clients for t in ts) for pool, ts in by_pool.items()}
        per_class: dict[ClassKey, list[float]] = {}
        for pool, engines in self.layout(loads, replicas).items():
            ts = by_pool[pool]
            share = loads[pool]
            m = engines[0]  # every engine of the pool holds the same clients: one stands for all
            _, rows = self.engine(self.k_for(pool, m), [(t, t.clients * m / share) for t in ts])
            for key, (tokens, tpot) in rows.items():
                acc = per_class.setdefault(key, [0.0, 0.0])
                acc[0] += tokens * len(engines)
                acc[1] += tokens * len(engines) * tpot
        classes = {key: (tok, wt / tok if tok else 0.0) for key, (tok, wt) in per_class.items()}
        return Evaluation(sum(tok for tok, _ in classes.values()), classes)

    def best_plan(
        self,
        traffic: Sequence[ClassTraffic],
        pools: Sequence[str],
        default: str,
        starts: Sequence[Plan] = (),
        replicas: Mapping[str, int] | None = None,
        quantum: float | None = None,
    ) -> tuple[dict[ClassKey, Assignment], float]:
        """The plan with the highest modelled throughput: coordinate ascent from several starts
        (``quantum``: a class may also be split over pools in steps of this share)."""
        keys = sorted(t.key for t in traffic)
        candidates = [dict.fromkeys(keys, pool) for pool in pools] + [dict(s) for s in starts]
        best_plan: dict[ClassKey, Assignment] = {}
        best = -1.0
        for start in candidates:
            plan, value = self.climb(
                traffic, {k: start.get(k, default) for k in keys}, pools, default, replicas, quantum
            )
            if value > best + 1e-9:
                best_plan, best = plan, value
        return best_plan, best

    def climb(
        self,
        traffic: Sequence[ClassTraffic],
        plan: dict[ClassKey, Assignment],
        pools: Sequence[str],
        default: str,
        replicas: Mapping[str, int] | None = None,
        quantum: float | None = None,
    ) -> tuple[dict[ClassKey, Assignment], float]:
        """Greedy: move one class at a time to the pool that raises modelled throughput most, or
        (with ``quantum``) a ``quantum`` share of it from one of its pools to another."""
        value = self.evaluate(traffic, plan, default, replicas).throughput
        while True:
            best_move = None
            for key in sorted(plan):
                for target in self.moves(plan[key], pools, quantum):
                    trial = {**plan, key: target}
                    v = self.evaluate(traffic, trial, default, replicas).throughput
                    if v > value * (1 + 1e-6) and (best_move is None or v > best_move[0]):
                        best_move = (v, key, target)
            if best_move is None:
                return plan, value
            value, key, target = best_move
            plan = {**plan, key: target}

    @staticmethod
    def moves(current: Assignment, pools: Sequence[str], quantum: float | None) -> list[Assignment]:
        """Every assignment one step from ``current``: the whole class on another pool, or a
        ``quantum`` share of it moved from one of its pools to another."""
        now = shares(current)
        out: list[Assignment] = [pool for pool in pools if now != {pool: 1.0}]
        if quantum:
            for source, share in sorted(now.items()):
                if share < quantum - EPS:
                    continue
                for pool in pools:
                    if pool != source:
                        moved = dict(now)
                        moved[source] -= quantum
                        moved[pool] = moved.get(pool, 0.0) + quantum
                        step = assignment(moved)
                        if step not in out and step != current:
                            out.append(step)
        return out


@dataclass(frozen=True)
class Evaluation:
    throughput: float  # output tokens per second
    classes: Mapping[ClassKey, tuple[float, float]]  # class -> (tokens/s, mean TPOT seconds)


def _binomial(n: int, q: float) -> list[tuple[int, float]]:
    """(d, P(d)) for Binomial(n, q), dropping negligible tails."""
    if q <= 0:
        return [(0, 1.0)]
    if q >= 1:
        return [(n, 1.0)]
    out = []
    log_q, log_r = math.log(q), math.log(1 - q)
    for d in range(n + 1):
        logp = math.lgamma(n + 1) - math.lgamma(d + 1) - math.lgamma(n - d + 1) + d * log_q + (n - d) * log_r
        p = math.exp(logp)
        if p > 1e-6:
            out.append((d, p))
    total = sum(p for _, p in out)
    return [(d, p / total) for d, p in out]
