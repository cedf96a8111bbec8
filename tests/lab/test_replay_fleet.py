"""Equal capacity (``lab.fleet``): N engines shared by every pool; allocation, drains and waiting."""

from __future__ import annotations

from specguard.lab import fleet as fleet_mod
from specguard.sim import config as sim_config

SIM = sim_config.load()


def request(f: fleet_mod.Fleet, pool: str, n: int):
    return f.engine_for(pool).new_request(task="chat", temperature=0.7, key=f"{pool}/{n}", ignore_eos=True)


def test_allocation_is_proportional_with_one_engine_per_pool_at_least():
    assert fleet_mod.allocation({"spec-k2": 32, "spec-k4": 16}, 4) == {"spec-k2": 3, "spec-k4": 1}
    assert fleet_mod.allocation({"spec-k2": 30, "nospec": 1, "spec-k4": 1}, 4) == {
        "spec-k2": 2,
        "nospec": 1,
        "spec-k4": 1,
    }
    assert fleet_mod.allocation({"a": 5, "b": 4, "c": 3, "d": 1}, 3) == {"a": 1, "b": 1, "c": 1, "d": 0}
    assert fleet_mod.allocation({}, 4) == {}


def test_requests_spread_over_the_engines_their_pool_is_due():
    f = fleet_mod.Fleet(SIM, ["spec-k4", "nospec"], 2, seed=0)
    slots = [f.place("spec-k4", request(f, "spec-k4", i), 0.0) for i in range(3)]
    assert [s.index for s in slots] == [0, 1, 0]  # the pool is due both engines: least loaded first
    assert [s.load for s in f.slots] == [2, 1]


def test_engines_follow_the_allocation_with_hysteresis():
    f = fleet_mod.Fleet(SIM, ["spec-k4", "spec-k2"], 4, seed=0)
    for i in range(16):
        f.place("spec-k4", request(f, "spec-k4", i), 0.0)
    assert [s.pool for s in f.slots] == ["spec-k4"] * 4
    for i in range(32):  # spec-k2 is due 3 of 4 engines: spec-k4's are drained for it
        f.place("spec-k2", request(f, "spec-k2", i), 1.0)
    assert sum(1 for s in f.slots if s.draining_for == "spec-k2") == 3
    assert len(f.engines_of("spec-k4")) == 1 and len(f.waiting["spec-k2"]) == 32
    moved = [f.release(f.slots[1], 2.0) for _ in range(4)][-1]  # one drained engine empties
    assert f.slots[1].pool == "spec-k2" and len(moved) == 11  # a third of the waiting requests
    # one request more or less moves no engine: spec-k4 (16 -> 17 of 49) keeps its one
    f.place("spec-k4", request(f, "spec-k4", 99), 3.0)
    assert sum(1 for s in f.slots if s.draining_for == "spec-k4") == 0


def test_a_pool_without_an_engine_waits_for_a_drained_one():
    f = fleet_mod.Fleet(SIM, ["spec-k4", "nospec"], 2, seed=0)
    placed = [f.place("spec-k4", request(f, "spec-k4", i), 0.0) for i in range(3)]
    waiting = request(f, "nospec", 0)
    assert f.place("nospec", waiting, 1.0) is None  # both engines are spec-k4's
    assert f.waiting["nospec"] == [waiting]
    drained = [s for s in f.slots if s.draining]
    assert [(s.index, s.draining_for) for s in drained] == [(1, "nospec")]  # the least loaded
    assert f.peek_load("spec-k4") == 3  # a draining engine admits nothing: the other one is joined
    moved = f.release(placed[1], 2.0)  # its last request finishes: the engine goes to nospec
    assert moved == [waiting] and f.slots[1].pool == "nospec" and not f.waiting.get("nospec")
    assert sum(1 for s in f.slots if s.load) <= 2 and f.stats.reconfigurations == 1


def test_never_more_engines_busy_than_the_fleet():
    f = fleet_mod.Fleet(SIM, ["spec-k4", "spec-k2", "nospec"], 3, seed=0)
    pools = ["spec-k4", "spec-k2", "nospec"]
    for i in range(30):
        f.place(pools[i % 3], request(f, pools[i % 3], i), float(i))
        assert sum(1 for s in f.slots if s.load) <= 3
    f.close(30.0)
    assert f.stats.max_busy <= 3 and f.stats.busy_engine_seconds <= 3 * 30.0
