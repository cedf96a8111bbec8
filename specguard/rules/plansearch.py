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

The local search prices moves on the options laid flat (``_Flat``: NumPy arrays), a whole pass of
single moves or every pair at once, with the same operations in the same order as one move at a
time, and sums a plan in class order: the plans and values are those of pricing each move alone.
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


@dataclass(frozen=True)
class _Flat:
    """Every class's options laid flat in the order single moves are tried (class, then option), so
    that pricing a plan or a pass of single moves is a few array operations, not a loop."""

    offsets: np.ndarray  # per class and one past the last: the flat index of its first option
    cls: np.ndarray  # per option: its class
    pool: np.ndarray
    u: np.ndarray
    share: np.ndarray  # n / u: its part of the pool's W
    room: np.ndarray  # cap / u: the highest step time its class allows there
    pen: np.ndarray
    n: np.ndarray  # its class's requests in flight
    pool_a: np.ndarray  # its pool's a and b
    pool_b: np.ndarray
    cap: np.ndarray  # per class
    a: np.ndarray  # per pool
    b: np.ndarray


def _flat(p: Problem) -> _Flat:
    """The problem's options laid flat (see ``_Flat``)."""
    cls = np.repeat(np.arange(len(p.n), dtype=np.intp), [len(o) for o in p.options])
    rows = np.array([o for options in p.options for o in options], dtype=float).reshape(-1, 3)
    pool, u, pen = rows[:, 0].astype(np.intp), rows[:, 1], rows[:, 2]
    n, cap, a, b = (np.array(x, dtype=float) for x in (p.n, p.cap, p.a, p.b))
    offsets = np.concatenate(([0], np.cumsum([len(o) for o in p.options], dtype=np.intp)))
    return _Flat(offsets, cls, pool, u, n[cls] / u, cap[cls] / u, pen, n[cls], a[pool], b[pool], cap, a, b)


def value(p: Problem, choice: tuple[int, ...] | list[int]) -> float | None:
    """The objective of a full plan, or None when it breaks a cap."""
    return _value(p, _flat(p), choice)


def _value(p: Problem, f: _Flat, choice: tuple[int, ...] | list[int]) -> float | None:
    """``value`` with the problem laid flat once for the many plans a search prices."""
    chosen = _chosen(f, choice)
    loads, weights, penalty = _sums(f, chosen)
    if _over(f, chosen, loads).any():
        return None
    loads_, weights_ = loads.tolist(), weights.tolist()  # Python floats: ``sum`` adds them as it did
    return sum(w / (p.a[j] + p.b[j] * loads_[j]) for j, w in enumerate(weights_) if w) - penalty


def _over(f: _Flat, chosen: np.ndarray, loads: np.ndarray) -> np.ndarray:
    """Per class: whether its TPOT at these loads breaks its cap."""
    pool = f.pool[chosen]
    return f.u[chosen] * (f.a[pool] + f.b[pool] * loads[pool]) > f.cap


def _chosen(f: _Flat, choice: tuple[int, ...] | list[int]) -> np.ndarray:
    """The flat index of each class's option in a plan."""
    return f.offsets[:-1] + np.asarray(choice, dtype=np.intp)


