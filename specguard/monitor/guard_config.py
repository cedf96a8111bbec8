"""The guard's config sections besides the policy: ``server:``, ``actuators:``, ``alertmanager:``.

Example::

    server:
      token_file: /etc/specguard/token   # bearer token for /api/v1/alerts and /api/v1/overrides
      token_env: SPECGUARD_TOKEN         # ... or read from this environment variable
      insecure_loopback: false           # true: no token, allowed only when tap.listen is a loopback address
      max_body_bytes: 1048576            # larger webhook/override bodies get 413
      status_decisions: 50               # last decisions shown by /status
    actuators:
      router: true                       # the tap's own routing follows the plan
      plan_file: /var/lib/specguard/plan.json    # persisted plan (atomic), reloaded on restart
      audit_log: /var/lib/specguard/audit.jsonl  # one JSON line per action
      webhook: {url: https://hooks.example/specguard, timeout_seconds: 5, retries: 2}
      configmap: {namespace: serving, name: specguard-routing, key: plan.json}
      follow: false                      # fleet replica: read the plan (ConfigMap or plan_http), never decide
      plan_http: {urls: ["http://decider:8090"], timeout_seconds: 2}   # a follower polls GET /api/v1/plan
      leader_election: {mode: auto}      # deciders: auto = a Lease with configmap, else a lock on plan_file
    alertmanager:
      enabled: true                      # mount POST /api/v1/alerts
      max_alerts: 10000                  # alerts kept at most (oldest received dropped first)
      max_alerts_per_class: 16           # per class, pool and alert name
      url: http://alertmanager:9093      # at start-up, read the active alerts back (API v2); optional
      receiver: specguard                # ... only those routed to this receiver (a regex); optional
      timeout_seconds: 10
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from specguard import configfile, untrusted
from specguard.errors import ConfigError, InputError

TOKEN_FILE_LIMIT = 4096
"""Largest token file read, bytes (a token is tens of bytes; /dev/zero must not be read for ever)."""


@dataclass(frozen=True)
class ServerSettings:
    token_file: str | None = None
    """File holding the bearer token (whitespace stripped)."""
    token_env: str | None = None
    """Environment variable holding the bearer token."""
    insecure_loopback: bool = False
    """Serve mutating endpoints without a token; only allowed on a loopback listen address."""
    max_body_bytes: int = 1 << 20
    """Largest accepted webhook/override body, bytes."""
    status_decisions: int = 50
    """How many recent decisions /status returns."""

    def token(self) -> str | None:
        """The configured token, or None. Raises ConfigError when the file cannot be read."""
        if self.token_file:
            try:
                raw = untrusted.read_bytes(self.token_file, TOKEN_FILE_LIMIT, "token file")
                value = raw.decode("utf-8").strip()
            except OSError as exc:
                raise ConfigError(
                    f"server.token_file: cannot read {self.token_file}: {exc.strerror}"
                ) from exc
            except (InputError, UnicodeDecodeError) as exc:
                reason = exc if isinstance(exc, InputError) else "not UTF-8 text"
                raise ConfigError(f"server.token_file: {reason}") from exc
            if not value:
                raise ConfigError(f"server.token_file: {self.token_file} is empty")
            return value
        if self.token_env:
            value = os.environ.get(self.token_env, "").strip()
            if not value:
                raise ConfigError(
                    f"server.token_env: environment variable {self.token_env} is not set or empty"
                )
            return value
        return None


@dataclass(frozen=True)
class WebhookSettings:
    url: str
    timeout_seconds: float = 5.0
    retries: int = 2


@dataclass(frozen=True)
class ConfigMapSettings:
    namespace: str
    name: str
    key: str = "plan.json"
    kubeconfig: str | None = None
    api_server: str | None = None
    """Kubernetes API base URL (e.g. a ``kubectl proxy``); default: in-cluster, then kubeconfig."""
    timeout_seconds: float = 10.0
    conflict_retries: int = 5


@dataclass(frozen=True)
class PlanHttpSettings:
    urls: tuple[str, ...]
    """Deciders' base URLs (or full plan URLs), tried in order; the plan is GET <url>/api/v1/plan."""
    timeout_seconds: float = 2.0
    """Timeout of one poll of one decider."""


LEADER_MODES = ("auto", "lease", "lock", "none")


