"""The persisted plan: class x load bucket -> pool/K, plus what the guard must not forget on restart.

Written atomically (temp file in the same directory, fsync, rename, fsync of the directory),
so a crash leaves either the old or the new file, never a torn one (a SIGKILL mid-write can leave
a ``.plan.json.XXXXXXXX.tmp``; the daemon's ``load`` at startup removes such leftovers).
What survives a restart: the plan itself, operator pins and pauses, the frozen flag, pending
shorten-K confirmations and the action times (so the cooldown and the cap per hour hold across
restarts), and the Alertmanager alerts received (Alertmanager re-sends a firing alert only every
``repeat_interval``): those received since the file's last write are appended to its alert journal
(``AlertJournal``), so a webhook costs a line, not a rewrite of a book of up to ~3 MB.
Evaluation counters are not kept: after a restart the guard needs fresh evidence, which is the
safe side.

The same JSON is what an external router reads (the "plan file" actuator) and what the
ConfigMap actuator stores under its key.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specguard import configfile, untrusted
from specguard.errors import InputError
from specguard.rules.evidence import AlertRecord, ClassKey
from specguard.rules.guard import ClassState, Pending

log = logging.getLogger("specguard.state")

FORMAT = 1


@dataclass(frozen=True)
class PlanDocument:
    """A plan as stored: its version (bumped on every change), time, and one entry per class."""

    version: int
    updated_at: float
    states: Mapping[ClassKey, ClassState]
    pools: Mapping[str, int]
    replicas: Mapping[str, int] = field(default_factory=dict)  # pool -> replicas (fleet: a PromQL count)
    alerts: tuple[AlertRecord, ...] = ()
    """Alerts received from Alertmanager (the plan file only; never sent to other stores)."""

    def routing(self) -> dict[ClassKey, str]:
        """The plan the tap's router takes: ``{(task_type, temperature_bucket, load_bucket): pool}``."""
        return {key: state.pool for key, state in self.states.items() if state.pool}


def encode(doc: PlanDocument) -> dict[str, Any]:
    entries = []
    for key, state in sorted(doc.states.items()):
        entry: dict[str, Any] = {
            "task_type": key[0],
            "temperature_bucket": key[1],
            "load_bucket": key[2],
            "pool": state.pool,
            "num_speculative_tokens": doc.pools.get(state.pool, 0),
        }
        if state.pin is not None:
            entry["pin"] = state.pin
        if state.paused:
            entry["paused"] = True
        if state.frozen:
            entry["frozen"] = True
        if state.last_action_at is not None:
            entry["last_action_at"] = state.last_action_at
        if state.action_times:
            entry["action_times"] = list(state.action_times)
        if state.pending is not None:
            p = state.pending
            entry["pending"] = {
                "from": p.from_pool,
                "to": p.to_pool,
                "predicted_rc": p.predicted_rc,
                "at": p.at,
            }
        entries.append(entry)
    out: dict[str, Any] = {
        "format": FORMAT,
        "version": doc.version,
        "updated_at": doc.updated_at,
        "entries": entries,
    }
    if doc.alerts:
        out["alerts"] = [_alert(a) for a in sorted(doc.alerts, key=_fingerprint)]
    if doc.replicas:
        out["replicas"] = dict(sorted(doc.replicas.items()))
    return out


def _alert(a: AlertRecord) -> dict[str, Any]:
    return {
        "fingerprint": a.fingerprint,
        "alertname": a.alertname,
        "status": a.status,
        "labels": dict(a.labels),
        "starts_at": a.starts_at,
        "received_at": a.received_at,
    }


def _fingerprint(a: AlertRecord) -> str:
    return a.fingerprint


