"""``specguard run`` with the guard, over real HTTP on loopback: the simulator as the engines, the
tap in front, an Alertmanager payload in, the plan out to the router, /status, ``specguard
status``, /metrics, and a restart that keeps the plan."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import re

import aiohttp
import pytest
import yaml

from specguard import cli
from specguard.errors import ConfigError, InputError
from specguard.lab import loadgen
from specguard.monitor import config, guard_wiring
from specguard.monitor.app import Monitor
from specguard.sim import cluster

K = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
TOKEN = "tok-3f9a"
CREATIVE_KEYS = [("creative", "high", load) for load in ("low", "medium", "high")]


def config_text(sim, tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    pools = "\n".join(
        f'  - {{name: {name}, url: "{url}", engine: vllm, num_speculative_tokens: {K[name]}}}'
        for name, url in sim.urls.items()
    )
    return f"""
pools:
{pools}
tap: {{listen: "127.0.0.1:0", holdout_share: 0, probe_share: 0, default_pool: spec-k4, nospec_pool: nospec}}
scrape: {{interval_seconds: 3600}}
guard:
  interval_seconds: 1
  alerts: {{consecutive_failure_limit: 0, interval_seconds: 1}}
  rules:
    - {{name: relative-cost, measure: rc_lower, threshold: 1.0,
       restore_measure: rc_upper, restore_threshold: 0.95}}
server: {{token_file: "{tmp_path / "token"}"}}
actuators: {{plan_file: "{tmp_path / "plan.json"}", audit_log: "{tmp_path / "audit.jsonl"}"}}
"""


async def start(cfg):
    monitor = Monitor(cfg, rng=random.Random(0))
    guard = guard_wiring.configure(monitor, cfg)
    url = await monitor.start("127.0.0.1", 0)
    return monitor, guard, url


ALERT = {
    "version": "4",
    "status": "firing",
    "receiver": "specguard",
    "groupLabels": {},
    "commonLabels": {},
    "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093",
    "groupKey": '{}:{alertname="SpecGuardRelativeCostAboveOne"}',
    "truncatedAlerts": 0,
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "SpecGuardRelativeCostAboveOne", "task_type": "creative"},
            "annotations": {},
            "startsAt": "2026-11-29T10:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "",
            "fingerprint": "c0ffee",
        }
    ],
}


async def wait_for(predicate, seconds=20.0):
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


def status_cli(url, token_file):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["status", "--url", url, "--token-file", str(token_file), "--json"])
    return code, json.loads(out.getvalue())


async def test_run_with_guard_end_to_end(tmp_path):
    async with cluster.SimCluster.from_config(None, seed=0, dialect="vllm", time_scale=0.02) as sim:
        cfg = config.parse_text(config_text(sim, tmp_path), "specguard.yaml")
        monitor, guard, url = await start(cfg)
        try:
            async with aiohttp.ClientSession() as session:
                control = monitor.control_url
                async with session.post(f"{control}/api/v1/alerts", json=ALERT) as response:
                    assert response.status == 401  # no token
                headers = {"Authorization": f"Bearer {TOKEN}"}
                async with session.post(f"{control}/api/v1/alerts", json=ALERT, headers=headers) as response:
                    assert response.status == 200 and (await response.json())["outcomes"] == {"new": 1}
                # the alert is evidence: creative goes off at the next scheduled evaluation
                assert await wait_for(lambda: monitor.router.plan().get(CREATIVE_KEYS[0]) == "nospec")
                mix = [loadgen.RequestClass("creative", temperature=1.0), loadgen.RequestClass("code")]
                results = await loadgen.run_load(url, mix, 2, requests=6, seed=1, stream=True)
                assert {r.status for r in results} == {200}
                pools = {(r.task_type, r.pool) for r in monitor.stats.records()}
                assert pools == {("creative", "nospec"), ("code", "spec-k4")}
                # the cost model's view behind each evaluation is exported with it
                code_spec = 'pool="spec-k4",side="spec",task_type="code",temperature_bucket="greedy"'

                async def metrics_text() -> str:
                    async with session.get(f"{url}/metrics") as response:
                        return await response.text()

                for _ in range(100):
                    metrics = await metrics_text()
                    if f'specguard_relative_cost_samples{{load_bucket="low",{code_spec}}}' in metrics:
                        break
                    await asyncio.sleep(0.1)
            sample_line = rf"specguard_relative_cost_samples{{load_bucket=\"low\",{code_spec}}} (\S+)"
            samples = re.search(sample_line, metrics)
            assert samples is not None and float(samples.group(1)) > 0
            # no no-spec traffic for code: its RC is unknown (no ratio sample), never 1.0
            assert 'source="none",task_type="code"' in metrics
            code_ratio = (
                'specguard_relative_cost_per_token_ratio{load_bucket="low",pool="spec-k4",task_type="code"'
            )
            assert code_ratio not in metrics
            labels = 'load_bucket="low",task_type="creative",temperature_bucket="high"'
            line = f"specguard_speculation_enabled{{{labels}}} 0.0"
            assert line in metrics
            assert 'specguard_webhook_alerts_total{outcome="new",status="firing"} 1.0' in metrics
            code, status = await asyncio.to_thread(status_cli, monitor.control_url, tmp_path / "token")
            assert code == 0 and status["plan_version"] >= 1
            rows = {(c["task_type"], c["load_bucket"]): c for c in status["classes"]}
            assert rows[("creative", "low")]["pool"] == "nospec"
            assert status["decisions"][0]["action"] == "off" and "alert" in status["decisions"][0]["reason"]
        finally:
            await monitor.stop()
        assert guard.running is False

        # restart: the persisted plan is applied before any evaluation
        monitor, guard, url = await start(cfg)
        try:
            assert monitor.router.plan()[CREATIVE_KEYS[0]] == "nospec"
        finally:
            await monitor.stop()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert (
            cli.main(
                [
                    "status",
                    "--plan-file",
                    str(tmp_path / "plan.json"),
                    "--audit-log",
                    str(tmp_path / "audit.jsonl"),
                ]
            )
            == 0
        )
    text = out.getvalue()
    assert "creative/high" in text and "nospec" in text and "off" in text


def test_check_config_reports_guard_errors_with_positions(tmp_path):
    bad = """
