"""The planner's solver (``rules.planner``): a branch and bound over one problem (a load bucket, or
every class of the fleet now), exact when it ends within its node budget.

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
vertex: every unplaced request on one pool. The bound is the largest of those (one per pool). It
is loose while many classes are unplaced (at a vertex they all find an empty pool), so with dozens
of classes free to move the budget ends before a proof, and the plan says so.

The first incumbent is the best of the plan now, the given ``starts`` (never-speculate), every
class on its best option alone and a plan built heaviest first, each improved by single moves; then
pairs of moves among the ``PAIRED`` heaviest movable classes and kicks (each of the ``KICKED``
heaviest put on another option, the classes sharing its new pool moved off until no cap breaks, the
rest improved), until neither finds more. Then the search proper, heaviest first, on problems of at
most ``SEARCHED`` movable classes: exact when it ends within the budget (it does, in the tests, on
every problem small enough to enumerate). Pure and deterministic: ties go to the lower option index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PAIRED = 12
"""Pairs of moves are tried among this many of the heaviest classes that may move."""
KICKED = 8
"""The heaviest classes that may move each kicked to its other options (iterated local search)."""
SEARCHED = 24
"""The most movable classes the search proper runs on (beyond, its bound proves nothing in budget:
the first plan stands, not proven optimal)."""


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
    loads, weights, penalty = _sums(p, choice)
    for c, o in enumerate(choice):
        j, u, _ = p.options[c][o]
        if u * (p.a[j] + p.b[j] * loads[j]) > p.cap[c]:
            return None
    return sum(w / (p.a[j] + p.b[j] * loads[j]) for j, w in enumerate(weights) if w) - penalty


def _sums(p: Problem, choice: tuple[int, ...] | list[int]) -> tuple[list[float], list[float], float]:
    """Requests in flight and ``W`` per pool of a plan, and its penalties."""
    loads, weights = [0.0] * len(p.a), [0.0] * len(p.a)
    penalty = 0.0
    for c, o in enumerate(choice):
        j, u, pen = p.options[c][o]
        loads[j] += p.n[c]
        weights[j] += p.n[c] / u
        penalty += pen
    return loads, weights, penalty


def _movable(p: Problem) -> list[int]:
    """The classes with more than one option, heaviest first."""
    return sorted((c for c in range(len(p.n)) if len(p.options[c]) > 1), key=lambda c: (-p.n[c], c))


def _improve(p: Problem, choice: list[int], best: float, held: int = -1) -> float:
    """Single moves while one improves (first improvement, in class order), each tried in O(1): only
    the two pools it touches change, and only the one it joins can break a cap."""
    pools = len(p.a)
    loads, weights, _ = _sums(p, choice)
    members: list[set[int]] = [set() for _ in range(pools)]
    for c, o in enumerate(choice):
        members[p.options[c][o][0]].add(c)
    limit = [_limit(p, choice, members[j], j) for j in range(pools)]

    def worth(j: int, w: float, n: float) -> float:
        return w / (p.a[j] + p.b[j] * n) if w else 0.0

    for _ in range(len(choice) + 1):
        moved = False
        for c in range(len(choice)):
            if c == held:  # a kicked class stays where it was kicked
                continue
            n = p.n[c]
            for o in range(len(p.options[c])):
                here, u_here, pen_here = p.options[c][choice[c]]
                j, u, pen = p.options[c][o]
                if o == choice[c] or j == here:
                    continue
                step = p.a[j] + p.b[j] * (loads[j] + n)
                if step > min(limit[j], p.cap[c] / u):
                    continue
                change = (
                    worth(here, weights[here] - n / u_here, loads[here] - n)
                    - worth(here, weights[here], loads[here])
                    + worth(j, weights[j] + n / u, loads[j] + n)
                    - worth(j, weights[j], loads[j])
                    - pen
                    + pen_here
                )
                if change <= 1e-12 * max(1.0, abs(best)):
                    continue
                best, moved = best + change, True
                loads[here] -= n
                weights[here] -= n / u_here
                loads[j] += n
                weights[j] += n / u
                members[here].discard(c)
                members[j].add(c)
                choice[c] = o
                limit[here] = _limit(p, choice, members[here], here)
                limit[j] = min(limit[j], p.cap[c] / u)
        if not moved:
            break
    return best


def _pairs(p: Problem, choice: list[int], best: float) -> float:
    """The best move of two classes at once among the ``PAIRED`` heaviest that may move (a heavy class
    off a pool often pays only with another onto it); ``choice`` takes it. Screened on the pools'
    sums, checked whole."""
    movable = _movable(p)[:PAIRED]
    loads, weights, penalty = _sums(p, choice)
    found, pick = best, None
    for x, c in enumerate(movable):
        for d in movable[x + 1 :]:
            for oc in range(len(p.options[c])):
                for od in range(len(p.options[d])):
                    if oc == choice[c] or od == choice[d]:
                        continue
                    n_, w_ = list(loads), list(weights)
                    pen = penalty
                    for k, o in ((c, oc), (d, od)):
                        j0, u0, p0 = p.options[k][choice[k]]
                        j1, u1, p1 = p.options[k][o]
                        n_[j0] -= p.n[k]
                        w_[j0] -= p.n[k] / u0
                        n_[j1] += p.n[k]
                        w_[j1] += p.n[k] / u1
                        pen += p1 - p0
                    v = sum(w / (p.a[j] + p.b[j] * n_[j]) for j, w in enumerate(w_) if w > 1e-15) - pen
                    if v > found + 1e-9 * max(1.0, abs(found)):
                        trial = list(choice)
                        trial[c], trial[d] = oc, od
                        if value(p, trial) is not None:
                            found, pick = v, trial
    if pick is None:
        return best
    choice[:] = pick
    return value(p, pick) or best


def _kicks(p: Problem, choice: list[int], best: float) -> float:
    """Iterated local search: each of the ``KICKED`` heaviest classes that may move is put on each of
    its other options and held there while the others improve; the best result is kept (a plan that
    needs several classes to move at once, e.g. a heavy one off a pool and two light ones onto it)."""
    movable = _movable(p)
    improved = True
    while improved:
        improved = False
        for c in movable[:KICKED]:
            for o in range(len(p.options[c])):
                if o == choice[c]:
                    continue
                trial = list(choice)
                trial[c] = o
                v = _repair(p, trial, c)
                if v is None:
                    continue
                v = _improve(p, trial, v, held=c)
                v = _improve(p, trial, v)
                if v > best + 1e-9 * max(1.0, abs(best)):
                    choice[:], best, improved = trial, v, True
    return best


def _repair(p: Problem, choice: list[int], kicked: int) -> float | None:
    """The plan's value once the classes sharing the kicked class's pool, heaviest first, have left
    for their best other option until no cap breaks; None when that is not enough."""
    pool = p.options[kicked][choice[kicked]][0]
    loads, _, _ = _sums(p, choice)
    there = [c for c, o in enumerate(choice) if p.options[c][o][0] == pool]
    there.sort(key=lambda c: (-p.n[c], c))

    def broken() -> bool:
        step = p.a[pool] + p.b[pool] * loads[pool]
        return any(step * p.options[c][choice[c]][1] > p.cap[c] for c in there)

    for c in [c for c in there if c != kicked and len(p.options[c]) > 1]:
        if not broken() and value(p, choice) is not None:  # the cheap test first
            break
        away = [o for o, (j, _, _) in enumerate(p.options[c]) if j != pool]
        choice[c] = max(away, key=lambda o, c=c: (_gain(p, c, o, loads), -o))
        loads[pool] -= p.n[c]
        loads[p.options[c][choice[c]][0]] += p.n[c]
        there.remove(c)
    return value(p, choice)


def _alone(p: Problem) -> list[int]:
    """Each class on its best option as if it were alone on the fleet (the per-class rule's plan)."""
    return [
        max(range(len(o)), key=lambda i, c=c: (_gain(p, c, i, [0.0] * len(p.a)), -i))
        for c, o in enumerate(p.options)
    ]


def _built(p: Problem) -> list[int]:
    """Heaviest first, each class where the plan so far gains most with it (caps kept)."""
    choice = [0] * len(p.n)
    loads, weights = [0.0] * len(p.a), [0.0] * len(p.a)
    for c in sorted(range(len(p.n)), key=lambda c: (-p.n[c], c)):
        best, pick = -math.inf, 0
        for o, (j, u, pen) in enumerate(p.options[c]):
            step = p.a[j] + p.b[j] * (loads[j] + p.n[c])
            if step * u > p.cap[c]:
                continue
            gain = (weights[j] + p.n[c] / u) / step - weights[j] / (p.a[j] + p.b[j] * loads[j]) - pen
            if gain > best:
                best, pick = gain, o
        j, u, _ = p.options[c][pick]
        loads[j] += p.n[c]
        weights[j] += p.n[c] / u
        choice[c] = pick
    return choice


def _limit(p: Problem, choice: list[int], members: set[int], j: int) -> float:
    """The highest step time the classes on pool ``j`` allow."""
    return min((p.cap[c] / p.options[c][choice[c]][1] for c in members), default=math.inf)


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
    for other in (stay, *starts, _alone(p), _built(p)):  # each improved by single moves; the best kept
        v = value(p, other)
        if v is not None:
            trial = list(other)
            v = _improve(p, trial, v)
            if v > best + 1e-12 * max(1.0, abs(best)) or trial == incumbent:
                incumbent, best = trial, v
    while True:  # then pairs of moves and kicks, until neither finds more
        before = best
        while (paired := _pairs(p, incumbent, best)) > best:
            best = _improve(p, incumbent, paired)
        best = _kicks(p, incumbent, best)
        if best <= before + 1e-9 * max(1.0, abs(before)):
            break
    order = _movable(p)
    if len(order) > SEARCHED:  # the bound cannot prove a plan this large within any budget here
        return Result(tuple(incumbent), best, False, 0)
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
    # per unplaced class (in branching order) and pool: tokens x step (n / u) and the penalty there
    gain = np.full((len(order), pools), -np.inf)
    fine = np.zeros((len(order), pools))
    for d, c in enumerate(order):
        for j, u, pen in p.options[c]:
            gain[d, j], fine[d, j] = p.n[c] / u, pen
    a, b = np.array(p.a), np.array(p.b)

    def bound(depth: int, penalty: float) -> float:
        best_vertex = -math.inf
        base = a + b * np.array(loads)
        for target in reach[depth]:  # every unplaced request on one pool: a vertex of the loads
            steps = base.copy()
            steps[target] += p.b[target] * rest_n[depth]
            total = float(np.sum(np.array(weights) / steps))
            total += float(np.max(gain[depth:] / steps - fine[depth:], axis=1).sum())
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