@dataclass(frozen=True)
class LeaderElectionSettings:
    mode: str = "auto"
    """auto: a Kubernetes Lease when actuators.configmap is set, else a lock on plan_file (none without
    one); lease; lock; none (one decider only)."""
    lease_name: str = "specguard-guard"
    """The coordination.k8s.io/v1 Lease (in configmap.namespace unless lease_namespace is set)."""
    lease_namespace: str | None = None
    identity: str | None = None
    """This candidate's name (default: $SPECGUARD_POD_NAME, else hostname-pid)."""
    lease_duration_seconds: int = 15
    """A standby takes a Lease not renewed for this long (the Lease's whole leaseDurationSeconds)."""
    renew_deadline_seconds: float = 10.0
    """The leader stops deciding when it has not renewed for this long."""
    retry_period_seconds: float = 2.0
    """Seconds between two tries (renewals, acquisitions, lock attempts)."""


@dataclass(frozen=True)
class ActuatorSettings:
    router: bool = True
    plan_file: str | None = None
    audit_log: str | None = None
    webhook: WebhookSettings | None = None
    configmap: ConfigMapSettings | None = None
    follow: bool = False
    plan_http: PlanHttpSettings | None = None
    leader_election: LeaderElectionSettings = field(default_factory=LeaderElectionSettings)


@dataclass(frozen=True)
class AlertmanagerSettings:
    enabled: bool = True
    max_alerts: int = 10_000
    """Alerts kept at most (the oldest received go first)."""
    max_alerts_per_class: int = 16
    """Alerts kept at most per class, pool and alert name (a flood of one kind dedupes to this)."""
    url: str | None = None
    """Alertmanager base URL: the active alerts are read back from its API at start-up."""
    receiver: str | None = None
    """Only alerts routed to this receiver (Alertmanager's ``receiver`` filter, a regex)."""
    timeout_seconds: float = 10.0


@dataclass(frozen=True)
class GuardSettings:
    server: ServerSettings = field(default_factory=ServerSettings)
    actuators: ActuatorSettings = field(default_factory=ActuatorSettings)
    alertmanager: AlertmanagerSettings = field(default_factory=AlertmanagerSettings)


def parse_server(root: configfile.Section) -> ServerSettings:
    s = root.section("server")
    out = ServerSettings(
        token_file=s.get("token_file", str, None, nullable=True),
        token_env=s.get("token_env", str, None, nullable=True),
        insecure_loopback=s.get("insecure_loopback", bool, False),
        max_body_bytes=s.get("max_body_bytes", int, 1 << 20, minimum=1024, maximum=64 << 20),
        status_decisions=s.get("status_decisions", int, 50, minimum=0, maximum=10000),
    )
    s.check(not (out.token_file and out.token_env), "token_env", "set token_file or token_env, not both")
    s.check(
        not (out.insecure_loopback and (out.token_file or out.token_env)),
        "insecure_loopback",
        "a token is configured: insecure_loopback must be false",
    )
    s.reject_unknown()
    return out


def parse_actuators(root: configfile.Section) -> ActuatorSettings:
    s = root.section("actuators")
    webhook = None
    if "webhook" in s and s.data.get("webhook") is not None:
        w = s.section("webhook")
        url = w.get("url", str)
        if url is not None and not url.startswith(("http://", "https://")):
            w.error("url", f"({url!r}) must be an http(s) URL")
        webhook = WebhookSettings(
            url=url or "",
            timeout_seconds=w.get("timeout_seconds", float, 5.0, minimum=0.1, maximum=120),
            retries=w.get("retries", int, 2, minimum=0, maximum=10),
        )
        w.reject_unknown()
    configmap = None
    if "configmap" in s and s.data.get("configmap") is not None:
        c = s.section("configmap")
        configmap = ConfigMapSettings(
            namespace=c.get("namespace", str) or "",
            name=c.get("name", str) or "",
            key=c.get("key", str, "plan.json"),
            kubeconfig=c.get("kubeconfig", str, None, nullable=True),
            api_server=c.get("api_server", str, None, nullable=True),
            timeout_seconds=c.get("timeout_seconds", float, 10.0, minimum=0.1, maximum=120),
            conflict_retries=c.get("conflict_retries", int, 5, minimum=0, maximum=50),
        )
        c.reject_unknown()
    out = ActuatorSettings(
        router=s.get("router", bool, True),
        plan_file=s.get("plan_file", str, None, nullable=True),
        audit_log=s.get("audit_log", str, None, nullable=True),
        webhook=webhook,
        configmap=configmap,
        follow=s.get("follow", bool, False),
        plan_http=_plan_http(s),
        leader_election=_leader_election(s),
    )
    sources = (configmap is not None) + (out.plan_http is not None)
    s.check(
        not out.follow or sources == 1,
        "follow",
        "follow: true needs one plan source: actuators.configmap or actuators.plan_http",
    )
    s.check(
        out.plan_http is None or out.follow,
        "plan_http",
        "is where a follower reads the plan: set follow: true (a decider serves GET /api/v1/plan itself)",
    )
    mode = out.leader_election.mode
    s.check(
        mode != "lease" or configmap is not None, "leader_election", "mode lease needs actuators.configmap"
    )
    s.check(
        mode != "lock" or out.plan_file is not None, "leader_election", "mode lock needs actuators.plan_file"
    )
    s.reject_unknown()
    return out