pools:
  - {name: spec-k4, url: "http://127.0.0.1:1", num_speculative_tokens: 4}
  - {name: nospec, url: "http://127.0.0.1:2", num_speculative_tokens: 0}
guard:
  nospec_pool: nope
  cooldown_seconds: -1
  rules:
    - {name: rc, measure: rc, threshold: 1.0, restore_threshold: 1.1}
server: {insecure_loopback: true, token_env: X}
actuators: {webhook: {url: "ftp://x"}, follow: true}
"""
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main(["check-config", str(path)]) == 2
    text = err.getvalue()
    for expected in (
        f"{path}:6:3: guard.nospec_pool: ('nope') is not a configured pool (nospec, spec-k4)",
        f"{path}:7:3: guard.cooldown_seconds: (-1.0) must be >= 0",
        "guard.rules[0].restore_threshold: (1.1) must be <= threshold (1.0) when direction is above",
        "server.insecure_loopback: a token is configured: insecure_loopback must be false",
        "actuators.webhook.url: ('ftp://x') must be an http(s) URL",
        "actuators.follow: follow: true needs one plan source: actuators.configmap or actuators.plan_http",
    ):
        assert expected in text, text


@pytest.mark.parametrize("name", [[], {"a": 1}], ids=["list", "mapping"])
def test_pool_name_of_the_wrong_type_is_a_config_error(name):
    """A pool ``name:`` that is a list or mapping is the pools parser's ConfigError, not a
    TypeError from the guard's cross-check of pool names (found by the config fuzzer)."""
    data = yaml.safe_load(config.DEFAULT_CONFIG.read_text())
    data["pools"][2]["name"] = name
    with pytest.raises(ConfigError, match=r"pools\[2\]\.name"):
        config.parse_text(yaml.safe_dump(data), "bad.yaml")


async def test_policy_reload_applies_good_changes_and_keeps_the_old_on_errors(tmp_path):
    path = tmp_path / "specguard.yaml"
    base = """
pools:
  - {name: spec-k4, url: "http://127.0.0.1:9", num_speculative_tokens: 4}
  - {name: nospec, url: "http://127.0.0.1:9", num_speculative_tokens: 0}
tap: {listen: "127.0.0.1:0", default_pool: spec-k4, nospec_pool: nospec}
"""
    path.write_text(base + "guard: {cooldown_seconds: 60}\n")
    cfg = config.load(path)
    monitor = Monitor(cfg)
    guard = guard_wiring.configure(monitor, cfg)
    assert guard.policy.cooldown_seconds == 60
    await guard._reload()
    assert guard.counters.reloads == {}  # unchanged file: nothing to do
    path.write_text(base + "guard: {cooldown_seconds: 5, interval_seconds: 15}\n")
    await guard._reload()
    assert (guard.policy.cooldown_seconds, guard.policy.interval_seconds) == (5, 15)
    assert guard.policy.pools == {"spec-k4": 4, "nospec": 0} and guard.counters.reloads["ok"] == 1
    path.write_text(base + "guard: {cooldown_seconds: -3, nospec_pool: nope}\n")
    await guard._reload()
    assert guard.policy.cooldown_seconds == 5 and guard.counters.reloads["error"] == 1
    assert "guard.cooldown_seconds: (-3.0) must be >= 0" in guard.reload_error
    assert "guard.nospec_pool: ('nope') is not a configured pool" in guard.status()["policy_reload_error"]


