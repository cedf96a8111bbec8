"""The guard daemon: gathers evidence, steps every class, applies and records the decisions.

One ``AsyncIOScheduler`` (APScheduler 3.x) job, "guard evaluation", runs in the aiohttp
event loop with ``coalesce=True, max_instances=1`` and a misfire grace of one interval; each
run has an overall deadline on top of the timeouts of every network call, and
``specguard_last_evaluation_timestamp_seconds`` makes a stalled loop visible. Evidence comes
from this process's tap and cost model (``LocalSource``) and/or PromQL (``PromQLSource``);
Alertmanager alerts join as evidence. Decisions go to the audit log, the persisted plan and
the actuators; a failed actuator or disk is counted and retried, and routing goes on.
In a fleet the guard follows a plan source or decides only while it leads (``monitor.fleet``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from specguard.errors import InputError, SourceError
from specguard.exporters import routing
from specguard.monitor import audit as audit_mod
from specguard.monitor import guard_status, persist
from specguard.monitor import state as state_mod
from specguard.monitor.actuators import Actuator
from specguard.monitor.fleet import FleetRoles, NotLeader, Takeover
from specguard.monitor.guard_metrics import GuardCounters, GuardView
from specguard.monitor.sources import EvidenceSource, LocalSource, PromQLSource, merge
from specguard.rules import bestpool, desired, evaluation, guard, planfeed, planprobes, probes
from specguard.rules import policy as policy_mod
from specguard.rules import spread as spread_mod
from specguard.rules.evidence import AlertBook, AlertRecord, ClassKey, Evidence, alerts_by_class

log = logging.getLogger("specguard.guard")

__all__ = ["EvidenceSource", "Guard", "LocalSource", "NotLeader", "PromQLSource", "merge"]

EXECUTOR = "guard"
"""The APScheduler executor of the guard's jobs; it logs as ``apscheduler.executors.guard``."""


def _quiet_job_log() -> None:
    """APScheduler speaks in its own words: two INFO lines per job run ("Running job ...", "...
    executed successfully", 90% of ``specguard run``'s log), "Adding job tentatively" at start,
    and "Run time of job ... was missed by ..." whenever a busy event loop delays a run. Below
    DEBUG (unless its loggers are configured explicitly) only its errors come through; the guard
    says what a missed or failed evaluation means itself (``Guard._on_job_event``)."""
    if log.isEnabledFor(logging.DEBUG):
        return
    for name in ("apscheduler", f"apscheduler.executors.{EXECUTOR}", "apscheduler.scheduler"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.ERROR)


