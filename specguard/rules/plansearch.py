"""The planner's solver (``rules.planner``): an exact branch and bound over one load bucket.

The problem, as numbers: classes ``c`` with requests in flight ``n_c``, each with options
``(pool j, unit u, penalty)``, the first its pool now (penalty 0); on pool ``j`` a class's TPOT is
``u x T_j`` with ``T_j = a_j + b_j x N_j`` (``N_j``: requests in flight on the pool, ``b_j`` per
request of the pool, the replicas divided in). The plan maximises
``sum_j W_j / T_j - sum penalties`` with ``W_j = sum(n_c / u_c on j)``, every class's TPOT at most
its ``cap``. Load only grows as classes are placed, so a pool past a cap prunes at once.

The bound at a node: with the final loads ``N`` fixed, every unplaced class would take its best
option, so the plan is worth at most ``F(N) = sum_j W_j / T_j(N_j) + sum_unplaced max_j n / (u
T_j(N_j))``. ``F`` is convex in ``N`` (sums and maxima of ``1 / (a + bN)``), so over the loads still
possible (each pool at least its load so far, the unplaced requests somewhere) it is largest at a
vertex: every unplaced request on one pool. The bound is the largest of those (one per pool).
Classes are branched heaviest first; the first incumbent is the plan now improved by single moves.
Pure and deterministic: ties go to the lower option index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    n: tuple[float, ...]
    options: tuple[tuple[tuple[int, float, float], ...], ...]  # (pool, unit, penalty); first: stay
    cap: tuple[float, ...]
    a: tuple[float, ...]
    b: tuple[float, ...]


@dataclass(frozen=True)
class Result:
    choice: tuple[int, ...]  # option index per class
    value: float
    exact: bool
    nodes: int


def value(p: Problem, choice: tuple[int, ...] | list[int]) -> float | None:
    """The objective of a full plan, or None when it breaks a cap."""
    loads = [0.0] * len(p.a)
    weights = [0.0] * len(p.a)
    penalty = 0.0
    for c, o in enumerate(choice):
        j, u, pen = p.options[c][o]
        loads[j] += p.n[c]
        weights[j] += p.n[c] / u
        penalty += pen
    for c, o in enumerate(choice):
        j, u, _ = p.options[c][o]
        if u * (p.a[j] + p.b[j] * loads[j]) > p.cap[c]:
            return None
    return sum(w / (p.a[j] + p.b[j] * loads[j]) for j, w in enumerate(weights) if w) - penalty


def _improve(p: Problem, choice: list[int], best: float) -> float:
    """Single moves while one improves (first improvement, in class order)."""
    for _ in range(len(choice) + 1):
        moved = False
        for c in range(len(choice)):
            for o in range(len(p.options[c])):
                if o == choice[c]:
                    continue
                old = choice[c]
                choice[c] = o
                v = value(p, choice)
                if v is not None and v > best + 1e-12 * max(1.0, abs(best)):
                    best, moved = v, True
                else:
                    choice[c] = old
        if not moved:
            break
    return best


def _gain(p: Problem, c: int, o: int, loads: list[float]) -> float:
    """What class ``c`` yields on option ``o`` at the loads so far, less its penalty."""
    j, u, pen = p.options[c][o]
    return p.n[c] / (u * (p.a[j] + p.b[j] * (loads[j] + p.n[c]))) - pen


def solve(p: Problem, budget: int, starts: tuple[list[int], ...] = ()) -> Result:
    """The best plan, exact unless ``budget`` nodes were not enough (``Result.exact``); ``starts``:
    plans the result is never worse than, whatever the budget (e.g. never-speculate)."""
    count = len(p.n)
    stay = [0] * count
    start = value(p, stay)
    if start is None:
        raise ValueError("the plan now breaks the caps it sets")
    incumbent, best = list(stay), start
    for other in starts:
        v = value(p, other)
        if v is not None and v > best:
            incumbent, best = list(other), v
    best = _improve(p, incumbent, best)
    order = sorted((c for c in range(count) if len(p.options[c]) > 1), key=lambda c: (-p.n[c], c))
    pools = len(p.a)
    loads, weights = [0.0] * pools, [0.0] * pools
    limit = [math.inf] * pools  # highest step time the classes on the pool allow
    for c in range(count):
        if len(p.options[c]) == 1:
            j, u, _ = p.options[c][0]
            loads[j] += p.n[c]
            weights[j] += p.n[c] / u
            limit[j] = min(limit[j], p.cap[c] / u)
    rest_n = [0.0] * (len(order) + 1)
    reach: list[set[int]] = [set() for _ in range(len(order) + 1)]
    for d in range(len(order) - 1, -1, -1):
        c = order[d]
        rest_n[d] = rest_n[d + 1] + p.n[c]
        reach[d] = reach[d + 1] | {j for j, _, _ in p.options[c]}
    choice = list(stay)
    nodes = 0
    exhausted = False

    def bound(depth: int, penalty: float) -> float:
        best_vertex = -math.inf
        for target in reach[depth]:  # every unplaced request on one pool: a vertex of the loads
            extra = [rest_n[depth] if j == target else 0.0 for j in range(pools)]
            steps = [p.a[j] + p.b[j] * (loads[j] + extra[j]) for j in range(pools)]
            total = sum(w / t for w, t in zip(weights, steps, strict=True) if w)
            for c in order[depth:]:
                total += max(p.n[c] / (u * steps[j]) - pen for j, u, pen in p.options[c])
            best_vertex = max(best_vertex, total)
        return best_vertex - penalty

    def visit(depth: int, penalty: float) -> None:
        nonlocal best, nodes, exhausted, incumbent
        nodes += 1
        if nodes > budget:
            exhausted = True
            return
        if depth == len(order):
            total = sum(w / (p.a[j] + p.b[j] * loads[j]) for j, w in enumerate(weights) if w) - penalty
            if total > best + 1e-12 * max(1.0, abs(best)):
                best, incumbent = total, list(choice)
            return
        if bound(depth, penalty) <= best + 1e-12 * max(1.0, abs(best)):
            return
        c = order[depth]
        n = p.n[c]
        for o in sorted(range(len(p.options[c])), key=lambda o: (-_gain(p, c, o, loads), o)):
            j, u, pen = p.options[c][o]
            loads[j] += n
            if p.a[j] + p.b[j] * loads[j] <= min(limit[j], p.cap[c] / u):
                saved = limit[j]
                limit[j] = min(limit[j], p.cap[c] / u)
                weights[j] += n / u
                choice[c] = o
                visit(depth + 1, penalty + pen)
                weights[j] -= n / u
                limit[j] = saved
                choice[c] = 0
            loads[j] -= n
            if exhausted:
                return

    visit(0, 0.0)
    return Result(tuple(incumbent), best, not exhausted, nodes)
