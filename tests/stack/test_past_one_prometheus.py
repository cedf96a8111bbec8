"""Past one Prometheus, with real parts: the fleet of tests/stack/test_fleet.py (three simulator
replicas, a follower per replica, the shipped decider) watched the way a fleet that outgrew one
Prometheus is. An edge Prometheus in agent mode scrapes the followers and the decider and
remote-writes their raw series to a second Debian Prometheus in remote-write receiver mode, which plays the
Mimir/Thanos-class store: the shipped rules run there (the edge has none) and the decider's
`guard.prometheus.url` points at it. Next to it, the alternative: a Prometheus that scrapes the
followers itself with the shipped rules (also the one-Prometheus reference) and one that federates
only its recorded aggregates.

Asserted: the decider, reading only the store, moves the losing class on the value the store
recorded, and its plan (scraped from the decider by the edge) is recorded by the store's ruler as
by the reference, and federated; the store holds every follower's raw series, labels intact (job,
instance), and the fleet-wide counters equal the sum over the followers; with the followers'
numbers settled, every query the decider runs (its PromQL rules rendered for every class and
speculative pool, as it renders them) answers the same through the store, the reference and the
federating Prometheus, at one evaluation timestamp, and equals RC combined by hand from the
followers' own /metrics.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
import yaml
from fleethelp import (
    RC,
    Load,
    audit,
    decider_config,
    fleet_counters,
    follower_counters,
    sim_args,
    start_followers,
    start_run,
)
from stackhelp import Prometheus, Stack, free_port, scrape, wait_until

from specguard.monitor import config as config_mod
from specguard.monitor.cost_metrics import LABELS, RATIO, SAMPLES
from specguard.monitor.promql import parse_result
from specguard.rules import policy as policy_mod

pytestmark = pytest.mark.stack

# what a federating Prometheus takes from the edge: the recorded aggregates, no raw series
AGGREGATES = '{__name__=~"pool_class_load:.*|pool_class:.*|pool_load:.*|class_load:.*"}'
MIN_SAMPLES = 20  # the decider's evidence floor (fleethelp.decider_config lowers the shipped 30)
CREATIVE = 'task_type="creative",temperature_bucket="high",load_bucket="low",pool="spec-k4"'
# The same inputs summed in another order (Prometheus' series order vs the followers' order here)
# can differ in the last bits of a float64; nothing else may differ.
EXACT = 1e-9
# the recorded series the decider's rule reads; the rate rules are left out of the comparison: each
# Prometheus scrapes at its own instants, so their rates differ by those instants
READ = '{__name__=~"pool_class_load:specguard_relative_cost_per_token(_samples)?:(ratio|sum)"}'


def decider_queries(config: dict) -> dict[tuple[str, tuple[str, str, str], str], str]:
    """Every query the decider runs per evaluation, keyed (rule, class, pool): its PromQL rules
    rendered for every configured class and speculative pool, as PromQLSource.collect does."""
    cfg = config_mod.parse_text(yaml.safe_dump(config, sort_keys=False))
    ex = cfg.exporter
    pools = {p.name: p.num_speculative_tokens for p in ex.pools}
    policy = cfg.sections["guard"].with_pools(pools, ex.tap.default_pool, ex.tap.nospec_pool)
    window = policy_mod.window_text(policy.window_seconds)
    temps = [b.name for b in ex.classes.temperature_buckets]
    loads = [b.name for b in ex.classes.load_buckets]
    out = {}
    for key in itertools.product(ex.classes.task_labels, temps, loads):
        variables = dict(zip(("task_type", "temperature_bucket", "load_bucket"), key, strict=True))
        for pool in (name for name, k in policy.pools.items() if k > 0):
            for rule in (r for r in policy.rules if r.query):
                out[(rule.name, key, pool)] = policy_mod.render_query(
                    rule.query, {**variables, "pool": pool, "window": window}
                )
    return out


def answers(prom: Prometheus, queries: dict, at: float) -> dict:
    """Each query's single value at `at` (None: no data), read as the decider reads it."""
    return {key: parse_result(prom.api("query", query=q, time=at)["result"]) for key, q in queries.items()}


