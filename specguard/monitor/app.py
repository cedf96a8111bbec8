"""Standalone wiring: the tap, one scrape loop per pool, ``/metrics``, ``/healthz`` and ``/livez``
on the data listener (``tap.listen``), and the control endpoints on a listener of their own.

``Monitor`` builds the parts from the config and owns their lifecycle through aiohttp's
cleanup contexts. Other components join before ``build_app()``:

- ``monitor.attach(name, start, stop)``: background work started after the tap and the scrape
  loops, stopped before them (e.g. the guard's APScheduler);
- ``monitor.add_control_routes([...])``: the control endpoints (``/status``, ``/api/v1/alerts``,
  ``/api/v1/overrides``, ``/api/v1/plan``), served on the control listener (``server.listen``,
  optionally TLS/mTLS) only; the data listener answers 404 for them and never proxies them;
- ``monitor.add_routes([...])``: extra endpoints on the data listener, before the tap's catch-all;
- ``monitor.registry``: register more collectors on it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from specguard.exporters import (
    addresses,
    clientguard,
    collector,
    enginepage,
    health,
    offload,
    poolwatch,
    promtext,
    routing,
    stackinfo,
    stats,
    tap,
    tapgate,
)
from specguard.exporters.addresses import join_listen
from specguard.exporters.classify import Classifier
from specguard.exporters.config import ExporterConfig, PoolConfig
from specguard.exporters.snapshot import EngineSnapshot
from specguard.monitor import controltls, guard_config
from specguard.monitor.config import SpecguardConfig

log = logging.getLogger("specguard.app")
STACK_PROBE_SECONDS = 600.0  # how often a pool's engine version and model are read again
CONTROL_PATHS = ("/status", "/api/v1/alerts", "/api/v1/overrides", "/api/v1/plan")
"""Served on the control listener only: the data listener answers 404 and never proxies them."""
CONTROL_CONNECTIONS = 256
"""Open connections the control listener keeps at most (Alertmanager, followers, operators)."""


class ControlListenError(OSError):
    """The control listener's address could not be bound (the tap's could)."""


@dataclass
class Component:
    name: str
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]


METRICS_MAX_BYTES = 32 << 20
"""Largest /metrics page served (far above what the shipped config renders)."""


def _render(registry: CollectorRegistry) -> bytes:
    """``generate_latest`` in a worker thread; a collector whose dict the loop changed meanwhile
    ("changed size during iteration") is simply read again."""
    for _ in range(2):
        try:
            return generate_latest(registry)
        except RuntimeError:
            continue
    return generate_latest(registry)


def page_fetch(
    limits: promtext.Limits = promtext.LIMITS, keys: Mapping[str, str] | None = None
) -> poolwatch.Fetch:
    """A fetch that scrapes one pool's page through the adapters (``exporters.scrape``), within
    ``limits`` (the config's ``scrape.max_*``), with the pool's API key when it has one (``keys``)."""

    async def fetch(pool: PoolConfig, timeout: float) -> EngineSnapshot:
        from specguard.exporters import scrape  # the adapters' module; imported late on purpose

        url = pool.url + pool.metrics_path
        auth = tapgate.auth_headers(keys or {}, pool.name)
        return await scrape.fetch_snapshot(
            url, engine=pool.engine, timeout=timeout, limits=limits, headers=auth
        )

    return fetch


class Monitor:
    """Tap + scrape + exporter for one config; the unit ``specguard run`` serves."""

    def __init__(
        self,
        config: SpecguardConfig | ExporterConfig,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        fetch: poolwatch.Fetch | None = None,
        session: aiohttp.ClientSession | None = None,
    ):
        self.config = config
        ex = config.exporter if isinstance(config, SpecguardConfig) else config
        self.exporter_config = ex
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics_max_bytes = METRICS_MAX_BYTES
        self._metrics_render: asyncio.Future[bytes] | None = None
        self.classifier = Classifier(ex.classes)
        # Label sets appear with their first request (none pre-created): an idle class costs
        # Prometheus no series. The guard's class list comes from the config, not from here.
        self.stats = stats.WindowedStats(
            window_seconds=ex.tap.window_seconds,
            max_records=ex.tap.max_window_records,
            full_rollback_request_threshold=ex.tap.full_rollback_request_threshold,
            clock=clock,
        )
        tap_cfg = ex.tap
        policy = health.EjectPolicy(
            tap_cfg.eject_consecutive_5xx, tap_cfg.eject_seconds, tap_cfg.eject_max_seconds
        )
        self.health = health.PoolHealth(ex.pool_names, clock=clock, eject=policy)
        self.router = routing.Router(
            ex.pools,
            default_pool=ex.tap.default_pool or ex.pools[0].name,
            nospec_pool=ex.tap.nospec_pool,
            holdout_share=ex.tap.holdout_share,
            probe_share=ex.tap.probe_share,
            rng=rng,
            health=self.health if ex.tap.failover else None,
        )
        self.tap = tap.Tap(
            ex,
            stats=self.stats,
            router=self.router,
            classifier=self.classifier,
            session=session,
            clock=clock,
            health=self.health,
        )
        self.pages = None
        if ex.tap.engine_pages:
            self.pages = enginepage.EnginePages(
                ex.pools,
                keys=self.tap.keys,
                tap=self.tap.handle,
                timeout=ex.scrape.timeout_seconds,
                limits=ex.scrape.limits,
            )
        self.watches = {pool.name: poolwatch.PoolWatch(pool, clock=clock) for pool in ex.pools}
        self.loops = [
            poolwatch.ScrapeLoop(
                self.watches[pool.name],
                fetch or page_fetch(ex.scrape.limits, self.tap.keys),
                interval=ex.scrape.interval_seconds,
                timeout=ex.scrape.timeout_seconds,
                on_snapshot=self._on_snapshot,
                health=self.health,
                down_interval=ex.scrape.down_interval_seconds,
            )
            for pool in ex.pools
        ]
        self.clients = clientguard.ClientGuard(ex.tap.client_limits)
        self.tap.clients = self.clients
        self.registry.register(self.clients.collector())
        nospec = [pool.name for pool in ex.pools if not pool.speculative]
        self.registry.register(collector.TapCollector(self.stats, self.tap.in_flight, nospec))
        self.registry.register(collector.EngineCollector(self.watches.values()))
        self.registry.register(collector.HealthCollector(self.health))
        self.registry.register(self.tap.gate.collector())
        self.stacks: dict[str, dict[str, str]] = {}  # pool -> engine, engine_version, model it serves
        self._stack_probed: dict[str, float] = {}
        self._probes: set[asyncio.Task[None]] = set()
        self._clock = clock
        self._components: list[Component] = []
        self._routes: list[web.RouteDef] = []
        self.app: web.Application | None = None
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._host = self.exporter_config.tap.host
        # the control listener: only a full config (the guard's sections) has one
        self.control_listen: str | None = None
        self.control_tls: guard_config.TlsSettings | None = None
        self._control_explicit = False
        if isinstance(config, SpecguardConfig):
            server = config.sections.get("server") or guard_config.ServerSettings()
            self.control_listen = guard_config.control_listen(server, ex.tap.host, ex.tap.port)
            self.control_tls = server.tls
            self._control_explicit = server.listen is not None
        limits = ex.tap.client_limits
        self.control_clients = clientguard.ClientGuard(
            clientguard.ClientLimits(
                min(CONTROL_CONNECTIONS, limits.max_connections, clientguard.fd_cap()),
                limits.header_timeout,
                limits.body_timeout,
                limits.idle_timeout,
            )
        )
        self._control_routes: list[web.RouteDef] = []
        self.control_app: web.Application | None = None
        self._control_runner: web.AppRunner | None = None
        self._control_server: asyncio.Server | None = None
        self.tls: controltls.ReloadingContext | None = None
        self.control_url: str | None = None

    def _on_snapshot(self, pool: PoolConfig, snapshot: EngineSnapshot) -> None:
        self.tap.set_engine(pool.name, snapshot.engine)
        now = self._clock()
        if now - self._stack_probed.get(pool.name, -math.inf) >= STACK_PROBE_SECONDS:
            self._stack_probed[pool.name] = now
            task = asyncio.get_running_loop().create_task(self._probe_stack(pool, snapshot.engine))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)

    async def _probe_stack(self, pool: PoolConfig, engine: str) -> None:
        """Read what the pool serves (engine version, model) for the profile's freshness check."""
        try:
            auth = tapgate.auth_headers(self.tap.keys, pool.name)
            async with aiohttp.ClientSession(headers=auth) as session:
                found = await stackinfo.fetch(
                    session, pool.url, engine, self.exporter_config.scrape.timeout_seconds
                )
        except Exception:  # a probe must never take anything down; the stack stays unknown
            log.debug("stack probe of %s failed", pool.name, exc_info=True)
            return
        if found:
            self.stacks[pool.name] = found

    def stack_of(self, pool: str | None) -> dict[str, str]:
        """What ``pool`` serves, as far as known ({} before the first probe answered)."""
        return dict(self.stacks.get(pool or "", {}))

    # -- extension points --------------------------------------------------------------------
    def attach(
        self, name: str, start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]
    ) -> None:
        if self.app is not None:
            raise RuntimeError("attach components before build_app()")
        self._components.append(Component(name, start, stop))

    def add_routes(self, routes: Iterable[web.RouteDef]) -> None:
        if self.app is not None:
            raise RuntimeError("add routes before build_app()")
        self._routes.extend(routes)

    def add_control_routes(self, routes: Iterable[web.RouteDef]) -> None:
        """Endpoints of the control listener (the guard's API); needs a config with one."""
        if self.app is not None:
            raise RuntimeError("add routes before build_app()")
        if self.control_listen is None:
            raise RuntimeError("this Monitor has no control listener (build it from a SpecguardConfig)")
        self._control_routes.extend(routes)

    # -- endpoints ---------------------------------------------------------------------------
    async def metrics(self, request: web.Request) -> web.Response:
        """The page, rendered in a worker thread (one render at a time: concurrent scrapes share
        it), so a large page never stalls the requests this loop relays; a page above
        ``METRICS_MAX_BYTES`` is refused with 503 and a log line."""
        if self._metrics_render is None or self._metrics_render.done():
            self._metrics_render = asyncio.ensure_future(asyncio.to_thread(_render, self.registry))
        body = await asyncio.shield(self._metrics_render)
        if len(body) > self.metrics_max_bytes:
            message = (
                f"/metrics: the page is {len(body)} bytes, above the cap of {self.metrics_max_bytes}: "
                "too many series (see classes.max_combinations)"
            )
            log.error("%s; refused", message)
            return web.json_response({"error": message}, status=503)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        """200 ``ok`` while at least one pool serves; 503 ``degraded`` when every pool is down
        (the body names them and why). For people and external checks: the Kubernetes probes use
        ``/livez``, since a pod whose readiness waited for the pools would never become ready
        behind engine Services that list only ready pods."""
        pools = {name: watch.up for name, watch in self.watches.items()}
        # why a pool is down (unreachable, or its page refused: too large, a line too long...)
        errors = {
            name: (watch.last_error or "")[:300] for name, watch in self.watches.items() if not watch.up
        }
        view = self.health.view()
        serving = {name: state.healthy for name, state in view.items()}
        body: dict[str, object] = {
            "status": "ok",
            "pools_up": pools,
            "pools_serving": serving,
            "pools_error": errors,
        }
        if serving and not any(serving.values()):
            body["status"] = "degraded"
            body["reason"] = "every pool is down: " + "; ".join(
                f"{name} ({view[name].reason or errors.get(name) or 'unreachable'})" for name in serving
            )
            return web.json_response(body, status=503)
        return web.json_response(body)

    async def livez(self, request: web.Request) -> web.Response:
        """200 while this process serves HTTP: the probes' endpoint, free of every dependency."""
        return web.json_response({"status": "alive"})

    async def not_here(self, request: web.Request) -> web.Response:
        """A control path asked on the data listener: 404, and never proxied to an engine."""
        shown = self.control_url or self.control_listen
        where = f" (the control listener: {shown})" if shown else ""
        return web.json_response(
            {"error": f"{request.path} is served on the control listener{where}"}, status=404
        )

    async def _lifecycle(self, app: web.Application):
        offload.acquire()
        await self.tap.start()
        for loop in self.loops:
            loop.start()
        started: list[Component] = []
        try:
            for component in self._components:
                log.info("starting %s", component.name)
                await component.start()
                started.append(component)
            yield
        finally:
            for component in reversed(started):
                log.info("stopping %s", component.name)
                try:
                    await component.stop()
                except Exception:
                    log.exception("stopping %s failed", component.name)
            for loop in self.loops:
                await loop.stop()
            for task in list(self._probes):
                task.cancel()
            if self.tls is not None:
                self.tls.stop()
            offload.release()
            await self.tap.close()

    def build_app(self) -> web.Application:
        """The aiohttp app: own endpoints, attached routes, then the tap's catch-all proxy."""
        if self.app is None:
            app = web.Application(
                client_max_size=self.exporter_config.tap.max_body_bytes, middlewares=[self.clients.middleware]
            )
            app.router.add_get("/metrics", self.metrics)
            app.router.add_get("/healthz", self.healthz)
            app.router.add_get("/livez", self.livez)
            app.router.add_routes(self._routes)
            for path in CONTROL_PATHS:
                app.router.add_route("*", path, self.not_here)
            if self.pages is not None:
                app.router.add_routes(self.pages.routes())
            app.router.add_routes(self.tap.routes())
            app.cleanup_ctx.append(self._lifecycle)
            self.app = app
            if self.control_listen is not None:
                control = web.Application(middlewares=[self.control_clients.middleware, controltls.cert_name])
                control.router.add_routes(self._control_routes)
                self.control_app = control
        return self.app

    async def listen(self, host: str | None = None, port: int | None = None) -> None:
        """Bind the listening sockets (the config's ``tap.listen`` and the control listener's
        ``server.listen`` by default) without serving yet. ``port`` 0 (any free port) puts the
        control listener on any free port too; another ``port`` moves a default control listener
        beside it.

        ``specguard run`` binds first, so a taken port is the first and only thing it reports,
        before any component starts or logs. Connections wait in the backlog until ``start()``.
        Raises OSError (e.g. the port is taken)."""
        if self._server is not None:
            return
        if self.control_listen is not None and self.control_tls is not None and self.tls is None:
            file = self.config.file if isinstance(self.config, SpecguardConfig) else "<config>"
            self.tls = controltls.ReloadingContext(self.control_tls, file)  # ConfigError: a bad file
        tap_cfg = self.exporter_config.tap
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.clients.factory(self._handler),
            host or tap_cfg.host,
            tap_cfg.port if port is None else port,
            reuse_address=True,
            backlog=self.clients.backlog,
            start_serving=False,
        )
        self._host = host or tap_cfg.host
        if self.control_listen is None:
            return
        if port == 0 and self.control_listen is not None:  # any free port: the control listener too
            control_host = (addresses.split_listen(self.control_listen) or ("127.0.0.1", 0))[0]
            self.control_listen = join_listen(control_host, 0)
        elif port is not None and not self._control_explicit:  # the default follows the tap's port
            self.control_listen = guard_config.control_listen(guard_config.ServerSettings(), "", port)
        control_host, control_port = addresses.split_listen(self.control_listen) or ("127.0.0.1", 0)
        try:
            self._control_server = await loop.create_server(
                self.control_clients.factory(self._control_handler),
                control_host,
                control_port,
                reuse_address=True,
                backlog=self.control_clients.backlog,
                ssl=self.tls.context if self.tls is not None else None,
                start_serving=False,
            )
        except OSError as exc:
            self._server.close()
            self._server = None
            raise ControlListenError(exc.errno, exc.strerror) from exc

    @property
    def control_port(self) -> int | None:
        """The control listener's bound port (after ``listen()``)."""
        if self._control_server is None or not self._control_server.sockets:
            return None
        return int(self._control_server.sockets[0].getsockname()[1])

    def _control_handler(self) -> asyncio.Protocol:
        assert self._control_runner is not None and self._control_runner.server is not None
        return self._control_runner.server()

    def _handler(self) -> asyncio.Protocol:
        """aiohttp's protocol for one connection (the runner exists by the time one is accepted)."""
        assert self._runner is not None and self._runner.server is not None
        return self._runner.server()

    async def start(self, host: str | None = None, port: int | None = None) -> str:
        """Serve on host:port (the config's ``tap.listen`` by default, or where ``listen()``
        bound); returns the base URL."""
        await self.listen(host, port)
        assert self._server is not None
        app = self.build_app()
        listen = self.exporter_config.tap
        try:
            self._runner = web.AppRunner(
                app,
                handler_cancellation=True,
                access_log=None,
                # a backstop only: the client guard closes idle connections first, and counts them
                keepalive_timeout=listen.client_idle_timeout_seconds + 5.0,
                logger=clientguard.ServerLog(logging.getLogger("specguard.http")),
            )
            await self._runner.setup()
            if self.control_app is not None and self._control_server is not None:
                self._control_runner = web.AppRunner(
                    self.control_app,
                    handler_cancellation=True,
                    access_log=None,
                    keepalive_timeout=listen.client_idle_timeout_seconds + 5.0,
                    logger=clientguard.ServerLog(logging.getLogger("specguard.http")),
                )
                await self._control_runner.setup()
                await self._control_server.start_serving()
                if self.tls is not None:
                    self.tls.start()
                host = (addresses.split_listen(self.control_listen or "") or ("127.0.0.1", 0))[0]
                scheme = "https" if self.tls is not None else "http"
                self.control_url = f"{scheme}://{join_listen(host, self.control_port or 0)}"
            await self._server.start_serving()
        except BaseException:  # close what setup() opened (the tap's session) and the sockets
            await self.stop()
            raise
        bound = self._server.sockets[0].getsockname()[1]
        return f"http://{join_listen(self._host, bound)}"

    async def stop(self) -> None:
        for server in (self._server, self._control_server):
            if server is not None:  # stop accepting; the runners then close the connections
                server.close()
        if self._control_runner is not None:
            await self._control_runner.cleanup()
            self._control_runner = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.tls is not None:
            self.tls.stop()
        self._server = None
        self._control_server = None

    async def __aenter__(self) -> Monitor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
