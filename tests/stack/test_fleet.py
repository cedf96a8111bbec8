"""Fleet mode end to end, with real parts: three simulator replicas (two spec-k4, one no-spec),
one follower `specguard run` per replica (the shipped sidecar config), Debian's Prometheus
scraping every follower and the decider with the shipped rules, Debian's Alertmanager delivering
to the decider, and one decider `specguard run` (the shipped decider config, `guard.local:
false`) reading RC across the replicas from the recording rule. Run once with the HTTP plan
source (GET /api/v1/plan; the decider holds the lock on its plan file) and once with the
ConfigMap of the loopback Kubernetes API stand-in (the decider holds its Lease).

Asserted: the fleet-wide per-class counters in Prometheus equal the sum over the followers and
the simulators' truth; RC per class comes from the recording rule across at least two
replicas' estimates; the decider moves the losing class and every follower routes it the new way
within one poll interval plus one scrape; the plan reaches Prometheus from the decider alone
(under its own job; the followers export its version) and the recording rules, the dashboard's
verdict and the version comparison of SpecGuardPlanStale all read it across the two jobs; with
the decider killed every follower keeps routing by the last plan (also across its own restart); a
restarted decider resumes without a plan change.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest
from fleethelp import (
    COUNTERS,
    POLL_SECONDS,
    RC,
    SCRAPE_SECONDS,
    Load,
    audit,
    decider_config,
    fleet_counters,
    follower_config,
    follower_counters,
    plan_of,
    sample,
    seeded_configmap,
    sim_args,
    start_followers,
    start_run,
    truth_counts,
)
from stackhelp import DASHBOARD, Stack, control_url, free_port, scrape, substitute, wait_until

from tests.monitor.kubekit import FakeKubeApi, Threaded

pytestmark = pytest.mark.stack

CREATIVE = ("creative", "high", "low")
CELL = ("task_type", "temperature_bucket", "load_bucket", "pool")
# RC across the followers by hand: their estimates weighted by speculative samples, and how many
WEIGHTED = """
label_replace(
  sum(specguard_relative_cost_per_token_ratio{{job="fleet",{sel}}}
      * ignoring (side) specguard_relative_cost_samples{{job="fleet",side="spec",{sel}}})
  / sum(specguard_relative_cost_samples{{job="fleet",side="spec",{sel}}}), "what", "r", "", "")
or label_replace(count(specguard_relative_cost_per_token_ratio{{job="fleet",{sel}}}), "what", "n", "", "")
"""


def routed(followers: list[str], since: list[tuple[float, float]], count: int) -> bool:
    """Whether every follower routed ``count`` creative requests since ``since`` (its routes then):
    enough that one probe is not a third of them, on a starved machine too."""
    now = [creative_routes(url) for url in followers]
    return all(sum(n) - sum(then) >= count for n, then in zip(now, since, strict=True))


def creative_routes(url: str) -> tuple[float, float]:
    """(creative requests on nospec, on spec-k4) counted by one follower."""
    got = {"nospec": 0.0, "spec-k4": 0.0}
    for s in scrape(url):
        if s.name == "specguard_requests_total" and s.labels["task_type"] == "creative":
            got[s.labels["pool"]] += s.value
    return got["nospec"], got["spec-k4"]


def adopted_at(prom, version: int) -> dict[str, float]:
    """When each follower's `version`, or a newer one, first reached Prometheus: instance -> sample
    timestamp. (A follower that polls after the decider published twice goes from the old version
    straight to the newer one: seen in a fresh-clone run, 0 -> 2 while the test waited for 1.)"""
    out = {}
    for row in prom.query('specguard_plan_version{job="fleet"}[1m]'):
        at = [float(t) for t, v in row["values"] if float(v) >= version]
        if at:
            out[row["metric"]["instance"]] = min(at)
    return out


def verdict(prom, panel: str, job: str) -> set[tuple[str, ...]]:
    """(task_type, temperature_bucket, load_bucket, pool) rows of a dashboard verdict panel, run as
    Grafana runs it with `job` as the job variable's regex and every other variable on All."""
    (target,) = next(p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == panel)["targets"]
    expr = substitute(target["expr"].replace("$job", job))
    return {tuple(r["metric"][k] for k in CELL) for r in prom.query(expr)}


