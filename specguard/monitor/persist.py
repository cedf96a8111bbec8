"""Where the guard's decisions land on disk: audit lines first, then the plan file.

Both are written in a worker thread (an fsync never holds up the event loop that serves
traffic), one write at a time. Plan writes go through one coalescing writer: every change
asked for while a write is in flight (or within ``MIN_WRITE_INTERVAL`` of the last) is applied
and written by the next single write, and the
caller hears back only once the write that contains its change is on disk (``commit``). A
change whose write the disk refused is rolled back and raised (``PlanWriteError``), so an
answer of 200 always means "on disk". What an evaluation's refused write left is retried at
every evaluation until the plan file matches the router again and no audit line is lost. After
a plan file that could not be used, versions go on from above every version it or the audit
log had.
"""

from __future__ import annotations

import asyncio
import errno as errno_mod
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specguard.monitor import audit as audit_mod
from specguard.monitor import state as state_mod
from specguard.monitor.guard_metrics import GuardCounters
from specguard.rules.evidence import AlertBook, AlertRecord

log = logging.getLogger("specguard.guard")

Undo = Callable[[], None]
Change = Callable[[], tuple[Any, Undo | None, bool]]
"""Applied on the event loop just before the write that would contain it: returns (result, undo,
whether it changed what the plan file holds). A batch that changed nothing writes nothing."""


MIN_WRITE_INTERVAL = 0.2
"""Seconds from one plan write to the next: a flood of webhooks costs at most five writes a
second (each batch covers every change asked for meanwhile), whatever its rate."""


class PlanWriteError(OSError):
    """The plan file could not be written; the change that asked for it was rolled back."""

    def __init__(self, path: str, exc: OSError, what: str = "plan file") -> None:
        code = errno_mod.errorcode.get(exc.errno or 0, str(exc.errno))
        super().__init__(exc.errno, exc.strerror or str(exc))
        self.path = path
        self.message = f"{what} {path}: write failed ({exc.strerror or exc}, {code}); not stored, retry"

    def __str__(self) -> str:
        return self.message


@dataclass
class _Request:
    change: Change | None
    future: asyncio.Future[Any] = field(repr=False)
    alerts_only: bool = False  # changes the alert book only: the journal may keep it


