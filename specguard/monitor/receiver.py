"""HTTP endpoints of the guard: Alertmanager receiver, operator overrides, ``/status``.

* ``POST /api/v1/alerts`` takes Alertmanager webhook payloads (version 4; unknown fields are
  ignored). Each alert is stored by fingerprint in the alert book and becomes evidence at the
  next evaluation: never a direct toggle; repeats and HA duplicates change nothing.
  2xx once accepted and on disk, 400 with the reason for a malformed payload (Alertmanager does
  not retry 4xx), 503 while the guard is not running or when the plan file could not be written
  (Alertmanager retries 5xx; nothing of a refused payload is kept), 413 past the size limit.
* ``POST /api/v1/overrides`` pins, unpins, pauses or resumes a class; ``GET`` lists them. A
  standby decider answers 503 (the leader takes overrides).
* ``GET /status`` (JSON) and ``GET /healthz``.

All of them are served on the control listener only, and every one needs a credential with its
role (``control_auth.Gate``): ``alertmanager`` for the webhook, ``operator`` for the rest; 401
without one, 403 for the wrong role, 429 past the failed-auth or rate limits. With
``server.insecure_loopback`` (and no credential) loopback requests need none. Tokens are never
logged or echoed. Each accepted webhook and override records its caller in the audit log.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from aiohttp import web

from specguard import untrusted
from specguard.errors import InputError
from specguard.exporters import httpbody
from specguard.monitor import control_auth, controltls
from specguard.monitor.control_auth import Caller, Refused
from specguard.monitor.daemon import Guard, NotLeader
from specguard.monitor.persist import PlanWriteError
from specguard.rules import evidence
from specguard.rules.evidence import AlertRecord, ClassKey, alert_time

log = logging.getLogger("specguard.receiver")

STATUSES = ("firing", "resolved")


def parse_alertmanager(
    payload: Any, now: float, known: Mapping[str, Collection[str]] | None = None
) -> list[AlertRecord]:
    """Alert records from a decoded webhook payload; InputError names the first bad field.

    ``known``: label name -> the configured values (task_type, temperature_bucket, load_bucket);
    an alert naming another value is refused, since it could never be evidence about a class.
    """
    if not isinstance(payload, dict):
        raise InputError(f"payload must be a JSON object, got {type(payload).__name__}")
    version = payload.get("version")
    if version is None:
        raise InputError("version: is required (Alertmanager webhook payload)")
    if str(version) != "4":
        raise InputError(f"version ({version!r}) is not supported (expected '4')")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise InputError("alerts: must be a list")
    out = []
    for index, alert in enumerate(alerts):
        where = f"alerts[{index}]"
        if not isinstance(alert, dict):
            raise InputError(f"{where}: must be an object")
        status = alert.get("status")
        if status not in STATUSES:
            raise InputError(f"{where}.status ({status!r}) must be 'firing' or 'resolved'")
        labels = alert.get("labels", {})
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise InputError(f"{where}.labels: must be an object of strings")
        fingerprint = alert.get("fingerprint")
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise InputError(f"{where}.fingerprint: must be a string")
        if not fingerprint:  # Alertmanager always sends one; a hand-made payload may not
            fingerprint = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
        for name, values in (known or {}).items():
            value = labels.get(name)
            if value is not None and values and value not in values:
                known_values = ", ".join(sorted(values))
                raise InputError(
                    f"{where}.labels.{name} ({value!r}) is not configured (known: {known_values})"
                )
        starts_at = alert.get("startsAt", "")
        if not isinstance(starts_at, str) or (starts_at and alert_time(starts_at) is None):
            raise InputError(f"{where}.startsAt ({starts_at!r}) must be an RFC 3339 time")
        out.append(
            AlertRecord(
                fingerprint=fingerprint,
                alertname=str(labels.get("alertname", "")),
                status=status,
                labels=dict(labels),
                starts_at=str(starts_at),
                received_at=now,
            )
        )
    return out


def known_class(labels: Mapping[str, str], keys: Iterable[ClassKey]) -> bool:
    """True when every class label an alert gives (task_type, temperature_bucket, load_bucket) is a
    configured value; with no configured classes (a bare guard) every class is known."""
    known = [set(values) for values in zip(*keys, strict=False)]
    if not known:
        return True
    return all(
        not labels.get(name) or labels[name] in values
        for name, values in zip(evidence.CLASS_LABELS, known, strict=True)
    )


class Api:
    """aiohttp handlers over a Guard; ``routes()`` is what the app mounts."""

    def __init__(
        self,
        guard: Guard,
        *,
        token: str | None = None,
        insecure: bool = False,
        gate: control_auth.Gate | None = None,
        max_body_bytes: int = 1 << 20,
        status_decisions: int = 50,
        alerts_enabled: bool = True,
        clock: Callable[[], float] | None = None,
        body_timeout: float | None = None,
        clients: Any = None,
    ):
        self.guard = guard
        if gate is None:  # one token with every role (the legacy server.token_file)
            roles = frozenset(control_auth.ROLES)
            credentials = [control_auth.Credential("token", roles, token.encode())] if token else []
            gate = control_auth.Gate(credentials, insecure=insecure)
        self.gate = gate
        self.max_body_bytes = max_body_bytes
        self.status_decisions = status_decisions
        self.alerts_enabled = alerts_enabled
        self._clock = clock or guard.clock
        self.body_timeout = body_timeout  # seconds to receive a whole body (None: no limit)
        self.clients = clients  # the tap's ClientGuard, which counts body timeouts

    def __repr__(self) -> str:
        return f"Api({self.gate!r})"

    def routes(self, *, healthz: bool = True) -> list[web.RouteDef]:
        routes = [
            web.get("/status", self.status),
            web.post("/api/v1/overrides", self.post_override),
            web.get("/api/v1/overrides", self.get_overrides),
        ]
        # mounted even when disabled: the tap's catch-all proxy must never forward it to an engine
        routes.append(web.post("/api/v1/alerts", self.post_alerts if self.alerts_enabled else self.disabled))
        if healthz:
            routes.append(web.get("/healthz", self.healthz))
        return routes

    # -- the framework-free core -------------------------------------------------------------
    def authorize(
        self, header: str | None, host: str | None = None, origin: str | None = None
    ) -> tuple[int, str] | None:
        """None when an operator may call, else (status, message) (the framework-free check)."""
        try:
            self.gate.admit("operator", header=header, peer="-", host=host, origin=origin)
        except Refused as exc:
            return exc.status, exc.message
        return None

    async def ingest(self, payload: Any) -> dict[str, Any]:
        """Store the payload's alerts; returns once they are on disk with the plan (a restart does
        not forget a firing alert). ``PlanWriteError`` when the disk refused them: nothing kept."""
        now = self._clock()
        # an alert about a class that is not configured is answered per alert (``unknown_class``), not
        # by refusing the batch: Alertmanager would resend the whole batch, good alerts included
        records = parse_alertmanager(payload, now)

        def apply() -> tuple[list[tuple[str, str]], bool]:
            seen = []
            for record in records:
                # an alert that names no class (no task_type label) is no evidence about any class
                if not record.labels.get("task_type"):
                    outcome = "ignored"
                elif not known_class(record.labels, self.guard.configured_keys):
                    outcome = "unknown_class"  # not stored: the store only holds alerts about real classes
                else:
                    outcome = self.guard.alerts.ingest(record)
                seen.append((record.status, outcome))
            return seen, any(outcome in ("new", "updated") for _, outcome in seen)

        seen = await self.guard.commit_alerts(apply)
        outcomes: dict[str, int] = {}
        for status, outcome in seen:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            self.guard.counters.webhook_alerts[(status, outcome)] += 1
        return {"accepted": len(records), "outcomes": outcomes}

    # -- handlers ----------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> Any:
        try:
            raw = await httpbody.read_limited(
                request.content, self.max_body_bytes, request.content_length, timeout=self.body_timeout
            )
        except httpbody.BodyTooLarge as exc:
            raise _error(413, str(exc)) from exc
        except httpbody.BodyTimeout as exc:
            if self.clients is not None:
                self.clients.count("body")
            raise _error(408, f"request {exc}", close=True) from exc
        try:
            return untrusted.loads(raw, "body")
        except InputError as exc:
            raise _error(400, str(exc)) from exc

    def _check(self, request: web.Request, role: str = "operator", limit: str | None = None) -> Caller:
        return check(self.gate, request, role, limit, self.guard.counters)

    async def post_alerts(self, request: web.Request) -> web.Response:
        caller = self._check(request, "alertmanager", "alerts")
        if not self.guard.running:
            raise _error(503, "guard not running yet; retry")
        payload = await self._body(request)
        try:
            result = await self.ingest(payload)
        except InputError as exc:
            self.guard.counters.webhook_alerts[("invalid", "rejected")] += 1
            raise _error(400, str(exc)) from exc
        except PlanWriteError as exc:  # not on disk: Alertmanager retries a 5xx
            raise _error(503, str(exc)) from exc
        await self.guard.audit_event(webhook_record(caller, payload, result, self._clock()))
        return web.json_response(result)

    async def disabled(self, request: web.Request) -> web.Response:
        raise _error(404, "the Alertmanager receiver is disabled (alertmanager.enabled: false)")

    async def post_override(self, request: web.Request) -> web.Response:
        caller = self._check(request, "operator", "overrides")
        body = await self._body(request)
        if not isinstance(body, dict):
            raise _error(400, "body must be a JSON object")
        unknown = sorted(set(body) - OVERRIDE_FIELDS)
        if unknown:
            shown = ", ".join(untrusted.printable(name, 40) for name in unknown[:10])
            raise _error(400, f"unknown field(s): {shown}")
        for field in ("action", "task_type"):
            if not isinstance(body.get(field), str) or not body[field]:
                raise _error(400, f"{field}: is required (a string)")
        for field in ("temperature_bucket", "load_bucket", "pool", "reason"):
            if body.get(field) is not None and not isinstance(body[field], str):
                raise _error(400, f"{field}: must be a string or null, got {_json_type(body[field])}")
        try:
            decisions = await self.guard.override(
                body["action"],
                body["task_type"],
                body.get("temperature_bucket"),
                body.get("load_bucket"),
                pool=body.get("pool"),
                reason=untrusted.printable(body.get("reason") or "", 200),  # one log line, no escapes
                caller=caller.to_json(),
            )
        except InputError as exc:
            raise _error(400, str(exc)) from exc
        except (NotLeader, PlanWriteError) as exc:
            raise _error(503, str(exc)) from exc
        return web.json_response({"decisions": [d.to_json() for d in decisions]})

    async def get_overrides(self, request: web.Request) -> web.Response:
        self._check(request)
        rows = [
            {
                "task_type": k[0],
                "temperature_bucket": k[1],
                "load_bucket": k[2],
                "pin": s.pin,
                "paused": s.paused,
            }
            for k, s in sorted(self.guard.states.items())
            if s.pin is not None or s.paused
        ]
        return web.json_response({"overrides": rows})

    async def status(self, request: web.Request) -> web.Response:
        self._check(request)
        return web.json_response(self.guard.status(self.status_decisions))

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "guard_running": self.guard.running})


OVERRIDE_FIELDS = frozenset({"action", "task_type", "temperature_bucket", "load_bucket", "pool", "reason"})


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def check(
    gate: control_auth.Gate, request: web.Request, role: str, limit: str | None = None, counters: Any = None
) -> Caller:
    """The caller of ``request`` when it may act as ``role``; else the refusal as an HTTP error."""
    headers = request.headers
    try:
        return gate.admit(
            role,
            header=headers.get("Authorization"),
            peer=request.remote or "unknown",
            host=headers.get("Host"),
            origin=headers.get("Origin"),
            name=request.get(controltls.CERT_NAME),
            limit=limit,
        )
    except Refused as exc:
        if counters is not None and exc.status in (401, 403):
            endpoint = request.path.rsplit("/", 1)[-1]
            counters.api_auth_failures[(endpoint, str(exc.status))] += 1
        raise _error(exc.status, exc.message, exc.headers) from None


MAX_AUDIT_TEXT = 300


def webhook_record(caller: Caller, payload: Any, result: dict[str, Any], now: float) -> dict[str, Any]:
    """The audit line of one accepted webhook: who sent it (credential, peer, Alertmanager's
    ``groupKey`` and ``externalURL``) and what came of it."""
    data = payload if isinstance(payload, dict) else {}

    def text(key: str) -> str:
        value = data.get(key)
        return untrusted.printable(value, MAX_AUDIT_TEXT) if isinstance(value, str) else ""

    return {
        "event": "webhook",
        "at": now,
        "caller": {**caller.to_json(), "group_key": text("groupKey"), "external_url": text("externalURL")},
        "accepted": result.get("accepted", 0),
        "outcomes": result.get("outcomes", {}),
    }


def _error(
    status: int, message: str, headers: dict[str, str] | None = None, *, close: bool = False
) -> web.HTTPException:
    body = json.dumps({"error": message})
    kinds = {
        400: web.HTTPBadRequest,
        401: web.HTTPUnauthorized,
        403: web.HTTPForbidden,
        404: web.HTTPNotFound,
        408: web.HTTPRequestTimeout,
        413: web.HTTPRequestEntityTooLarge,
        429: web.HTTPTooManyRequests,
        503: web.HTTPServiceUnavailable,
    }
    if close:
        headers = {**(headers or {}), "Connection": "close"}
    if status == 413:
        return web.HTTPRequestEntityTooLarge(
            max_size=0, actual_size=0, text=body, content_type="application/json", headers=headers
        )
    return kinds[status](text=body, content_type="application/json", headers=headers)
