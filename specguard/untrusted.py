"""Input from outside, read within bounds: JSON with a nesting limit, files with a size limit,
and text made safe for one log line.

Every body, file and header that specguard did not write itself goes through here (the config
reader in ``configfile`` adds its YAML limits on top). Each failure is an ``InputError`` that
says what was wrong and where, never a ``RecursionError``, ``MemoryError`` or a traceback.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from specguard.errors import InputError

MAX_JSON_DEPTH = 100
"""Nesting limit of untrusted JSON (objects and arrays), well below Python's recursion limit."""

_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_DELTA = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth_exceeds(data: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``data`` nests objects/arrays deeper than ``limit`` (strings are skipped).

    Linear and mostly in C: a body with no more brackets than ``limit`` is decided by two
    counts; otherwise strings are cut out and the running bracket depth is accumulated.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_DELTA.__getitem__, brackets)), default=0) > limit


def loads(data: bytes | str, where: str = "<json>", *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that names ``where`` in an InputError for every way untrusted JSON can fail:
    not UTF-8, not JSON, nested deeper than ``max_depth``, an integer too long to convert."""
    if json_depth_exceeds(data, max_depth):
        raise InputError(f"{where}: JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: not UTF-8 (byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not JSON: {exc}") from exc
    except (ValueError, RecursionError) as exc:  # e.g. an integer literal of 5,000 digits
        raise InputError(f"{where}: not acceptable JSON: {exc}") from exc


class NotRegularFile(InputError):
    """A path that names a FIFO, a directory, a device or a socket where a file was expected."""


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_bytes(path: str | Path, limit: int, what: str = "file", *, regular: bool = True) -> bytes:
    """The file's bytes, refusing more than ``limit`` (a device such as /dev/zero never ends).

    ``regular`` (the default): only a regular file; a FIFO, directory or device is a
    ``NotRegularFile`` naming the path and what it is. It is opened without blocking (a FIFO
    with no writer would otherwise hang the caller, start-up included) and checked with fstat.
    OSError propagates for the caller to word (missing file, permission); a file larger than
    the limit is an InputError naming the path and the limit.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags) if regular else os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if regular and not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotRegularFile(f"{path}: {what} is {_kind(info.st_mode)}, not a regular file")
    with open(fd, "rb", closefd=True) as handle:
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise InputError(f"{path}: {what} larger than {limit} bytes ({info.st_size})")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{path}: {what} larger than {limit} bytes")
    return data


def require_regular(path: str | Path, what: str = "file") -> None:
    """``NotRegularFile`` unless ``path`` is a regular file or does not exist yet (a file specguard
    will create): checked before opening it for writing, which on a FIFO would block."""
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(f"{path}: {what} is {_kind(info.st_mode)}, not a regular file")


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: object, limit: int = 200) -> str:
    """``text`` as one safe log line: control characters (newlines, ANSI escapes) shown escaped,
    cut to ``limit`` characters, so a client cannot forge or colour log lines."""
    value = str(text)
    if len(value) > limit:
        value = value[:limit] + "..."
    return _UNPRINTABLE.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), value)
