"""What the guard's ``rc_rises_with_load`` relies on, checked on the simulator's own model (the
truth table, every shipped world): a class that loses at one load loses at every higher load up to
where the no-spec engine itself saturates (its knee); past it the no-spec engine slows too, and a
loss can turn back into a gain (the example docs/guard.md gives). RC is not monotone for a class
that pays: padding to graph sizes makes it saw-tooth between them."""

from __future__ import annotations

import pytest

from specguard.lab import worlds
from specguard.sim.truth import relative_cost

WORLDS = worlds.names()


def curves(cfg):
    """(task, temperature, K) -> [(concurrency, RC)] at the truth table's concurrencies."""
    for task, profile in cfg.tasks.items():
        for point in profile.acceptance:
            for pool in cfg.pools:
                k = pool.num_speculative_tokens
                if k:
                    rcs = [
                        (b, relative_cost(cfg, task, point.temperature, k, b)) for b in cfg.truth_concurrency
                    ]
                    yield (task, point.temperature, k), rcs


@pytest.mark.parametrize("name", WORLDS)
def test_a_loss_stays_a_loss_as_load_rises_below_the_nospec_knee(name):
    cfg = worlds.load(name)
    knee = cfg.cost.knee_tokens  # the no-spec engine executes one token per request and step
    checked = 0
    for key, rcs in curves(cfg):
        below = [(b, rc) for b, rc in rcs if b <= knee]
        for i, (b, rc) in enumerate(below):
            if rc > 1.0:
                later = [(b2, round(rc2, 3)) for b2, rc2 in below[i + 1 :] if rc2 <= 1.0]
                assert not later, f"{name} {key}: loses at {b} ({rc:.3f}) but pays at {later}"
                checked += 1
    assert checked, f"{name}: no class loses below the knee, nothing was checked"


def test_past_the_nospec_knee_a_loss_can_turn_back_into_a_gain():
    """The example docs/guard.md gives: early-knee, code at temperature 0 on K=2."""
    cfg = worlds.load("early-knee")
    rc = {b: relative_cost(cfg, "code", 0.0, 2, b) for b in (128, 200)}
    assert cfg.cost.knee_tokens < 128
    assert (round(rc[128], 2), round(rc[200], 2)) == (1.11, 0.88)
