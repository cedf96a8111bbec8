"""One decider at a time: a Kubernetes Lease, or a lock on the plan store.

Two decider replicas must never both write plans. An elector answers ``is_leader`` (read by
the daemon before every evaluation and before every write) and names the ``holder`` when it
knows it; ``start()`` / ``stop()`` run and end the election.

- ``Single``: no election (one decider, or a follower).
- ``FileLock``: ``flock(2)`` on a file next to the plan store. The kernel drops the lock when
  its holder dies, however it dies, so a standby takes over within one retry period.
- ``Lease``: the official Kubernetes client's leader election (``kubernetes.leaderelection``,
  a ``coordination.k8s.io/v1`` Lease), run in a thread of its own because it blocks. A clean
  stop hands the Lease back (holder cleared) so a standby need not wait out the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from specguard.errors import ConfigError

log = logging.getLogger("specguard.leader")
# the client library logs every retry at info ("yet to finish lease_duration ..."); we log changes
logging.getLogger("leaderelection").setLevel(logging.WARNING)


class Elector(Protocol):
    name: str

    @property
    def is_leader(self) -> bool: ...

    @property
    def holder(self) -> str | None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def default_identity() -> str:
    """``$SPECGUARD_POD_NAME`` (the Downward API), else ``hostname-pid``.

    A restarted container of the same pod keeps its name and renews its own Lease at once.
    """
    pod = os.environ.get("SPECGUARD_POD_NAME", "").strip()
    return pod or f"{socket.gethostname()}-{os.getpid()}"


class Single:
    """No election: this process is the only decider."""

    name = "none"
    is_leader = True
    holder = None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class FileLock:
    """An exclusive ``flock`` on ``path``, tried now and then every ``retry_seconds`` until held.

    Works between processes on one host (or a filesystem whose locks are shared, which NFS
    without lockd is not). The holder writes its identity into the file for people and standbys.
    """

    name = "lock"

    def __init__(self, path: str | Path, *, identity: str | None = None, retry_seconds: float = 2.0):
        self.path = Path(path)
        self.identity = identity or default_identity()
        self.retry_seconds = retry_seconds
        self._fd: int | None = None
        self._holder: str | None = None
        self._task: asyncio.Task | None = None
        self._unlocked = False  # the lock file could not be created: decide without it

    @property
    def is_leader(self) -> bool:
        return self._fd is not None or self._unlocked

    @property
    def holder(self) -> str | None:
        return self.identity if self.is_leader else self._holder

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never blocks.

        A lock file that cannot be created at all (read-only or missing directory) must not stop
        the guard: it then decides unlocked, as a single decider would, and says so.
        """
        if self._fd is not None or self._unlocked:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            self._unlocked = True
            log.error(
                "cannot create the lock %s (%s): deciding without it; run no second decider on this plan",
                self.path,
                exc.strerror or exc,
            )
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with contextlib.suppress(OSError):
                self._holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or None
            os.close(fd)
            return False
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, (self.identity + "\n").encode(), 0)
        self._fd = fd
        log.info("leader: %s holds %s", self.identity, self.path)
        return True

    async def start(self) -> None:
        if not self.try_acquire():
            log.info(
                "standby: %s is held by %s; retrying every %g s", self.path, self._holder, self.retry_seconds
            )
            self._task = asyncio.create_task(self._retry(), name="leader election (lock)")

    async def _retry(self) -> None:
        while not self.try_acquire():
            await asyncio.sleep(self.retry_seconds)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            log.info("leader: %s released %s", self.identity, self.path)


class _Stopped(Exception):
    """Raised inside the client's election loop to end it (its sleeps cannot be interrupted)."""


class _Timed:
    """An API object whose every call carries ``_request_timeout`` (the election's calls have none)."""

    def __init__(self, api: Any, timeout: float):
        self._api, self._timeout = api, timeout

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._api, name)
        return functools.partial(value, _request_timeout=self._timeout) if callable(value) else value


