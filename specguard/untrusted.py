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


def read_bytes(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The file's bytes, refusing more than ``limit`` (a device such as /dev/zero never ends).

    OSError propagates for the caller to word (missing file, permission); a file larger than
    the limit is an InputError naming the path and the limit.
    """
    with open(path, "rb") as handle:
        info = os.fstat(handle.fileno())
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise InputError(f"{path}: {what} larger than {limit} bytes ({info.st_size})")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{path}: {what} larger than {limit} bytes")
    return data


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: object, limit: int = 200) -> str:
    """``text`` as one safe log line: control characters (newlines, ANSI escapes) shown escaped,
    cut to ``limit`` characters, so a client cannot forge or colour log lines."""
    value = str(text)
    if len(value) > limit:
        value = value[:limit] + "..."
    return _UNPRINTABLE.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), value)
