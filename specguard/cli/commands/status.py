"""``specguard status``: the current plan and the last decisions of a running guard.

Reads ``/status`` of a running instance's control listener (``--url``, or ``server.listen`` of
``--config``, default ``http://127.0.0.1:8091``) with an operator token: ``--token-file``, else
``$SPECGUARD_TOKEN``, else the operator credential of ``--config``, else the token ``specguard run``
generated for that port when no credential is configured. When the instance cannot be reached, or
with ``--plan-file``, reads the persisted plan (and the audit log, if given or configured)
instead. ``--json`` prints the machine-readable form.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import sys
import textwrap
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from specguard import columns as columns_mod
from specguard import untrusted
from specguard.errors import ConfigError, InputError, SourceError
from specguard.monitor import audit as audit_mod
from specguard.monitor import control_auth
from specguard.monitor import state as state_mod
from specguard.rules import rcquality


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="print the guard's current plan and last decisions",
        description="Print the current plan (class x load bucket -> pool/K) and the last decisions, "
        "from a running instance's /status or from the persisted plan file.",
    )
    parser.add_argument(
        "--url",
        help="base URL of a running specguard's control listener (default: server.listen of --config, "
        f"else {DEFAULT_URL})",
    )
    parser.add_argument("--config", metavar="FILE", help="the config file (server.*, actuators.*)")
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="an operator token (default: $SPECGUARD_TOKEN, the config's operator credential, or the "
        "token specguard run generated)",
    )
    parser.add_argument("--cacert", metavar="FILE", help="the CA of an https control listener")
    parser.add_argument(
        "--plan-file", metavar="FILE", help="read this persisted plan instead of a running instance"
    )
    parser.add_argument(
        "--audit-log", metavar="FILE", help="with --plan-file: show the last decisions from it"
    )
    parser.add_argument(
        "--decisions", type=int, default=10, metavar="N", help="how many decisions (default 10)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for /status (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


DEFAULT_URL = "http://127.0.0.1:8091"


def run(args: argparse.Namespace) -> int:
    plan_file, audit_log, url = args.plan_file, args.audit_log, args.url
    token = None
    if args.config:
        from specguard.monitor import config as config_mod

        cfg = config_mod.load(args.config)
        acts = cfg.sections.get("actuators")
        server = cfg.sections.get("server")
        if not url:
            scheme = "https" if server is not None and server.tls is not None else "http"
            url = f"{scheme}://{config_mod.control_listen(cfg)}"
        token = config_token(server)
        if acts is not None:
            plan_file = plan_file or (acts.plan_file if not args.url else None)
            audit_log = audit_log or acts.audit_log
    note = None
    if args.plan_file is None and not url and not plan_file:
        url = DEFAULT_URL
    if args.plan_file is None and url:
        token = operator_token(args.token_file, token, url)
        try:
            status = fetch(url, args.timeout, token, args.cacert)
        except SourceError as exc:
            if not plan_file:
                raise
            note = f"{exc}; showing the persisted plan"
            status = from_files(plan_file, audit_log)
    else:
        status = from_files(plan_file, audit_log)
    if note:
        status["note"] = note
    status["decisions"] = status.get("decisions", [])[-args.decisions :] if args.decisions else []
    if args.json:
        json.dump(status, sys.stdout, indent=2, sort_keys=True)
        print()
    else:
        print(render(status))
    return 0


def config_token(server: Any) -> str | None:
    """The token of the config's first operator credential (the legacy token has every role)."""
    if server is None:
        return None
    for credential in server.all_credentials():
        if "operator" in credential.roles:
            return credential.token()
    return None


def operator_token(token_file: str | None, configured: str | None, url: str) -> str | None:
    """``--token-file``, else ``$SPECGUARD_TOKEN``, else the config's, else the generated one."""
    from specguard.monitor import guard_config

    if token_file:
        return guard_config.read_token(token_file, "--token-file")
    if os.environ.get("SPECGUARD_TOKEN", "").strip():
        return os.environ["SPECGUARD_TOKEN"].strip()
    if configured:
        return configured
    port = urlsplit(url).port
    path = control_auth.generated_token_path(port) if port else None
    if path is not None and path.is_file():
        try:
            return guard_config.read_token(str(path), "the generated operator token")
        except ConfigError:
            return None
    return None


def fetch(url: str, timeout: float, token: str | None = None, cacert: str | None = None) -> dict[str, Any]:
    target = url.rstrip("/") + "/status"
    request = urllib.request.Request(target, headers={"Authorization": f"Bearer {token}"} if token else {})
    context = ssl.create_default_context(cafile=cacert) if cacert else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise SourceError(
                f"{target}: HTTP {exc.code}: an operator token is needed (--token-file, "
                "$SPECGUARD_TOKEN, or the config's server.credentials with --config)"
            ) from exc
        raise SourceError(f"{target}: HTTP {exc.code}") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceError(f"cannot reach {target}: {reason}") from exc
    data = untrusted.loads(body, target)
    if not isinstance(data, dict) or "classes" not in data:
        raise InputError(f"{target}: not a specguard /status answer")
    return data