class Lease:
    """Leader election on a ``coordination.k8s.io/v1`` Lease with the official client.

    ``api_client`` is a ``kubernetes.client.ApiClient`` factory (the ConfigMap actuator's
    connection settings). Timing as client-go: the holder renews every ``retry_period``, gives up
    after ``renew_deadline`` without a renewal, and a standby takes an unrenewed Lease after
    ``lease_duration`` (measured on its own clock).
    """

    name = "lease"

    def __init__(
        self,
        name: str,
        namespace: str,
        *,
        api_client: Callable[[], Any],
        identity: str | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        timeout: float = 5.0,
    ):
        self.lease_name = name
        self.namespace = namespace
        self.identity = identity or default_identity()
        self.lease_duration = max(1, math.ceil(lease_duration))  # whole seconds: leaseDurationSeconds
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.timeout = timeout
        self._api_client = api_client
        self._leading = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._holder: str | None = None
        self._renewed_at = float("-inf")

    @property
    def is_leader(self) -> bool:
        """Leading, and renewed within ``renew_deadline`` (a hung API call must not leave two leaders)."""
        return self._leading.is_set() and time.monotonic() - self._renewed_at < self.renew_deadline

    @property
    def holder(self) -> str | None:
        return self.identity if self.is_leader else self._holder

    def _coordination(self) -> Any:
        from kubernetes import client

        return client.CoordinationV1Api(self._api_client())

    def _lock(self) -> Any:
        from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

        elector = self

        class StoppableLeaseLock(LeaseLock):
            def get(self, name: str, namespace: str) -> Any:
                if elector._stopping.is_set():
                    raise _Stopped
                found, record = super().get(name, namespace)
                if found and record is not None:
                    elector._holder = record.holder_identity
                return found, record

            def create(self, name: str, namespace: str, election_record: Any) -> bool:
                return elector._renewed(super().create(name, namespace, election_record))

            def update(self, name: str, namespace: str, updated_record: Any) -> bool:
                return elector._renewed(super().update(name, namespace, updated_record))

        lock = StoppableLeaseLock(self.lease_name, self.namespace, self.identity)
        # our connection (not the client's global default), and a timeout on every call
        lock.api_instance = _Timed(self._coordination(), self.timeout)
        return lock

    def _renewed(self, ok: bool) -> bool:
        if ok:
            self._renewed_at = time.monotonic()
        return ok

    def _run(self) -> None:
        from kubernetes.leaderelection import electionconfig, leaderelection

        while not self._stopping.is_set():
            config = electionconfig.Config(
                self._lock(),
                lease_duration=self.lease_duration,
                renew_deadline=self.renew_deadline,
                retry_period=self.retry_period,
                onstarted_leading=self._started,
                onstopped_leading=self._lost,
            )
            try:
                leaderelection.LeaderElection(config).run()
            except _Stopped:
                break
            except Exception as exc:  # API unreachable, bad answer: a standby again, try later
                if self._leading.is_set():
                    self._lost()
                log.warning("leader election on Lease %s/%s: %s", self.namespace, self.lease_name, exc)
            self._stopping.wait(self.retry_period)

    def _started(self) -> None:
        self._leading.set()
        log.info("leader: %s holds Lease %s/%s", self.identity, self.namespace, self.lease_name)

    def _lost(self) -> None:
        if self._leading.is_set():
            log.warning("leader: %s lost Lease %s/%s", self.identity, self.namespace, self.lease_name)
        self._leading.clear()

    async def start(self) -> None:
        try:
            import kubernetes.leaderelection  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                "actuators.leader_election (a Lease) needs the kubernetes client: "
                "pip install 'specguard[kubernetes]'"
            ) from exc
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopping.set()
        was_leading = self._leading.is_set()
        self._leading.clear()  # stop deciding before handing the Lease back
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self.retry_period + self.timeout)
            self._thread = None
        if was_leading:
            try:
                await asyncio.to_thread(self._release)
            except Exception as exc:
                log.warning("could not hand back Lease %s/%s: %s", self.namespace, self.lease_name, exc)

    def _release(self) -> None:
        """Clear the holder (as client-go's ReleaseOnCancel) so a standby takes over at once."""
        api = self._coordination()
        lease = api.read_namespaced_lease(self.lease_name, self.namespace, _request_timeout=self.timeout)
        if lease.spec is None or lease.spec.holder_identity != self.identity:
            return
        lease.spec.holder_identity = None
        api.replace_namespaced_lease(self.lease_name, self.namespace, lease, _request_timeout=self.timeout)
        log.info("leader: %s handed back Lease %s/%s", self.identity, self.namespace, self.lease_name)