def rc_by_hand(urls: list[str]) -> dict[tuple[str, ...], tuple[float, float, int]]:
    """From the followers' own /metrics, per (task_type, temperature_bucket, load_bucket, pool): RC
    weighted by speculative samples, the samples summed, and how many followers' estimates. A
    follower that exports samples but no RC counts in neither sum (as the shipped rules)."""
    num: dict = {}
    den: dict = {}
    count: dict = {}
    for url in urls:
        samples = scrape(url)
        spec = {
            tuple(s.labels[k] for k in LABELS): s.value
            for s in samples
            if s.name == SAMPLES and s.labels["side"] == "spec"
        }
        for s in samples:
            key = tuple(s.labels[k] for k in LABELS) if s.name == RATIO else None
            if key in spec:
                num[key] = num.get(key, 0.0) + s.value * spec[key]
                den[key] = den.get(key, 0.0) + spec[key]
                count[key] = count.get(key, 0) + 1
    return {key: (num[key] / den[key], den[key], count[key]) for key in num if den[key] > 0}


def expected(queries: dict, by_hand: dict) -> dict:
    """What the decider's rule (`max(RC{class} and on (...) samples:sum >= 20)`) must answer."""
    out = {}
    for rule, (task, temp, load), pool in queries:
        found = by_hand.get((task, temp, load, pool))
        out[(rule, (task, temp, load), pool)] = found[0] if found and found[1] >= MIN_SAMPLES else None
    return out


def recorded(prom: Prometheus, at: float) -> dict[frozenset, float]:
    """The series READ selects at `at`, by their whole label sets."""
    rows = prom.api("query", query=READ, time=at)["result"]
    return {frozenset(r["metric"].items()): float(r["value"][1]) for r in rows}


def same(got: dict, want: dict) -> bool:
    if got.keys() != want.keys() or any((got[k] is None) != (want[k] is None) for k in want):
        return False
    return all(got[k] == pytest.approx(want[k], rel=EXACT) for k in want if want[k] is not None)


