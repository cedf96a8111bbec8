"""Who may call the control listener, and how often: credentials per role, failed-auth throttling,
rate limits on the endpoints that change state, and the operator token made when none is configured.

Every control request names a role (``alertmanager``, ``operator``, ``follower``). ``Gate.admit``
answers the caller (credential name, peer address) or raises ``Refused``: 401 for no or a wrong
credential, 403 for a credential without the role, 429 (with ``Retry-After``) for a peer past its
failed-authentication budget or an endpoint past its rate. Tokens are compared in constant time
against every credential (no early exit tells which one nearly matched), and never logged.
A peer's failed attempts are logged once per burst, not once per request.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import os
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, Metric

log = logging.getLogger("specguard.control")

ROLES = ("alertmanager", "operator", "follower")
REASONS = ("unauthenticated", "forbidden", "throttled", "rate_limited")
MAX_PEERS = 4096
"""Peers whose failed attempts are remembered at most (the oldest are forgotten first)."""
GENERATED_NAME = "generated"
"""The credential name of the operator token ``specguard run`` makes when none is configured."""


@dataclass(frozen=True)
class Credential:
    name: str
    roles: frozenset[str]
    token: bytes

    def __repr__(self) -> str:
        return f"Credential({self.name!r}, roles={sorted(self.roles)}, token=*****)"


@dataclass(frozen=True)
class Caller:
    """Who a request came from, as the audit log records it."""

    name: str
    peer: str

    def to_json(self) -> dict[str, str]:
        return {"credential": self.name, "peer": self.peer}


class Refused(Exception):
    def __init__(self, status: int, message: str, reason: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.reason, self.headers = status, message, reason, headers


class TokenBucket:
    """``rate`` per second on average, bursts of ``burst``; ``take()`` is None or seconds to wait."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> float | None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return None
        return (1 - self._tokens) / self.rate


class FailedAuth:
    """Failed authentications per peer in a fixed window; past ``limit`` the peer gets 429."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic):
        self.limit, self.window, self._clock = limit, window, clock
        self._peers: OrderedDict[str, list[float]] = OrderedDict()  # peer -> [window start, failures]

    def wait(self, peer: str) -> float | None:
        """Seconds until ``peer`` may try again, or None when it may now."""
        entry = self._peers.get(peer)
        if entry is None:
            return None
        left = entry[0] + self.window - self._clock()
        if left <= 0:
            del self._peers[peer]
            return None
        return left if entry[1] >= self.limit else None

    def failed(self, peer: str) -> int:
        """Count one failure; returns the peer's failures in this window (1: a new burst)."""
        now = self._clock()
        entry = self._peers.get(peer)
        if entry is None or now - entry[0] >= self.window:
            entry = [now, 0]
        entry[1] += 1
        self._peers[peer] = entry
        self._peers.move_to_end(peer)
        while len(self._peers) > MAX_PEERS:
            self._peers.popitem(last=False)
        return int(entry[1])


