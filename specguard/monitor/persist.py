"""Where the guard's decisions land on disk: audit lines first, then the plan file.

Both are written in a worker thread (an fsync never holds up the event loop that serves
traffic), one write at a time, and whatever the disk refused is retried at every evaluation
until the plan file matches the router again and no audit line is lost. After a plan file
that could not be used, versions go on from above every version it or the audit log had.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

from specguard.monitor import audit as audit_mod
from specguard.monitor import state as state_mod
from specguard.monitor.guard_metrics import GuardCounters

log = logging.getLogger("specguard.guard")


class Persistence:
    """The plan store and audit log of one guard, with what a failed write left to do."""

    def __init__(
        self, store: state_mod.PlanStore | None, audit: audit_mod.AuditLog, counters: GuardCounters
    ) -> None:
        self.store = store
        self.audit = audit
        self.counters = counters
        self.plan_behind = False  # the plan file is older than the router (a write failed)
        self._lock = threading.Lock()

    def version_after_recovery(self) -> int:
        """A version above every one the unusable plan file or the audit log had."""
        seen = [self.store.salvaged_version or 0] if self.store is not None else [0]
        seen += [
            v
            for r in self.audit.recent
            if isinstance(v := r.get("plan_version"), int) and not isinstance(v, bool) and v >= 0
        ]
        return min(max(seen), state_mod.MAX_VERSION - 2) + 1

    async def record(
        self, records: Sequence[dict[str, Any]], doc: state_mod.PlanDocument, *, save: bool = True
    ) -> None:
        """Append ``records`` to the audit log, then write ``doc`` as the plan file (unless not ``save``:
        dry-run records change no plan)."""

        def write() -> None:
            with self._lock:
                self.audit.append(records)
                if save:
                    self._save(doc)

        await asyncio.to_thread(write)

    async def retry(self, doc: state_mod.PlanDocument) -> None:
        """Write what a failed write left (audit lines, then the plan ``doc``), if anything."""
        if not (self.plan_behind or self.audit.pending):
            return

        def flush() -> None:
            with self._lock:
                if self.audit.retry() and self.plan_behind:
                    self._save(doc)

        await asyncio.to_thread(flush)

    def save_now(self, doc: state_mod.PlanDocument) -> None:
        """Write ``doc`` as the plan file from the calling thread (a plan adopted from elsewhere)."""
        with self._lock:
            self._save(doc)

    def _save(self, doc: state_mod.PlanDocument) -> None:
        if self.store is None:
            return
        try:
            self.store.save(doc)
        except OSError as exc:
            self.counters.plan_write_errors += 1
            self.plan_behind = True
            log.error(
                "plan file %s: write failed (%s); routing goes on from memory, retried each evaluation",
                self.store.path,
                exc.strerror,
            )
            return
        self.plan_behind = False
