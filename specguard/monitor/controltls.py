"""TLS (and mTLS) for the control listener: one ``ssl.SSLContext`` reloaded when its files change.

``ReloadingContext`` loads ``server.tls``'s certificate and key (and, with ``client_ca_file``,
requires every client to present a certificate that CA signed). A thread checks the files'
modification times every ``reload_seconds`` (never on the event loop) and loads the pair again on
the same context, so a renewed certificate is served to new connections without a restart; a pair
that fails to load is logged and the old one kept. ``cert_name`` (a middleware) puts a client
certificate's common name on the request, where it may name a credential.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Awaitable, Callable

from aiohttp import web

from specguard.errors import ConfigError, ConfigIssue
from specguard.monitor.guard_config import TlsSettings

log = logging.getLogger("specguard.control")

CERT_NAME = web.RequestKey("specguard_cert_name", str)
"""Request key of the client certificate's common name (mTLS)."""


class ReloadingContext:
    def __init__(self, settings: TlsSettings, file: str = "<config>"):
        self.settings = settings
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.reloads = 0
        try:
            self._load()
            if settings.client_ca_file:
                self.context.load_verify_locations(cafile=settings.client_ca_file)
                self.context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            message = f"cannot load {self._files()}: {_why(exc)}"
            raise ConfigError(ConfigIssue(file, None, None, "server.tls", message)) from exc
        self._seen = self._stamp()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _files(self) -> str:
        return f"{self.settings.cert_file} / {self.settings.key_file}"

    def _load(self) -> None:
        self.context.load_cert_chain(self.settings.cert_file, self.settings.key_file)

    def _stamp(self) -> tuple[int, ...]:
        out = []
        for path in (self.settings.cert_file, self.settings.key_file):
            try:
                out.append(os.stat(path).st_mtime_ns)
            except OSError:
                out.append(-1)
        return tuple(out)

    def check(self) -> bool:
        """Load the pair again if a file changed; True when it was reloaded."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        try:
            self._load()
        except (OSError, ssl.SSLError) as exc:  # a half-written renewal: keep serving the old pair
            log.error(
                "server.tls: reloading %s failed (%s); keeping the old certificate", self._files(), _why(exc)
            )
            return False
        self._seen = stamp
        self.reloads += 1
        log.info("server.tls: certificate %s reloaded", self.settings.cert_file)
        return True

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="tls reload", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.reload_seconds):
            try:
                self.check()
            except Exception:  # the reload thread must never die
                log.exception("server.tls: reload check failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)


@web.middleware
async def cert_name(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The client certificate's common name, if any, as ``request[CERT_NAME]``."""
    transport = request.transport
    peer = transport.get_extra_info("peercert") if transport is not None else None
    if peer:
        for rdn in peer.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    request[CERT_NAME] = value
    return await handler(request)
