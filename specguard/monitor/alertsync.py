"""Read the active alerts back from Alertmanager's API (v2) when the guard starts.

Alertmanager sends a firing alert again only every ``repeat_interval`` (an hour or more), so a
guard that restarted without its plan file (or whose file predates the alert) would not know about
it for that long. With ``alertmanager.url`` set, the guard asks ``GET /api/v2/alerts`` for the
active, unsilenced, uninhibited alerts (optionally only those routed to ``alertmanager.receiver``)
as it starts (in the background: the tap never waits for it) and takes each one as if the
webhook had delivered it. Alerts that name no configured
class are skipped; a failure is logged and the guard starts anyway (the webhook still works).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

import aiohttp

from specguard.errors import InputError, SourceError
from specguard.monitor import receiver
from specguard.rules.evidence import AlertRecord

log = logging.getLogger("specguard.receiver")


async def active_alerts(
    url: str,
    *,
    now: float,
    known: Mapping[str, Collection[str]] | None = None,
    receiver_name: str | None = None,
    timeout: float = 10.0,
) -> list[AlertRecord]:
    """The active alerts of the Alertmanager at ``url`` about a class; SourceError if unreachable."""
    params = {"active": "true", "silenced": "false", "inhibited": "false", "unprocessed": "false"}
    if receiver_name:
        params["receiver"] = receiver_name
    endpoint = url.rstrip("/") + "/api/v2/alerts"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(endpoint, params=params) as response:
                if response.status != 200:
                    raise SourceError(f"{endpoint}: HTTP {response.status}")
                data = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise SourceError(f"{endpoint}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(data, list):
        raise SourceError(f"{endpoint}: expected a list of alerts, got {type(data).__name__}")
    out = []
    for index, alert in enumerate(data):
        try:
            out.extend(receiver.parse_alertmanager(_as_webhook(alert), now, known))
        except InputError as exc:
            log.info("alert %d from %s skipped: %s", index, endpoint, exc)
    return [a for a in out if a.labels.get("task_type")]


def _as_webhook(alert: Any) -> dict[str, Any]:
    """One v2 API alert in the webhook's (version 4) shape, for the webhook's parser."""
    if not isinstance(alert, dict):
        raise InputError(f"alert must be an object, got {type(alert).__name__}")
    state = alert.get("status", {}).get("state") if isinstance(alert.get("status"), dict) else None
    return {
        "version": "4",
        "alerts": [
            {
                "status": "firing" if state == "active" else "resolved",
                "labels": alert.get("labels", {}),
                "fingerprint": alert.get("fingerprint"),
                "startsAt": alert.get("startsAt", ""),
            }
        ],
    }
