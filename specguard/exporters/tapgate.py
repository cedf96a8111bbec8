"""Which requests the tap forwards, and with which credentials.

The tap is an inference proxy, not an open door to the engines: vLLM and SGLang serve admin
endpoints next to the OpenAI API (``/sleep``, ``/wake_up``, ``/collective_rpc``,
``/reset_prefix_cache``, ``/v1/load_lora_adapter``, ``/start_profile``...) that anyone who can
reach the tap could otherwise call. So only an allowlist of exact paths, each with its methods,
is forwarded: the inference API by default, plus what ``tap.forward_paths`` adds. Anything else
is answered by the tap itself (404, or 405 for a known path with another method) and counted.

The client's ``Authorization`` header is never forwarded: it is the client's credential for
the tap, not the engine's. A pool with ``api_key_file`` gets the engine's own key instead.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from specguard.errors import ConfigError

DEFAULT_FORWARD: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("/v1/chat/completions", ("POST",)),
    ("/v1/completions", ("POST",)),
    ("/v1/models", ("GET",)),
)
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
"""Methods ``tap.forward_paths`` may name (TRACE and CONNECT are never forwarded)."""
REFUSED_PATH = "path"  # not on the allowlist
REFUSED_METHOD = "method"  # an allowed path, another method
REFUSED_ENCODED = "encoded_path"  # percent-encoded or dot segments: forwarded only as written
KEY_FILE_LIMIT = 4096  # an engine API key is a short line


@dataclass(frozen=True)
class ForwardPath:
    """An exact path the tap forwards, with the methods it forwards for it."""

    path: str
    methods: tuple[str, ...] = ("POST",)


@dataclass(frozen=True)
class Verdict:
    """Whether a request may go through; when not, the status and reason for the counter."""

    allowed: bool
    status: int = 200
    reason: str = ""
    allow: tuple[str, ...] = ()  # for a 405: the methods the path takes


class Gate:
    """The allowlist and the count of what it refused, by reason."""

    def __init__(self, extra: Iterable[ForwardPath] = ()):
        table: dict[str, set[str]] = {path: set(methods) for path, methods in DEFAULT_FORWARD}
        for entry in extra:
            table.setdefault(entry.path, set()).update(entry.methods)
        self._table = {path: frozenset(methods) for path, methods in table.items()}
        self.refused: Counter[str] = Counter()

    @property
    def paths(self) -> dict[str, tuple[str, ...]]:
        return {path: tuple(sorted(methods)) for path, methods in sorted(self._table.items())}

    def check(self, method: str, raw_path: str, path: str) -> Verdict:
        """``raw_path`` as the client wrote it, ``path`` decoded: both must name an allowed path
        (so the engine is asked exactly what was checked)."""
        methods = self._table.get(raw_path)
        if methods is None:
            reason = REFUSED_ENCODED if path in self._table else REFUSED_PATH
            self.refused[reason] += 1
            return Verdict(False, 404, reason)
        if method not in methods:
            self.refused[REFUSED_METHOD] += 1
            return Verdict(False, 405, REFUSED_METHOD, tuple(sorted(methods)))
        return Verdict(True)

    def collector(self) -> Collector:
        return _GateCollector(self)


class _GateCollector(Collector):
    def __init__(self, gate: Gate):
        self._gate = gate

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "specguard_tap_refused_requests",
            "Requests the tap answered itself instead of forwarding: a path not on its allowlist "
            "(path, encoded_path) or a method the path does not take (method).",
            labels=["reason"],
        )
        for reason in (REFUSED_PATH, REFUSED_METHOD, REFUSED_ENCODED):
            family.add_metric([reason], float(self._gate.refused.get(reason, 0)))
        yield family


def read_key(path: str, where: str) -> str:
    """The engine API key held in ``path``: a regular file (a FIFO or a device would hang or never
    end), at most ``KEY_FILE_LIMIT`` bytes, UTF-8, whitespace stripped. ConfigError naming
    ``where`` (the config key) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{where}: {path} is not a regular file")
        if info.st_size > KEY_FILE_LIMIT:
            raise ConfigError(f"{where}: {path} is larger than {KEY_FILE_LIMIT} bytes")
        data = os.read(fd, KEY_FILE_LIMIT + 1)
    finally:
        os.close(fd)
    try:
        key = data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: {path} is not UTF-8 text") from exc
    if not key:
        raise ConfigError(f"{where}: {path} is empty")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in key):
        raise ConfigError(f"{where}: {path} holds whitespace or control characters inside the key")
    return key


def auth_headers(keys: Mapping[str, str], pool: str) -> dict[str, str]:
    """The header that authenticates the tap to ``pool`` (none when it has no key)."""
    key = keys.get(pool)
    return {"Authorization": f"Bearer {key}"} if key else {}
