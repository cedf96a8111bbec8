"""``specguard report``: a self-contained HTML report from a Prometheus server."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from specguard.errors import ConfigError, ConfigIssue


def flag_error(message: str) -> ConfigError:
    """A bad command-line flag: ``--flag rest`` -> ``Error: --flag: rest``."""
    flag, _, rest = message.partition(" ")
    return ConfigError(ConfigIssue(flag.rstrip(":"), None, None, "", rest))


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, flag: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds; anything else is a clear error."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise flag_error(f"{flag} {text!r}: expected a positive duration such as 90s, 15m, 2h or 1d")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="HTML report of RC, decisions, acceptance and the current plan from Prometheus",
        description=(
            "Query a Prometheus server that scrapes specguard and write one self-contained HTML file: "
            "RC per class over time with the guard's decisions marked, acceptance and rollback trends, "
            "per-pool TPOT and throughput, and the current plan."
        ),
    )
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    parser.add_argument("--since", default="1h", help="report the last DURATION (default 1h)")
    parser.add_argument(
        "--end", type=float, default=None, help="end of the range, epoch seconds (default now)"
    )
    parser.add_argument("--step", default=None, help="query step (default: range/240, at least 1s)")
    parser.add_argument("--window", default=None, help="rate() window (default max(4 steps, 20s))")
    parser.add_argument("--output", "-o", default="specguard-report.html", help="HTML file to write")
    parser.add_argument("--title", default="specguard report")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per Prometheus request")
    parser.add_argument("--json", action="store_true", help="also print the plan and decisions as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specguard.lab import report
    from specguard.lab.report_data import PromData

    since = parse_duration(args.since, "--since")
    step = parse_duration(args.step, "--step") if args.step else max(1.0, round(since / 240.0))
    window = f"{parse_duration(args.window, '--window'):g}s" if args.window else None
    end = args.end if args.end is not None else time.time()
    source = PromData(args.prometheus, timeout_s=args.timeout)
    try:
        data = report.collect(source, end - since, end, step, window)
    finally:
        source.close()
    page = report.render_html(data, args.title)
    out = Path(args.output)
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise flag_error(f"--output {out}: cannot write: {exc.strerror}") from exc
    if args.json:
        summary = {
            "output": str(out),
            "prometheus": data.url,
            "start": data.start,
            "end": data.end,
            "step_seconds": data.step_s,
            "requests": data.requests,
            "rc_series": int(data.rc.groupby(list(_labels(data.rc))).ngroups) if not data.rc.empty else 0,
            "plan": _records(data.plan),
            "actions": _records(data.actions),
        }
        json.dump(summary, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        print(
            f"wrote {out} ({len(page) // 1024} KiB): {len(data.plan)} plan entries, "
            f"{len(data.actions)} decisions, {data.requests:.0f} requests"
        )
    return 0


def _labels(frame):
    return [c for c in frame.columns if c not in ("timestamp", "value")]


def _records(frame) -> list[dict]:
    if frame.empty:
        return []
    out = frame.copy()
    if "timestamp" in out:
        out["timestamp"] = out["timestamp"].map(lambda t: t.timestamp())
    return json.loads(out.to_json(orient="records"))
