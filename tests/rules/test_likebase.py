"""The live baseline like for like (``rules.likebase``): the class's own no-spec level, at the load
and context of its speculative requests, and every class's, adjusted, where it has none."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specguard.exporters.records import RequestRecord
from specguard.rules import cost, likebase
from specguard.rules.cost_config import CostSettings

POOLS = {"spec": 4, "nospec": 0}
SETTINGS = CostSettings(min_samples=20, baseline_min_samples=20).with_traffic([("low", 16), ("high", None)])


SAMPLED = {"chat": 0.7, "creative": 1.0}


def request(
    rng: np.random.Generator,
    pool: str,
    task: str,
    tpot: float,
    *,
    load: float = 1.0,
    prompt: int = 80,
    tokens: int = 32,
    noise: float = 0.04,
) -> RequestRecord:
    bucket = "high" if task in SAMPLED else "greedy"
    return RequestRecord(
        pool=pool,
        task_type=task,
        temperature_bucket=bucket,
        load_bucket="low",
        route="plan" if pool == "spec" else "holdout",
        started_at=1000.0,
        status=200,
        streamed=True,
        output_tokens=tokens,
        decode_seconds=tpot * (tokens - 1) * float(np.exp(rng.normal(0, noise))),
        load=load,
        decode_load=load,
        prompt_tokens=prompt,
        temperature=SAMPLED.get(task, 0.0),
    )


def rc_of(results, task: str) -> cost.ClassCost:
    (found,) = [c for c in results if c.task_type == task and c.pool == "spec"]
    return found


def test_each_class_is_compared_with_its_own_no_spec_tpot_not_the_pooled_one():
    """Two classes whose no-spec TPOT differs (the real tier's extraction 113.7 ms and creative
    142.9 ms): the pooled 129 ms made extraction's RC 1.43 where the A/B said 1.06-1.20."""
    rng = np.random.default_rng(1)
    base = {"extraction": 0.1137, "creative": 0.1429}
    truth = {"extraction": 1.10, "creative": 1.16}
    records = []
    for task, tpot in base.items():
        records += [request(rng, "nospec", task, tpot) for _ in range(40)]
        records += [request(rng, "spec", task, tpot * truth[task]) for _ in range(60)]
    results = cost.evaluate(records, POOLS, None, 1000.0, SETTINGS)
    for task, rc in truth.items():
        found = rc_of(results, task)
        assert found.baseline_source == "live" and f"class {task}/" in found.baseline_detail
        assert found.rc == pytest.approx(rc, rel=0.03), task
        assert found.lower < rc < found.upper
    pooled = cost.evaluate(records, POOLS, None, 1000.0, dataclasses.replace(SETTINGS, baseline_scope="load"))
    assert rc_of(pooled, "extraction").rc < 0.95 * truth["extraction"]  # what the pooled baseline said


def test_the_baseline_is_matched_to_the_load_the_speculative_requests_ran_at():
    """Within one load bucket the holdout ran at ~1 request in flight and the speculative pool at
    1.64: the no-spec TPOT at 1.64 (the step line through the no-spec loads), not at 1."""
    rng = np.random.default_rng(2)
    c0, cb = 0.060, 0.040  # no-spec TPOT = c0 + cb * load

    def nospec_tpot(load: float) -> float:
        return c0 + cb * load

    truth = 0.9
    records = []
    for i in range(60):  # a 20% holdout beside two clients: mostly alone, sometimes with the other
        load = 1.0 if i % 5 else float(rng.uniform(1.4, 2.0))
        records.append(request(rng, "nospec", "extraction", nospec_tpot(load), load=load))
    for _ in range(80):
        load = float(rng.uniform(1.5, 1.8))
        records.append(request(rng, "spec", "extraction", truth * nospec_tpot(load), load=load))
    found = rc_of(cost.evaluate(records, POOLS, None, 1000.0, SETTINGS), "extraction")
    assert found.rc == pytest.approx(truth, rel=0.03)
    assert found.lower < truth < found.upper
    assert "load 1.6" in found.baseline_detail


def test_a_class_without_its_own_is_read_at_every_class_level_with_their_spread_in_the_interval():
    """A class with too few no-spec requests of its own: the line through the others at its
    context (long prompts cost more per token here), and an interval wider by how far classes
    stray from the line."""
    rng = np.random.default_rng(3)

    def nospec_tpot(prompt: int) -> float:
        return 0.050 + 0.00004 * (prompt + 16)

    records = []
    for task, prompt in (("chat", 100), ("creative", 300), ("code", 900)):
        records += [request(rng, "nospec", task, nospec_tpot(prompt), prompt=prompt) for _ in range(30)]
    records += [request(rng, "nospec", "extraction", nospec_tpot(600), prompt=600) for _ in range(5)]
    records += [request(rng, "spec", "extraction", 0.8 * nospec_tpot(600), prompt=600) for _ in range(60)]
    found = rc_of(cost.evaluate(records, POOLS, None, 1000.0, SETTINGS), "extraction")
    assert "all classes (95 requests)" in found.baseline_detail and "context 616" in found.baseline_detail
    assert found.rc == pytest.approx(0.8, rel=0.03)
    assert found.lower < 0.8 < found.upper
    by_load = rc_of(
        cost.evaluate(
            records, POOLS, None, 1000.0, dataclasses.replace(SETTINGS, baseline_scope="class_then_load")
        ),
        "extraction",
    )
    assert by_load.rc > 0.8 * 1.05  # without the context term: the pooled level, short prompts mostly


