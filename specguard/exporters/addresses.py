"""Addresses in the config: ``tap.listen`` (IPv4, names and bracketed IPv6) and pool URLs
(a valid port, and a password never shown in a log line or a message)."""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit, urlunsplit


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