def decode(data: Any, where: str) -> PlanDocument:
    """Parse a stored plan; anything malformed raises InputError naming the file and the field.

    Strict about types (a ``version`` of NaN, 1e400, "abc" or a list is malformed, not a crash):
    this is what the guard trusts with routing after a restart.
    """
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise InputError(f"{where}: not a specguard plan (expected an object with 'entries')")
    if data.get("format", FORMAT) != FORMAT or isinstance(data.get("format"), bool):
        raise InputError(f"{where}: plan format {data.get('format')!r} is not supported (expected {FORMAT})")
    version = _whole(data.get("version", 0), f"{where}: version")
    updated_at = _number(data.get("updated_at", 0.0), f"{where}: updated_at")
    states: dict[ClassKey, ClassState] = {}
    pools: dict[str, int] = {}
    for index, entry in enumerate(data["entries"]):
        at = f"{where}: entries[{index}]"
        if not isinstance(entry, dict):
            raise InputError(f"{at}: must be an object")
        key = (
            _text(entry.get("task_type"), f"{at}.task_type"),
            _text(entry.get("temperature_bucket"), f"{at}.temperature_bucket"),
            _text(entry.get("load_bucket"), f"{at}.load_bucket"),
        )
        pool = _text(entry.get("pool"), f"{at}.pool")
        pin = entry.get("pin")
        times = entry.get("action_times", [])
        if not isinstance(times, list):
            raise InputError(f"{at}.action_times: must be a list of times")
        states[key] = ClassState(
            key=key,
            pool=pool,
            pin=None if pin is None else _text(pin, f"{at}.pin"),
            paused=_flag(entry.get("paused", False), f"{at}.paused"),
            frozen=_flag(entry.get("frozen", False), f"{at}.frozen"),
            last_action_at=_optional(entry.get("last_action_at"), f"{at}.last_action_at"),
            action_times=tuple(_number(t, f"{at}.action_times[{i}]") for i, t in enumerate(times)),
            pending=_pending(entry.get("pending"), f"{at}.pending"),
        )
        k = _whole(entry.get("num_speculative_tokens", 0), f"{at}.num_speculative_tokens")
        pools[pool] = k
    replicas = data.get("replicas", {})
    if not isinstance(replicas, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
        for k, v in replicas.items()
    ):
        raise InputError(f"{where}: replicas must map pool names to whole numbers >= 1")
    return PlanDocument(
        version=version,
        updated_at=updated_at,
        states=states,
        pools=pools,
        replicas=dict(replicas),
        alerts=_alerts(data.get("alerts", []), where),
    )


MAX_VERSION = 2**53
"""Plan versions stay exact in every JSON reader (and in a float)."""


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_VERSION:
        raise InputError(f"{where} ({_shown(value)}) must be a whole number from 0 to 2**53")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"{where} ({_shown(value)}) must be a finite number")
    return float(value)


def _optional(value: Any, where: str) -> float | None:
    return None if value is None else _number(value, where)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 256:
        raise InputError(f"{where} ({_shown(value)}) must be a non-empty string")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{where} ({_shown(value)}) must be true or false")
    return value


def _pending(value: Any, where: str) -> Pending | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(f"{where}: must be an object")
    return Pending(
        _text(value.get("from"), f"{where}.from"),
        _text(value.get("to"), f"{where}.to"),
        _number(value.get("predicted_rc"), f"{where}.predicted_rc"),
        _number(value.get("at"), f"{where}.at"),
    )


def _shown(value: Any) -> str:
    if isinstance(value, list | dict):
        return f"a {type(value).__name__}"
    return untrusted.printable(repr(value), 40)


def salvage_version(data: Any) -> int | None:
    """The version of a plan that is otherwise unusable, when that one field is still sound."""
    if isinstance(data, dict):
        try:
            return _whole(data.get("version"), "version")
        except InputError:
            return None
    return None


def _alerts(data: Any, where: str) -> tuple[AlertRecord, ...]:
    """The received alerts persisted with the plan (restored at start-up)."""
    if not isinstance(data, list):
        raise InputError(f"{where}: alerts: must be a list")
    out = []
    for index, item in enumerate(data):
        at = f"{where}: alerts[{index}]"
        if not isinstance(item, dict):
            raise InputError(f"{at}: must be an object")
        labels = item.get("labels")
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise InputError(f"{at}.labels: must be an object of strings")
        out.append(
            AlertRecord(
                fingerprint=_text(item.get("fingerprint"), f"{at}.fingerprint"),
                alertname=_text(item.get("alertname"), f"{at}.alertname"),
                status=_text(item.get("status"), f"{at}.status"),
                labels=dict(labels),
                starts_at=_text(item.get("starts_at"), f"{at}.starts_at"),
                received_at=_number(item.get("received_at"), f"{at}.received_at"),
            )
        )
    return tuple(out)


