"""Addresses in the config: ``tap.listen`` (IPv4, names and bracketed IPv6) and pool URLs
(a valid port, and a password never shown in a log line or a message)."""

from __future__ import annotations

import errno
from urllib.parse import SplitResult, urlsplit, urlunsplit

LISTEN_FORM = "must be host:port ([address]:port for IPv6)"


def listen_problem(listen: str) -> str | None:
    """What is wrong with a ``host:port`` listen address, in words (None when it is fine)."""
    if split_listen(listen) is not None:
        return None
    port = listen.rpartition(":")[2]
    if port.isdigit() and int(port) > 65535:
        return f"port {int(port)} is out of range (0-65535)"
    return LISTEN_FORM


def bind_reason(exc: OSError) -> str:
    """Why a listening socket could not be bound, in a user's words (no ``[Errno 98]``)."""
    reasons = {
        errno.EADDRINUSE: "address already in use (another process listens there)",
        errno.EACCES: "permission denied (ports below 1024 need privileges)",
        errno.EADDRNOTAVAIL: "no such address on this machine",
    }
    if exc.errno in reasons:
        return reasons[exc.errno]
    text = exc.strerror or str(exc)
    return text.rpartition(": ")[2] if text.startswith("error while attempting to bind") else text


def shift_url_port(url: str, step: int) -> tuple[str, int]:
    """``url`` with its port (explicit, or the scheme's default) moved by ``step``; and that port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    moved = port + step
    auth, _, hostport = parts.netloc.rpartition("@")
    host = hostport.rsplit(":", 1)[0] if parts.port is not None else hostport
    netloc = f"{auth}@{host}:{moved}" if auth else f"{host}:{moved}"
    return urlunsplit(parts._replace(netloc=netloc)), moved


def split_listen(listen: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6-address]:port`` as (host without brackets, port); None if malformed."""
    host, _, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host:
            return None
    elif ":" in host or host.startswith("["):
        return None  # an IPv6 address needs brackets: [::1]:8090
    if not (host and port.isdigit() and 0 <= int(port) <= 65535):
        return None
    return host, int(port)


def join_listen(host: str, port: int) -> str:
    """The ``host:port`` text of an address (IPv6 in brackets), as in URLs and ``tap.listen``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def port_ok(parts: SplitResult) -> bool:
    try:
        port = parts.port
    except ValueError:
        return False
    return port is None or 1 <= port <= 65535


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``*****`` (pool URLs may carry credentials)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:*****@{host}"))