class Gate:
    """The control listener's door: credentials, the failed-auth throttle and the rate limits."""

    def __init__(
        self,
        credentials: Iterable[Credential] = (),
        *,
        insecure: bool = False,
        failed_auth_limit: int = 10,
        failed_auth_window: float = 10.0,
        rates: dict[str, tuple[float, int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.credentials = list(credentials)
        self.insecure = insecure
        self.failed = FailedAuth(failed_auth_limit, failed_auth_window, clock)
        self.buckets = {name: TokenBucket(r, b, clock) for name, (r, b) in (rates or {}).items()}
        self.refused: Counter[str] = Counter()

    def add(self, credential: Credential) -> None:
        self.credentials.append(credential)

    def __repr__(self) -> str:
        return f"Gate({[c.name for c in self.credentials]}, insecure={self.insecure})"

    def identify(self, header: str | None) -> Credential | None:
        """The credential whose token the ``Authorization: Bearer`` header carries, or None."""
        scheme, _, given = (header or "").partition(" ")
        try:
            offered = given.strip().encode("utf-8")
        except UnicodeEncodeError:  # a byte that is not UTF-8 in the header: no token has it
            return None
        if scheme.lower() != "bearer" or not offered:
            return None
        found = None
        for credential in self.credentials:  # every one compared: the time does not say which matched
            if hmac.compare_digest(offered, credential.token) and found is None:
                found = credential
        return found

    def admit(
        self,
        role: str | tuple[str, ...],
        *,
        header: str | None,
        peer: str,
        host: str | None = None,
        origin: str | None = None,
        name: str | None = None,
        limit: str | None = None,
    ) -> Caller:
        """The caller when it may act as ``role`` (and ``limit``'s bucket has room), else Refused.

        ``name``: a credential already established (a client certificate's CN)."""
        wait = self.failed.wait(peer)
        if wait is not None:
            self._refuse("throttled")
            raise Refused(
                429, "too many failed authentications; retry later", "throttled", _retry_after(wait)
            )
        caller = self._who(role, header, peer, host, origin, name)
        if limit is not None and limit in self.buckets:
            wait = self.buckets[limit].take()
            if wait is not None:
                self._refuse("rate_limited")
                raise Refused(
                    429, f"{limit}: rate limit reached; retry later", "rate_limited", _retry_after(wait)
                )
        return caller

    def _who(
        self,
        role: str | tuple[str, ...],
        header: str | None,
        peer: str,
        host: str | None,
        origin: str | None,
        name: str | None,
    ) -> Caller:
        if self.insecure and not self.credentials:
            # no token: the request must name a loopback Host and, if a browser sent an Origin, a
            # loopback origin, so a web page can neither post here (a cross-origin simple request)
            # nor reach it through a name that resolves to 127.0.0.1 (DNS rebinding)
            if not _loopback_host(host) or (origin is not None and not _loopback_origin(origin)):
                self._refuse("forbidden")
                raise Refused(
                    403, "insecure_loopback: only requests to and from a loopback address", "forbidden"
                )
            return Caller("insecure_loopback", peer)
        credential = self.identify(header)
        if credential is None and name is not None:
            credential = next((c for c in self.credentials if c.name == name), None)
        if credential is None:
            self._fail(peer)
            raise Refused(
                401, "missing or wrong bearer token", "unauthenticated", {"WWW-Authenticate": "Bearer"}
            )
        roles = (role,) if isinstance(role, str) else role
        if not credential.roles.intersection(roles):
            self._refuse("forbidden")
            wanted = " or ".join(roles)
            raise Refused(403, f"credential {credential.name!r} has no {wanted} role", "forbidden")
        return Caller(credential.name, peer)

    def _fail(self, peer: str) -> None:
        self._refuse("unauthenticated")
        if self.failed.failed(peer) == 1:  # one line per burst: the rest are counted, not logged
            log.warning(
                "control listener: failed authentication from %s (more within %g s are counted in "
                "specguard_control_refused_requests_total, not logged; past %d, 429 until the window ends)",
                peer,
                self.failed.window,
                self.failed.limit,
            )

    def _refuse(self, reason: str) -> None:
        self.refused[reason] += 1

    def collector(self) -> RefusedCollector:
        return RefusedCollector(self)


class RefusedCollector:
    """``specguard_control_refused_requests_total{reason}``."""

    def __init__(self, gate: Gate):
        self.gate = gate

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "specguard_control_refused_requests",
            "Requests the control listener refused, by reason (401, 403, 429 throttled or rate-limited)",
            labels=["reason"],
        )
        for reason in REASONS:
            family.add_metric([reason], float(self.gate.refused[reason]))
        yield family


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def _loopback_host(host: str | None) -> bool:
    """A ``Host`` header (``name``, ``name:port``, ``[v6]`` or ``[v6]:port``) naming a loopback address."""
    if not host:
        return False
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else ""
    else:
        name = host.rpartition(":")[0] if ":" in host else host
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _loopback_origin(origin: str) -> bool:
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and _loopback_host(parts.netloc)


# -- the generated operator token ------------------------------------------------------------------
def token_dir() -> Path:
    """Where ``specguard run`` writes the operator token it makes: ``$XDG_RUNTIME_DIR/specguard``
    (a per-user tmpfs), else ``~/.local/state/specguard``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "specguard"
    return Path.home() / ".local" / "state" / "specguard"


def generated_token_path(port: int) -> Path:
    """The generated operator token of the control listener on ``port``."""
    return token_dir() / f"control-{port}.token"


def write_generated_token(path: Path) -> str:
    """A fresh operator token, written to ``path`` readable by this user only (0600, in a 0700
    directory), atomically. Raises OSError."""
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def remove_generated_token(path: Path, token: str) -> None:
    """Remove ``path`` if it still holds ``token`` (another run may have replaced it)."""
    try:
        if hmac.compare_digest(path.read_text().strip().encode(), token.encode()):
            path.unlink()
    except OSError:
        pass