def from_files(plan_file: str, audit_log: str | None) -> dict[str, Any]:
    doc = state_mod.PlanStore(plan_file).load_readonly()
    if doc is None:
        raise InputError(f"{plan_file}: no plan file")
    classes = [
        {
            "task_type": k[0],
            "temperature_bucket": k[1],
            "load_bucket": k[2],
            "pool": s.pool,
            "num_speculative_tokens": doc.pools.get(s.pool, 0),
            "speculation_enabled": doc.pools.get(s.pool, 0) > 0,
            "pin": s.pin,
            "paused": s.paused,
            "frozen": s.frozen,
            "phase": None,
            "reason": None,
        }
        for k, s in sorted(doc.states.items())
    ]
    decisions, torn = audit_mod.read(audit_log) if audit_log else ([], [])
    decisions = audit_mod.decisions(decisions)  # webhook lines are no decisions
    return {
        "mode": "file",
        "plan_version": doc.version,
        "updated_at": doc.updated_at,
        "classes": classes,
        "decisions": decisions,
        "audit_torn_lines": torn,
    }


def _ago(ts: float | None) -> str:
    if ts is None:
        return "never"
    return f"{max(0.0, time.time() - ts):.0f} s ago"


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


def _when(ts: float | None) -> str:
    """``in 25 s (23:50:45Z)``; ``due now`` once the time has passed."""
    if ts is None:
        return "no time can be given"
    left = ts - time.time()
    return f"in {left:.0f} s ({_clock(ts)})" if left >= 0.5 else f"due now ({_clock(ts)})"


def _rc(found: Any) -> str:
    """``1.37 [1.13, 1.66] (live, spec-k4)``: the class's RC, its interval and the baseline source
    and pool it used; ``not enough evidence [...]`` when the interval is too wide for a number."""
    if not isinstance(found, dict):
        return "-"
    evidence = found.get("evidence")
    text = rcquality.shown(found.get("rc"), found.get("lower"), found.get("upper"), state=evidence)
    if evidence == rcquality.CONTRADICTED:
        text += " !"
    pool = "" if found.get("pool") is None else ", " + str(found["pool"])
    return f"{text} ({found.get('baseline_source')}{pool})"


def _phase(c: dict[str, Any]) -> str:
    """The engine's phase, with a hold's kind in words: ``hold: too little data``."""
    phase = c.get("phase") or "-"
    return f"{phase}: {c['hold_words']}" if phase == "hold" and c.get("hold_words") else phase


