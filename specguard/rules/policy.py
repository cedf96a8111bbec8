"""The guard policy: what counts as bad or good evidence, and how much of it moves a class.

Parsed from the ``guard:`` section of the config file (or the shipped ``default-policy.yaml``)
into frozen dataclasses. Semantics follow Argo Rollouts analysis (limits counted over
evaluations, ``> limit`` breaches, ``-1`` disables), HPA (stabilisation window before the
"safer" direction) and KEDA (a declared fallback when the data source keeps failing).
Every problem in the file is reported at once as ``file:line:col: path: message``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from specguard import configfile, schedules

DEFAULT_POLICY_PATH = Path(__file__).with_name("default-policy.yaml")

DEFAULT_INTERVAL_SECONDS = 30.0
DEFAULT_WINDOW_SECONDS = 300.0
DEFAULT_MIN_SAMPLES = 30
DEFAULT_CONSECUTIVE_FAILURE_LIMIT = 2
DEFAULT_FAILURE_LIMIT = 4
DEFAULT_FAILURE_WINDOW_SECONDS = 1800.0
DEFAULT_CONSECUTIVE_SUCCESS_LIMIT = 3
DEFAULT_CONSECUTIVE_ERROR_LIMIT = 4  # argo utils/defaults DefaultConsecutiveErrorLimit
DEFAULT_STABILIZATION_WINDOW_SECONDS = 300.0  # HPA scale-down default
DEFAULT_COOLDOWN_SECONDS = 60.0
DEFAULT_MAX_ACTIONS_PER_HOUR = 6

# Per-class numbers a rule can read from the local cost model (rules.evidence builds them).
MEASURES = (
    "rc",  # relative cost per token, point estimate
    "rc_lower",  # lower confidence bound of rc
    "rc_upper",  # upper confidence bound of rc
    "strict_accept_rate",  # accepted drafts / proposed drafts
    "accept_length",  # output tokens per verify round, bonus included
    "full_rollback_ratio",  # rounds that accepted no draft / rounds
    "full_rollback_request_ratio",  # requests whose rounds were mostly full rollbacks / requests
    "samples",  # spec-side requests behind the numbers
    "baseline_samples",  # no-spec-side requests behind the baseline
)
DIRECTIONS = ("above", "below")  # which side of the threshold is bad
SAFE_STATES = ("last", "nospec", "default")
PRIORS = ("none", "profile")
HOLDOUT_MODES = ("matched_on_demand", "capacity_matched", "on_demand", "fixed")
DECIDERS = ("per-class", "planner")
TEMPLATE_VARIABLES = ("task_type", "temperature_bucket", "load_bucket", "pool", "window")
_TEMPLATE = re.compile(r"{{\s*([A-Za-z_][A-Za-z0-9_]*)\s*}}")


@dataclass(frozen=True)
class Limits:
    """How many evaluations move a class; breached when ``counter > limit``; -1 disables a limit."""

    consecutive_failure_limit: int = DEFAULT_CONSECUTIVE_FAILURE_LIMIT
    """Bad evaluations in a row tolerated before acting (0 = act on the first)."""
    failure_limit: int = DEFAULT_FAILURE_LIMIT
    """Bad evaluations within ``failure_window_seconds`` tolerated before acting (cumulative)."""
    failure_window_seconds: float = DEFAULT_FAILURE_WINDOW_SECONDS
    """Seconds over which cumulative failures are counted."""
    consecutive_success_limit: int = DEFAULT_CONSECUTIVE_SUCCESS_LIMIT
    """Good evaluations in a row needed before restoring (reached when ``counter >= limit``)."""
    consecutive_error_limit: int = DEFAULT_CONSECUTIVE_ERROR_LIMIT
    """Data-source errors in a row tolerated before freezing the safe state."""
    stabilization_window_seconds: float = DEFAULT_STABILIZATION_WINDOW_SECONDS
    """Seconds the evidence must have stayed good before restoring."""
    min_samples: int = DEFAULT_MIN_SAMPLES
    """Spec-side requests a measurement needs; fewer is too little data (hold)."""
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    """Seconds between two evaluations of a rule."""


@dataclass(frozen=True)
class Rule:
    """One check: a measurement (or a PromQL query) against a threshold, in one direction."""

    name: str
    measure: str | None = "rc"
    """Local measurement read (one of MEASURES); None when ``query`` is set."""
    query: str | None = None
    """PromQL template ({{ task_type }}, {{ temperature_bucket }}, {{ load_bucket }}, {{ pool }},
    {{ window }}); must return one sample per class."""
    direction: str = "above"
    """``above``: values above ``threshold`` are bad; ``below``: values below it are bad."""
    threshold: float = 1.0
    """Act side: a value past it (in ``direction``) is a failed evaluation."""
    restore_threshold: float = 1.0
    """Good side: a value must be this far back (strictly) to count as a success (hysteresis)."""
    restore_measure: str | None = None
    """Measurement read for the good side (defaults to ``measure``), e.g. act on rc_lower, restore on rc."""
    limits: Limits = field(default_factory=Limits)
    dry_run: bool = False
    """Evaluated, logged and exported, never acted on (Argo ``dryRun``)."""

    def is_bad(self, value: float) -> bool:
        return value > self.threshold if self.direction == "above" else value < self.threshold

    def is_good(self, value: float) -> bool:
        if self.direction == "above":
            return value < self.restore_threshold
        return value > self.restore_threshold


@dataclass(frozen=True)
class AlertsPolicy:
    """Alertmanager alerts as evidence: a firing alert for a class is a failed evaluation."""

    enabled: bool = True
    limits: Limits = field(default_factory=lambda: Limits(consecutive_failure_limit=0, failure_limit=-1))
    firing_ttl_seconds: float = 6 * 3600.0
    """A firing alert not re-sent for this long is forgotten (Alertmanager repeats every 4 h)."""
    resolved_ttl_seconds: float = 3600.0
    """A resolved alert counts as recovery evidence for this long."""

    def as_rule(self) -> Rule:
        return Rule(name="alertmanager", measure=None, limits=self.limits)


@dataclass(frozen=True)
class Scaling:
    """``guard.scaling``: desired replicas per pool for an autoscaled fleet (``rules.desired``)."""

    target_in_flight: float = 16.0
    """Requests in flight per replica a pool is sized at where speculation does not set a lower one
    (the no-spec pool's, and the HPA target an in-flight autoscaler would use)."""
    start_delay_seconds: float = 120.0
    """How long a new replica takes to serve: a pool scales up only for demand that has lasted this long."""
    min_replicas: int = 1
    max_replicas: int = 0
    """0: no cap."""
    sustain_seconds: float | None = None
    """How long a class's demand must have lasted before replicas are asked for it (None: the start
    delay, so no replica is asked for a burst it would not outlast; 0: at once, as an in-flight HPA)."""

    @property
    def sustain(self) -> float:
        return self.start_delay_seconds if self.sustain_seconds is None else self.sustain_seconds


@dataclass(frozen=True)
class Policy:
    """The whole guard policy (``guard:`` section)."""

    rules: tuple[Rule, ...]
    enabled: bool = True
    """False: no evaluations at all (metrics and routing still run)."""
    dry_run: bool = False
    """Decide, log, audit and export every action, but never change the plan."""
    window_seconds: float = DEFAULT_WINDOW_SECONDS
    """Evidence window: statistics cover the last this many seconds ({{ window }} in PromQL)."""
    cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS
    """Minimum seconds between two actions on one class."""
    max_actions_per_hour: int = DEFAULT_MAX_ACTIONS_PER_HOUR
    """Cap on actions per class in any 3600 s; -1 disables."""
    safe_state: str = "last"
    """Where a class goes when its data source keeps failing: last (keep the plan), nospec, default."""
    shorten: bool = True
    """Try a shorter-K pool (by the cost model's what-if) before turning speculation off."""
    shorten_max_rc: float = 0.95
    """A shorter-K pool qualifies only when its predicted (or measured) rc is below this."""
    restore_on_prediction: bool = False
    """Allow restoring on what-if predictions alone; default needs probe measurements."""
    rc_rises_with_load: bool = True
    """A class+pool with too few samples at a load bucket inherits a loss (rc_lower > 1) measured at
    the nearest lower bucket, as a bound (docs/guard.md); never a gain, never for restoring."""
    best_pool: bool = True
    """Move a speculating class to the pool with the lowest relative cost per token (another K, or no
    speculation) when that pool is cheaper by ``best_pool_margin`` for more than
    ``best_pool_consecutive_limit`` evaluations in a row (``rules.bestpool``)."""
    best_pool_margin: float = 0.03
    """Relative margin: a pool is cheaper when its rc < the current pool's rc x (1 - margin)."""
    best_pool_consecutive_limit: int = 2
    """Evaluations in a row favouring the same cheaper pool tolerated before moving (act on the next)."""
    decider: str = "per-class"
    """``per-class``: each class moves to its cheapest pool (``best_pool``) and is restored by its
    rules; ``planner`` (in progress, not the default): one plan for every class, charged the load
    each move puts on the pool's replicas (``rules.planner``), in place of the best-pool choice and
    the restore rule; the watch rules, error freeze, pins, dry-run, cooldown and cap stay."""
    spread: bool = True
    """Each request of a class joins the pool where it adds least time at the loads now, among its
    pool and the pools whose cells have evidence enough (``rules.spread``), so a class heavier than
    its pool's replicas spills onto the others; false: each class whole on the pool its plan says."""
    scaling: Scaling | None = None
    """Desired replicas per pool from the fleet plan (``guard.decider: planner``), exported for an
    HPA or KEDA to scale each pool on; None: not computed."""
    memory_seconds: float = 3600.0
    """A pool a class left keeps its last measured rc as evidence this long (so predictions cannot
    send the class back to a pool whose measurement was worse: no flapping)."""
    prior: str = "profile"
    """``profile``: the calibration profile's rc per class, load bucket and pool is evidence where
    there is no live evidence (a warm start from ``specguard sweep``); ``none``: live evidence only.
    Read by the best-pool choice only: no effect with ``best_pool: false``."""
    holdout: str = "matched_on_demand"
    """``matched_on_demand``: ``on_demand``, and capacity matched in a load bucket only while its live
    baseline is short (the no-spec replicas climb to the fleet's load there until the window holds
    ``cost.baseline_min_samples`` requests at that load); ``capacity_matched``: a request planned on
    a speculative pool goes to the no-spec pool while that pool's load per replica is below the
    planned pool's (a tie: by their replica share), so the no-spec replicas run at the speculative
    replicas' load (a live baseline at every load bucket the fleet runs at) and take their share of
    the replica capacity; ``fixed``: every class always sends ``tap.holdout_share`` to the no-spec
    pool; ``on_demand``: per load bucket only as much of ``tap.holdout_share`` as keeps the live
    baseline filled (``holdout_min_share`` where planned no-spec traffic covers it; not with
    ``cost.baseline_scope: class_then_load``, whose classes each need their own)."""
    holdout_min_share: float = 0.0
    """Holdout share of a load bucket whose baseline is already covered by planned no-spec traffic."""
    alerts: AlertsPolicy = field(default_factory=AlertsPolicy)
    default_pool: str | None = None
    """Pool a class starts on and is restored to (None: the tap's ``default_pool``)."""
    nospec_pool: str | None = None
    """Pool for speculation off (None: the tap's ``nospec_pool``)."""
    pools: Mapping[str, int] = field(default_factory=dict)
    """Pool name -> num_speculative_tokens (0 = no speculation); filled in from ``pools:``."""
    k_schedules: Mapping[str, schedules.Schedule] = field(default_factory=dict)
    """Pool name -> its in-engine K schedule, for the pools launched with one (``pools:``): such a
    pool runs the K its schedule picks at its load, not ``pools``' K, and is priced so (``k_at``)."""
    prometheus_url: str | None = None
    """Prometheus base URL for PromQL rules (fleet mode); required when a rule has a query."""
    prometheus_timeout_seconds: float = 10.0
    """Timeout of one PromQL query (the client has none by default)."""
    replicas_query: str | None = None
    """Fleet mode: PromQL counting one pool's replicas that are up (``{{ pool }}`` filled in), e.g.
    ``count(specguard_engine_up{pool="{{ pool }}"} == 1)``; the counts travel with the plan."""
    local: bool = True
    """Read per-class numbers from this process's tap and cost model (standalone mode)."""
    version: str = ""
    """Short digest of the policy text, exported as specguard_config_info{version}."""
    default_rules: bool = False
    """True when the ``guard:`` section has no ``rules:`` key and the shipped default rules apply."""

    @property
    def all_rules(self) -> tuple[Rule, ...]:
        return self.rules + ((self.alerts.as_rule(),) if self.alerts.enabled else ())

    @property
    def interval_seconds(self) -> float:
        """The scheduler tick: the shortest rule interval."""
        return min((r.limits.interval_seconds for r in self.all_rules), default=DEFAULT_INTERVAL_SECONDS)

    def k_at(self, pool: str, load: float) -> int:
        """The K ``pool`` runs at ``load`` requests per replica: its schedule's, else its fixed K."""
        return schedules.k_at_load(self.pools.get(pool, 0), self.k_schedules.get(pool), load)

    def with_pools(
        self,
        pools: Mapping[str, int],
        default_pool: str | None,
        nospec_pool: str | None,
        k_schedules: Mapping[str, schedules.Schedule] | None = None,
    ) -> Policy:
        return replace(
            self,
            pools=dict(pools),
            k_schedules=dict(k_schedules or {}),
            default_pool=self.default_pool or default_pool,
            nospec_pool=self.nospec_pool or nospec_pool,
        )


def _limits(section: configfile.Section, base: Limits) -> Limits:
    def integer(key: str, value: int) -> int:
        return section.get(key, int, value, minimum=-1)

    return Limits(
        consecutive_failure_limit=integer("consecutive_failure_limit", base.consecutive_failure_limit),
        failure_limit=integer("failure_limit", base.failure_limit),
        failure_window_seconds=section.get(
            "failure_window_seconds", float, base.failure_window_seconds, minimum=1
        ),
        consecutive_success_limit=section.get(
            "consecutive_success_limit", int, base.consecutive_success_limit, minimum=1
        ),
        consecutive_error_limit=integer("consecutive_error_limit", base.consecutive_error_limit),
        stabilization_window_seconds=section.get(
            "stabilization_window_seconds", float, base.stabilization_window_seconds, minimum=0, maximum=86400
        ),
        min_samples=section.get("min_samples", int, base.min_samples, minimum=0),
        interval_seconds=section.get(
            "interval_seconds", float, base.interval_seconds, minimum=1, maximum=3600
        ),
    )


def _check_limits(section: configfile.Section, limits: Limits, *, own: bool = True) -> None:
    """Both failure limits disabled can never act; checked where the keys are set."""
    if not own and "failure_limit" not in section and "consecutive_failure_limit" not in section:
        return
    section.check(
        not (limits.consecutive_failure_limit < 0 and limits.failure_limit < 0),
        "failure_limit",
        "failure_limit and consecutive_failure_limit cannot both be disabled (-1)",
    )


def _rule(section: configfile.Section, base: Limits, names: set[str], has_prometheus: bool) -> Rule | None:
    name = section.get("name", str)
    query = section.get("query", str, None)
    measure = section.get("measure", str, None if query else "rc", choices=MEASURES)
    restore_measure = section.get("restore_measure", str, None, choices=MEASURES)
    direction = section.get("direction", str, "above", choices=DIRECTIONS)
    threshold = section.get("threshold", float)
    restore_threshold = section.get("restore_threshold", float, threshold)
    dry_run = section.get("dry_run", bool, False)
    limits = _limits(section, base)
    section.reject_unknown()
    _check_limits(section, limits, own=False)
    if name is not None:
        section.check(name not in names and name != "alertmanager", "name", f"duplicate rule name {name!r}")
        section.check(bool(re.fullmatch(r"[A-Za-z0-9_.-]+", name)), "name", "use letters, digits, _ . -")
        names.add(name)
    if query is not None:
        section.check("measure" not in section, "measure", "set either measure or query, not both")
        section.check(restore_measure is None, "restore_measure", "not allowed with query")
        section.check(has_prometheus, "query", "a rule with a query needs guard.prometheus.url")
        for variable in _TEMPLATE.findall(query):
            section.check(
                variable in TEMPLATE_VARIABLES,
                "query",
                f"unknown template variable {{{{ {variable} }}}} (known: {', '.join(TEMPLATE_VARIABLES)})",
            )
        measure = None
    if None in (name, threshold, direction, restore_threshold):
        return None
    if direction == "above":
        ok = section.check(
            restore_threshold <= threshold,
            "restore_threshold",
            f"({restore_threshold}) must be <= threshold ({threshold}) when direction is above",
        )
    else:
        ok = section.check(
            restore_threshold >= threshold,
            "restore_threshold",
            f"({restore_threshold}) must be >= threshold ({threshold}) when direction is below",
        )
    if not ok:
        return None
    return Rule(
        name=name,
        measure=measure,
        query=query,
        direction=direction,
        threshold=threshold,
        restore_threshold=restore_threshold,
        restore_measure=restore_measure,
        limits=limits,
        dry_run=dry_run,
    )


def parse(section: configfile.Section) -> Policy:
    """Build the Policy from a ``guard:`` section; problems are recorded on the document."""
    base = _limits(section, Limits())
    _check_limits(section, base)
    prometheus = section.section("prometheus")
    prometheus_url = prometheus.get("url", str, None)
    if prometheus_url is not None and not re.fullmatch(r"https?://[^/\s]+(/\S*)?", prometheus_url):
        prometheus.error("url", f"({prometheus_url!r}) must be an http(s) URL")
        prometheus_url = None
    prometheus_timeout = prometheus.get("timeout_seconds", float, 10.0, minimum=0.1, maximum=300)
    replicas_query = prometheus.get("replicas_query", str, None, nullable=True)
    if replicas_query is not None:
        prometheus.check(prometheus_url is not None, "replicas_query", "needs guard.prometheus.url")
        unknown = sorted(set(_TEMPLATE.findall(replicas_query)) - {"pool"})
        prometheus.check(
            not unknown, "replicas_query", f"knows only {{{{ pool }}}}, not {', '.join(unknown)}"
        )
    prometheus.reject_unknown()
    names: set[str] = set()
    defaults = "rules" not in section.data
    # No `rules:` key: the shipped rules, with this section's limits (a `guard:` written to set
    # dry_run or a limit must not silently leave the guard without its rules). `rules: []` is
    # an explicit "no rules": then only Alertmanager alerts move classes.
    items = _default_rule_items() if defaults else section.items("rules")
    rules = tuple(
        r for r in (_rule(item, base, names, prometheus_url is not None) for item in items) if r is not None
    )
    alerts_section = section.section("alerts")
    alert_base = replace(base, consecutive_failure_limit=0, failure_limit=-1, min_samples=0)
    alerts = AlertsPolicy(
        enabled=alerts_section.get("enabled", bool, True),
        limits=_limits(alerts_section, alert_base),
        firing_ttl_seconds=alerts_section.get("firing_ttl_seconds", float, 6 * 3600.0, minimum=60),
        resolved_ttl_seconds=alerts_section.get("resolved_ttl_seconds", float, 3600.0, minimum=0),
    )
    alerts_section.reject_unknown()
    scaling_section = section.section("scaling")  # (known whether set or not)
    scaling = _scaling(scaling_section) if section.data.get("scaling") is not None else None
    policy = Policy(
        rules=rules,
        enabled=section.get("enabled", bool, True),
        dry_run=section.get("dry_run", bool, False),
        window_seconds=section.get(
            "window_seconds", float, DEFAULT_WINDOW_SECONDS, minimum=10, maximum=86400
        ),
        cooldown_seconds=section.get("cooldown_seconds", float, DEFAULT_COOLDOWN_SECONDS, minimum=0),
        max_actions_per_hour=section.get(
            "max_actions_per_hour", int, DEFAULT_MAX_ACTIONS_PER_HOUR, minimum=-1
        ),
        safe_state=section.get("safe_state", str, "last", choices=SAFE_STATES),
        shorten=section.get("shorten", bool, True),
        shorten_max_rc=section.get("shorten_max_rc", float, 0.95, minimum=0),
        restore_on_prediction=section.get("restore_on_prediction", bool, False),
        rc_rises_with_load=section.get("rc_rises_with_load", bool, True),
        best_pool=section.get("best_pool", bool, True),
        best_pool_margin=section.get("best_pool_margin", float, 0.03, minimum=0, maximum=0.5),
        best_pool_consecutive_limit=section.get("best_pool_consecutive_limit", int, 2, minimum=0),
        decider=section.get("decider", str, "per-class", choices=DECIDERS),
        spread=section.get("spread", bool, True),
        scaling=scaling,
        memory_seconds=section.get("memory_seconds", float, 3600.0, minimum=0, maximum=7 * 86400),
        prior=section.get("prior", str, "profile", choices=PRIORS),
        holdout=section.get("holdout", str, "matched_on_demand", choices=HOLDOUT_MODES),
        holdout_min_share=section.get("holdout_min_share", float, 0.0, minimum=0, maximum=1),
        alerts=alerts,
        default_pool=section.get("default_pool", str, None, nullable=True),
        nospec_pool=section.get("nospec_pool", str, None, nullable=True),
        prometheus_url=prometheus_url.rstrip("/") if prometheus_url else None,
        prometheus_timeout_seconds=prometheus_timeout,
        replicas_query=replicas_query,
        local=section.get("local", bool, True),
        default_rules=defaults,
    )
    section.check(policy.max_actions_per_hour != 0, "max_actions_per_hour", "0 would forbid every action")
    section.check(
        scaling is None or policy.decider == "planner",
        "scaling",
        "desired replicas come from the fleet plan: set decider: planner",
    )
    section.check(
        policy.decider != "planner" or policy.local,
        "decider",
        "planner plans from the tap's own requests: it needs local: true (a fleet's decider reads PromQL)",
    )
    section.check(
        bool(rules) or alerts.enabled or "rules" not in section.data,
        "rules",
        "no rules and alerts disabled: the guard would never act",
    )
    section.reject_unknown()
    return policy


def _scaling(sub: configfile.Section) -> Scaling:
    out = Scaling(
        target_in_flight=sub.get("target_in_flight", float, 16.0, minimum=0.1),
        start_delay_seconds=sub.get("start_delay_seconds", float, 120.0, minimum=0, maximum=86400),
        min_replicas=sub.get("min_replicas", int, 1, minimum=0),
        max_replicas=sub.get("max_replicas", int, 0, minimum=0),
        sustain_seconds=sub.get("sustain_seconds", float, None, minimum=0, maximum=86400, nullable=True),
    )
    sub.check(
        not out.max_replicas or out.max_replicas >= out.min_replicas,
        "max_replicas",
        f"({out.max_replicas}) is below min_replicas ({out.min_replicas}); 0 means no cap",
    )
    sub.reject_unknown()
    return out


def _default_rule_items() -> list[configfile.Section]:
    """The shipped default policy's rule entries (located in its own file for any message)."""
    doc = configfile.parse_text(DEFAULT_POLICY_PATH.read_text(encoding="utf-8"), str(DEFAULT_POLICY_PATH))
    return list(doc.root().section("guard").items("rules"))


def parse_document(doc: configfile.Document, key: str = "guard") -> Policy:
    """The policy under ``key`` of a whole config document; the shipped default when absent."""
    return from_root(doc.root(), key)


def from_root(root: configfile.Section, key: str = "guard") -> Policy:
    """The policy under ``key`` of a root section (marks the key as known); default when absent."""
    if key not in root.data:
        root.section(key)
        return load_default()
    policy = parse(root.section(key))
    return replace(policy, version=_digest(json.dumps(root.data[key], sort_keys=True, default=str)))


def load_default() -> Policy:
    """The shipped, documented default policy."""
    text = DEFAULT_POLICY_PATH.read_text(encoding="utf-8")  # read once: parsed and digested
    doc = configfile.parse_text(text, str(DEFAULT_POLICY_PATH))
    policy = configfile.parse_with(doc, lambda root: parse(root.section("guard")))
    return replace(policy, version=_digest(text))


def parse_text(text: str, file: str = "<policy>") -> Policy:
    """Parse a whole YAML document holding a ``guard:`` section (raises ConfigError with every issue)."""
    doc = configfile.parse_text(text, file)
    policy = configfile.parse_with(doc, lambda root: parse(root.section("guard", required=True)))
    return replace(policy, version=_digest(text))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def render_query(template: str, variables: Mapping[str, str]) -> str:
    """Fill ``{{ name }}`` placeholders; label values are escaped for PromQL string literals."""

    def fill(match: re.Match[str]) -> str:
        value = str(variables.get(match.group(1), ""))
        return value.replace("\\", "\\\\").replace('"', '\\"')

    return _TEMPLATE.sub(fill, template)


def window_text(seconds: float) -> str:
    """A PromQL duration for ``{{ window }}`` (``300s`` -> ``5m``)."""
    whole = int(round(seconds))
    if whole % 3600 == 0:
        return f"{whole // 3600}h"
    if whole % 60 == 0:
        return f"{whole // 60}m"
    return f"{whole}s"
