"""The persisted plan: class x load bucket -> pool/K, plus what the guard must not forget on restart.

Written atomically (temp file in the same directory, fsync, rename, fsync of the directory),
so a crash leaves either the old or the new file, never a torn one (a SIGKILL mid-write can leave
a ``.plan.json.XXXXXXXX.tmp``; the daemon's ``load`` at startup removes such leftovers).
What survives a restart: the plan itself, operator pins and pauses, the frozen flag, pending
shorten-K confirmations and the action times (so the cooldown and the cap per hour hold across
restarts). Evaluation counters are not kept: after a restart the guard needs fresh evidence,
which is the safe side.

The same JSON is what an external router reads (the "plan file" actuator) and what the
ConfigMap actuator stores under its key.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specguard.errors import InputError
from specguard.rules.evidence import ClassKey
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
    out = {"format": FORMAT, "version": doc.version, "updated_at": doc.updated_at, "entries": entries}
    if doc.replicas:
        out["replicas"] = dict(sorted(doc.replicas.items()))
    return out


def decode(data: Any, where: str) -> PlanDocument:
    """Parse a stored plan; a malformed one raises InputError naming the file and the entry."""
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise InputError(f"{where}: not a specguard plan (expected an object with 'entries')")
    if data.get("format", FORMAT) != FORMAT:
        raise InputError(f"{where}: plan format {data.get('format')!r} is not supported (expected {FORMAT})")
    states: dict[ClassKey, ClassState] = {}
    pools: dict[str, int] = {}
    for index, entry in enumerate(data["entries"]):
        try:
            key = (str(entry["task_type"]), str(entry["temperature_bucket"]), str(entry["load_bucket"]))
            pending = entry.get("pending")
            states[key] = ClassState(
                key=key,
                pool=str(entry["pool"]),
                pin=entry.get("pin"),
                paused=bool(entry.get("paused", False)),
                frozen=bool(entry.get("frozen", False)),
                last_action_at=_float(entry.get("last_action_at")),
                action_times=tuple(float(t) for t in entry.get("action_times", ())),
                pending=Pending(
                    str(pending["from"]),
                    str(pending["to"]),
                    float(pending["predicted_rc"]),
                    float(pending["at"]),
                )
                if pending
                else None,
            )
            pools[str(entry["pool"])] = int(entry.get("num_speculative_tokens", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{where}: entries[{index}]: malformed entry ({exc!r})") from exc
    replicas = data.get("replicas", {})
    if not isinstance(replicas, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
        for k, v in replicas.items()
    ):
        raise InputError(f"{where}: replicas must map pool names to whole numbers >= 1")
    return PlanDocument(
        version=int(data.get("version", 0)),
        updated_at=float(data.get("updated_at", 0.0)),
        states=states,
        pools=pools,
        replicas=dict(replicas),
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


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
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


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


class PlanStore:
    """Load and save the plan file. ``save`` raises OSError (disk full...) for the caller to count."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.recovered: str | None = None  # why the file on disk could not be used, if so

    def load(self) -> PlanDocument | None:
        """The stored plan, or None when there is none. A corrupt file is moved aside and reported.

        Called once at startup by the daemon: also removes temp files a killed writer left behind.
        """
        remove_stale_temp_files(self.path)
        text = self._read()
        if text is None:
            return None
        try:
            return decode(json.loads(text), str(self.path))
        except (json.JSONDecodeError, InputError) as exc:
            aside = self.path.with_name(self.path.name + ".corrupt")
            os.replace(self.path, aside)
            self.recovered = (
                f"{self.path}: unreadable ({exc}); moved to {aside}, starting from the default plan"
            )
            log.error("%s", self.recovered)
            return None

    def load_readonly(self) -> PlanDocument | None:
        """Like ``load`` but never touches the file: a corrupt plan raises InputError (for the CLI)."""
        text = self._read()
        if text is None:
            return None
        try:
            return decode(json.loads(text), str(self.path))
        except json.JSONDecodeError as exc:
            raise InputError(f"{self.path}: not JSON ({exc})") from exc

    def _read(self) -> str | None:
        """The file's text, or None when there is no file."""
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InputError(f"cannot read plan file {self.path}: {exc.strerror}") from exc

    def save(self, doc: PlanDocument) -> None:
        atomic_write(self.path, json.dumps(encode(doc), indent=1, sort_keys=True) + "\n")