class AlertJournal:
    """Alerts received since the plan file was last written, one JSON object per line.

    A webhook's alerts are on disk (appended and fsynced) before its 200; the next whole write of
    the plan file holds them, and the journal starts over. At start-up its lines are replayed onto
    the plan file's alerts (the book's own rules make a repeat harmless). A line a crash cut short
    is skipped: it was never acknowledged, since the fsync comes before the answer. An append the
    disk refused is cut off again, so the next one never continues a torn line.
    """

    MAX_BYTES = 64 * 1024 * 1024
    """Far above a journal's size (compacted at the book's size, ~3 MB at 10,000 alerts)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0
        self.usable = True  # False after a refused append could not be cut off: whole writes only

    def append(self, lines: Sequence[str]) -> None:
        if not lines:
            return
        created = not self.path.exists()
        with open(self.path, "ab") as handle:
            size = handle.tell()
            try:
                handle.write(("\n".join(lines) + "\n").encode())
                handle.flush()
                os.fsync(handle.fileno())
            except OSError:
                try:
                    handle.truncate(size)
                except OSError:
                    self.usable = False
                raise
        if created:
            _fsync_dir(self.path.parent)
        self.lines += len(lines)

    def reset(self) -> None:
        """Empty it (after a whole write); a failure is logged: its lines repeat what is written."""
        if self.lines == 0 and self.usable and not self.path.exists():
            return
        try:
            with open(self.path, "wb") as handle:
                os.fsync(handle.fileno())
        except OSError as exc:
            log.warning("alert journal %s: not emptied (%s); replaying it is harmless", self.path, exc)
            return
        self.lines = 0
        self.usable = True

    def discard(self) -> None:
        """No plan file to replay onto: whatever is there is older than anything kept now."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("alert journal %s: could not be removed (%s)", self.path, exc.strerror)

    def load(self) -> tuple[AlertRecord, ...]:
        """The journal's alerts, oldest first; a line that is not one is skipped with a warning."""
        try:
            raw = untrusted.read_bytes(self.path, self.MAX_BYTES, "alert journal")
        except (FileNotFoundError, NotADirectoryError):
            return ()
        except (OSError, InputError) as exc:
            log.error("alert journal %s: unreadable (%s); its alerts are lost", self.path, exc)
            self.usable = False
            return ()
        out: list[AlertRecord] = []
        skipped: list[str] = []
        if raw and not raw.endswith(b"\n"):  # a torn last line: cut off, so appends start a new one
            try:
                os.truncate(self.path, raw.rfind(b"\n") + 1)
            except OSError as exc:
                log.error("alert journal %s: torn line not cut off (%s); whole writes only", self.path, exc)
                self.usable = False
        lines = raw.split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{self.path}:{number}"
            try:
                out.extend(_alerts([untrusted.loads(line, where)], where))
            except InputError as exc:
                skipped.append(str(exc))
        if skipped:
            log.warning(
                "alert journal %s: %d line(s) skipped (a write cut short by a crash is one): %s",
                self.path,
                len(skipped),
                untrusted.printable(skipped[0], 300),
            )
        self.lines = len(out) + len(skipped)
        return tuple(out)


def _fsync_dir(directory: Path) -> None:
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers and crashes see the old or the new file only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


STALE_TEMP_SECONDS = 60.0
"""A temp file of ours older than this is a leftover of a killed writer, not a write in progress."""


def remove_stale_temp_files(
    path: Path, *, older_than: float = STALE_TEMP_SECONDS, now: float | None = None
) -> list[Path]:
    """Delete ``atomic_write``'s leftovers for ``path`` (``.NAME.XXXXXXXX.tmp``); returns them.

    Only files of exactly our naming (tempfile.mkstemp's 8 random characters) and older than
    ``older_than`` seconds, so a write in progress by another process is left alone.
    """
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    now = time.time() if now is None else now
    removed = []
    try:
        candidates = [p for p in path.parent.iterdir() if pattern.fullmatch(p.name)]
    except OSError:
        return []
    for candidate in candidates:
        try:
            if now - candidate.stat().st_mtime < older_than or not candidate.is_file():
                continue
            candidate.unlink()
        except OSError:
            continue
        removed.append(candidate)
    if removed:
        names = ", ".join(p.name for p in sorted(removed))
        log.warning(
            "removed %d stale temp file(s) of an interrupted plan write in %s: %s",
            len(removed),
            path.parent,
            names,
        )
    return removed


class _Unreadable(InputError):
    """The file is there but cannot be read (permissions): not a malformed plan, never moved."""


def _parse(raw: bytes | str, where: str) -> Any:
    return untrusted.loads(raw, where, max_depth=configfile.LIMITS.max_depth)