def plan_in_prometheus(prom, followers: list[str], version: int, creative_sel: str) -> None:
    """The plan reaches Prometheus from the decider alone, under its own job, and everything that
    reads it still does: the planned/probe split of the followers' RC, the dashboard's verdict,
    and the version comparison that finds a lagging follower."""
    cells = "specguard_(plan_info|speculation_enabled|num_speculative_tokens)"
    assert prom.query(f'count_over_time({{__name__=~"{cells}",job="fleet"}}[10m])') == []  # no follower's
    on_nospec = creative_sel.replace("spec-k4", "nospec")
    plan = f'class_load:specguard_plan_info:max{{job="specguard-guard",{on_nospec}}} == 1'
    wait_until("the decider's plan recorded", lambda: prom.value(plan), 10)
    # the followers' RC of creative on spec-k4 is probe traffic now: the rules join the decider's plan
    probe = f'pool_class_load:specguard_probe_relative_cost_per_token:ratio{{job="fleet",{creative_sel}}}'
    wait_until("creative on spec-k4 recorded as probe", lambda: prom.value(probe), 10)
    planned = f"pool_class_load:specguard_planned_relative_cost_per_token:ratio{{{creative_sel}}}"
    assert not prom.value(planned)
    # the dashboard: with the decider's job in view creative is on its probe panel, not planned;
    # with only the followers' job the plan is out of view, and every pool counts as planned
    creative = tuple(CREATIVE) + ("spec-k4",)
    title = "Relative cost per token (RC) per class, as planned"
    assert creative not in verdict(prom, title, "fleet|specguard-guard")
    assert creative in verdict(prom, "RC on probe traffic (classes planned elsewhere)", ".+")
    assert creative in verdict(prom, title, "fleet")
    # SpecGuardPlanStale's comparison, with == for !=: each follower's version against the leader's
    same = (
        "(specguard_plan_version and specguard_plan_age_seconds) == on (namespace) group_left () "
        "max by (namespace) (specguard_plan_version and (specguard_guard_leader == 1))"
    )
    instances = {u.split("//")[1] for u in followers}

    def matched() -> dict[str, float] | None:
        """Every follower on the leader's version (``version`` or a newer one the decider published
        since: a scrape of the leader can land before the followers' scrapes of the new version)."""
        found = {dict(k)["instance"]: v for k, v in prom.value(same).items()}
        return found if set(found) == instances and min(found.values()) >= version else None

    wait_until("every follower on the leader's version", matched, 3 * SCRAPE_SECONDS)