class Persistence:
    """The plan store and audit log of one guard, with what a failed write left to do."""

    def __init__(
        self,
        store: state_mod.PlanStore | None,
        audit: audit_mod.AuditLog,
        counters: GuardCounters,
        build: Callable[[], state_mod.PlanDocument] | None = None,
        checkpoint: Callable[[], Undo] | None = None,
        alerts: AlertBook | None = None,
    ) -> None:
        self.store = store
        self.alerts = alerts  # its fresh alerts go to the store's journal when nothing else changed
        self.audit = audit
        self.counters = counters
        self.build = build  # the plan as it is now (the guard's ``stored``), taken at each write
        self.checkpoint = checkpoint  # once per batch: returns what puts the alert book back
        self.plan_behind = False  # the plan file is older than the router (a write failed)
        self.writes = 0  # plan files written or journal appends (each covers a coalesced batch)
        self._lock = threading.Lock()
        self._queue: list[_Request] = []
        self._writer: asyncio.Task[None] | None = None
        self._last_write = -MIN_WRITE_INTERVAL  # loop time the last plan write ended
        self._built = 0  # generation of the newest document built
        self._written = 0  # generation of the newest document on disk

    def version_after_recovery(self) -> int:
        """A version above every one the unusable plan file or the audit log had."""
        seen = [self.store.salvaged_version or 0] if self.store is not None else [0]
        seen += [
            v
            for r in self.audit.recent
            if isinstance(v := r.get("plan_version"), int) and not isinstance(v, bool) and v >= 0
        ]
        return min(max(seen), state_mod.MAX_VERSION - 2) + 1

    # -- the coalescing writer -----------------------------------------------------------------
    async def commit(self, change: Change | None = None, *, alerts_only: bool = False) -> Any:
        """Apply ``change`` and return its result once a plan file containing it is on disk.

        Changes asked for during a write share the next one. When that write fails, every change
        in it is undone (newest first) and ``PlanWriteError`` raised to each caller. A batch of
        ``alerts_only`` changes appends the alerts it received to the alert journal instead of
        writing the whole file (which, with a full book, is ~3 MB to encode and fsync).
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(change, future, alerts_only))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._drain(), name="plan writer")
        return await asyncio.shield(future)  # a cancelled caller never cancels a shared write

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        stored = self.store is not None and self.build is not None  # else nothing to write or undo
        while self._queue:
            wait = self._last_write + MIN_WRITE_INTERVAL - loop.time()
            if stored and wait > 0:  # more changes join this batch meanwhile
                await asyncio.sleep(wait)
            batch, self._queue = self._queue, []
            undos: list[Undo] = [self.checkpoint()] if stored and self.checkpoint is not None else []
            results: list[Any] = []
            dirty = False
            for request in batch:
                if request.change is None:  # an evaluation's plan: always written
                    results.append(None)
                    dirty = True
                    continue
                try:
                    result, undo, changed = request.change()
                except Exception as exc:  # a bug in one change fails that caller only
                    log.exception("plan change failed")
                    results.append(exc)
                    continue
                results.append(result)
                dirty = dirty or changed
                if undo is not None:
                    undos.append(undo)
            if dirty:
                try:
                    if stored and self._appendable(batch):
                        await asyncio.to_thread(self._append, self.alerts.take_fresh())  # type: ignore[union-attr]
                    else:
                        if self.alerts is not None:
                            self.alerts.take_fresh()  # the whole file written now holds them
                        await self._write(self._document())
                except Exception as exc:  # the disk refused it (or a bug): nothing of the batch is kept
                    if not isinstance(exc, PlanWriteError):
                        log.exception("plan write failed")
                        where = str(self.store.path) if self.store is not None else "-"
                        exc = PlanWriteError(where, OSError(errno_mod.EIO, repr(exc)))
                    for undo in reversed(undos):
                        undo()
                    results = [exc] * len(batch)
                finally:
                    self._last_write = loop.time()
            for request, result in zip(batch, results, strict=True):
                if request.future.done():
                    continue
                if isinstance(result, BaseException):
                    request.future.set_exception(result)
                else:
                    request.future.set_result(result)

    def _appendable(self, batch: Sequence[_Request]) -> bool:
        return (
            self.alerts is not None
            and self.store is not None
            and all(request.alerts_only for request in batch)
            and self.store.can_append(len(self.alerts))
        )

    def _append(self, alerts: Sequence[AlertRecord]) -> None:
        assert self.store is not None
        with self._lock:
            try:
                self.store.append_alerts(alerts)
            except OSError as exc:
                self.counters.plan_write_errors += 1
                error = PlanWriteError(str(self.store.journal.path), exc, "alert journal")
                log.error("%s", error)
                raise error from exc
            self.writes += 1

    def _document(self) -> tuple[int, state_mod.PlanDocument | None]:
        if self.store is None or self.build is None:
            return 0, None
        self._built += 1
        return self._built, self.build()

    async def _write(self, built: tuple[int, state_mod.PlanDocument | None]) -> None:
        generation, doc = built
        if doc is None:
            return
        await asyncio.to_thread(self._save_generation, generation, doc)

    def _save_generation(self, generation: int, doc: state_mod.PlanDocument) -> None:
        with self._lock:
            if generation < self._written:  # a newer plan (which contains this one) is on disk
                return
            self._save(doc)
            self._written = generation

    # -- the evaluation's writes ---------------------------------------------------------------
    async def record(self, records: Sequence[dict[str, Any]], *, save: bool = True) -> None:
        """Append ``records`` to the audit log, then write the plan file (unless not ``save``:
        dry-run records change no plan). A refused plan write is counted and retried later."""

        def append() -> None:
            with self._lock:
                self.audit.append(records)

        await asyncio.to_thread(append)
        if save:
            try:
                await self.commit()
            except PlanWriteError:
                pass  # counted, logged; ``retry`` writes it at the next evaluation

    async def retry(self) -> None:
        """Write what a failed write left (audit lines, then the plan), if anything."""
        if not (self.plan_behind or self.audit.pending):
            return

        def flush() -> bool:
            with self._lock:
                return self.audit.retry()

        if await asyncio.to_thread(flush) and self.plan_behind:
            try:
                await self.commit()
            except PlanWriteError:
                pass

    def save_now(self, doc: state_mod.PlanDocument) -> None:
        """Write ``doc`` as the plan file from the calling thread (a plan adopted from elsewhere)."""
        with self._lock:
            self._built += 1
            try:
                self._save(doc)
            except PlanWriteError:
                return
            self._written = self._built

    def _save(self, doc: state_mod.PlanDocument) -> None:
        if self.store is None:
            return
        try:
            self.store.save(doc)
        except OSError as exc:
            self.counters.plan_write_errors += 1
            self.plan_behind = True
            error = PlanWriteError(str(self.store.path), exc)
            log.error("%s (routing goes on from memory; retried each evaluation)", error)
            raise error from exc
        self.writes += 1
        self.plan_behind = False
