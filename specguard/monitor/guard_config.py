"""The guard's config sections besides the policy: ``server:``, ``actuators:``, ``alertmanager:``.

Example::

    server:
      listen: 127.0.0.1:8091             # the control listener (default: 127.0.0.1, tap.listen's port + 1)
      credentials:                       # bearer tokens per role (files or environment variables)
        - {name: am, role: alertmanager, token_file: /etc/specguard/am-token}      # POST /api/v1/alerts
        - {name: ops, role: operator, token_file: /etc/specguard/ops-token}        # /status, overrides, plan
        - {name: fleet, role: follower, token_env: SPECGUARD_FOLLOWER_TOKEN}       # GET /api/v1/plan
      token_file: /etc/specguard/token   # legacy: one token with every role (credential name "token")
      token_env: SPECGUARD_TOKEN         # ... or read from this environment variable
      insecure_loopback: false           # true: no token, allowed only when server.listen is loopback
      failed_auth_limit: 10              # failed authentications per peer and window, then 429
      failed_auth_window_seconds: 10
      alerts_per_second: 1.0             # webhooks accepted per second (a bucket of alerts_burst), then 429
      alerts_burst: 30
      overrides_per_second: 1.0          # overrides accepted per second (a bucket of overrides_burst)
      overrides_burst: 10
      tls: {cert_file: /etc/specguard/tls.crt, key_file: /etc/specguard/tls.key,
            client_ca_file: /etc/specguard/ca.crt}  # optional; with client_ca_file a client cert is required
      max_body_bytes: 1048576            # larger webhook/override bodies get 413
      status_decisions: 50               # last decisions shown by /status
    actuators:
      router: true                       # the tap's own routing follows the plan
      plan_file: /var/lib/specguard/plan.json    # persisted plan (atomic), reloaded on restart
      audit_log: /var/lib/specguard/audit.jsonl  # one JSON line per action
      webhook: {url: https://hooks.example/specguard, timeout_seconds: 5, retries: 2}
      configmap: {namespace: serving, name: specguard-routing, key: plan.json}
      follow: false                      # fleet replica: read the plan (ConfigMap or plan_http), never decide
      plan_http: {urls: ["http://decider:8091"], timeout_seconds: 2,  # a follower polls GET /api/v1/plan
                  token_file: /etc/specguard/follower-token}            # ... as a follower credential
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


ROLES = ("alertmanager", "operator", "follower")
"""Who may call what on the control listener: Alertmanager posts alerts; operators read /status, the
plan and overrides and set overrides; followers read the plan."""


def read_token(path: str, key: str) -> str:
    """The token in ``path`` (whitespace stripped); ConfigError naming ``key`` when it cannot be read."""
    try:
        raw = untrusted.read_bytes(path, TOKEN_FILE_LIMIT, "token file")
        value = raw.decode("utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from exc
    except (InputError, UnicodeDecodeError) as exc:
        reason = exc if isinstance(exc, InputError) else "not UTF-8 text"
        raise ConfigError(f"{key}: {reason}") from exc
    if not value:
        raise ConfigError(f"{key}: {path} is empty")
    return value


def env_token(name: str, key: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ConfigError(f"{key}: environment variable {name} is not set or empty")
    return value


RESERVED_NAMES = ("token", "generated", "insecure_loopback")
"""Credential names specguard gives itself: the legacy server.token_file, the generated operator
token, the insecure loopback mode."""


@dataclass(frozen=True)
class CredentialSettings:
    """One caller of the control listener: a name (in the audit log), its roles and its token."""

    name: str
    roles: tuple[str, ...]
    token_file: str | None = None
    token_env: str | None = None
    where: str = "server.credentials"

    def token(self) -> str:
        if self.token_file:
            return read_token(self.token_file, f"{self.where}.token_file")
        return env_token(self.token_env or "", f"{self.where}.token_env")


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    """With it, every client must present a certificate signed by this CA (mTLS)."""
    reload_seconds: float = 30.0
    """How often the files' modification times are checked (a changed pair is loaded again)."""


@dataclass(frozen=True)
class ServerSettings:
    listen: str | None = None
    """The control listener's HOST:PORT (None: 127.0.0.1 at tap.listen's port + 1; 0 stays 0)."""
    credentials: tuple[CredentialSettings, ...] = ()
    token_file: str | None = None
    """Legacy: a file holding one bearer token with every role (whitespace stripped)."""
    token_env: str | None = None
    """Legacy: an environment variable holding that token."""
    insecure_loopback: bool = False
    """Serve the control endpoints without a token; only allowed on a loopback listen address."""
    max_body_bytes: int = 1 << 20
    """Largest accepted webhook/override body, bytes."""
    status_decisions: int = 50
    """How many recent decisions /status returns."""
    failed_auth_limit: int = 10
    """Failed authentications a peer may make per window; beyond, 429 until the window ends."""
    failed_auth_window_seconds: float = 10.0
    alerts_per_second: float = 1.0
    """Webhooks accepted per second on average (a bucket of ``alerts_burst``); beyond, 429."""
    alerts_burst: int = 30
    overrides_per_second: float = 1.0
    overrides_burst: int = 10
    tls: TlsSettings | None = None

    def token(self) -> str | None:
        """The legacy token, or None. Raises ConfigError when the file cannot be read."""
        if self.token_file:
            return read_token(self.token_file, "server.token_file")
        if self.token_env:
            return env_token(self.token_env, "server.token_env")
        return None

    def all_credentials(self) -> tuple[CredentialSettings, ...]:
        """The configured credentials, the legacy token as one named ``token`` with every role."""
        legacy = ()
        if self.token_file or self.token_env:
            legacy = (CredentialSettings("token", ROLES, self.token_file, self.token_env, "server"),)
        return self.credentials + legacy


