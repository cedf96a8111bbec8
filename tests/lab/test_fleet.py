"""Equal capacity (``lab.fleet``): N engines shared by every pool; packing, drains and waiting."""

from __future__ import annotations

from specguard.lab import fleet as fleet_mod
from specguard.sim import config as sim_config

SIM = sim_config.load()


def request(f: fleet_mod.Fleet, pool: str, n: int):
    return f.engine_for(pool).new_request(task="chat", temperature=0.7, key=f"{pool}/{n}", ignore_eos=True)


def test_requests_are_packed_to_the_fleet_wide_cap():
    f = fleet_mod.Fleet(SIM, ["spec-k4", "nospec"], 2, seed=0)
    slots = [f.place("spec-k4", request(f, "spec-k4", i), 0.0) for i in range(3)]
    assert [s.index for s in slots] == [0, 1, 0]  # cap 1, 1, then 2 per engine
    assert [s.load for s in f.slots] == [2, 1]


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
