"""``specguard status``: the current plan and the last decisions of a running guard.

Reads ``/status`` of a running instance (``--url``, or ``tap.listen`` of ``--config``); when
the instance cannot be reached, or with ``--plan-file``, reads the persisted plan (and the
audit log, if given or configured) instead. ``--json`` prints the machine-readable form.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
import time
import urllib.error
import urllib.request
from typing import Any

from specguard import columns as columns_mod
from specguard import untrusted
from specguard.errors import InputError, SourceError
from specguard.monitor import audit as audit_mod
from specguard.monitor import state as state_mod
from specguard.rules import rcquality


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="print the guard's current plan and last decisions",
        description="Print the current plan (class x load bucket -> pool/K) and the last decisions, "
        "from a running instance's /status or from the persisted plan file.",
    )
    parser.add_argument("--url", help="base URL of a running specguard (default: tap.listen of --config)")
    parser.add_argument("--config", metavar="FILE", help="the config file (for tap.listen and actuators.*)")
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


def run(args: argparse.Namespace) -> int:
    plan_file, audit_log, url = args.plan_file, args.audit_log, args.url
    if args.config:
        from specguard.monitor import config as config_mod

        cfg = config_mod.load(args.config)
        acts = cfg.sections.get("actuators")
        url = url or f"http://{cfg.exporter.tap.listen}"
        if acts is not None:
            plan_file = plan_file or (acts.plan_file if not args.url else None)
            audit_log = audit_log or acts.audit_log
    note = None
    if args.plan_file is None and url:
        try:
            status = fetch(url, args.timeout)
        except SourceError as exc:
            if not plan_file:
                raise
            note = f"{exc}; showing the persisted plan"
            status = from_files(plan_file, audit_log)
    elif plan_file:
        status = from_files(plan_file, audit_log)
    else:
        url = "http://127.0.0.1:8090"
        status = fetch(url, args.timeout)
    if note:
        status["note"] = note
    status["decisions"] = status.get("decisions", [])[-args.decisions :] if args.decisions else []
    if args.json:
        json.dump(status, sys.stdout, indent=2, sort_keys=True)
        print()
    else:
        print(render(status))
    return 0


def fetch(url: str, timeout: float) -> dict[str, Any]:
    target = url.rstrip("/") + "/status"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
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


def _baselines(report: Any) -> list[str]:
    """Each load bucket's baseline source, and the cells without one with how to get one."""
    if not isinstance(report, dict):
        return []
    lines = ["", "baselines (no-spec TPOT per load bucket):"]
    for row in report.get("load_buckets", []):
        also = [s for s in row.get("available", []) if s != row.get("source")]
        extra = f" (also: {', '.join(also)})" if also else ""
        lines.append(f"  {row['load_bucket']:<8} {row['source']}{extra}")
    missing = report.get("missing", [])
    if missing:
        cells = ", ".join(f"{m['pool']}/{m['load_bucket']}" for m in missing)
        lines.append(f"  no baseline for {cells}: to get one: {missing[0]['how_to_get_one']}")
    return lines


def _holdout(report: Any) -> list[str]:
    """The router's holdout: its mode, shares per load bucket, and the buckets being refilled."""
    if not isinstance(report, dict):
        return []
    shares = report.get("shares") or {}
    held = ", ".join(f"{bucket} {share:.1%}" for bucket, share in shares.items())
    line = f"  holdout: {report.get('mode')}; share {held or format(report.get('share', 0.0), '.1%')}"
    if report.get("refilling"):
        line += f"; refilling (capacity matched): {', '.join(report['refilling'])}"
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
    lines += _baselines(status.get("baselines"))
    lines += _holdout(status.get("holdout"))
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
