"""The simulator's engine core in virtual time: cost model, batching, acceptance, truth, determinism."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard.sim import config as simconfig
from specguard.sim import truth, virtual
from specguard.sim.engine import EngineCore


@pytest.fixture(scope="module")
def cfg():
    return simconfig.load()


def tpot(run: virtual.VirtualRun) -> float:
    results = [r for r in run.results if r.output_tokens > 1]
    return sum(r.decode_seconds for r in results) / sum(r.output_tokens - 1 for r in results)


def test_same_seed_same_run_and_another_seed_differs(cfg):
    classes = [("chat", 0.7, 1.0), ("code", 0.0, 1.0)]
    a = virtual.simulate_closed(cfg, "spec-k4", classes, 8, 40)
    b = virtual.simulate_closed(cfg, "spec-k4", classes, 8, 40)
    c = virtual.simulate_closed(cfg, "spec-k4", classes, 8, 40, seed=1)
    assert a.results == b.results and a.steps == b.steps
    assert [r.histogram for r in a.results] != [r.histogram for r in c.results]


def test_every_step_takes_the_cost_model_time(cfg):
    run = virtual.simulate_closed(cfg, "spec-k4", [("chat", 0.7, 1.0)], 16, 48)
    cost = cfg.cost
    for step in run.steps:
        prefill_tokens = 0 if not step.prefill_requests else None
        if prefill_tokens == 0:
            assert step.duration == pytest.approx(cost.step_seconds(step.decode_requests, 4))
        assert step.verify_tokens == step.decode_requests * 5
        assert step.padded_tokens >= step.verify_tokens


@pytest.mark.parametrize("pool,k", [("spec-k4", 4), ("nospec", 0)])
def test_decode_step_time_grows_with_concurrency_as_modelled(cfg, pool, k):
    means = {}
    for concurrency in (1, 16, 64, 160):
        run = virtual.simulate_closed(
            cfg, pool, [("chat", 0.7, 1.0)], concurrency, concurrency, max_tokens=40, ignore_eos=True
        )
        pure = [s.duration for s in run.steps if s.prefill_requests == 0 and s.decode_requests == concurrency]
        assert pure, f"no full decode step at concurrency {concurrency}"
        means[concurrency] = sum(pure) / len(pure)
        assert means[concurrency] == pytest.approx(cfg.cost.step_seconds(concurrency, k))
    assert means[1] < means[16] < means[64] < means[160]
    # the knee: past it each extra verify token costs more than below it
    cost = cfg.cost
    low = (cost.verify_seconds(cost.knee_tokens) - cost.verify_seconds(cost.knee_tokens // 2)) / (
        cost.knee_tokens // 2
    )
    high = (
        cost.verify_seconds(cost.knee_tokens * 2) - cost.verify_seconds(cost.knee_tokens)
    ) / cost.knee_tokens
    assert high > 3 * low


def test_graph_tiers_pad_verify_tokens(cfg):
    cost = cfg.cost
    assert cost.padded(37) == 48 and cost.padded(48) == 48 and cost.padded(10_000) == 10_000
    assert cost.step_seconds(9, 0) == cost.step_seconds(9, 0)
    assert cost.verify_seconds(cost.padded(33)) == cost.verify_seconds(cost.padded(47))


def test_max_num_seqs_caps_the_batch_and_the_rest_waits(cfg):
    small = replace(cfg, pools=(replace(cfg.pool("spec-k2"), max_num_seqs=4),))
    run = virtual.simulate_closed(small, "spec-k2", [("code", 0.0, 1.0)], 10, 30, max_tokens=30)
    assert max(s.batch_size for s in run.steps) == 4
    assert max(s.waiting for s in run.steps) == 6
    assert any(r.scheduled > r.arrival for r in run.results)
    assert all(r.scheduled >= r.arrival for r in run.results)


def test_per_request_numbers_add_up_to_the_engine_totals(cfg):
    run = virtual.simulate_closed(cfg, "spec-k4", [("chat", 0.7, 1.0), ("creative", 1.0, 1.0)], 12, 60)
    totals = run.truth["pools"]["spec-k4"]["totals"]
    assert totals["requests_finished"] == 60
    assert sum(r.rounds for r in run.results) == totals["drafts"]
    assert sum(r.accepted_tokens for r in run.results) == totals["accepted_tokens"]
    assert sum(r.draft_tokens for r in run.results) == totals["draft_tokens"] == 4 * totals["drafts"]
    assert sum(r.output_tokens for r in run.results) == totals["generation_tokens"]
    assert sum(r.full_rollback_rounds for r in run.results) == totals["full_rollback_rounds"]
    for r in run.results:
        assert sum(r.histogram) == r.rounds
        assert sum(j * n for j, n in enumerate(r.histogram)) == r.accepted_tokens
        # accepted drafts are counted even when max_tokens or the stop length truncates them
        assert r.output_tokens <= 1 + r.rounds + r.accepted_tokens
        stats = r.spec_stats()
        assert stats is not None and stats.accept_length == pytest.approx(1 + r.accepted_tokens / r.rounds)
    classes = run.truth["pools"]["spec-k4"]["classes"]
    assert set(classes) == {"chat@0.7", "creative@1"}
    assert sum(c["verify_rounds"] for c in classes.values()) == totals["drafts"]
    per_pos = [sum(c["per_position_accepted"][i] for c in classes.values()) for i in range(4)]
    assert per_pos == totals["accepted_per_position"]


def test_measured_acceptance_converges_to_the_table(cfg):
    run = virtual.simulate_closed(
        cfg, "spec-k4", [("code", 0.0, 1.0)], 32, 200, ignore_eos=True, max_tokens=200
    )
    measured = run.truth["pools"]["spec-k4"]["classes"]["code@0"]
    expected = run.truth["model"]["classes"]["code@0"]["pools"]["spec-k4"]
    # requests differ (request_spread), so 200 requests leave a few percent of sampling noise
    assert measured["accept_length"] == pytest.approx(expected["accept_length"], rel=0.06)
    for got, want in zip(measured["per_position_rate"], expected["per_position_rate"], strict=True):
        assert got == pytest.approx(want, abs=0.05)


def test_full_rollback_requests_exist_for_low_acceptance_classes(cfg):
    run = virtual.simulate_closed(cfg, "spec-k4", [("creative", 1.0, 1.0), ("code", 0.0, 1.0)], 8, 60)
    classes = run.truth["pools"]["spec-k4"]["classes"]
    assert classes["creative@1"]["full_rollback_request_ratio"] > 0.8
    assert classes["code@0"]["full_rollback_request_ratio"] == 0.0
    assert classes["creative@1"]["full_rollback_round_ratio"] > 0.8


def test_nospec_pool_never_drafts(cfg):
    run = virtual.simulate_closed(cfg, "nospec", [("code", 0.0, 1.0)], 4, 12)
    totals = run.truth["pools"]["nospec"]["totals"]
    assert totals["drafts"] == 0 and totals["accepted_per_position"] == []
    assert all(r.spec_stats() is None and r.rounds == 0 for r in run.results)


def test_true_relative_cost_sides_of_one(cfg):
    rc = truth.relative_cost
    for k in (2, 4):
        for b in (1, 4, 8):
            assert rc(cfg, "code", 0.0, k, b) < 0.7
            assert rc(cfg, "extraction", 0.0, k, b) < 0.7
        for b in cfg.truth_concurrency:
            assert rc(cfg, "creative", 1.0, k, b) > 1.05
    assert rc(cfg, "chat", 0.7, 4, 1) < 0.8 and rc(cfg, "chat", 0.7, 4, 128) > 1.5
    # shortening K is a real option for the middle class at some loads
    assert any(rc(cfg, "chat", 0.7, 2, b) < 1.0 < rc(cfg, "chat", 0.7, 4, b) for b in range(1, 257))
    table = truth.model_table(cfg)
    assert table["classes"]["chat@0.7"]["pools"]["spec-k4"]["relative_cost"]["1"] == rc(
        cfg, "chat", 0.7, 4, 1
    )


@pytest.mark.parametrize(
    "task,temperature,concurrency,side",
    [
        ("code", 0.0, 4, "below"),
        ("creative", 1.0, 4, "above"),
        ("chat", 0.7, 4, "below"),
        ("chat", 0.7, 128, "above"),
    ],
)
def test_measured_relative_cost_lands_on_the_true_side(cfg, task, temperature, concurrency, side):
    def run(pool):
        return virtual.simulate_closed(
            cfg,
            pool,
            [(task, temperature, 1.0)],
            concurrency,
            2 * concurrency,
            max_tokens=96,
            ignore_eos=True,
        )

    measured = tpot(run("spec-k4")) / tpot(run("nospec"))
    model = truth.relative_cost(cfg, task, temperature, 4, concurrency)
    assert (measured < 1.0) if side == "below" else (measured > 1.0)
    assert measured == pytest.approx(model, rel=0.15)


def test_scripted_open_loop_workload(cfg):
    items = [
        virtual.WorkItem(arrival=0.05 * i, task_type="extraction", temperature=0.0, max_tokens=20)
        for i in range(10)
    ]
    run = virtual.simulate(cfg, "spec-k2", items)
    assert len(run.results) == 10
    assert all(
        r.arrival == pytest.approx(0.05 * int(r.request_id.split("-")[-1]) - 0.05) for r in run.results
    )
    assert all(r.output_tokens <= 20 and r.first_token > r.arrival for r in run.results)
    assert run.end == max(r.finished for r in run.results)


def test_unknown_task_uses_the_default_class_and_abort_works(cfg):
    engine = EngineCore(cfg, cfg.pool("spec-k4"))
    request = engine.new_request(task="poetry-slam", temperature=0.7, max_tokens=50)
    assert request.task == cfg.default_task
    engine.add(request)
    engine.step()
    assert engine.abort(request) and request.finish_reason == "abort" and engine.idle
    assert not engine.abort(request)