async def test_override_of_an_unknown_class_is_refused_and_disabled_guard_only_applies_the_plan(tmp_path):
    path = tmp_path / "specguard.yaml"
    path.write_text(
        """
pools:
  - {name: spec-k4, url: "http://127.0.0.1:9", num_speculative_tokens: 4}
  - {name: nospec, url: "http://127.0.0.1:9", num_speculative_tokens: 0}
guard: {enabled: false}
"""
    )
    cfg = config.load(path)
    monitor = Monitor(cfg)
    guard = guard_wiring.configure(monitor, cfg)
    # no credential configured: an operator token is made at start
    assert [c.name for c in monitor._components] == ["control credential", "guard (disabled)"]
    with pytest.raises(InputError, match=r"task_type \('poetry'\) is not configured \(known: chat, code"):
        await guard.override("pause", "poetry")
    with pytest.raises(InputError, match=r"load_bucket \('huge'\) is not configured"):
        await guard.override("pause", "chat", load_bucket="huge")
    decisions = await guard.override("pause", "chat", "greedy")
    assert {d.key[2] for d in decisions} == {"low", "medium", "high"}


async def test_run_with_the_planner_and_the_spread_plans_from_its_own_window(tmp_path):
    """``guard.decider: planner`` and ``guard.spread`` in ``specguard run``: the daemon plans from the
    tap's own requests each evaluation, /status shows the plan and the spread, and traffic is served."""
    async with cluster.SimCluster.from_config(None, seed=0, dialect="vllm", time_scale=0.1) as sim:
        text = config_text(sim, tmp_path).replace(
            "guard:\n", "guard:\n  decider: planner\n  spread: true\n  min_samples: 5\n", 1
        )
        # without a calibration profile the step-cost fit needs the window to cover (pool, load
        # bucket) cells enough: a holdout on the no-spec pool, and load buckets this load reaches
        text = text.replace("holdout_share: 0,", "holdout_share: 0.3,").replace(
            "probe_share: 0,", "probe_share: 0.05,"
        )
        buckets = "[{name: low, max: 1}, {name: medium, max: 3}, {name: high, max: null}]"
        text += f"classes: {{load_buckets: {buckets}}}\n"
        cfg = config.parse_text(text, "specguard.yaml")
        monitor, guard, url = await start(cfg)
        try:
            await guard.evaluate()
            before = guard.status()["planner"]  # no traffic yet: no plan, and why
            assert before["plan"] is None and before["reason"].startswith("planner: no step-cost fit")
            mix = [loadgen.RequestClass("creative", temperature=1.0), loadgen.RequestClass("code")]
            for concurrency in (2, 8, 24):
                results = await loadgen.run_load(url, mix, concurrency, requests=80, seed=1, stream=True)
                assert {r.status for r in results} == {200}
            await guard.evaluate()
            status = guard.status()
            # both classes planned, code (greedy, accepts well) on K=4; where creative (high
            # temperature) goes is the planner's call on noise (its spread unit on K=4 is about 0.95):
            # its calls on fixed numbers are tests/rules/test_planner.py's. 10x real time, not 50x: at
            # 50x a CI run on a busy machine read code's steps from the machine's jitter and planned
            # it off speculation (its true spread unit on K=4 is about 0.35)
            plan = status["planner"]["plan"]
            assert set(plan) == {"code/greedy", "creative/high"} and plan["code/greedy"] == "spec-k4", plan
            # and the tap routes as planned (the router keeps what differs from the default pool)
            routed = monitor.router.plan()
            for task, temperature in (("code", "greedy"), ("creative", "high")):
                for load in ("low", "medium", "high"):
                    pool = routed.get((task, temperature, load), "spec-k4")
                    assert pool == plan[f"{task}/{temperature}"], (task, load, routed, plan)
            # probes and holdout priced by the plan (rules.planprobes): a class on K=4 gets its
            # least holdout share, one off speculation its probe, each within the tap's cap
            holdouts = monitor.router.class_holdouts()
            assert ("code", "greedy") in holdouts and 0.0 <= holdouts["code", "greedy"] <= 0.3, holdouts
            assert status["holdout"]["class_shares"] == {"/".join(k): v for k, v in sorted(holdouts.items())}
            for c in status["classes"]:
                if (
                    c["pool"] == "nospec"
                    and plan.get(f"{c['task_type']}/{c['temperature_bucket']}") == "nospec"
                ):
                    assert c["probe"]["basis"].startswith("planned"), c
                    assert (
                        c["probe"]["pool"] in ("spec-k4", "spec-k2") and 0.0 <= c["probe"]["share"] <= 0.05
                    ), c
            # proven optimal, unless the load runs read as a swing (then the plan is the one held for
            # both loads, chosen among four: rules.swing)
            swung = any("swinging" in why for why in guard.last_plan.reasons.values())
            assert status["planner"]["proven_optimal"] is True or swung, status["planner"]
            # the buckets with evidence enough (on a busy machine not every one reaches min_samples)
            spread = {
                (c["task_type"], c["load_bucket"]): c["spread"] for c in status["classes"] if c["spread"]
            }
            assert all(units["nospec"] == 1.0 for units in spread.values()), spread
            # code pays on K=4 where the spread prices it (not asserted at every bucket: at 50x
            # real time the step fit of a high bucket reads the machine's jitter as much as the sim)
            code = [units for (task, _), units in spread.items() if task == "code"]
            assert code and min(units["spec-k4"] for units in code) < 1.0, spread
        finally:
            await monitor.stop()
