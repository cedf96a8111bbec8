"""The audit log: one JSON line per decision that did something (time, class, from, to, reason, numbers,
and for an override its ``caller``), and one per accepted webhook (``event: webhook``, its caller).

Appended and flushed per batch. A crash can leave the last line torn; on reload a line that
is not valid JSON is skipped and reported (``torn``), and the next append starts on a fresh
line so a torn tail never swallows a good record. A write error (disk full, read-only
filesystem) never stops the guard: it is counted and the decision is still kept in memory.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specguard import untrusted
from specguard.errors import InputError

log = logging.getLogger("specguard.audit")

MAX_PENDING = 10_000
"""Audit lines kept in memory while the disk refuses them."""


def read(path: str | Path) -> tuple[list[dict[str, Any]], list[int]]:
    """(records, line numbers skipped as torn or invalid) of an audit log; a missing file is empty,
    a FIFO, directory or device is ``untrusted.NotRegularFile``."""
    records: list[dict[str, Any]] = []
    skipped: list[int] = []
    untrusted.require_regular(path, "audit log")  # a FIFO would block the open for ever
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = untrusted.loads(line, f"{path}:{number}")
                except InputError:  # torn, not JSON, nested too deep...
                    skipped.append(number)
                    continue
                if isinstance(record, dict):
                    records.append(record)
                else:
                    skipped.append(number)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("audit log %s: cannot read (%s)", path, exc.strerror)
    return records, skipped


def decisions(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decision lines of an audit log: the others (``event``: an accepted webhook and its
    caller) record who asked, not what changed."""
    return [r for r in records if "event" not in r]


class AuditLog:
    """Append-only JSON lines at ``path`` (None: memory only) plus the last ``keep`` records in memory."""

    def __init__(self, path: str | Path | None, *, keep: int = 200, fsync: bool = True):
        self.path = Path(path) if path is not None else None
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self.write_errors = 0
        self.torn_lines: list[int] = []
        self._fsync = fsync
        self._needs_newline = False
        self.pending: list[str] = []  # lines a failed write left to write
        if self.path is not None:
            records, self.torn_lines = read(self.path)
            self.recent.extend(records[-keep:])
            if self.torn_lines:
                log.warning("audit log %s: skipped unreadable line(s) %s", self.path, self.torn_lines)
            self._needs_newline = _ends_without_newline(self.path)

    def append(self, records: Iterable[dict[str, Any]]) -> bool:
        """Append records; False (and one more write error counted) if the disk refused them.

        Refused lines are kept (``pending``) and written first by the next ``append`` or ``retry``,
        so an outage delays audit lines but never loses them.
        """
        batch = list(records)
        if not batch:
            return True
        self.recent.extend(batch)
        if self.path is None:
            return True
        self.pending.extend(json.dumps(r, sort_keys=True, default=str) + "\n" for r in batch)
        if len(self.pending) > MAX_PENDING:  # a disk full for days: keep the newest lines
            del self.pending[: len(self.pending) - MAX_PENDING]
        return self.retry()

    def retry(self) -> bool:
        """Write the pending lines; True when none are left."""
        if not self.pending or self.path is None:
            return True
        text = "".join(self.pending)
        if self._needs_newline:
            text = "\n" + text
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _append_whole(self.path, text.encode("utf-8"), fsync=self._fsync)
        except OSError as exc:
            self.write_errors += 1
            self._needs_newline = _ends_without_newline(self.path)
            log.error(
                "audit log %s: write failed (%s); %d line(s) kept for the next write; routing goes on",
                self.path,
                exc.strerror,
                len(self.pending),
            )
            return False
        self.pending.clear()
        self._needs_newline = False
        return True


def _append_whole(path: Path, data: bytes, *, fsync: bool) -> None:
    """Append ``data`` entirely or not at all (a failed write is cut off again), then fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def _ends_without_newline(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return False
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    except OSError:
        return False
