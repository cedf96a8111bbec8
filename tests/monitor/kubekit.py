"""A loopback stand-in for the Kubernetes API that the official client talks to: one ConfigMap
(GET, PATCH) and coordination.k8s.io/v1 Leases (GET, POST, PUT), each write checked against the
``resourceVersion`` that was read, as the API server does (409 Conflict otherwise).

``FakeKubeApi.app()`` serves it in the test's event loop; ``Threaded(app)`` serves it from a
thread of its own, for clients in other processes (the fleet test)."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def status(code: int, reason: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
    return web.json_response(body, status=code)


class FakeKubeApi:
    """GET and PATCH of one ConfigMap, and Leases, with resourceVersion checks."""

    def __init__(self, data=None, *, interfering_writes=0):
        self.version = 7
        self.data = dict(data or {"other": "kept"})
        self.interfering_writes = interfering_writes  # someone else writes between our read and patch
        self.patches = []
        self.conflicts = 0
        self.leases: dict[tuple[str, str], dict] = {}
        self.lease_writes: list[tuple[str, str | None]] = []  # (verb, holderIdentity) of accepted writes
        self.lease_version = 100
        self.down = False  # every request answers 500 (an API server outage)

    def obj(self):
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "routing", "namespace": "serving", "resourceVersion": str(self.version)},
            "data": self.data,
        }

    # -- ConfigMap -----------------------------------------------------------------------------
    async def get(self, request):
        return web.json_response(self.obj())

    async def patch(self, request):
        body = await request.json()
        self.patches.append((request.headers.get("Content-Type"), body))
        if self.interfering_writes:
            self.interfering_writes -= 1
            self.version += 1
            self.data["human"] = f"edit {self.version}"
        if body.get("metadata", {}).get("resourceVersion") != str(self.version):
            self.conflicts += 1
            return status(409, "Conflict")
        self.version += 1
        self.data.update(body.get("data", {}))
        return web.json_response(self.obj())

    # -- Lease ---------------------------------------------------------------------------------
    def holder(self, namespace="serving", name="specguard-guard"):
        lease = self.leases.get((namespace, name))
        return None if lease is None else (lease.get("spec") or {}).get("holderIdentity")

    async def get_lease(self, request):
        lease = self.leases.get((request.match_info["namespace"], request.match_info["name"]))
        return status(404, "NotFound") if lease is None else web.json_response(lease)

    async def create_lease(self, request):
        body = await request.json()
        namespace, name = request.match_info["namespace"], body["metadata"]["name"]
        if (namespace, name) in self.leases:
            return status(409, "AlreadyExists")
        return self._store(namespace, name, body, "create", 201)

    async def replace_lease(self, request):
        body = await request.json()
        key = (request.match_info["namespace"], request.match_info["name"])
        current = self.leases.get(key)
        if current is None:
            return status(404, "NotFound")
        if body.get("metadata", {}).get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return status(409, "Conflict")
        return self._store(*key, body, "replace", 200)

    def _store(self, namespace, name, body, verb, code):
        self.lease_version += 1
        metadata = {**body.get("metadata", {}), "name": name, "namespace": namespace}
        metadata["resourceVersion"] = str(self.lease_version)
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **body, "metadata": metadata}
        self.leases[(namespace, name)] = lease
        self.lease_writes.append((verb, (lease.get("spec") or {}).get("holderIdentity")))
        return web.json_response(lease, status=code)

    @web.middleware
    async def outage(self, request, handler):
        return status(500, "InternalError") if self.down else await handler(request)

    def app(self):
        app = web.Application(middlewares=[self.outage])
        path = "/api/v1/namespaces/{namespace}/configmaps/{name}"
        app.router.add_get(path, self.get)
        app.router.add_patch(path, self.patch)
        app.router.add_get(LEASES + "/{name}", self.get_lease)
        app.router.add_put(LEASES + "/{name}", self.replace_lease)
        app.router.add_post(LEASES, self.create_lease)
        return app


class Threaded:
    """Serve an aiohttp app on 127.0.0.1 from a thread and event loop of its own (``with ... as url``)."""

    def __init__(self, app: web.Application):
        self.app = app
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-api-stand-in", daemon=True)
        self._runner: web.AppRunner | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def __enter__(self) -> str:
        self._thread.start()
        self._ready.wait(10)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
