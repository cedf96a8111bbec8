"""The guard's Prometheus metrics (names in contracts.md), rendered from the daemon's state.

One collector: ``collect()`` reads what the last evaluation stored and never waits or raises.
Counters are plain integers owned here and incremented by the daemon and the receiver.

Per role: the plan's cells (``specguard_plan_info``, ``_speculation_enabled``,
``_num_speculative_tokens``) come only from the process that decides the plan — standalone, or
the fleet's leading decider. A fleet's followers all hold that plan and export its version
(``specguard_plan_version``, which ``SpecGuardPlanStale`` compares with the leader's); a standby
decider's plan may be old until it takes over. A follower exports no evaluation counts, frozen
flag or error streak either: it never evaluates, and those would repeat its decider's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from specguard.rules.evidence import ClassKey

CLASS_LABELS = ["task_type", "temperature_bucket", "load_bucket"]


@dataclass
class GuardCounters:
    """Monotonic counters; labels are bounded by the config (classes, actions, phases)."""

    actions: Counter[tuple[str, str, str, str]] = field(
        default_factory=Counter
    )  # (task, temp, action, reason)
    # when each action label set first happened: exported as specguard_actions_created, so a
    # decision taken before Prometheus's first scrape still has its real time
    action_created: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    evaluations: Counter[str] = field(default_factory=Counter)  # result
    webhook_alerts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (status, outcome)
    actuation_errors: Counter[str] = field(default_factory=Counter)  # actuator
    plan_write_errors: int = 0
    reloads: Counter[str] = field(default_factory=Counter)  # result: ok | error
    api_auth_failures: Counter[tuple[str, str]] = field(default_factory=Counter)  # (endpoint, code)
    plans_ignored: int = 0  # a follower: plans its source served that were not newer than its own

    def count_action(self, labels: tuple[str, str, str, str], at: float) -> None:
        self.actions[labels] += 1
        self.action_created.setdefault(labels, at)


PLANS_IGNORED_HELP = "Plans a follower's source served that were not newer than its own (ignored)"


@dataclass(frozen=True)
class GuardView:
    """What the collector renders; the daemon builds it after each evaluation."""

    plan: Mapping[ClassKey, str]
    pools: Mapping[str, int]
    last_evaluation: float | None
    frozen: bool
    consecutive_errors: int
    config_version: str
    audit_write_errors: int
    plan_version: int
    plan_age_seconds: float | None = None
    """A follower's seconds since its source last confirmed its plan (None: a decider)."""
    leader: bool | None = None
    """A decider's role: True when it decides, False on standby (None: a follower)."""
    last_evaluation_seconds: float | None = None
    """Wall time of the last deciding evaluation (PromQL queries included)."""
    desired_replicas: Mapping[str, int] = field(default_factory=dict)
    """``guard.scaling``: replicas each pool should have for the plan's traffic (``rules.desired``)."""


PLAN_AGE_HELP = "Follower: seconds since its plan source (decider or ConfigMap) last confirmed its plan"
LEADER_HELP = "Decider: 1 while it decides (leads, or no election), 0 on standby"
DURATION_HELP = "Seconds the last deciding evaluation took (evidence queries included)"
DESIRED_HELP = "Replicas the pool should have for the traffic the fleet plan puts on it (guard.scaling)"


def _fleet(view: GuardView) -> Iterator:
    """Families only one role has: a follower's plan age; a decider's leadership and round time."""
    age = GaugeMetricFamily("specguard_plan_age_seconds", PLAN_AGE_HELP)
    if view.plan_age_seconds is not None:
        age.add_metric([], view.plan_age_seconds)
    yield age
    leader = GaugeMetricFamily("specguard_guard_leader", LEADER_HELP)
    if view.leader is not None:
        leader.add_metric([], 1.0 if view.leader else 0.0)
    yield leader
    duration = GaugeMetricFamily("specguard_last_evaluation_duration_seconds", DURATION_HELP)
    if view.last_evaluation_seconds is not None:
        duration.add_metric([], view.last_evaluation_seconds)
    yield duration
    wanted = GaugeMetricFamily("specguard_pool_desired_replicas", DESIRED_HELP, labels=["pool"])
    for pool, count in sorted(view.desired_replicas.items()):
        wanted.add_metric([pool], float(count))
    yield wanted


