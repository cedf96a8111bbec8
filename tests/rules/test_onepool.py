"""One pool, no routing (``rules.onepool``): a pool running vLLM's K schedule and nothing else.

In virtual time, one simulated engine with ``[[1, 8, 4], [9, 256, 0]]`` serves 48 clients (its
schedule off), then 12, then 4 (on): the model baseline is fitted on the pool's own requests that
verified no draft, and the class whose RC is above 1.0 where the schedule speculates is named.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specguard import schedules
from specguard.lab import replay, scenario, shapes
from specguard.lab import replay_policies as rp
from specguard.monitor import config as monitor_config
from specguard.monitor.schedule_metrics import ScheduleCollector
from specguard.rules import cost, onepool
from specguard.rules.cost_config import CostSettings
from specguard.sim import config as sim_config
from specguard.sim import truth

SCHEDULE = schedules.vllm([[1, 8, 4], [9, 256, 0]], 4)


class Recorder(rp.StaticPolicy):
    def __init__(self) -> None:
        super().__init__("one-pool", "scheduled")
        self.records: list = []

    def observe(self, record) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def evaluated():
    cfg = monitor_config.load_default()
    base = sim_config.load()
    sim = replace(base, pools=(replace(base.pool("spec-k4"), name="scheduled", k_schedule=SCHEDULE),))
    phases = tuple(
        scenario.Phase(name, seconds, scenario._loads(n, n, n, n))
        for name, seconds, n in (("busy", 120.0, 12), ("middle", 120.0, 3), ("low", 240.0, 1))
    )
    recorder = Recorder()
    one = shapes.FleetShape(shapes.FIXED, {"scheduled": 1}, 1)
    buckets = replay.Buckets.from_classes(cfg.exporter.classes)
    replay.Replay(sim, scenario.Scenario("one", phases), recorder, buckets, seed=0, shape=one).run()
    pool = replace(cfg.exporter.pools[0], name="scheduled", k_schedule=SCHEDULE)
    settings = replace(CostSettings().with_traffic(cfg.exporter.classes.load_buckets, 0.5), window_seconds=0)
    costs, baselines = cost.evaluate_all(recorder.records, [pool], None, 480.0, settings)
    return sim, settings, costs, baselines


def test_the_pools_own_steps_without_drafts_are_its_baseline(evaluated):
    _, _, costs, baselines = evaluated
    low = baselines["low"]
    assert low.source == "model" and "scheduled@K=0" in low.detail  # no second pool, no profile
    by = {(c.task_type, c.load_bucket): c for c in costs}
    assert {c.baseline_source for c in costs} == {"model"}
    # where the schedule is off, speculation changes nothing: RC about 1
    assert by[("code", "medium")].rc == pytest.approx(1.0, abs=0.03)


def test_the_class_that_loses_where_the_schedule_speculates_is_named(evaluated):
    sim, settings, costs, _ = evaluated
    found = onepool.losses(costs, {"scheduled": SCHEDULE}, settings.bucket_range)
    assert [(x.task_type, x.load_bucket, x.k) for x in found] == [("creative", "low", (0, 4))]
    assert truth.relative_cost(sim, "creative", 1.0, 4, 4) > 1 > truth.relative_cost(sim, "code", 0.0, 4, 4)
    by = {(c.task_type, c.load_bucket): c for c in costs}
    assert by[("code", "low")].upper < 1 and by[("extraction", "low")].upper < 1  # the rest pays

    collector = ScheduleCollector(
        {"scheduled": SCHEDULE},
        [(b.name, *settings.bucket_range(b.name)) for b in settings.load_buckets],
        lambda: costs,
    )
    samples = {
        (m.name, tuple(sorted(s.labels.items()))): s.value for m in collector.collect() for s in m.samples
    }
    loses = {k: v for k, v in samples.items() if k[0] == "specguard_schedule_class_loses" and v == 1}
    assert [dict(k[1])["task_type"] for k in loses] == ["creative"]
    spec = (
        "specguard_schedule_speculative_tokens",
        (("bound", "max"), ("load_bucket", "medium"), ("pool", "scheduled")),
    )
    assert samples[spec] == 0  # off at every medium load
    report = collector.report()
    assert report["pools"]["scheduled"]["k_by_load_bucket"]["low"] == [0, 4]
    assert report["lines"][0].startswith("creative/high loses at load low on scheduled")


def test_one_pool_needs_a_schedule_to_go_without_a_nospec_pool(tmp_path):
    from specguard.errors import ConfigError

    text = monitor_config.DEFAULT_CONFIG.read_text()
    start, end = text.index("pools:"), text.index("classes:")
    one = "pools:\n  - {name: scheduled, url: 'http://127.0.0.1:8001', num_speculative_tokens: 4%s}\n\n"
    path = tmp_path / "one.yaml"
    body = (
        text[end:]
        .replace("default_pool: spec-k4", "default_pool: scheduled")
        .replace("nospec_pool: nospec", "nospec_pool: null")
    )
    path.write_text(
        text[:start] + one % ", num_speculative_tokens_per_batch_size: [[1, 8, 4], [9, 256, 0]]" + body
    )
    cfg = monitor_config.load(path)
    assert cfg.exporter.pools[0].k_schedule == SCHEDULE
    path.write_text(text[:start] + one % "" + body)
    with pytest.raises(ConfigError, match="or run one pool with its in-engine K schedule"):
        monitor_config.load(path)