def parse(raw: bytes | str, where: str) -> PlanDocument:
    """A stored plan's text (a file, a ConfigMap key, a decider's answer) within the JSON limits;
    InputError for anything malformed, never RecursionError or ValueError."""
    return decode(_parse(raw, where), where)


class PlanStore:
    """Load and save the plan file. ``save`` raises OSError (disk full...) for the caller to count."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.journal = AlertJournal(self.path.with_name(self.path.name + ".alerts"))
        self._alert_text: dict[str, tuple[AlertRecord, str]] = {}  # each alert's JSON, kept between saves
        self.recovered: str | None = None  # why the file on disk could not be used, if so
        self.salvaged_version: int | None = None  # the unusable file's version, if it was sound

    def load(self) -> PlanDocument | None:
        """The stored plan, or None when there is none. A malformed file (any way at all: not JSON,
        too large, nested too deep, wrong types) is moved aside to ``.corrupt`` and reported.

        Called once at startup by the daemon: also removes temp files a killed writer left behind.
        """
        remove_stale_temp_files(self.path)
        data: Any = None
        try:
            raw = self._read()
            if raw is None:
                self.journal.discard()  # (appended to a plan file only: none without one)
                return None
            data = _parse(raw, str(self.path))
            doc = decode(data, str(self.path))
        except _Unreadable:
            raise
        except InputError as exc:
            self._set_aside(exc, data)
            self.journal.discard()
            return None
        later = self.journal.load()
        return replace(doc, alerts=doc.alerts + later) if later else doc

    def _set_aside(self, exc: InputError, data: Any) -> None:
        self.salvaged_version = salvage_version(data)
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
            moved = f"moved to {aside}"
        except OSError as move_exc:
            moved = f"could not be moved aside ({move_exc.strerror})"
        self.recovered = (
            f"unreadable ({untrusted.printable(exc, 300)}); {moved}, starting from the default plan"
        )
        log.error("plan file unusable: %s", self.recovered)

    def load_readonly(self) -> PlanDocument | None:
        """Like ``load`` but never touches the file: a malformed plan raises InputError (for the CLI)."""
        raw = self._read()
        return None if raw is None else decode(_parse(raw, str(self.path)), str(self.path))

    def _read(self) -> bytes | None:
        """The file's bytes, or None when absent; InputError when larger than any plan can be."""
        try:
            return untrusted.read_bytes(self.path, configfile.LIMITS.max_bytes, "plan file")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except untrusted.NotRegularFile as exc:  # never moved aside: it is not a plan at all
            raise _Unreadable(f"actuators.plan_file: {exc}") from exc
        except OSError as exc:
            raise _Unreadable(f"cannot read plan file {self.path}: {exc.strerror}") from exc

    def save(self, doc: PlanDocument) -> None:
        """Write the whole plan, alerts included; the journal's alerts are in it, so it starts over."""
        atomic_write(self.path, self.text(doc))
        self.journal.reset()

    def append_alerts(self, alerts: Sequence[AlertRecord]) -> None:
        """Keep ``alerts`` (received since the last write) by appending them to the journal: a few
        hundred bytes to fsync instead of the whole book. OSError when the disk refused them."""
        self.journal.append([json.dumps(_alert(a), sort_keys=True) for a in alerts])

    def can_append(self, book_size: int) -> bool:
        """Whether the next alerts may go to the journal: there is a plan file to replay them onto,
        and the journal is still small next to the book (else a whole write compacts it)."""
        return self.journal.usable and self.path.exists() and self.journal.lines < max(1024, book_size)

    def text(self, doc: PlanDocument) -> str:
        """The file's text (``encode``'s JSON). Each alert's JSON is kept from the save before, so
        a full book (10,000 alerts, ~3 MB) costs a join, not a re-encoding: the encoder holds the
        interpreter lock, and the event loop that serves traffic needs it."""
        head = json.dumps(encode(replace(doc, alerts=())), indent=1, sort_keys=True)
        if not doc.alerts:
            return head + "\n"
        known, kept = self._alert_text, {}
        parts = []
        for a in sorted(doc.alerts, key=_fingerprint):
            hit = known.get(a.fingerprint)
            if hit is None or hit[0] is not a:  # records are frozen: the same object, the same text
                hit = (a, json.dumps(_alert(a), sort_keys=True))
            kept[a.fingerprint] = hit
            parts.append(hit[1])
        self._alert_text = kept
        return head[: head.rindex("}")].rstrip() + ',\n "alerts": [\n  ' + ",\n  ".join(parts) + "\n ]\n}\n"