class GuardCollector(Collector):
    def __init__(self, counters: GuardCounters, view: Callable[[], GuardView]):
        self._counters = counters
        self._view = view

    def describe(self) -> Iterator:
        yield GaugeMetricFamily(
            "specguard_speculation_enabled", "1 when the plan routes the class to a speculative pool"
        )
        yield GaugeMetricFamily(
            "specguard_num_speculative_tokens", "K of the pool the plan routes the class to"
        )
        yield GaugeMetricFamily("specguard_plan_info", "The pool the plan routes the class to (value 1)")
        yield CounterMetricFamily("specguard_actions", "Guard actions by class, action and reason")
        yield CounterMetricFamily(
            "specguard_evaluations", "Class evaluations by result (ok, act, hold, error)"
        )
        yield GaugeMetricFamily(
            "specguard_last_evaluation_timestamp_seconds", "Unix time of the last evaluation"
        )
        yield GaugeMetricFamily("specguard_guard_frozen", "1 when a class is frozen in its safe state")
        yield GaugeMetricFamily(
            "specguard_consecutive_errors", "Most consecutive data-source errors of any class"
        )
        yield CounterMetricFamily(
            "specguard_webhook_alerts", "Alertmanager alerts received by status and outcome"
        )
        yield CounterMetricFamily("specguard_audit_write_errors", "Audit log appends that failed")
        yield CounterMetricFamily("specguard_actuation_errors", "Actuator applications that failed")
        yield CounterMetricFamily("specguard_plan_write_errors", "Plan file writes that failed")
        yield GaugeMetricFamily("specguard_plan_version", "Version of the plan the guard holds")
        yield CounterMetricFamily("specguard_plans_ignored", PLANS_IGNORED_HELP)
        yield GaugeMetricFamily("specguard_plan_age_seconds", PLAN_AGE_HELP)
        yield GaugeMetricFamily("specguard_guard_leader", LEADER_HELP)
        yield GaugeMetricFamily("specguard_last_evaluation_duration_seconds", DURATION_HELP)
        yield GaugeMetricFamily("specguard_pool_desired_replicas", DESIRED_HELP)
        yield CounterMetricFamily("specguard_policy_reloads", "Policy reloads from the config file by result")
        yield CounterMetricFamily(
            "specguard_api_auth_failures",
            "Requests to /api/v1/alerts and /api/v1/overrides refused (401, 403)",
        )
        yield InfoMetricFamily("specguard_config", "Digest of the guard policy in use")

    def collect(self) -> Iterator:
        view = self._view()
        counters = self._counters
        enabled = GaugeMetricFamily(
            "specguard_speculation_enabled",
            "1 when the plan routes the class to a speculative pool",
            labels=CLASS_LABELS,
        )
        tokens = GaugeMetricFamily(
            "specguard_num_speculative_tokens",
            "K of the pool the plan routes the class to",
            labels=CLASS_LABELS,
        )
        info = GaugeMetricFamily(
            "specguard_plan_info",
            "The pool the plan routes the class to (value 1)",
            labels=[*CLASS_LABELS, "pool"],
        )
        # the plan's cells come from the process that decides it (standalone, or the fleet's
        # leading decider): every follower holds the same plan, and says which by its version
        for key, pool in sorted(view.plan.items()) if view.leader else ():
            k = view.pools.get(pool, 0)
            enabled.add_metric(list(key), 1.0 if k > 0 else 0.0)
            tokens.add_metric(list(key), float(k))
            info.add_metric([*key, pool], 1.0)
        yield enabled
        yield tokens
        yield info
        actions = CounterMetricFamily(
            "specguard_actions",
            "Guard actions by class, action and reason",
            labels=["task_type", "temperature_bucket", "action", "reason"],
        )
        for labels, value in sorted(counters.actions.items()):
            actions.add_metric(list(labels), value, created=counters.action_created.get(labels))
        yield actions
        follower = view.leader is None
        evaluations = CounterMetricFamily(
            "specguard_evaluations", "Class evaluations by result (ok, act, hold, error)", labels=["result"]
        )
        for result in ("ok", "act", "hold", "error") if not follower else ():  # a follower never evaluates
            evaluations.add_metric([result], counters.evaluations.get(result, 0))
        yield evaluations
        last = GaugeMetricFamily(
            "specguard_last_evaluation_timestamp_seconds", "Unix time of the last evaluation"
        )
        if view.last_evaluation is not None:
            last.add_metric([], view.last_evaluation)
        yield last
        frozen = GaugeMetricFamily("specguard_guard_frozen", "1 when a class is frozen in its safe state")
        errors = GaugeMetricFamily(
            "specguard_consecutive_errors", "Most consecutive data-source errors of any class"
        )
        if not follower:  # a follower's would only repeat its decider's state
            frozen.add_metric([], 1.0 if view.frozen else 0.0)
            errors.add_metric([], float(view.consecutive_errors))
        yield frozen
        yield errors
        alerts = CounterMetricFamily(
            "specguard_webhook_alerts",
            "Alertmanager alerts received by status and outcome",
            labels=["status", "outcome"],
        )
        for labels, value in sorted(counters.webhook_alerts.items()):
            alerts.add_metric(list(labels), value)
        yield alerts
        yield CounterMetricFamily(
            "specguard_audit_write_errors", "Audit log appends that failed", value=view.audit_write_errors
        )
        failed = CounterMetricFamily(
            "specguard_actuation_errors", "Actuator applications that failed", labels=["actuator"]
        )
        for name, value in sorted(counters.actuation_errors.items()):
            failed.add_metric([name], value)
        yield failed
        yield CounterMetricFamily(
            "specguard_plan_write_errors", "Plan file writes that failed", value=counters.plan_write_errors
        )
        yield GaugeMetricFamily(
            "specguard_plan_version", "Version of the plan the guard holds", value=float(view.plan_version)
        )
        yield CounterMetricFamily("specguard_plans_ignored", PLANS_IGNORED_HELP, value=counters.plans_ignored)
        yield from _fleet(view)
        reloads = CounterMetricFamily(
            "specguard_policy_reloads", "Policy reloads from the config file by result", labels=["result"]
        )
        for result in ("ok", "error"):
            reloads.add_metric([result], counters.reloads.get(result, 0))
        yield reloads
        refused = CounterMetricFamily(
            "specguard_api_auth_failures",
            "Requests to /api/v1/alerts and /api/v1/overrides refused (401, 403)",
            labels=["endpoint", "code"],
        )
        for labels, value in sorted(counters.api_auth_failures.items()):
            refused.add_metric(list(labels), value)
        yield refused
        yield InfoMetricFamily(
            "specguard_config", "Digest of the guard policy in use", value={"version": view.config_version}
        )