def test_store_ruler_and_federation_answer_the_decider_alike(tmp_path: Path):
    started_at = time.monotonic()
    with Stack(tmp_path) as stack:
        engines = stack.start_sim(time_scale=0.2, args=sim_args(tmp_path))
        decider_port = free_port()
        decider_url = f"http://127.0.0.1:{decider_port}"
        followers = start_followers(stack, engines, "http", tmp_path, decider_url, None)
        # the edges scrape the decider too: the plan's cells are on its /metrics alone
        fleet = {"fleet": followers, "specguard-guard": [decider_url]}

        # the store: no targets of its own, the shipped rules, remote writes accepted
        store = stack.start_prometheus(jobs={}, name="store", receiver=True)
        # the edge: agent mode (no rules, no local queries), raw series remote-written to the store
        write = {
            "url": store.url + "/api/v1/write",
            "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms", "max_backoff": "1s"},
        }
        stack.start_prometheus(jobs=fleet, name="edge", rules=False, agent=True, remote_write=(write,))
        # the alternative: a Prometheus with the shipped rules (the one-Prometheus shape), and one
        # that federates only its recorded aggregates
        reference = stack.start_prometheus(jobs=fleet, name="reference")
        federate = {
            "job_name": "federate",
            "honor_labels": True,
            "metrics_path": "/federate",
            "params": {"match[]": [AGGREGATES]},
            "static_configs": [{"targets": [reference.url.split("//")[1]]}],
        }
        federated = stack.start_prometheus(jobs={}, name="federated", rules=False, scrape_configs=(federate,))

        config = decider_config(engines, "http", tmp_path, store.url, None)
        queries = decider_queries(config)
        assert len(queries) == 60  # 5 task labels x 4 temperature buckets x 3 load buckets x spec-k4
        start_run(stack, "decider", config, decider_port)
        load = Load(followers)
        t0 = time.monotonic()

        # (b) the decider, reading only the store, moves the losing class on the store's numbers
        decisions = wait_until(
            "the decider moved creative",
            lambda: [r for r in audit(tmp_path / "audit.jsonl") if r["action"] == "off"],
            60,
            stack.procs,
        )
        decided = time.monotonic() - t0
        (moved,) = [r for r in decisions if r["class"] == "creative/high"]
        assert moved["load_bucket"] == "low" and (moved["from"], moved["to"]) == ("spec-k4", "nospec")
        assert moved["cause"] == "fleet-relative-cost", moved  # no Alertmanager here: PromQL only
        read = moved["numbers"]["rules"]["fleet-relative-cost@spec-k4"]["value"]
        assert read > 1.0, moved
        # the number it acted on (audited to 6 decimals) is one the store's ruler recorded
        ruled = [float(v) for _, v in store.query(f"{RC}{{{CREATIVE}}}[2m]")[0]["values"]]
        assert any(abs(read - v) <= 5e-7 for v in ruled), (read, ruled)
        assert {r["class"] for r in decisions} == {"creative/high"}
        # the load runs on until code has its estimate too, from two followers or more on twice
        # the evidence floor (on a busy machine the decider can move creative before code's window
        # holds enough requests; a follower's estimate on a dozen requests can lose its point once
        # its baseline moves, and with it the decider's floor: a CI run settled on one follower)
        code_key = ("code", "greedy", "low", "spec-k4")

        def code_estimated() -> bool:
            _, samples, count = rc_by_hand(followers).get(code_key, (0, 0, 0))
            return count >= 2 and samples >= 2 * MIN_SAMPLES

        wait_until("code's RC from two followers", code_estimated, 60, stack.procs)
        results = load.stop()
        assert results and all(r.status == 200 for r in results)

        # the followers' numbers settle once the load stops (their estimates are re-evaluated
        # every guard interval, 2 s): two snapshots 2.5 s apart alike
        def settled():
            first = (rc_by_hand(followers), follower_counters(followers))
            time.sleep(2.5)
            second = (rc_by_hand(followers), follower_counters(followers))
            return second if first == second else None

        by_hand, counters = wait_until("the followers' numbers settle", settled, 20, stack.procs)
        # creative's settled estimate is not asserted above 1.0: the decision on it was asserted
        # above, on the store's value; since then creative runs on nospec, whose load (and so the
        # low-load baseline) moved with it (a fresh-clone run settled at 0.81 after the decider
        # read it above 1.0)
        creative = by_hand[("creative", "high", "low", "spec-k4")]
        assert creative[1] >= MIN_SAMPLES and creative[2] >= 2, creative
        code = by_hand[code_key]
        assert code[0] < 1.0 and code[1] >= MIN_SAMPLES, code
        want = expected(queries, by_hand)
        assert sum(v is not None for v in want.values()) >= 2, want

        # (a) every decider query, at one evaluation timestamp, through the store, the reference
        # and the federating Prometheus equals RC combined by hand. Polled only for the pipeline
        # to carry the settled numbers through (scrape, remote write, rule evaluation, federation
        # scrape: about 1 s each here); an answer that stays different fails.
        def alike():
            at = time.time()
            proms = {"store": store, "reference": reference, "federated": federated}
            got = {name: answers(prom, queries, at) for name, prom in proms.items()}
            series = {name: recorded(prom, at) for name, prom in proms.items()}
            return (
                all(same(g, want) for g in got.values())
                and series["store"]
                and all(same(other, series["reference"]) for other in series.values())
                and series
            )

        series = wait_until("the decider's queries answer alike", alike, 30, stack.procs, interval=1)
        assert len(series["store"]) >= 2, series
        # labels through both paths (the label sets are compared whole above): the followers' job
        # kept, their instance summed away by the ruler (and not added back by federation with
        # honor_labels: /federate exposes what it has no instance for with an empty one)
        assert all(dict(k)["job"] == "fleet" and "instance" not in dict(k) for k in series["store"])

        # the store holds the raw series, remote-written with their labels: one instance per
        # follower under job "fleet", and fleet-wide counters equal to the followers' sums
        instances = store.value(f'count by (instance) ({SAMPLES}{{job="fleet"}})')
        assert {dict(k)["instance"] for k in instances} == {u.split("//")[1] for u in followers}
        wait_until("the store holds the final counters", lambda: fleet_counters(store) == counters, 10)
        assert fleet_counters(reference) == counters
        # the decider's plan, recorded alike by the store's ruler and the reference, and federated
        on_nospec = CREATIVE.replace("spec-k4", "nospec")
        plan = f'class_load:specguard_plan_info:max{{job="specguard-guard",{on_nospec}}} == 1'
        for name, prom in (("store", store), ("reference", reference), ("federated", federated)):
            wait_until(f"the plan recorded in {name}", lambda prom=prom: prom.value(plan), 10, stack.procs)
        # ... and the federating Prometheus only the aggregates
        assert federated.query('count({__name__=~"specguard_.+"})') == []
        print(f"decided {decided:.1f} s after load start; wall {time.monotonic() - started_at:.1f} s")
