"""Properties of the state machine over arbitrary evidence sequences: it never flaps faster than
its limits allow, whatever the numbers do."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specguard.rules import guard
from specguard.rules.evidence import Evidence, PoolEvidence
from tests.propkit import examples
from tests.rules.test_guard import KEY, POLICY

RC = st.one_of(st.none(), st.floats(min_value=0.3, max_value=2.0))
STEP = st.tuples(
    RC,  # rc on spec-k4 (None: no data)
    RC,  # rc on spec-k2, predicted
    st.integers(min_value=0, max_value=60),  # samples
    st.booleans(),  # source error
    st.floats(min_value=0.0, max_value=0.3),  # half-width of the intervals (relative)
)


def evidence(k4, k2, samples, error, width=0.0):
    pools = {}

    def values(rc):
        return {"rc": rc, "rc_lower": rc * (1 - width), "rc_upper": rc * (1 + width)}

    if k4 is not None:
        pools["spec-k4"] = PoolEvidence("spec-k4", values(k4), samples)
    if k2 is not None:
        pools["spec-k2"] = PoolEvidence("spec-k2", values(k2), samples, predicted=True, method="histogram")
    return Evidence(pools=pools, error="down" if error else None)


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(STEP, min_size=1, max_size=80))
def test_actions_respect_cooldown_cap_and_stabilisation(steps):
    state = guard.initial_state(KEY, POLICY)
    now = 0.0
    actions = []
    for k4, k2, samples, error, width in steps:
        now += 10.0
        state, decision = guard.step(state, evidence(k4, k2, samples, error, width), now, POLICY)
        if decision.changes_plan and decision.action not in ("freeze",):
            actions.append(decision)
        assert decision.phase.value in ("ok", "act", "hold", "error")
        assert decision.reason
    for before, after in zip(actions, actions[1:], strict=False):
        assert after.at - before.at >= POLICY.cooldown_seconds
    for i, action in enumerate(actions):
        recent = [a for a in actions[: i + 1] if action.at - a.at < 3600]
        assert len(recent) <= POLICY.max_actions_per_hour
        if action.action == "restore" and i > 0:
            stabilization = POLICY.rules[0].limits.stabilization_window_seconds
            assert action.at - actions[i - 1].at >= stabilization


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(STEP, min_size=1, max_size=60))
def test_only_bad_evidence_moves_a_class_off_its_default_pool(steps):
    """Off the default pool only on a loss there, or on a pool cheaper by the margin, repeatedly."""
    state = guard.initial_state(KEY, POLICY)
    now = 0.0
    seen = []
    for k4, k2, samples, error, width in steps:
        now += 10.0
        before = state.pool
        seen.append((k2, error))
        state, decision = guard.step(state, evidence(k4, k2, samples, error, width), now, POLICY)
        if before == "spec-k4" and state.pool != "spec-k4":
            assert decision.action in ("off", "shorten")
            if decision.cause == "best_pool":
                numbers = decision.numbers
                # beyond both intervals, never on the points
                limit = numbers["current_rc"] * (1 - width) * (1 - POLICY.best_pool_margin)
                assert numbers["target_rc"] * (1 + width) < limit + 1e-9 or decision.to_pool == "nospec"
                if decision.to_pool == "nospec":
                    assert 1.0 < numbers["current_rc"] * (1 - width) * (1 - POLICY.best_pool_margin) + 1e-9
                # errors neither count nor reset (Argo); the favouring evaluations are the others
                assert sum(1 for _, err in seen if not err) > POLICY.best_pool_consecutive_limit
                if decision.to_pool == "spec-k2":
                    assert k2 is not None and k2 == numbers["target_rc"]
            else:
                assert k4 is not None and k4 * (1 - width) > 1.0 and samples >= 10 and not error
