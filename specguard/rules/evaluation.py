"""One evaluation of every class: the pure core of the guard daemon's round.

Kept apart from the daemon so it can run in a worker thread (its cost grows with classes and
alerts, and the event loop that serves traffic must never wait for it) and be tested as a plain
function.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from specguard.rules import guard
from specguard.rules import policy as policy_mod
from specguard.rules.evidence import AlertRecord, ClassKey, Evidence, alerts_by_class


def step_all(
    policy: policy_mod.Policy,
    states: dict[ClassKey, guard.ClassState],
    keys: Iterable[ClassKey],
    evidence: dict[ClassKey, Evidence],
    alerts: Sequence[AlertRecord],
    error: str | None,
    now: float,
    planned: Mapping[tuple[str, str], tuple[str, str]] | None = None,
) -> list[tuple[ClassKey, guard.ClassState, guard.Decision]]:
    """One evaluation of every class (pure: the daemon runs it in a worker thread); ``planned``:
    the fleet plan per class (``guard.decider: planner``, ``planfeed.decide``)."""
    every = sorted(set(keys) | set(evidence))
    alerted = alerts_by_class(alerts, every)
    out = []
    for key in every:
        prior = states.get(key) or guard.initial_state(key, policy)
        found = replace(evidence.get(key, Evidence()), alerts=alerted.get(key, ()), error=error)
        new, decision = guard.step(prior, found, now, policy, (planned or {}).get(key[:2]))
        out.append((key, new, decision))
    return out