def _plan_http(s: configfile.Section) -> PlanHttpSettings | None:
    h = s.section("plan_http")
    if s.data.get("plan_http") is None:
        return None  # absent or null: no HTTP plan source
    urls = []
    for index, url in h.values("urls", required=True):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            h.error(f"urls[{index}]", f"({url!r}) must be an http(s) URL")
        else:
            urls.append(url)
    h.check(bool(urls) or "urls" not in h.data, "urls", "must name at least one decider")
    out = PlanHttpSettings(
        urls=tuple(urls), timeout_seconds=h.get("timeout_seconds", float, 2.0, minimum=0.1, maximum=60)
    )
    h.reject_unknown()
    return out


def _leader_election(s: configfile.Section) -> LeaderElectionSettings:
    e = s.section("leader_election")
    base = LeaderElectionSettings()
    out = LeaderElectionSettings(
        mode=e.get("mode", str, base.mode, choices=LEADER_MODES),
        lease_name=e.get("lease_name", str, base.lease_name),
        lease_namespace=e.get("lease_namespace", str, None, nullable=True),
        identity=e.get("identity", str, None, nullable=True),
        lease_duration_seconds=e.get("lease_duration_seconds", int, 15, minimum=1, maximum=3600),
        renew_deadline_seconds=e.get("renew_deadline_seconds", float, 10.0, minimum=1, maximum=3600),
        retry_period_seconds=e.get("retry_period_seconds", float, 2.0, minimum=1, maximum=600),
    )
    # the client library exits the process on these; say so here instead
    e.check(
        out.lease_duration_seconds > out.renew_deadline_seconds,
        "lease_duration_seconds",
        f"({out.lease_duration_seconds:g}) must be > renew_deadline_seconds ({out.renew_deadline_seconds:g})",
    )
    e.check(
        out.renew_deadline_seconds > 1.2 * out.retry_period_seconds,
        "renew_deadline_seconds",
        f"({out.renew_deadline_seconds:g}) must be > 1.2 x retry_period_seconds "
        f"({out.retry_period_seconds:g})",
    )
    e.reject_unknown()
    return out


def parse_alertmanager(root: configfile.Section) -> AlertmanagerSettings:
    s = root.section("alertmanager")
    url = s.get("url", str, None, nullable=True)
    if url is not None and not url.startswith(("http://", "https://")):
        s.error("url", f"({url!r}) must be an http(s) URL")
        url = None
    out = AlertmanagerSettings(
        enabled=s.get("enabled", bool, True),
        max_alerts=s.get("max_alerts", int, 10_000, minimum=1, maximum=1_000_000),
        max_alerts_per_class=s.get("max_alerts_per_class", int, 16, minimum=1, maximum=10_000),
        url=url.rstrip("/") if url else None,
        receiver=s.get("receiver", str, None, nullable=True),
        timeout_seconds=s.get("timeout_seconds", float, 10.0, minimum=0.1, maximum=120),
    )
    s.reject_unknown()
    return out


def check_listen(settings: ServerSettings, listen_host: str) -> None:
    """Refuse an insecure (tokenless) API on anything but a loopback address."""
    if not settings.insecure_loopback:
        return
    host = listen_host.strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(
            f"server.insecure_loopback is true but the listen address {listen_host} is not loopback: "
            "configure server.token_file or server.token_env"
        )