def _wrapped(label: str, text: str, width: int, indent: str = "    ") -> list[str]:
    """``text`` whole, wrapped to ``width`` under ``label`` (never cut)."""
    return textwrap.wrap(
        text,
        width,
        initial_indent=f"{indent}{label}",
        subsequent_indent=indent + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def _class_lines(c: dict[str, Any], width: int) -> list[str]:
    """The reason, notes and what a held class waits for, each whole and wrapped."""
    note = []
    if c.get("pin"):
        note.append(f"pinned to {c['pin']}")
    if c.get("paused"):
        note.append("paused")
    if c.get("frozen"):
        note.append("frozen")
    if c.get("failover"):
        note.append(f"{c['pool']} is down: served by another pool meanwhile")
    found = c.get("rc") if isinstance(c.get("rc"), dict) else {}
    if found.get("evidence_note"):
        note.append(f"RC flagged: {found['evidence_note']}")
    for why in (c.get("reports") or {}).values():
        note.append(why)
    lines = _wrapped("why: ", c["reason"], width) if c.get("reason") else []
    if note:
        lines += _wrapped("note: ", "; ".join(note), width)
    if c.get("waiting_for"):
        what = c.get("until_what") or "next evaluation"
        lines += _wrapped("waiting for: ", f"{c['waiting_for']}; {what} {_when(c.get('until'))}", width)
    return lines


def _baselines(report: Any, width: int = 100) -> list[str]:
    """Each load bucket's baseline source (with why there is none: every source's reason, e.g. a
    model baseline not read past twice the no-spec loads), and the cells without one with how to
    get one."""
    if not isinstance(report, dict):
        return []
    lines = ["", "baselines (no-spec TPOT per load bucket):"]
    for row in report.get("load_buckets", []):
        also = [s for s in row.get("available", []) if s != row.get("source")]
        extra = f" (also: {', '.join(also)})" if also else ""
        lines.append(f"  {row['load_bucket']:<8} {row['source']}{extra}")
        if row.get("source") == "none" and row.get("detail"):
            why = str(row["detail"]).split("; to get one:")[0]
            lines += _wrapped("why none: ", why, width, indent="    ")
    missing = report.get("missing", [])
    if missing:
        cells = ", ".join(f"{m['pool']}/{m['load_bucket']}" for m in missing)
        lines.append(f"  no baseline for {cells}: to get one: {missing[0]['how_to_get_one']}")
    return lines


def _schedule(report: Any) -> list[str]:
    """One pool, no routing: each scheduled pool's K per load bucket and the classes that lose."""
    if not isinstance(report, dict):
        return []
    lines = ["", "in-engine K schedule (one pool, no routing):"]
    for pool, info in (report.get("pools") or {}).items():
        ks = ", ".join(
            f"{bucket} K={lo}" if lo == hi else f"{bucket} K={lo}-{hi}"
            for bucket, (lo, hi) in (info.get("k_by_load_bucket") or {}).items()
        )
        lines.append(f"  {pool}: {info.get('schedule')} ({ks})")
    losing = report.get("lines") or []
    lines += [f"  LOSES: {line}" for line in losing] or ["  no class loses where the schedule speculates"]
    return lines


def _holdout(report: Any) -> list[str]:
    """The router's holdout: its mode, shares per load bucket, the buckets being refilled, and the
    least share per class the fleet plan holds out."""
    if not isinstance(report, dict):
        return []
    shares = report.get("shares") or {}
    held = ", ".join(f"{bucket} {share:.1%}" for bucket, share in shares.items())
    line = f"  holdout: {report.get('mode')}; share {held or format(report.get('share', 0.0), '.1%')}"
    if report.get("refilling"):
        line += f"; refilling (capacity matched): {', '.join(report['refilling'])}"
    planned = report.get("class_shares") or {}
    if planned:
        line += "; at least, as planned: " + ", ".join(f"{c} {share:.1%}" for c, share in planned.items())
    return [line]


def width() -> int:
    """The terminal's width (100 when not a terminal), within 60..160."""
    return max(60, min(160, shutil.get_terminal_size((100, 24)).columns))


def render(status: dict[str, Any], columns: int | None = None) -> str:
    columns = columns or width()
    lines = []
    if status.get("note"):
        lines += _wrapped("note: ", status["note"], columns, indent="")
    head = [f"plan version {status.get('plan_version')}"]
    if status.get("mode") == "file":
        head.append(f"written {_ago(status.get('updated_at'))} (from the plan file)")
    else:
        head.append(f"policy {status.get('policy_version')}")
        head.append("dry-run" if status.get("dry_run") else "acting")
        if status.get("frozen"):
            head.append("FROZEN (data source errors)")
    lines.append(" | ".join(head))
    if status.get("mode") != "file":
        last, every = status.get("last_evaluation"), status.get("interval_seconds")
        evaluated = f"last evaluation {_ago(last)}"
        if last is not None and every:
            evaluated = f"evaluations every {every:g} s: last {_ago(last)}, next {_when(last + every)}"
        lines.append(evaluated)
    rows = [("CLASS", "LOAD", "POOL", "K", "PHASE", "RC [INTERVAL] (BASELINE, POOL)")]
    details = []
    for c in status.get("classes", []):
        rows.append(
            (
                f"{c['task_type']}/{c['temperature_bucket']}",
                c["load_bucket"],
                c["pool"],
                str(c.get("num_speculative_tokens", "")),
                _phase(c),
                _rc(c.get("rc")),
            )
        )
        details.append(_class_lines(c, columns))
    table = columns_mod.aligned(rows)
    lines.append(table[0])
    for row, more in zip(table[1:], details, strict=True):
        lines.append(row)
        lines += more
    if any(
        isinstance(c.get("rc"), dict) and c["rc"].get("evidence") == rcquality.CONTRADICTED
        for c in status.get("classes", [])
    ):
        lines.append(
            "  ! the model baseline's RC contradicts a measured one at a neighbouring load (see its note)"
        )
    lines += _baselines(status.get("baselines"), columns)
    lines += _holdout(status.get("holdout"))
    lines += _schedule(status.get("schedule"))
    decisions = status.get("decisions", [])
    lines.append("")
    lines.append("last decisions:" if decisions else "no decisions yet")
    for d in decisions:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(d.get("time", 0)))
        dry = " (dry-run)" if d.get("dry_run") else ""
        lines.append(
            f"  {when}  {d.get('class', '?')} at load {d.get('load_bucket', '?')}: {d.get('action')}{dry}, "
            f"{d.get('from')} -> {d.get('to')}"
        )
        if d.get("reason"):
            lines += _wrapped("", d["reason"], columns, indent="      ")
    if status.get("policy_reload_error"):
        lines.append(f"policy reload failed (the previous policy stays): {status['policy_reload_error']}")
    if status.get("plan_file_recovered"):
        lines.append(f"note: {status['plan_file_recovered']}")
    if status.get("audit_torn_lines"):
        lines.append(f"note: audit log lines skipped as torn: {status['audit_torn_lines']}")
    return "\n".join(lines)
