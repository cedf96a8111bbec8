"""Wire the guard into ``specguard run``: config sections, the daemon, its endpoints and metrics.

``register_sections`` adds the ``guard:``, ``server:``, ``actuators:`` and ``alertmanager:``
parsers to ``monitor.config.SECTIONS``; ``configure(monitor, cfg)`` (a ``run.CONFIGURERS``
hook) builds the Guard over the Monitor's statistics and router, mounts ``/status`` and the
``/api/v1/*`` endpoints, registers the guard's collector and attaches the scheduler.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from specguard import configfile, untrusted
from specguard.errors import ConfigError
from specguard.exporters import addresses
from specguard.monitor import actuators as actuators_mod
from specguard.monitor import audit as audit_mod
from specguard.monitor import control_auth, daemon, guard_config, leader, planhttp, receiver
from specguard.monitor import replicas as replicas_mod
from specguard.monitor import state as state_mod
from specguard.monitor.cost_metrics import CostCollector
from specguard.monitor.guard_metrics import GuardCollector
from specguard.monitor.promql import PromQL
from specguard.monitor.schedule_metrics import ScheduleCollector
from specguard.rules import baseline as baseline_mod
from specguard.rules import holdout, onepool
from specguard.rules import policy as policy_mod
from specguard.rules.evidence import AlertBook

log = logging.getLogger("specguard.guard")


def parse_guard(root: configfile.Section) -> policy_mod.Policy:
    """The ``guard:`` policy; pool names it mentions must be configured pools."""
    policy = policy_mod.from_root(root)
    pools = root.data.get("pools")
    # only well-formed (string) names: a list or mapping name is the pools parser's error to report
    entries = pools if isinstance(pools, list) else []
    names = {p["name"] for p in entries if isinstance(p, dict) and isinstance(p.get("name"), str)}
    section = configfile.Section(root.doc, "guard", root.data.get("guard") or {})
    for key in ("default_pool", "nospec_pool"):
        value = getattr(policy, key)
        if value is not None and names:
            section.check(
                value in names, key, f"({value!r}) is not a configured pool ({', '.join(sorted(names))})"
            )
    return policy


class PolicyReloader:
    """Re-reads the ``guard:`` section when the config file changes (other sections need a restart).

    Called from the daemon's "policy reload" job; returns None when the file is unchanged and
    raises ConfigError (with every issue) when the new section is invalid, so the old policy stays.
    """

    def __init__(
        self,
        path: str | Path,
        pools: dict[str, int],
        default_pool: str,
        nospec_pool: str | None,
        on_policy: Any = None,
        k_schedules: Mapping[str, Any] | None = None,
    ):
        self.path = Path(path)
        self._pools, self._default, self._nospec = pools, default_pool, nospec_pool
        self._k_schedules = dict(k_schedules or {})
        self._on_policy = on_policy  # called with each new policy (e.g. the router's holdout mode)
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def __call__(self) -> policy_mod.Policy | None:
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return None
        doc = configfile.load_file(self.path)
        policy = parse_guard(doc.root())
        doc.raise_if_issues()
        self._seen = stamp
        policy = policy.with_pools(self._pools, self._default, self._nospec, self._k_schedules)
        if self._on_policy is not None:
            self._on_policy(policy)
        return policy


def register_sections(sections: MutableMapping[str, Any]) -> None:
    sections["guard"] = parse_guard
    sections["server"] = guard_config.parse_server
    sections["actuators"] = guard_config.parse_actuators
    sections["alertmanager"] = guard_config.parse_alertmanager


def build(
    monitor: Any, cfg: Any, cost_collector: CostCollector | None = None
) -> tuple[daemon.Guard, receiver.Api]:
    """The Guard and its Api for one Monitor (the tap's standalone app) and its config."""
    ex = cfg.exporter
    sections = cfg.sections
    pools = {p.name: p.num_speculative_tokens for p in ex.pools}
    default_pool = ex.tap.default_pool or ex.pools[0].name
    k_schedules = onepool.of_pools(ex.pools)
    policy = (sections.get("guard") or policy_mod.load_default()).with_pools(
        pools, default_pool, ex.tap.nospec_pool, k_schedules
    )
    server = sections.get("server") or guard_config.ServerSettings()
    acts = sections.get("actuators") or guard_config.ActuatorSettings()

    def holdout_mode(new: policy_mod.Policy) -> None:
        """The router's holdout follows ``guard.holdout`` (followers route too, and never collect)."""
        if acts.router:
            monitor.router.set_holdout_mode(holdout.router_mode(new))

    holdout_mode(policy)
    alertmanager = sections.get("alertmanager") or guard_config.AlertmanagerSettings()

    sources: list[Any] = []
    if policy.local:
        sources.append(
            daemon.LocalSource(
                monitor.stats,
                ex.pools,
                _cost_settings(cfg),
                profile=_profile(cfg),
                window_seconds=policy.window_seconds,
                on_costs=cost_collector.update if cost_collector is not None else None,
                policy=policy,
                on_holdout=(lambda held: monitor.router.set_holdout_shares(held.shares, held.matched))
                if acts.router
                else None,
                max_holdout_share=ex.tap.holdout_share,
                model_window_seconds=ex.tap.window_seconds,
                watches=getattr(monitor, "watches", None),
                stack=lambda: monitor.stack_of(ex.tap.nospec_pool) if hasattr(monitor, "stack_of") else {},
            )
        )
    promql = None
    if policy.prometheus_url:
        promql = PromQL(policy.prometheus_url, timeout=policy.prometheus_timeout_seconds)
    if promql is not None and any(r.query for r in policy.rules):
        sources.append(daemon.PromQLSource(promql, policy))
    counts = None
    if promql is not None and policy.replicas_query:
        counts = replicas_mod.PromQLReplicas(promql, pools, policy.replicas_query)

    actuators: list[Any] = []
    if acts.router:
        actuators.append(actuators_mod.RouterActuator(monitor.router))
    if acts.webhook is not None:
        hook = acts.webhook
        actuators.append(
            actuators_mod.WebhookActuator(hook.url, timeout=hook.timeout_seconds, retries=hook.retries)
        )
    follow: Any = None
    configmap = None
    if acts.configmap is not None:
        cm = acts.configmap
        configmap = actuators_mod.ConfigMapActuator(
            cm.namespace,
            cm.name,
            key=cm.key,
            timeout=cm.timeout_seconds,
            conflict_retries=cm.conflict_retries,
            kubeconfig=cm.kubeconfig,
            api_server=cm.api_server,
        )
        if acts.follow:
            follow = configmap
        else:
            actuators.append(configmap)
    if acts.plan_http is not None:
        follow = plan_source(acts.plan_http)
    store = state_mod.PlanStore(acts.plan_file) if acts.plan_file else None
    elector, takeover = (None, None) if acts.follow else election(acts, store, configmap)

    classes = ex.classes
    temps = [b.name for b in classes.temperature_buckets]
    loads = [b.name for b in classes.load_buckets]
    guard = daemon.Guard(
        policy,
        sources=sources,
        actuators=actuators,
        store=store,
        audit=_audit_log(acts.audit_log),
        alerts=AlertBook(max_alerts=alertmanager.max_alerts, max_per_class=alertmanager.max_alerts_per_class),
        keys=list(itertools.product(classes.task_labels, temps, loads)),
        temperature_buckets=temps,
        load_buckets=loads,
        follow=follow,
        elector=elector,
        takeover=takeover,
        reloader=PolicyReloader(cfg.file, pools, default_pool, ex.tap.nospec_pool, holdout_mode, k_schedules)
        if Path(cfg.file).is_file()
        else None,
        preferences=monitor.router.set_preferences if acts.router else None,
        set_probes=monitor.router.set_probes if acts.router else None,
        set_spread=monitor.router.set_spread if acts.router else None,
        pool_replicas=monitor.router.replicas if acts.router else None,
        probe_share=ex.tap.probe_share,
        set_class_holdouts=monitor.router.set_class_holdouts if acts.router else None,
        holdout_share=ex.tap.holdout_share,
        routing_status=getattr(getattr(monitor, "health", None), "status", None),
        replica_counts=counts,
    )
    if alertmanager.enabled and alertmanager.url:
        guard.restore_alerts = functools.partial(_active_alerts, guard, alertmanager)
    gate = build_gate(server)
    control = guard_config.control_listen(server, ex.tap.host, ex.tap.port)
    guard_config.check_listen(server, (addresses.split_listen(control) or ("127.0.0.1", 0))[0])
    api = receiver.Api(
        guard,
        gate=gate,
        max_body_bytes=server.max_body_bytes,
        status_decisions=server.status_decisions,
        alerts_enabled=alertmanager.enabled,
        body_timeout=ex.tap.client_body_timeout_seconds,
        clients=getattr(monitor, "clients", None),
    )
    if not any("alertmanager" in c.roles for c in gate.credentials) and not gate.insecure:
        if alertmanager.enabled:
            log.info("no alertmanager credential configured: POST /api/v1/alerts answers 401")
    if acts.plan_file is None:
        log.warning("actuators.plan_file not set: the plan is not persisted across restarts")
    return guard, api


def build_gate(server: guard_config.ServerSettings) -> control_auth.Gate:
    """The control listener's credentials and limits; ConfigError when a token cannot be read."""
    credentials = [
        control_auth.Credential(c.name, frozenset(c.roles), c.token().encode())
        for c in server.all_credentials()
    ]
    return control_auth.Gate(
        credentials,
        insecure=server.insecure_loopback,
        failed_auth_limit=server.failed_auth_limit,
        failed_auth_window=server.failed_auth_window_seconds,
        rates={
            "alerts": (server.alerts_per_second, server.alerts_burst),
            "overrides": (server.overrides_per_second, server.overrides_burst),
        },
    )


def plan_source(settings: guard_config.PlanHttpSettings) -> planhttp.HttpPlanSource:
    """A follower's HTTP plan source with its follower token and, if set, its client certificate."""
    import ssl

    token = (
        guard_config.read_token(settings.token_file, "actuators.plan_http.token_file")
        if settings.token_file
        else None
    )
    context = None
    if settings.cert_file or settings.ca_file:
        try:
            context = ssl.create_default_context(cafile=settings.ca_file)
            if settings.cert_file and settings.key_file:
                context.load_cert_chain(settings.cert_file, settings.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"actuators.plan_http: cannot load its TLS files: {exc}") from exc
    return planhttp.HttpPlanSource(settings.urls, timeout=settings.timeout_seconds, token=token, ssl=context)


def generated_credential(monitor: Any, gate: control_auth.Gate) -> tuple[Any, Any]:
    """(start, stop) of the operator token made when no credential is configured: written at start
    (0600) where ``specguard status`` finds it by the control port, removed at stop."""
    made: dict[str, Any] = {}

    async def start() -> None:
        port = getattr(monitor, "control_port", None)
        if port is None:
            return
        path = control_auth.generated_token_path(port)
        try:
            token = await asyncio.to_thread(control_auth.write_generated_token, path)
        except OSError as exc:
            log.error(
                "no server.credentials configured and the operator token cannot be written to %s (%s): "
                "the control listener refuses every request",
                path,
                exc.strerror,
            )
            return
        made.update(path=path, token=token)
        gate.add(
            control_auth.Credential(control_auth.GENERATED_NAME, frozenset({"operator"}), token.encode())
        )
        log.warning(
            "no server.credentials configured: operator token written to %s (specguard status reads "
            "it; overrides: Authorization: Bearer <its content>); configure server.credentials for "
            "Alertmanager and followers",
            path,
        )

    async def stop() -> None:
        if made:
            await asyncio.to_thread(control_auth.remove_generated_token, made["path"], made["token"])

    return start, stop


def election(
    acts: guard_config.ActuatorSettings,
    store: state_mod.PlanStore | None,
    configmap: actuators_mod.ConfigMapActuator | None,
) -> tuple[Any, Any]:
    """A decider's (elector, takeover): who may decide, and how the new leader reads the shared plan."""
    settings = acts.leader_election
    mode = settings.mode
    if mode == "auto":
        mode = "lease" if configmap is not None else "lock" if store is not None else "none"
    if mode == "lease" and configmap is not None:
        cm = acts.configmap
        elector = leader.Lease(
            settings.lease_name,
            settings.lease_namespace or configmap.namespace,
            api_client=lambda: actuators_mod.api_client(kubeconfig=cm.kubeconfig, api_server=cm.api_server),
            identity=settings.identity,
            lease_duration=settings.lease_duration_seconds,
            renew_deadline=settings.renew_deadline_seconds,
            retry_period=settings.retry_period_seconds,
            timeout=cm.timeout_seconds,
        )
        return elector, configmap.read_plan
    if mode == "lock" and store is not None:
        elector = leader.FileLock(
            store.path.with_name(store.path.name + ".lock"),
            identity=settings.identity,
            retry_seconds=settings.retry_period_seconds,
        )

        async def read_store() -> state_mod.PlanDocument | None:
            return await asyncio.to_thread(store.load_readonly)

        return elector, read_store
    return None, None


def configure(monitor: Any, cfg: Any) -> daemon.Guard:
    """``run.CONFIGURERS`` hook: mount the guard on a Monitor before it starts."""
    cost_collector = CostCollector(
        (p.name for p in cfg.exporter.pools if p.speculative),
        (b.name for b in cfg.exporter.classes.load_buckets),
    )
    notice = start_baselines(cost_collector, cfg)
    guard, api = build(monitor, cfg, cost_collector)
    guard.baseline_report = cost_collector.baseline_report
    guard.cost_view = lambda: cost_collector.costs
    scheduled = onepool.of_pools(cfg.exporter.pools)
    if scheduled:  # one pool, no routing: where its in-engine schedule loses
        settings = _cost_settings(cfg)
        bands = [(b.name, *settings.bucket_range(b.name)) for b in cfg.exporter.classes.load_buckets]
        schedule_collector = ScheduleCollector(scheduled, bands, lambda: cost_collector.costs)
        monitor.registry.register(schedule_collector)
        guard.schedule_report = schedule_collector.report
    guard.holdout_report = monitor.router.holdout_report

    async def say_where_no_baseline() -> None:
        if notice:
            log.warning("%s", notice)

    async def nothing_to_stop() -> None:
        return None

    routes = api.routes(healthz=False) + planhttp.PlanEndpoint(guard, api.gate).routes()
    if getattr(monitor, "control_listen", None) is not None:
        monitor.add_control_routes(routes)
    else:  # a Monitor without a control listener (built from the exporter config alone)
        monitor.add_routes(routes)
    monitor.registry.register(GuardCollector(guard.counters, guard.view))
    monitor.registry.register(api.gate.collector())
    if not api.gate.credentials and not api.gate.insecure:
        start, stop = generated_credential(monitor, api.gate)
        monitor.attach("control credential", start, stop)
    monitor.registry.register(cost_collector)
    if guard.policy.enabled:
        monitor.attach("baseline notice", say_where_no_baseline, nothing_to_stop)
        monitor.attach("guard", guard.start, guard.stop)
    else:
        log.warning("guard.enabled is false: no evaluations; the persisted plan is still applied")

        async def apply_only() -> None:
            await guard.start_elector()
            if guard.follow is None:
                await guard._lead()
            await guard._actuate([])

        monitor.attach("guard (disabled)", apply_only, guard.elector.stop)
    monitor.guard = guard
    return guard


async def _active_alerts(guard: daemon.Guard, settings: guard_config.AlertmanagerSettings) -> list:
    from specguard.monitor import alertsync

    return await alertsync.active_alerts(
        settings.url or "",
        now=guard.clock(),
        known=guard.known_labels(),
        receiver_name=settings.receiver,
        timeout=settings.timeout_seconds,
    )


def start_baselines(collector: CostCollector, cfg: Any) -> str | None:
    """Before any traffic: which load buckets have a baseline (a calibration profile at most), into
    ``/metrics`` and ``/status``; returns the notice naming the (pool, load bucket) cells without one."""
    from specguard.rules import cost

    settings = _cost_settings(cfg)
    try:
        profile = _profile(cfg)
    except Exception:  # the run itself reports a bad profile; this is only the start-up notice
        profile = None
    pools = {p.name: p.num_speculative_tokens for p in cfg.exporter.pools}
    _, baselines = cost.evaluate_all([], pools, profile, 0.0, settings)
    collector.update((), baselines)
    missing = [b for b, base in baselines.items() if base.source == baseline_mod.SOURCE_NONE]
    spec = [p.name for p in cfg.exporter.pools if p.speculative]
    if not missing or not spec:
        return None
    cells = ", ".join(f"{pool}/{bucket}" for pool in spec for bucket in missing)
    return (
        f"no baseline yet for (pool/load bucket) {cells}: RC is unknown there until one exists; "
        f"to get one: {baseline_mod.HOW_TO_GET_ONE}"
    )


def _cost_settings(cfg: Any) -> Any:
    from specguard.rules.cost_config import CostSettings

    settings = cfg.sections.get("cost") or CostSettings()
    ex = cfg.exporter
    return settings.with_traffic(ex.classes.load_buckets, ex.tap.full_rollback_request_threshold)


def _profile(cfg: Any) -> Any:
    from specguard.rules import cost_config, profile

    settings = cfg.sections.get("cost")
    path = cost_config.resolve_profile_path(settings, cfg.file) if settings is not None else None
    return profile.load_profile(path) if path is not None else None


def _audit_log(path: str | None) -> audit_mod.AuditLog:
    """The audit log; a path naming a FIFO, directory or device is a ConfigError naming the key."""
    try:
        return audit_mod.AuditLog(path)
    except untrusted.NotRegularFile as exc:
        raise ConfigError(f"actuators.audit_log: {exc}") from exc