def _sums(f: _Flat, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Requests in flight and ``W`` per pool of a plan, and its penalties: each added up in class
    order (``bincount`` and ``cumsum`` add in order), so the same plan always sums the same."""
    pool = f.pool[chosen]
    loads = np.bincount(pool, weights=f.n[chosen], minlength=len(f.a)).astype(float, copy=False)
    weights = np.bincount(pool, weights=f.share[chosen], minlength=len(f.a)).astype(float, copy=False)
    penalty = float(np.cumsum(f.pen[chosen])[-1]) if len(chosen) else 0.0
    return loads, weights, penalty


def _movable(p: Problem) -> list[int]:
    """The classes with more than one option, heaviest first."""
    return sorted((c for c in range(len(p.n)) if len(p.options[c]) > 1), key=lambda c: (-p.n[c], c))


def _worth(w: np.ndarray, step: np.ndarray) -> np.ndarray:
    """``W / T``, 0 where ``W`` is: a pool nobody is on is worth nothing, whatever its step."""
    return w / np.where(w != 0, step, 1.0)


def _changes(
    f: _Flat, at: np.ndarray, loads: np.ndarray, weights: np.ndarray, limit: np.ndarray
) -> np.ndarray:
    """What each single move adds to the plan (``at``: per option, the flat index of its class's
    option now), -inf where it is no move or breaks a cap: only the two pools it touches change, and
    only the one it joins can break a cap."""
    here, there = f.pool[at], f.pool
    step = f.pool_a + f.pool_b * (loads[there] + f.n)
    now = _worth(weights, f.a + f.b * loads)
    left = _worth(weights[here] - f.share[at], f.pool_a[at] + f.pool_b[at] * (loads[here] - f.n))
    change = left - now[here] + _worth(weights[there] + f.share, step) - now[there] - f.pen + f.pen[at]
    change[(there == here) | (step > limit[there]) | (step > f.room)] = -np.inf
    return change


def _limits(f: _Flat, chosen: np.ndarray) -> np.ndarray:
    """The highest step time the classes on each pool allow."""
    limit = np.full(len(f.a), np.inf)
    np.minimum.at(limit, f.pool[chosen], f.room[chosen])
    return limit


def _improve(p: Problem, f: _Flat, choice: list[int], best: float, held: int = -1) -> float:
    """Single moves while one improves (first improvement, in class order): all of a pass's moves
    are priced at once, the first that pays is made and the rest of the pass priced again; a new
    pass starts on the prices the last one ended on, as nothing has moved since."""
    chosen = _chosen(f, choice)
    loads, weights, _ = _sums(f, chosen)
    limit = _limits(f, chosen)
    at = chosen[f.cls]
    frozen = slice(f.offsets[held], f.offsets[held + 1]) if held >= 0 else slice(0)  # held: kicked there
    change = None
    for _ in range(len(choice) + 1):
        start, moved = 0, False
        while True:
            if change is None:
                change = _changes(f, at, loads, weights, limit)
                change[frozen] = -np.inf
            pays = (change[start:] > 1e-12 * max(1.0, abs(best))).nonzero()[0]
            if not pays.size:
                break
            k = start + int(pays[0])
            c, here, j = int(f.cls[k]), int(f.pool[at[k]]), int(f.pool[k])
            best, moved, start = best + float(change[k]), True, k + 1
            loads[here] -= f.n[k]
            weights[here] -= f.share[at[k]]
            loads[j] += f.n[k]
            weights[j] += f.share[k]
            choice[c], chosen[c] = k - int(f.offsets[c]), k
            at[f.offsets[c] : f.offsets[c + 1]] = k
            limit, change = _limits(f, chosen), None
        if not moved:
            break
    return best


def _pairs(p: Problem, f: _Flat, choice: list[int], best: float) -> float:
    """The best move of two classes at once among the ``PAIRED`` heaviest that may move (a heavy class
    off a pool often pays only with another onto it); ``choice`` takes it. Screened on the pools'
    sums, checked whole; the screen runs on every pair at once, the pairs it passes in order."""
    chosen = _chosen(f, choice)
    sums = _sums(f, chosen)
    loads, weights, penalty = sums[0].tolist(), sums[1].tolist(), sums[2]
    found, pick = best, None
    for c, oc, d, od in _screened(p, f, chosen, sums, best):
        n_, w_, pen = _moved(p, c, choice[c], oc, loads, weights, penalty)
        n_, w_, pen = _moved(p, d, choice[d], od, n_, w_, pen)
        v = sum(w / (p.a[j] + p.b[j] * n_[j]) for j, w in enumerate(w_) if w > 1e-15) - pen
        if v > found + 1e-9 * max(1.0, abs(found)):
            trial = list(choice)
            trial[c], trial[d] = oc, od
            if _value(p, f, trial) is not None:
                found, pick = v, trial
    if pick is None:
        return best
    choice[:] = pick
    return _value(p, f, pick) or best


def _screened(
    p: Problem, f: _Flat, chosen: np.ndarray, sums: tuple[np.ndarray, np.ndarray, float], best: float
) -> list[tuple[int, int, int, int]]:
    """The pairs of moves ``(c, option, d, option)`` that may beat ``best``, in ``_pairs``'s order:
    every pair priced at once as ``_pairs`` prices one, kept within a margin of beating it, as the
    pools' terms are added here in another way than Python's ``sum`` may add them."""
    c, oc, d, od = _pair_moves(p, f, chosen)
    rows = np.arange(len(c))
    loads, weights = np.tile(sums[0], (len(c), 1)), np.tile(sums[1], (len(c), 1))
    penalty = np.full(len(c), sums[2])
    for old, new in ((chosen[c], f.offsets[c] + oc), (chosen[d], f.offsets[d] + od)):
        loads[rows, f.pool[old]] -= f.n[old]
        weights[rows, f.pool[old]] -= f.share[old]
        loads[rows, f.pool[new]] += f.n[new]
        weights[rows, f.pool[new]] += f.share[new]
        penalty += f.pen[new] - f.pen[old]
    terms = np.divide(weights, f.a + f.b * loads, out=np.zeros_like(weights), where=weights > 1e-15)
    v = terms.sum(axis=1) - penalty
    margin = 1e-12 * (np.abs(terms).sum(axis=1) + np.abs(penalty) + 1.0)
    keep = np.flatnonzero(v + margin > best + 1e-9 * max(1.0, abs(best)))
    return list(zip(c[keep].tolist(), oc[keep].tolist(), d[keep].tolist(), od[keep].tolist(), strict=True))


def _pair_moves(p: Problem, f: _Flat, chosen: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every pair of moves ``_pairs`` tries, as classes and options ``(c, oc, d, od)``, in its order:
    each of the ``PAIRED`` heaviest classes that may move with each lighter one, then their options,
    both off the option they are on."""
    movable = np.array(_movable(p)[:PAIRED], dtype=np.intp)
    width = f.offsets[movable + 1] - f.offsets[movable]
    most = int(width.max(initial=0))
    x, y, oc, od = (i.ravel() for i in np.indices((len(movable), len(movable), most, most)))
    c, d = movable[x], movable[y]
    tried = (x < y) & (oc < width[x]) & (od < width[y])
    tried &= (f.offsets[c] + oc != chosen[c]) & (f.offsets[d] + od != chosen[d])
    return c[tried], oc[tried], d[tried], od[tried]


def _moved(
    p: Problem, c: int, old: int, new: int, loads: list[float], weights: list[float], penalty: float
) -> tuple[list[float], list[float], float]:
    """The pools' sums and the penalties once class ``c`` has moved from option ``old`` to ``new``."""
    j0, u0, p0 = p.options[c][old]
    j1, u1, p1 = p.options[c][new]
    loads, weights = list(loads), list(weights)
    loads[j0] -= p.n[c]
    weights[j0] -= p.n[c] / u0
    loads[j1] += p.n[c]
    weights[j1] += p.n[c] / u1
    return loads, weights, penalty + (p1 - p0)


_Kicked = dict[tuple[tuple[int, ...], int], tuple[float | None, list[int]]]
"""Kicks already run in a search: (the plan kicked, the class kicked) -> the value and plan it led to."""


def _kicks(p: Problem, f: _Flat, choice: list[int], best: float, tried: _Kicked) -> float:
    """Iterated local search: each of the ``KICKED`` heaviest classes that may move is put on each of
    its other options and held there while the others improve; the best result is kept (a plan that
    needs several classes to move at once, e.g. a heavy one off a pool and two light ones onto it).
    A kick is a function of the plan it starts from, so ``tried`` keeps each: a round after a find
    repeats every kick past it, and the search's last call every kick of the round before."""
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
                key = (tuple(trial), c)
                if key not in tried:
                    tried[key] = _kick(p, f, trial, c)
                v, trial = tried[key]
                if v is not None and v > best + 1e-9 * max(1.0, abs(best)):
                    choice[:], best, improved = trial, v, True
    return best


def _kick(p: Problem, f: _Flat, trial: list[int], kicked: int) -> tuple[float | None, list[int]]:
    """One kick: the plan repaired around the kicked class, then improved with it held, then free."""
    v = _repair(p, f, trial, kicked)
    if v is not None:
        v = _improve(p, f, trial, v, held=kicked)
        v = _improve(p, f, trial, v)
    return v, trial


def _repair(p: Problem, f: _Flat, choice: list[int], kicked: int) -> float | None:
    """The plan's value once the classes sharing the kicked class's pool, heaviest first, have left
    for their best other option until no cap breaks; None when that is not enough.

    Once the kicked pool holds, a cap broken on another pool stays broken: the classes leaving the
    kicked pool only add load and members there (requests in flight and ``b`` are never negative)."""
    pool = p.options[kicked][choice[kicked]][0]
    chosen = _chosen(f, choice)
    loads = _sums(f, chosen)[0].tolist()
    there = np.flatnonzero(f.pool[chosen] == pool).tolist()
    there.sort(key=lambda c: (-p.n[c], c))

    def broken() -> bool:
        step = p.a[pool] + p.b[pool] * loads[pool]
        return any(step * p.options[c][choice[c]][1] > p.cap[c] for c in there)

    for c in [c for c in there if c != kicked and len(p.options[c]) > 1]:
        if not broken():
            v = _value(p, f, choice)
            if v is not None or _broken_elsewhere(f, choice, pool):
                return v
        away = [o for o, (j, _, _) in enumerate(p.options[c]) if j != pool]
        choice[c] = max(away, key=lambda o, c=c: (_gain(p, c, o, loads), -o))
        loads[pool] -= p.n[c]
        loads[p.options[c][choice[c]][0]] += p.n[c]
        there.remove(c)
    return _value(p, f, choice)


def _broken_elsewhere(f: _Flat, choice: list[int], pool: int) -> bool:
    """Whether a plan breaks a cap on a pool other than ``pool`` (at the loads ``value`` sums)."""
    chosen = _chosen(f, choice)
    over = _over(f, chosen, _sums(f, chosen)[0])
    return bool((f.pool[chosen][over] != pool).any())


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


def _gain(p: Problem, c: int, o: int, loads: list[float]) -> float:
    """What class ``c`` yields on option ``o`` at the loads so far, less its penalty."""
    j, u, pen = p.options[c][o]
    return p.n[c] / (u * (p.a[j] + p.b[j] * (loads[j] + p.n[c]))) - pen


def solve(p: Problem, budget: int, starts: tuple[list[int], ...] = ()) -> Result:
    """The best plan, exact unless ``budget`` nodes were not enough (``Result.exact``); ``starts``:
    plans the result is never worse than, whatever the budget (e.g. never-speculate)."""
    count = len(p.n)
    stay = [0] * count
    flat = _flat(p)
    start = _value(p, flat, stay)
    if start is None:
        raise ValueError("the plan now breaks the caps it sets")
    incumbent, best = list(stay), start
    for other in (stay, *starts, _alone(p), _built(p)):  # each improved by single moves; the best kept
        v = _value(p, flat, other)
        if v is not None:
            trial = list(other)
            v = _improve(p, flat, trial, v)
            if v > best + 1e-12 * max(1.0, abs(best)) or trial == incumbent:
                incumbent, best = trial, v
    tried: _Kicked = {}
    while True:  # then pairs of moves and kicks, until neither finds more
        before = best
        while (paired := _pairs(p, flat, incumbent, best)) > best:
            best = _improve(p, flat, incumbent, paired)
        best = _kicks(p, flat, incumbent, best, tried)
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
