"""Where a plan goes: the tap's router, an HTTP webhook, a Kubernetes ConfigMap.

Every actuator has ``name`` and ``async apply(plan, decisions)``; a failure raises
SourceError and the daemon retries on its next evaluation (it keeps applying until each
actuator has seen the current plan version). Network calls all carry timeouts.

The ConfigMap is written with optimistic concurrency: read, change only our key, patch with
the ``resourceVersion`` that was read; a 409 Conflict means someone else wrote in between, so
the map is read again and the change re-applied, never written blindly. Inside our key, only
the classes this guard just decided about replace the stored entries (several replicas that
decide never clobber each other's classes). Fleet replicas read
the plan back with ``ConfigMapActuator.read_plan``. The ``kubernetes`` package is an optional
extra, imported only when a ConfigMap is configured.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import aiohttp

from specguard.errors import ConfigError, InputError, SourceError
from specguard.monitor import state as state_mod
from specguard.rules.guard import Decision

log = logging.getLogger("specguard.actuators")


class Actuator(Protocol):
    name: str

    async def apply(self, plan: state_mod.PlanDocument, decisions: Sequence[Decision]) -> None: ...


class RouterActuator:
    """The tap's own routing (standalone mode): ``Router.set_plan``."""

    name = "router"

    def __init__(self, router: Any):
        self._router = router

    async def apply(self, plan: state_mod.PlanDocument, decisions: Sequence[Decision]) -> None:
        try:
            self._router.set_plan(plan.routing())
            if plan.replicas:  # fleet: replica counts travel with the plan
                known = self._router.replicas()
                self._router.set_replicas({p: n for p, n in plan.replicas.items() if p in known})
        except Exception as exc:  # the router rejects a plan naming unknown pools
            raise SourceError(f"router refused the plan: {exc}") from exc


class WebhookActuator:
    """POST each decision that changed something (JSON) to a URL; undelivered ones are retried later."""

    name = "webhook"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        retries: int = 2,
        backoff: float = 0.5,
        headers: dict[str, str] | None = None,
        outbox_limit: int = 1000,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ):
        self.url = url
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._headers = headers or {}
        self._outbox: deque[dict[str, Any]] = deque(maxlen=outbox_limit)
        self._sleep = sleep

    async def apply(self, plan: state_mod.PlanDocument, decisions: Sequence[Decision]) -> None:
        for decision in decisions:
            if decision.action != "none":
                self._outbox.append({"plan_version": plan.version, "decision": decision.to_json()})
        if not self._outbox:
            return
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout, headers=self._headers) as session:
            while self._outbox:
                await self._post(session, self._outbox[0])
                self._outbox.popleft()

    async def _post(self, session: aiohttp.ClientSession, body: dict[str, Any]) -> None:
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await self._sleep(self.backoff * 2 ** (attempt - 1))
            try:
                async with session.post(self.url, json=body) as response:
                    if response.status < 300:
                        return
                    last = f"HTTP {response.status}"
                    if response.status < 500 and response.status not in (408, 429):
                        break  # the receiver rejected it: retrying the same body will not help
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = type(exc).__name__
        raise SourceError(f"webhook {self.url}: {last} ({len(self._outbox)} decision(s) queued)")