def control_listen(server: ServerSettings, tap_host: str, tap_port: int) -> str:
    """Where the control listener listens: ``server.listen``, else 127.0.0.1 at the tap's port + 1
    (port 0, any free port, when the tap's is 0)."""
    from specguard.exporters.addresses import join_listen

    if server.listen:
        return server.listen
    return join_listen("127.0.0.1", tap_port + 1 if tap_port else 0)


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
    token_file: str | None = None
    """The follower credential's token, sent as ``Authorization: Bearer``."""
    cert_file: str | None = None
    """A client certificate (with ``key_file``) for a decider that requires mTLS."""
    key_file: str | None = None
    ca_file: str | None = None
    """The CA that signed the deciders' certificates (https URLs); default: the system's."""


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
    listen = s.get("listen", str, None, nullable=True)
    if listen is not None:
        from specguard.exporters.addresses import listen_problem

        problem = listen_problem(listen)
        if problem is not None:
            s.error("listen", f"({listen!r}) {problem}")
            listen = None
    out = ServerSettings(
        listen=listen,
        credentials=_credentials(s),
        token_file=s.get("token_file", str, None, nullable=True),
        token_env=s.get("token_env", str, None, nullable=True),
        insecure_loopback=s.get("insecure_loopback", bool, False),
        max_body_bytes=s.get("max_body_bytes", int, 1 << 20, minimum=1024, maximum=64 << 20),
        status_decisions=s.get("status_decisions", int, 50, minimum=0, maximum=10000),
        failed_auth_limit=s.get("failed_auth_limit", int, 10, minimum=1, maximum=100_000),
        failed_auth_window_seconds=s.get("failed_auth_window_seconds", float, 10.0, minimum=1, maximum=3600),
        alerts_per_second=s.get("alerts_per_second", float, 1.0, minimum=0.01, maximum=10_000),
        alerts_burst=s.get("alerts_burst", int, 30, minimum=1, maximum=100_000),
        overrides_per_second=s.get("overrides_per_second", float, 1.0, minimum=0.01, maximum=10_000),
        overrides_burst=s.get("overrides_burst", int, 10, minimum=1, maximum=100_000),
        tls=_tls(s),
    )
    s.check(not (out.token_file and out.token_env), "token_env", "set token_file or token_env, not both")
    s.check(
        not (out.insecure_loopback and (out.token_file or out.token_env or out.credentials)),
        "insecure_loopback",
        "a token is configured: insecure_loopback must be false",
    )
    s.reject_unknown()
    return out


def _credentials(s: configfile.Section) -> tuple[CredentialSettings, ...]:
    out: list[CredentialSettings] = []
    names: set[str] = set()
    for c in s.items("credentials"):
        name = c.get("name", str) or ""
        c.check(name not in names, "name", f"({name!r}) names another credential too")
        c.check(
            name not in RESERVED_NAMES,
            "name",
            f"({name!r}) is reserved (the legacy token, the generated one)",
        )
        names.add(name)
        roles: list[str] = []
        if "roles" in c.data:
            for index, role in c.values("roles"):
                if role not in ROLES:
                    c.error(f"roles[{index}]", f"({role!r}) must be one of {', '.join(ROLES)}")
                else:
                    roles.append(role)
        if "role" in c.data:
            role = c.get("role", str, None, choices=ROLES)
            if role is not None:
                roles.append(role)
        c.check("role" in c.data or "roles" in c.data, "role", f"is required (one of {', '.join(ROLES)})")
        token_file = c.get("token_file", str, None, nullable=True)
        token_env = c.get("token_env", str, None, nullable=True)
        c.check(bool(token_file) ^ bool(token_env), "token_file", "set token_file or token_env (one of them)")
        c.reject_unknown()
        out.append(CredentialSettings(name, tuple(dict.fromkeys(roles)), token_file, token_env, c.path))
    return tuple(out)


def _tls(s: configfile.Section) -> TlsSettings | None:
    if s.data.get("tls") is None:
        s.section("tls")  # marks the key seen
        return None
    t = s.section("tls")
    out = TlsSettings(
        cert_file=t.get("cert_file", str) or "",
        key_file=t.get("key_file", str) or "",
        client_ca_file=t.get("client_ca_file", str, None, nullable=True),
        reload_seconds=t.get("reload_seconds", float, 30.0, minimum=1, maximum=86400),
    )
    t.reject_unknown()
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
        urls=tuple(urls),
        timeout_seconds=h.get("timeout_seconds", float, 2.0, minimum=0.1, maximum=60),
        token_file=h.get("token_file", str, None, nullable=True),
        cert_file=h.get("cert_file", str, None, nullable=True),
        key_file=h.get("key_file", str, None, nullable=True),
        ca_file=h.get("ca_file", str, None, nullable=True),
    )
    h.check(bool(out.cert_file) == bool(out.key_file), "key_file", "cert_file and key_file go together")
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


def check_listen(settings: ServerSettings, listen_host: str) -> None:  # the control listener's host
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
            f"server.insecure_loopback is true but the control listener's address {listen_host} is not "
            "loopback: configure server.credentials (or server.token_file)"
        )