@pytest.mark.parametrize("source", ["http", "configmap"])
def test_fleet_end_to_end(tmp_path: Path, source: str):
    kube = FakeKubeApi(seeded_configmap()) if source == "configmap" else None
    timings: dict[str, float] = {}
    with Stack(tmp_path) as stack, contextlib.ExitStack() as api:
        kube_url = api.enter_context(Threaded(kube.app())) if kube else None
        engines = stack.start_sim(time_scale=0.2, args=sim_args(tmp_path))
        decider_port = free_port()
        decider_url = f"http://127.0.0.1:{decider_port}"
        followers = start_followers(stack, engines, source, tmp_path, decider_url, kube_url)
        am_url = stack.start_alertmanager(control_url(decider_url) + "/api/v1/alerts")
        jobs = {"fleet": followers, "specguard-guard": [decider_url]}
        prom = stack.start_prometheus(decider_url, am_url, jobs=jobs)
        config = decider_config(engines, source, tmp_path, prom.url, kube_url)
        decider, _ = start_run(stack, "decider", config, decider_port)
        load = Load(followers)
        t0 = time.monotonic()

        # RC per class across replicas: the recording rule over the followers' own estimates
        creative_sel = 'task_type="creative",temperature_bucket="high",load_bucket="low",pool="spec-k4"'
        code_sel = 'task_type="code",temperature_bucket="greedy",load_bucket="low",pool="spec-k4"'
        (recorded,) = wait_until(
            "fleet RC of creative above 1", lambda: prom.query(f"{RC}{{{creative_sel}}} > 1"), 60, stack.procs
        )
        timings["RC recorded"] = time.monotonic() - t0

        def combined():
            """The recording rule's last value is the followers' estimates weighted by their samples
            (within 2%: a scrape appended after the rule's evaluation can still carry an earlier
            timestamp, so this query may see a newer estimate than the rule did)."""
            (row,) = prom.query(f"{RC}{{{creative_sel}}}")
            at, value = row["value"]
            by = {
                r["metric"]["what"]: float(r["value"][1])
                for r in prom.api("query", query=WEIGHTED.format(sel=creative_sel), time=at)["result"]
            }
            several = by.get("n", 0) >= 2  # several replicas' estimates, combined by the rule
            return by if several and by.get("r") == pytest.approx(float(value), rel=0.02) else None

        # the first follower can cross 1.0 before the others have min_samples (seen in a suite run)
        wait_until("RC recorded across replicas", combined, 45, stack.procs)
        code_rc = wait_until("fleet RC of code", lambda: prom.value(f"{RC}{{{code_sel}}}"), 30, stack.procs)
        assert min(code_rc.values()) < 1.0, code_rc

        # the decider moves the losing class; every follower routes it the new way within one
        # poll interval plus one scrape (measured on the decision's and Prometheus' own clocks)
        decisions = wait_until(
            "the decider moved creative",
            lambda: [r for r in audit(tmp_path / "audit.jsonl") if r["action"] == "off"],
            40,
            stack.procs,
        )
        timings["decided"] = time.monotonic() - t0
        # an alert without a load bucket (the full-rollback ratio's) moves the class at every load
        (moved,) = [r for r in decisions if r["class"] == "creative/high" and r["load_bucket"] == "low"]
        assert (moved["from"], moved["to"]) == ("spec-k4", "nospec")
        # on fleet-wide evidence: its PromQL rule (RC across replicas) or an alert on the fleet's series
        assert moved["cause"] in ("fleet-relative-cost", "alertmanager"), moved
        assert "fleet-relative-cost@spec-k4" in moved["numbers"]["rules"], moved
        assert {r["class"] for r in decisions} == {"creative/high"}
        version = moved["plan_version"]
        for url in followers:
            wait_until(  # or a newer one: the decider may publish again before a follower polls
                f"{url} follows version {version}",
                lambda url=url: plan_of(url)[0] >= version,
                POLL_SECONDS * 3,
                stack.procs,
                interval=0.1,
            )
            assert plan_of(url)[1][CREATIVE] == "nospec"
        timings["followed"] = time.monotonic() - t0
        # each follower's new version in Prometheus (the plan's cells come from the decider only)
        firsts = wait_until(
            "the new plan version scraped from every follower",
            lambda: len(adopted_at(prom, version)) == len(followers) and adopted_at(prom, version),
            10,
            stack.procs,
        )
        # from the moment the decider published the plan (wrote its plan file, served and patched it)
        published = (tmp_path / "decider-plan.json").stat().st_mtime
        delays = [at - published for at in firsts.values()]
        assert max(delays) <= POLL_SECONDS + SCRAPE_SECONDS + 1.0, delays  # 1 s: scheduling on a busy box
        plan_in_prometheus(prom, followers, version, creative_sel)
        print(
            "seconds from the plan's publication to Prometheus, per follower:", [round(d, 2) for d in delays]
        )
        before = [creative_routes(url) for url in followers]
        time.sleep(4)
        wait_until("12 creative requests a follower", lambda: routed(followers, before, 12), 60, stack.procs)
        results = load.stop()
        after = [creative_routes(url) for url in followers]
        for url, (nospec0, spec0), (nospec1, spec1) in zip(followers, before, after, strict=True):
            assert nospec1 - nospec0 > 3 * (spec1 - spec0), (url, before, after)  # probes only
        assert results and all(r.status == 200 for r in results)

        # fleet-wide per-class counters == the sum over the followers == the simulators' truth
        direct = follower_counters(followers)
        wait_until(
            "Prometheus holds the final counters", lambda: fleet_counters(prom) == direct, 10, stack.procs
        )
        real = truth_counts(next(iter(engines.values())), tuple(COUNTERS.values()))
        assert direct == real, (direct, real)
        assert {k[0] for k in real} == {"spec-k4", "nospec"} and len(real) == 4
        assert sum(row["requests"] for row in real.values()) == len(results)

        # the decider is killed: every follower keeps routing by the last plan
        plans = [plan_of(url) for url in followers]
        decided = plan_of(decider_url)
        decider.popen.kill()
        decider.popen.wait(10)
        stack.procs.remove(decider)
        survivors = Load(followers)
        time.sleep(POLL_SECONDS * 2.5)
        wait_until("12 creative requests a follower", lambda: routed(followers, after, 12), 60, stack.procs)
        survivors.stop()
        assert [plan_of(url) for url in followers] == plans
        ages = [sample(url, "specguard_plan_age_seconds") for url in followers]
        if source == "http":  # the decider was their source: unconfirmed since it died
            assert all(age >= POLL_SECONDS * 1.5 for age in ages), ages
            assert all(
                sample(url, "specguard_actuation_errors_total", actuator="follow") for url in followers
            )
        else:  # the ConfigMap still answers: the same plan, confirmed
            assert all(age <= POLL_SECONDS + 1 for age in ages), ages
        routes = [creative_routes(url) for url in followers]
        for url, (nospec0, spec0), (nospec1, spec1) in zip(followers, after, routes, strict=True):
            assert nospec1 - nospec0 > 3 * (spec1 - spec0), (url, after, routes)
        # ... and so does a follower restarted meanwhile, from its own plan file
        restarted = next(p for p in stack.procs if p.name == "follower-0")
        restarted.stop()
        stack.procs.remove(restarted)
        config = follower_config(0, engines, source, tmp_path, decider_url, kube_url)
        start_run(stack, "follower-0-restarted", config, int(followers[0].rsplit(":", 1)[1]))
        assert plan_of(followers[0]) == plans[0]

        # a restarted decider resumes the plan, no spurious change (ConfigMap variant: as a new pod
        # whose own plan file is gone, from the ConfigMap)
        if source == "configmap":
            (tmp_path / "decider-plan.json").unlink()
        records = audit(tmp_path / "audit.jsonl")
        config = decider_config(engines, source, tmp_path, prom.url, kube_url)
        start_run(stack, "decider-restarted", config, decider_port)
        leads = lambda: sample(decider_url, "specguard_guard_leader")  # noqa: E731
        wait_until("the restarted decider leads", leads, 30, stack.procs)
        leading_at = time.time()
        evaluated = lambda: sample(decider_url, "specguard_last_evaluation_timestamp_seconds") or 0  # noqa: E731
        wait_until("three evaluations as leader", lambda: evaluated() > leading_at + 3, 20, stack.procs)
        assert leads() == 1
        assert plan_of(decider_url) == decided
        assert audit(tmp_path / "audit.jsonl") == records
        time.sleep(POLL_SECONDS * 1.5)
        assert [plan_of(url) for url in followers] == plans
        if source == "http":
            ages = [sample(url, "specguard_plan_age_seconds") for url in followers]
            assert all(age <= POLL_SECONDS + 1 for age in ages), ages  # confirmed again
        else:
            assert kube.holder() == "specguard-guard-0"
        print(f"{source}: seconds after load start:", {k: round(v, 1) for k, v in timings.items()})
