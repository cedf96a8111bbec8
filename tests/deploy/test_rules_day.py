"""Acceptance counters without a load bucket change no result of the shipped recording rules.

A recorded day of traffic: the demo's default scenario three times over (load from 16 to 160
clients and back, so every class crosses every load bucket), replayed in virtual time with one
class on the no-spec pool. Its requests go, as they finish, into the tap's stats, and the tap's
page is scraped every 15 s. Beside each page stands what the page exported before acceptance
lost its load bucket: the same totals per (pool, class, load bucket). promtool then evaluates
the shipped rules on the new series and, on the same timeline, the old page's per-load series
summed the way the old rules summed them. Every acceptance record must equal the old sum
wherever both sides had all their series through the whole 5-minute window (a series born
inside a window is extrapolated by rate() on its own: the first-scrape loss metrics.md
describes).
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache

import yaml
from deployhelp import RULES, run_promtool
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specguard.exporters.collector import SPARSE, SPEC_ONLY, TapCollector
from specguard.exporters.stats import WindowedStats
from specguard.lab import replay
from specguard.lab import replay_policies as rp
from specguard.lab import scenario as sc
from specguard.monitor import config as monitor_config
from specguard.sim import config as sim_config

SCRAPE = 15.0
WINDOW = 300.0
FAMILIES = sorted(SPEC_ONLY - SPARSE)  # acceptance counters with a value for vLLM's summaries


class Recorder(rp.StaticPolicy):
    def __init__(self) -> None:
        super().__init__("recorded", "spec-k4", {("creative", "high"): "nospec"})
        self.records = []

    def observe(self, record) -> None:
        self.records.append(record)


@cache
def recorded_day() -> tuple[list[float], list[dict], list[dict]]:
    """Scrape times; at each, the new page's acceptance samples and the old page's per-load totals."""
    buckets = replay.Buckets.from_classes(monitor_config.load_default().exporter.classes)
    policy = Recorder()
    demo = sc.default_scenario()
    day = sc.Scenario("day", demo.phases * 3)  # the demo's traffic three times over: 28.5 minutes
    replay.Replay(sim_config.load(), day, policy, buckets, seed=0, fleet=3).run()
    done = sorted(policy.records, key=lambda r: r.started_at + r.e2e_seconds)
    stats = WindowedStats()
    registry = CollectorRegistry()
    registry.register(TapCollector(stats, {}, nospec_pools=["nospec"]))
    times, new, old = [], [], []
    at, i = SCRAPE, 0
    while i < len(done):
        while i < len(done) and done[i].started_at + done[i].e2e_seconds <= at:
            stats.add(done[i])
            i += 1
        page = {}
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for s in family.samples:
                if s.name.removeprefix("specguard_").removesuffix("_total") in FAMILIES:
                    page[(s.name, tuple(sorted(s.labels.items())))] = s.value
        per_load = {
            (f"specguard_{attr}_total", key): getattr(t, attr)
            for key, t in stats.totals().items()
            if key[0] != "nospec"
            for attr in FAMILIES
        }
        times.append(at)
        new.append(page)
        old.append(per_load)
        at += SCRAPE
    return times, new, old


def series_text(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def values(points: list[float | None]) -> str:
    return " ".join("_" if v is None else repr(float(v)) for v in points)


def test_the_page_sums_acceptance_over_load_buckets_at_every_scrape():
    times, new, old = recorded_day()
    loads_seen = {key[3] for scrape in old for (_, key) in scrape}
    assert loads_seen == {"low", "medium", "high"}  # the day crossed every load bucket
    for page, per_load in zip(new, old, strict=True):
        summed: dict[tuple, float] = defaultdict(float)
        for (name, (pool, task, temperature, _)), value in per_load.items():
            cell = (("pool", pool), ("task_type", task), ("temperature_bucket", temperature))
            summed[(name, cell)] += value
        assert page == dict(summed)


def test_the_recording_rules_give_the_old_pages_results(tmp_path):
    times, new, old = recorded_day()
    n = len(times)
    born_new: dict[tuple, int] = {}
    series: dict[str, list[float | None]] = {}
    for step, (page, per_load) in enumerate(zip(new, old, strict=True)):
        for (name, labels), value in page.items():
            text = series_text(name, {**dict(labels), "job": "specguard", "instance": "a:9464"})
            series.setdefault(text, [None] * n)[step] = value
            born_new.setdefault(labels, step)
        for (name, (pool, task, temperature, load)), value in per_load.items():
            labels = {"pool": pool, "task_type": task, "temperature_bucket": temperature, "load_bucket": load}
            text = series_text(f"old_{name}", {**labels, "job": "specguard", "instance": "a:9464"})
            series.setdefault(text, [None] * n)[step] = value
    # a cell's old series are all there from the step its last load bucket first appeared
    first_seen: dict[tuple, int] = {}
    for text, points in series.items():
        if text.startswith("old_"):
            labels = dict(part.split("=") for part in text[text.index("{") + 1 : -1].split(","))
            cell = tuple((k, labels[k].strip('"')) for k in ("pool", "task_type", "temperature_bucket"))
            start = next(i for i, v in enumerate(points) if v is not None)
            first_seen[cell] = max(first_seen.get(cell, 0), start)
    settled_by = {cell: max(first_seen[cell], born_new[cell]) for cell in first_seen}
    window_steps = int(WINDOW / SCRAPE) + 1
    checks, compared = [], 0
    for step in range(window_steps + 1, n, 2):
        cells = [cell for cell, born in settled_by.items() if born + window_steps <= step]
        for cell in cells:
            sel = ",".join(f'{k}="{v}"' for k, v in cell)
            for family in FAMILIES:
                recorded = f"pool_class:specguard_{family}:rate5m{{{sel}}}"
                by_hand = (
                    f"sum without (instance, load_bucket) (rate(old_specguard_{family}_total{{{sel}}}[5m]))"
                )
                checks.append(
                    {
                        "expr": f"abs({recorded} - {by_hand}) > 1e-9 * {by_hand}",
                        "eval_time": f"{int(times[step] - SCRAPE)}s",
                        "exp_samples": [],
                    }
                )
                checks.append(  # and the comparison is not vacuous: the record is there
                    {
                        "expr": f"count({recorded}) == bool 1",
                        "eval_time": f"{int(times[step] - SCRAPE)}s",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    }
                )
                compared += 1
    assert compared >= 50, compared
    assert {dict(cell)["task_type"] for cell in settled_by} >= {"code", "extraction", "chat"}
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": f"{int(SCRAPE)}s",
        "tests": [
            {
                "name": "a recorded day: acceptance records equal the old per-load series summed",
                "interval": f"{int(SCRAPE)}s",
                "input_series": [{"series": s, "values": values(p)} for s, p in series.items()],
                "promql_expr_test": checks,
            }
        ],
    }
    path = tmp_path / "day.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    done = run_promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