class ConfigMapActuator:
    """The plan as JSON under ``key`` of one ConfigMap, via the official Kubernetes client."""

    name = "configmap"

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        key: str = "plan.json",
        timeout: float = 10.0,
        conflict_retries: int = 5,
        api_factory: Callable[[], Any] | None = None,
        kubeconfig: str | None = None,
        api_server: str | None = None,
    ):
        self.namespace = namespace
        self.configmap = name
        self.key = key
        self.timeout = timeout
        self.conflict_retries = conflict_retries
        self._factory = api_factory or (lambda: core_api(kubeconfig=kubeconfig, api_server=api_server))
        self._api: Any = None
        self.conflicts = 0  # 409s seen (each was re-read and retried)
        self._pending: set = set()

    def _core(self) -> Any:
        if self._api is None:
            self._api = self._factory()
        return self._api

    async def apply(self, plan: state_mod.PlanDocument, decisions: Sequence[Decision]) -> None:
        # classes decided here and not yet written survive a failed write until one succeeds
        self._pending |= {d.key for d in decisions if d.action != "none" and not d.dry_run}
        async with asyncio.timeout(self.timeout * (self.conflict_retries + 2)):
            await asyncio.to_thread(self._write, plan, set(self._pending))
        self._pending.clear()

    def _merge(self, stored_text: str | None, plan: state_mod.PlanDocument, changed: set) -> str:
        """Our plan laid over the stored one: only the classes we decided about replace stored entries.

        With no (readable) stored plan, ours is written whole. Another writer's entries for classes
        we did not act on are kept, so replicas never clobber each other's decisions. The stored
        version follows ours (followers compare it with the decider's ``specguard_plan_version``).
        """
        stored = None
        if stored_text is not None:
            try:
                stored = state_mod.parse(stored_text, f"configmap key {self.key}")
            except InputError as exc:
                log.warning(
                    "configmap %s/%s: stored plan unreadable (%s); writing ours whole",
                    self.namespace,
                    self.configmap,
                    exc,
                )
        if stored is None:
            merged = plan
        else:
            states = dict(stored.states)
            states.update({k: plan.states[k] for k in changed if k in plan.states})
            version = max(stored.version + (1 if changed else 0), plan.version)
            merged = state_mod.PlanDocument(version, plan.updated_at, states, {**stored.pools, **plan.pools})
            if not changed and version == stored.version:
                return stored_text  # nothing decided here: leave the stored plan as it is
        return json.dumps(state_mod.encode(merged), indent=1, sort_keys=True)

    def _write(self, plan: state_mod.PlanDocument, changed: set) -> None:
        from kubernetes.client.exceptions import ApiException

        api = self._core()
        where = f"configmap {self.namespace}/{self.configmap}"
        for _attempt in range(self.conflict_retries + 1):
            try:
                current = api.read_namespaced_config_map(
                    self.configmap, self.namespace, _request_timeout=self.timeout
                )
            except ApiException as exc:
                raise SourceError(f"{where}: read failed: HTTP {exc.status} {exc.reason}") from exc
            except Exception as exc:  # urllib3 connection and timeout errors
                raise SourceError(f"{where}: read failed: {type(exc).__name__}") from exc
            stored_text = (current.data or {}).get(self.key)
            text = self._merge(stored_text, plan, changed)
            if stored_text == text:
                return
            body = {
                "metadata": {"resourceVersion": current.metadata.resource_version},
                "data": {self.key: text},
            }
            try:
                api.patch_namespaced_config_map(
                    self.configmap, self.namespace, body, _request_timeout=self.timeout
                )
                return
            except ApiException as exc:
                if exc.status == 409:
                    self.conflicts += 1
                    log.info("%s changed since it was read (409); reading it again", where)
                    continue
                raise SourceError(f"{where}: write failed: HTTP {exc.status} {exc.reason}") from exc
            except Exception as exc:
                raise SourceError(f"{where}: write failed: {type(exc).__name__}") from exc
        raise SourceError(f"{where}: still conflicting after {self.conflict_retries} retries")

    async def read_plan(self) -> state_mod.PlanDocument | None:
        """The plan stored in the ConfigMap (fleet replicas follow it); None when the key is absent."""
        async with asyncio.timeout(self.timeout + 1.0):
            return await asyncio.to_thread(self._read)

    def _read(self) -> state_mod.PlanDocument | None:
        where = f"configmap {self.namespace}/{self.configmap}"
        try:
            current = self._core().read_namespaced_config_map(
                self.configmap, self.namespace, _request_timeout=self.timeout
            )
        except Exception as exc:
            raise SourceError(f"{where}: read failed: {exc}") from exc
        text = (current.data or {}).get(self.key)
        if text is None:
            return None
        return state_mod.parse(text, f"{where} key {self.key}")  # (InputError when malformed)


def core_api(*, kubeconfig: str | None = None, api_server: str | None = None) -> Any:
    """A CoreV1Api over ``api_client``'s connection."""
    from kubernetes import client

    return client.CoreV1Api(api_client(kubeconfig=kubeconfig, api_server=api_server))


def api_client(*, kubeconfig: str | None = None, api_server: str | None = None) -> Any:
    """An ApiClient: ``api_server`` (e.g. kubectl proxy), else a kubeconfig, else in-cluster, else ~/.kube."""
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise ConfigError(
            "actuators.configmap needs the kubernetes client: pip install 'specguard[kubernetes]'"
        ) from exc
    if api_server:
        configuration = client.Configuration()
        configuration.host = api_server
        return client.ApiClient(configuration)
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()