class Guard(FleetRoles):
    """Holds every class's state and the plan; ``evaluate()`` is one round (the scheduled job).

    In a fleet it either follows a plan source (``follow``) or decides while its ``elector`` says
    it leads (``monitor.fleet``); ``takeover`` reads the shared plan when it becomes leader.
    """

    def __init__(
        self,
        policy: policy_mod.Policy,
        *,
        sources: Sequence[EvidenceSource] = (),
        actuators: Sequence[Actuator] = (),
        store: state_mod.PlanStore | None = None,
        audit: audit_mod.AuditLog | None = None,
        counters: GuardCounters | None = None,
        alerts: AlertBook | None = None,
        clock: Callable[[], float] = time.time,
        keys: Iterable[ClassKey] = (),
        temperature_buckets: Sequence[str] = (),
        load_buckets: Sequence[str] = (),
        evaluation_timeout: float | None = None,
        keep_decisions: int = 200,
        follow: Any = None,
        elector: Any = None,
        takeover: Takeover | None = None,
        reloader: Callable[[], policy_mod.Policy | None] | None = None,
        reload_interval: float = 10.0,
        preferences: Callable[[dict[ClassKey, tuple[str, ...]]], None] | None = None,
        routing_status: Callable[[], list[dict[str, Any]]] | None = None,
        restore_alerts: Callable[[], Awaitable[list[AlertRecord]]] | None = None,
        replica_counts: Any = None,
        set_probes: Callable[[dict[ClassKey, tuple[str, float]]], None] | None = None,
        probe_share: float = 0.0,
        set_class_holdouts: Callable[[dict[tuple[str, str], float]], None] | None = None,
        holdout_share: float = 0.0,
        set_spread: Callable[[routing.Spread | None], None] | None = None,
        pool_replicas: Callable[[], Mapping[str, int]] | None = None,
    ):
        self.policy = policy
        self.sources = list(sources)
        self.actuators = list(actuators)
        self.store = store
        self.audit = audit or audit_mod.AuditLog(None)
        self.counters = counters or GuardCounters()
        self.alerts = alerts if alerts is not None else AlertBook()  # (an empty book is falsy)
        self.clock = clock
        self.configured_keys = list(keys)
        self.temperature_buckets = list(temperature_buckets)
        self.load_buckets = list(load_buckets)
        self.evaluation_timeout = evaluation_timeout or max(5.0, policy.interval_seconds * 0.8)
        self.follow = follow  # a plan source to follow (ConfigMap or HTTP; fleet replica), or None
        self.reloader = reloader  # returns a new policy when the config file changed (ConfigError if bad)
        self.reload_interval = reload_interval
        self.preferences = preferences  # the router's failover order per class (cheapest first)
        self.set_probes = set_probes  # the router's probe pool and share per class off speculation
        self.probe_share = probe_share
        self.set_class_holdouts = set_class_holdouts  # the router's least holdout per class (planner)
        self.holdout_share = holdout_share
        self.planned_shares: planprobes.Shares | None = None  # what the plan prices probes at
        self.set_spread = set_spread  # the router's spread (``guard.spread``), from the local window
        self.spread: dict[ClassKey, dict[str, float]] = {}  # the latest units, for /status
        self.spread_fit: str | None = None  # the spread's step-cost fit, held fit or why none
        self.pool_replicas = pool_replicas  # the router's replicas per pool (the planner's capacity)
        self.last_plan: Any = None  # guard.decider: planner: the latest plan or why none, for /status
        self.sizer: desired.Sizer | None = None  # guard.scaling: desired replicas per pool
        self.desired_replicas: dict[str, int] = {}
        self.probes: dict[ClassKey, probes.Probe] = {}  # the latest, for /status
        self.routing_status = routing_status  # pool health and failovers, for /status
        self.restore_alerts = restore_alerts  # Alertmanager's active alerts, read at start-up
        self.readback: asyncio.Task[None] | None = None  # that read, running in the background
        self.reload_error: str | None = None
        self.replica_counts = replica_counts  # fleet: replicas.PromQLReplicas (counts go into the plan)
        self.replicas: dict[str, int] = {}
        self.baseline_report: Callable[[], dict[str, Any]] | None = None  # per load bucket, for /status
        self.holdout_report: Callable[[], dict[str, Any]] | None = None  # the router's holdout, for /status
        self.schedule_report: Callable[[], dict[str, Any]] | None = None  # one scheduled pool, for /status
        self.cost_view: Callable[[], Sequence[Any]] | None = None  # the latest RCs, for /status
        self.states: dict[ClassKey, guard.ClassState] = {}
        self.last_decisions: dict[ClassKey, guard.Decision] = {}
        self.decisions: deque[dict[str, Any]] = deque(maxlen=keep_decisions)
        self.version = 0
        self.last_evaluation: float | None = None
        self.last_evaluation_seconds: float | None = None
        self.adopted_updated_at: float | None = None  # updated_at of the last plan taken from a file/source
        self.running = False
        self.missed_runs = 0  # scheduled runs skipped because the event loop was busy past the grace
        self._applied: dict[str, int] = {}
        self._reporting: set[tuple[ClassKey, str]] = set()  # report-only rules now breached
        self._lock = asyncio.Lock()
        self.persistence = persist.Persistence(
            self.store,
            self.audit,
            self.counters,
            build=self.stored,
            checkpoint=self._checkpoint,
            alerts=self.alerts,
        )
        self._scheduler: Any = None
        self.decisions.extend(audit_mod.decisions(self.audit.recent))
        self._load()
        self._init_fleet(elector, takeover)

    # -- persistence ---------------------------------------------------------------------------
    def _load(self) -> None:
        if self.store is None:
            return
        doc = self.store.load()
        if doc is None:
            if self.store.recovered is not None:
                # the plan was unusable: go on from above every version it or the audit log had,
                # and write the default plan at once (versions never go back)
                self.version = self.persistence.version_after_recovery()
                self.persistence.plan_behind = True
            return
        dropped = sorted({s.pool for s in doc.states.values() if s.pool not in self.policy.pools})
        if dropped:
            log.warning(
                "plan file %s names pools no longer configured (%s): those classes start over",
                self.store.path,
                ", ".join(dropped),
            )
        self._adopt(doc)
        for alert in doc.alerts:  # what Alertmanager sent before the restart (it re-sends hourly only)
            self.alerts.ingest(alert)
        self.alerts.take_fresh()  # on disk already
        log.info(
            "loaded plan version %d (%d classes, %d alerts) from %s",
            doc.version,
            len(self.states),
            len(doc.alerts),
            self.store.path,
        )

    def _adopt(self, doc: state_mod.PlanDocument) -> None:
        """Take a stored or followed plan; classes on pools no longer configured start over."""
        self.states = {k: s for k, s in doc.states.items() if s.pool in self.policy.pools}
        self.version = doc.version
        self.adopted_updated_at = doc.updated_at
        self.replicas = {p: n for p, n in doc.replicas.items() if p in self.policy.pools}

    def _state(self, key: ClassKey) -> guard.ClassState:
        return self.states.get(key) or guard.initial_state(key, self.policy)

    def _persist(self) -> None:
        """Write the plan we hold (a plan adopted from a source or a takeover); failures are retried."""
        self.persistence.save_now(self.stored())

    def document(self) -> state_mod.PlanDocument:
        """The plan as actuators, followers and /api/v1/plan see it (no alerts: they stay here)."""
        return state_mod.PlanDocument(
            self.version,
            self.clock(),
            dict(self.states),
            dict(self.policy.pools),
            replicas=dict(self.replicas),
        )

    def stored(self) -> state_mod.PlanDocument:
        """The plan as the plan file keeps it: with the alerts received, so a restart keeps them.
        (Unsorted: ``state.encode`` sorts them in the writer's thread, off the event loop.)"""
        return replace(self.document(), alerts=tuple(self.alerts.snapshot()))

    def _checkpoint(self) -> persist.Undo:
        return self.alerts.checkpoint()

    async def commit_alerts(self, change: Callable[[], tuple[Any, bool]]) -> Any:
        """Apply ``change`` to the alert book and return its result once the plan file holding it is
        on disk (the receiver's 200); ``change`` returns (result, whether the book changed).
        ``persist.PlanWriteError`` when the disk refused it (the book is put back as it was)."""

        def apply() -> tuple[Any, None, bool]:
            result, changed = change()
            return result, None, changed

        return await self.persistence.commit(apply, alerts_only=True)

    def known_labels(self) -> dict[str, set[str]]:
        """The configured values of each class label (an alert naming another is refused)."""
        names = ("task_type", "temperature_bucket", "load_bucket")
        return {name: {k[i] for k in self.configured_keys} for i, name in enumerate(names)}

    # -- one round -----------------------------------------------------------------------------
    async def evaluate(self, now: float | None = None) -> list[guard.Decision]:
        async with self._lock:
            now = self.clock() if now is None else now
            started = time.monotonic()
            if self.follow is not None or not await self._lead():
                if self.follow is not None:
                    await self._follow(now)
                self.last_evaluation = now  # a follower or a standby: its round is done
                return []
            await self.persistence.retry()
            alerts_policy = self.policy.alerts
            self.alerts.expire(now, alerts_policy.firing_ttl_seconds, alerts_policy.resolved_ttl_seconds)
            alerts = self.alerts.snapshot()
            # the work that grows with alerts and classes runs in a worker thread, so traffic on
            # the event loop never waits for it
            alerted = await asyncio.to_thread(alerts_by_class, alerts, self.configured_keys)
            keys = set(self.states) | set(self.configured_keys if not self.policy.local else ())
            keys |= set(alerted)  # alerts name unseen classes too
            evidence, error = await self._collect(now, sorted(keys))
            planned, self.planned_shares = {}, None
            if self.policy.decider == "planner" and error is None:
                planned = await asyncio.to_thread(self._plan, evidence, now)
            stepped = await asyncio.to_thread(
                evaluation.step_all,
                self.policy,
                dict(self.states),
                keys,
                evidence,
                alerts,
                error,
                now,
                planned,
            )
            decisions: list[guard.Decision] = []
            for key, new, decision in stepped:
                self.states[key] = new
                if decision.reason != "no rule due":  # a tick between two rule intervals is no evaluation
                    self.last_decisions[key] = decision
                    self.counters.evaluations[decision.phase.value] += 1
                    self._report(key, decision)
                decisions.append(decision)
            if self.preferences is not None and error is None:
                self.preferences(await asyncio.to_thread(self._rankings, stepped, evidence, now))
            if error is None:
                expected = await asyncio.to_thread(
                    probes.plan, dict(self.states), evidence, now, self.policy, self.probe_share
                )
                self.probes = planprobes.merged(expected, self.planned_shares)
                if self.set_class_holdouts is not None:
                    self.set_class_holdouts(planprobes.class_holdouts(self.planned_shares))
                if self.set_probes is not None:
                    self.set_probes({key: (p.pool, p.share) for key, p in self.probes.items()})
                if self.set_spread is not None:
                    self.set_spread(await asyncio.to_thread(self._spread, evidence, now))
            await self._count_replicas()
            await asyncio.shield(self._record(decisions))  # a timeout must not lose a taken decision
            self.last_evaluation = now
            self.last_evaluation_seconds = time.monotonic() - started
            return decisions

    def _plan(self, evidence: dict[ClassKey, Evidence], now: float) -> planfeed.Planned:
        """``guard.decider: planner``: the fleet plan from the local window (none: no class is
        planned this round, and the guard's gates stand)."""
        local = next((s for s in self.sources if hasattr(s, "plan")), None)  # LocalSource
        if local is None:
            self.last_plan = "no local window (the planner reads the tap's own requests)"
            return {}
        replicas = {**(self.pool_replicas() if self.pool_replicas is not None else {}), **self.replicas}
        try:
            found = local.plan(dict(self.states), evidence, now, replicas)
        except Exception as exc:  # a bug in planning must not stop the watch rules: no plan this round
            log.exception("planner: failed")
            self.last_plan = f"planner failed: {type(exc).__name__}: {exc}"
            return {}
        self.last_plan = found.plan or found.reason
        if found.plan is None:
            log.info("planner: no plan this evaluation (%s)", found.reason)
        self.planned_shares = found.shares(self.probe_share, self.holdout_share)
        scaling = self.policy.scaling
        if scaling is None:
            self.sizer, self.desired_replicas = None, {}
        elif found.plan is not None and found.input is not None:  # else the last sizes stand
            if self.sizer is None or self.sizer.scaling != scaling:
                self.sizer = desired.Sizer(scaling)
            self.desired_replicas = self.sizer.desired(found.input, found.plan, now)
        return found.planned

    def _spread(self, evidence: dict[ClassKey, Evidence], now: float) -> routing.Spread | None:
        """The router's spread for ``guard.spread`` (None: off, or no step-cost fit this round)."""
        local = next((s for s in self.sources if hasattr(s, "spread_model")), None)  # LocalSource
        self.spread, self.spread_fit = {}, None
        if not self.policy.spread or local is None:
            return None
        try:
            found = local.spread_model(now)
            if isinstance(found, str):
                log.info("spread: none this evaluation (%s)", found)
                self.spread_fit = f"none: {found}"
                return None
            if found.held:
                log.info("spread: %s", found.held)
            self.spread_fit = f"held: {found.held}" if found.held else found.fit.formula()
            self.spread = spread_mod.units(dict(self.states), evidence, now, self.policy, found)
        except Exception:  # a bug in the spread must not stop the guard: requests follow the plan
            log.exception("spread: failed")
            self.spread, self.spread_fit = {}, "none: failed (see the log)"
            return None
        return routing.Spread(self.spread, spread_mod.stepper(found, self.policy))

    def _rankings(
        self, stepped: Sequence[tuple[ClassKey, guard.ClassState, guard.Decision]], evidence, now: float
    ) -> dict[ClassKey, tuple[str, ...]]:
        """Each class's pools, cheapest first: where the router sends it while its pool is down."""
        return {
            key: bestpool.ranking(new.pool, evidence.get(key, Evidence()), new.memory, now, self.policy)
            for key, new, _ in stepped
        }

    def _report(self, key: ClassKey, decision: guard.Decision) -> None:
        """Report-only rules: a breach is logged and counted once when it starts, and said to end."""
        now = {(key, rule) for rule in decision.reports}
        was = {(k, rule) for k, rule in self._reporting if k == key}
        for _, rule in sorted(now - was):
            self.counters.actions[(key[0], key[1], "report", f"report_only:{rule}")] += 1
            log.warning("%s report: %s", "/".join(key), decision.reports[rule])
        for _, rule in sorted(was - now):
            log.info("%s report: %s is no longer breached", "/".join(key), rule)
        self._reporting = (self._reporting - was) | now

    async def _count_replicas(self) -> None:
        """Fleet mode: the pools' replica counts; a change is a new plan version for the followers."""
        if self.replica_counts is None:
            return
        counts = {**self.replicas, **await self.replica_counts.counts()}
        if counts != self.replicas:
            log.info("replicas %s", ", ".join(f"{p}={n}" for p, n in sorted(counts.items())))
            self.replicas = counts
            self.version += 1
            self._persist()

    async def _collect(
        self, now: float, keys: Sequence[ClassKey]
    ) -> tuple[dict[ClassKey, Evidence], str | None]:
        """Evidence from every source; a source that fails outright turns into an error for all classes."""
        merged: dict[ClassKey, Evidence] = {}
        for source in self.sources:
            try:
                async with asyncio.timeout(self.evaluation_timeout):
                    found = await source.collect(now, keys)
            except TimeoutError:
                return merged, f"{type(source).__name__} timed out after {self.evaluation_timeout:g} s"
            except SourceError as exc:
                return merged, str(exc)
            except Exception as exc:  # a bug in a source must not stop the guard; it is an error evaluation
                log.exception("evidence source %s failed", type(source).__name__)
                return merged, f"{type(source).__name__} failed: {type(exc).__name__}: {exc}"
            merged = merge(merged, found)
        return merged, None

    async def _record(
        self,
        decisions: Sequence[guard.Decision],
        caller: dict[str, str] | None = None,
        *,
        saved: bool = False,
    ) -> None:
        """Count, log and audit every action; a real one (not dry-run) bumps the plan version and
        is persisted (unless ``saved``: an override is on disk before it is recorded). A dry-run
        decision is a record of what would have happened, nothing more."""
        acted = [d for d in decisions if d.action != "none"]
        real = [d for d in acted if not d.dry_run]
        if acted:
            if real and not saved:
                self.version += 1
            for d in acted:
                reason = ("dry_run:" if d.dry_run else "") + (d.cause or "none")
                self.counters.count_action((d.key[0], d.key[1], d.action, reason), d.at)
                log.info(
                    "%s %s: %s %s -> %s: %s",
                    "/".join(d.key),
                    d.phase.value,
                    d.action + (" (dry-run)" if d.dry_run else ""),
                    d.from_pool,
                    d.to_pool,
                    d.reason,
                )
            records = [{**d.to_json(), "plan_version": self.version} for d in acted]
            if caller is not None:  # an operator's override: who asked, in every line it caused
                records = [{**r, "caller": caller} for r in records]
            self.decisions.extend(records)
            await self.persistence.record(records, save=bool(real) and not saved)
        await self._actuate(acted)

    async def _actuate(self, acted: Sequence[guard.Decision]) -> None:
        if self.follow is None and not self.is_leader:
            return  # a standby never writes (it may have lost the lead during this round)
        doc = self.document()
        for actuator in self.actuators:
            if self._applied.get(actuator.name) == self.version and not acted:
                continue
            try:
                async with asyncio.timeout(self.evaluation_timeout):
                    await actuator.apply(doc, acted)
                self._applied[actuator.name] = self.version
            except (SourceError, TimeoutError, OSError) as exc:
                self.counters.actuation_errors[actuator.name] += 1
                log.error(
                    "actuator %s failed: %s (retried on the next evaluation)", actuator.name, exc or "timeout"
                )

    # -- operator ------------------------------------------------------------------------------
    async def audit_event(self, record: dict[str, Any]) -> None:
        """Append one audit line that is no decision (an accepted webhook and its caller)."""
        await self.persistence.record([record], save=False)  # the plan is not written

    async def override(
        self,
        action: str,
        task_type: str,
        temperature_bucket: str | None = None,
        load_bucket: str | None = None,
        *,
        pool: str | None = None,
        reason: str = "",
        caller: dict[str, str] | None = None,
    ) -> list[guard.Decision]:
        if action not in guard.OPERATOR_ACTIONS:
            raise InputError(f"action ({action!r}) must be one of {', '.join(guard.OPERATOR_ACTIONS)}")
        if action == "pin" and pool not in self.policy.pools:
            known = ", ".join(sorted(self.policy.pools))
            raise InputError(f"pool ({pool!r}) must be a configured pool ({known})")
        self._check_labels(task_type, temperature_bucket, load_bucket)
        keys = self._matching(task_type, temperature_bucket, load_bucket)
        if not keys:
            raise InputError(
                f"no class matches task_type={task_type!r} temperature_bucket={temperature_bucket!r} "
                f"load_bucket={load_bucket!r}"
            )
        async with self._lock:
            if self.follow is None and not await self._lead():
                raise NotLeader(f"not the leader (leader: {self.leader_holder or 'unknown'}): ask the leader")
            now = self.clock()
            decisions = []
            changed: dict[ClassKey, tuple[guard.ClassState, guard.Decision]] = {}
            for key in keys:
                new, decision = guard.override(self._state(key), action, now, pool=pool, reason=reason)
                if decision.action != "none":  # a no-op (unpin of a class not pinned...) changes nothing
                    changed[key] = (new, decision)
                decisions.append(decision)
            if any(not d.dry_run for _, d in changed.values()):
                # on disk before it is answered or recorded; PlanWriteError (rolled back) otherwise
                await self.persistence.commit(lambda: self._apply_override(changed))
            else:
                self._apply_override(changed)
            await self._record(decisions, caller, saved=True)
            return decisions

    def _apply_override(
        self, changed: dict[ClassKey, tuple[guard.ClassState, guard.Decision]]
    ) -> tuple[None, persist.Undo, bool]:
        before = {key: (self.states.get(key), self.last_decisions.get(key)) for key in changed}
        version = self.version
        for key, (new, decision) in changed.items():
            self.states[key] = new
            self.last_decisions[key] = decision
        real = any(not d.dry_run for _, d in changed.values())
        self.version += real

        def undo() -> None:
            self.version = version
            for key, (state, decision) in before.items():
                if state is None:
                    self.states.pop(key, None)
                else:
                    self.states[key] = state
                if decision is None:
                    self.last_decisions.pop(key, None)
                else:
                    self.last_decisions[key] = decision

        return None, undo, real

    def _check_labels(self, task_type: str, temperature_bucket: str | None, load_bucket: str | None) -> None:
        known = self.configured_keys
        for index, (name, value) in enumerate(
            (
                ("task_type", task_type),
                ("temperature_bucket", temperature_bucket),
                ("load_bucket", load_bucket),
            )
        ):
            allowed = sorted({k[index] for k in known})
            if value is not None and allowed and value not in allowed:
                raise InputError(f"{name} ({value!r}) is not configured (known: {', '.join(allowed)})")

    def _matching(
        self, task_type: str, temperature_bucket: str | None, load_bucket: str | None
    ) -> list[ClassKey]:
        temps = [temperature_bucket] if temperature_bucket else self.temperature_buckets
        loads = [load_bucket] if load_bucket else self.load_buckets
        keys = {(task_type, t, lb) for t in temps for lb in loads}
        keys |= {
            k
            for k in self.states
            if k[0] == task_type and (temperature_bucket in (None, k[1])) and (load_bucket in (None, k[2]))
        }
        return sorted(keys)

    # -- views ---------------------------------------------------------------------------------
    def plan(self) -> dict[ClassKey, str]:
        return self.document().routing()

    def view(self) -> GuardView:
        return GuardView(
            plan=self.plan(),
            pools=self.policy.pools,
            last_evaluation=self.last_evaluation,
            frozen=any(s.frozen for s in self.states.values()),
            consecutive_errors=max((s.consecutive_errors for s in self.states.values()), default=0),
            config_version=self.policy.version,
            audit_write_errors=self.audit.write_errors,
            plan_version=self.version,
            plan_age_seconds=self.plan_age(self.clock()),
            leader=None if self.follow is not None else self.is_leader,
            last_evaluation_seconds=self.last_evaluation_seconds,
            desired_replicas=self.desired_replicas if self.follow is None and self.is_leader else {},
        )

    def status(self, decisions: int = 50) -> dict[str, Any]:
        """The status document (``guard_status.document``) with the last ``decisions`` decisions."""
        return guard_status.document(self, decisions)

    # -- scheduling ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Apply the loaded plan, then evaluate every interval under APScheduler."""
        from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED
        from apscheduler.executors.asyncio import AsyncIOExecutor
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        await self.start_elector()
        if self.follow is None:
            await self._lead()  # a new leader first takes the shared plan over
        await self.persistence.retry()  # what a refused write left behind
        await self._actuate([])  # the plan we hold (a follower: until its source answers)
        if self.restore_alerts is not None:  # in the background: the tap must not wait for Alertmanager
            self.readback = asyncio.get_running_loop().create_task(
                self._restore_alerts(), name="alert read-back"
            )
        interval = self.policy.interval_seconds
        _quiet_job_log()
        self._scheduler = AsyncIOScheduler(timezone=UTC, executors={EXECUTOR: AsyncIOExecutor()})
        self._scheduler.add_job(
            self._tick,
            "interval",
            seconds=interval,
            executor=EXECUTOR,
            id="guard-evaluation",
            name="guard evaluation",
            coalesce=True,
            max_instances=1,
            misfire_grace_time=max(1, int(interval)),
            next_run_time=datetime.now(UTC) + timedelta(seconds=self._first_evaluation_delay()),
        )
        if self.reloader is not None:
            self._scheduler.add_job(
                self._reload,
                "interval",
                seconds=self.reload_interval,
                executor=EXECUTOR,
                id="policy-reload",
                name="policy reload",
                coalesce=True,
                max_instances=1,
                misfire_grace_time=max(1, int(self.reload_interval)),
            )
        self._scheduler.add_listener(
            self._on_job_event, EVENT_JOB_ERROR | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES
        )
        self._scheduler.start()
        self.running = True
        log.info("guard evaluation every %g s (%s)", interval, "dry-run" if self.policy.dry_run else "acting")

    def _first_evaluation_delay(self) -> float:
        """At once with a calibration prior (its warm start plans every class it knows before the
        first request); otherwise after a few seconds of traffic (at most one interval)."""
        if any(getattr(source, "has_prior", False) for source in self.sources):
            return 0.0
        return min(self.policy.interval_seconds, 5.0)

    async def _restore_alerts(self) -> None:
        """Take Alertmanager's active alerts as if its webhook had just delivered them."""
        try:
            async with asyncio.timeout(self.evaluation_timeout):
                records = await self.restore_alerts()  # type: ignore[misc]
        except (SourceError, TimeoutError) as exc:
            log.warning("reading the active alerts back from Alertmanager failed (%s): waiting for it", exc)
            return
        new = 0
        for record in records:
            outcome = self.alerts.ingest(record)
            new += outcome in ("new", "updated")
            self.counters.webhook_alerts[(record.status, "restored" if outcome == "new" else outcome)] += 1
        log.info("read %d active alerts back from Alertmanager (%d not known yet)", len(records), new)
        if new:
            self._persist()

    async def stop(self) -> None:
        self.running = False
        if self.readback is not None and not self.readback.done():
            self.readback.cancel()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        async with self._lock:  # let an evaluation in flight finish its writes
            pass
        await self.elector.stop()
        self._elector_started = False
        if self.follow is not None and hasattr(self.follow, "close"):
            await self.follow.close()

    async def _tick(self) -> None:
        try:
            async with asyncio.timeout(self.evaluation_timeout * 2):
                await self.evaluate()
        except asyncio.CancelledError:
            if self.running:
                raise
            log.info("guard evaluation: cancelled (shutting down)")  # not an error to report
        except TimeoutError:
            # no class was evaluated this round: each counts as an error evaluation
            classes = len(set(self.states) | set(self.configured_keys)) or 1
            self.counters.evaluations["error"] += classes
            log.error(
                "guard evaluation: timed out after %g s (%d class evaluations counted as errors)",
                self.evaluation_timeout * 2,
                classes,
            )
        except Exception:
            log.exception("guard evaluation has failed")

    async def set_policy(self, policy: policy_mod.Policy) -> None:
        """Swap the policy between evaluations; class states (plan, counters, pins) are kept."""
        async with self._lock:
            old = self.policy
            self.policy = policy
            self.evaluation_timeout = max(5.0, policy.interval_seconds * 0.8)
            for source in self.sources:
                if hasattr(source, "policy"):
                    source.policy = policy
            if self._scheduler is not None and policy.interval_seconds != old.interval_seconds:
                self._scheduler.reschedule_job(
                    "guard-evaluation", trigger="interval", seconds=policy.interval_seconds
                )
        log.info("policy %s -> %s applied", old.version, policy.version)

    async def _reload(self) -> None:
        """The "policy reload" job: a bad file keeps the old policy and says why."""
        from specguard.errors import ConfigError

        try:
            policy = await asyncio.to_thread(self.reloader)
        except ConfigError as exc:
            if str(exc) != self.reload_error:
                log.error("policy reload failed, keeping version %s:\n%s", self.policy.version, exc)
                self.counters.reloads["error"] += 1
            self.reload_error = str(exc)
            return
        except Exception:
            log.exception("policy reload has failed")
            return
        self.reload_error = None
        if policy is not None and policy.version != self.policy.version:
            await self.set_policy(policy)
            self.counters.reloads["ok"] += 1

    def _on_job_event(self, event: Any) -> None:
        from apscheduler.events import EVENT_JOB_MISSED

        if event.code == EVENT_JOB_MISSED:  # the loop was busy past the grace: the next run is on time
            self.missed_runs += 1
            log.debug("%s skipped: the event loop was busy past its grace time", event.job_id)
            return
        log.warning(
            "guard evaluation: scheduler event %s (%s)", event.code, getattr(event, "exception", "") or ""
        )