def test_no_live_baseline_where_the_speculative_load_is_far_from_every_no_spec_load():
    rng = np.random.default_rng(4)
    records = [request(rng, "nospec", "chat", 0.1, load=1.0) for _ in range(40)]
    records += [request(rng, "spec", "chat", 0.12, load=3.0) for _ in range(40)]
    found = rc_of(cost.evaluate(records, POOLS, None, 1000.0, SETTINGS), "chat")
    assert found.baseline_source != "live"
    assert "load 3.00 of the speculative requests is not matched" in found.baseline_detail
    records = [
        request(rng, "nospec", "chat", 0.1 + 0.01 * (i % 3), load=1.0 + 0.5 * (i % 3)) for i in range(40)
    ]
    records += [request(rng, "spec", "chat", 0.2, load=6.0) for _ in range(40)]
    found = rc_of(cost.evaluate(records, POOLS, None, 1000.0, SETTINGS), "chat")
    assert found.baseline_source != "live"
    assert "more than 2x beyond the no-spec requests' 1.00-2.00" in found.baseline_detail


def test_a_negative_step_cost_is_noise_set_to_zero_and_its_uncertainty_stays():
    rng = np.random.default_rng(5)
    # flat in load with noise, so the fitted slope may come out negative
    records = [request(rng, "nospec", "chat", 0.1, load=1.0 + (i % 2) * 0.5, noise=0.1) for i in range(30)]
    target = [request(rng, "spec", "chat", 0.1, load=2.2) for _ in range(10)]
    found = likebase.baseline(
        records, target, cls=("chat", "high"), scope="class_then_load", min_samples=20, method="delta"
    )
    assert isinstance(found, likebase.Result)
    slope = [
        float(part.split(" ms per load")[0].split()[-1]) for part in [found.detail] if "ms per load" in part
    ]
    assert slope and slope[0] >= 0.0
    assert found.tpot_seconds >= 0.09
    # the interval is the unconstrained fit's, read beyond the data: wider than at the data's centre
    centre = likebase.baseline(
        records, records[:10], cls=("chat", "high"), scope="class_then_load", min_samples=20, method="delta"
    )
    assert found.log_variance > 2 * centre.log_variance


@pytest.mark.parametrize("method", ["delta", "jackknife"])
def test_with_no_term_it_is_the_ratio_of_sums_and_its_variance(method):
    from specguard.rules import confidence

    rng = np.random.default_rng(6)
    records = [
        request(rng, "nospec", "chat", 0.1, tokens=int(rng.integers(5, 60)), noise=0.2) for _ in range(30)
    ]
    found = likebase.baseline(
        records, [], cls=("chat", "high"), scope="class_then_load", min_samples=20, method=method
    )
    seconds = np.array([r.decode_seconds for r in records])
    tokens = np.array([r.output_tokens - 1 for r in records], dtype=float)
    plain = confidence.ratio_of_sums(seconds, tokens)
    assert found.tpot_seconds == pytest.approx(plain.value)
    # (the ratio's jackknife is of log R, the line's of R: equal to first order)
    tolerance = 1e-6 if method == "delta" else 0.01
    assert found.log_variance == pytest.approx(plain.variance(method), rel=tolerance)


def test_a_sampling_class_without_its_own_is_read_at_the_sampling_classes_cost():
    """On vLLM's CPU build a sampling step cost 10-20% more than a greedy one: a sampling class
    short of its own no-spec requests is read where the other sampling classes are, not at the
    greedy ones' level; and a sampler no no-spec request used leaves no live baseline."""
    rng = np.random.default_rng(8)
    records = [request(rng, "nospec", "code", 0.036) for _ in range(30)]
    records += [request(rng, "nospec", "chat", 0.042) for _ in range(30)]
    records += [request(rng, "nospec", "creative", 0.042) for _ in range(3)]
    records += [request(rng, "spec", "creative", 0.042) for _ in range(40)]
    found = rc_of(cost.evaluate(records, POOLS, None, 1000.0, SETTINGS), "creative")
    assert "all classes" in found.baseline_detail and "sampled 1.00" in found.baseline_detail
    assert found.rc == pytest.approx(1.0, rel=0.03)
    only_greedy = [r for r in records if r.pool == "spec" or r.task_type == "code"]
    found = rc_of(cost.evaluate(only_greedy, POOLS, None, 1000.0, SETTINGS), "creative")
    assert found.baseline_source != "live"
    assert "sampled 1.00 of the speculative requests is not matched" in found.baseline_detail
