"""``specguard inspect``: what an engine's /metrics page says about speculative decoding.

One page (``--file``, ``--url``, ``--sample``) gives cumulative numbers since the engine started;
two pages (two ``--file``s, or ``--url`` with ``--interval``) give the window between them, with
counter resets handled like Prometheus ``rate()``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib import resources

from specguard import columns, untrusted
from specguard.errors import InputError
from specguard.exporters import derive, engines, promtext, scrape
from specguard.exporters.snapshot import EngineSnapshot

SAMPLE = "vllm-0.32-cpu-ngram-k4.metrics.txt"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="read an engine /metrics page: acceptance, accept length, rollbacks, step time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--file",
        action="append",
        metavar="PATH",
        help="a saved page ('-' = stdin); give it twice for the window between two pages",
    )
    source.add_argument("--url", help="scrape an engine (http://host:port uses the engine's metrics path)")
    source.add_argument(
        "--sample", action="store_true", help="the bundled real vLLM 0.32 CPU page (n-gram, K=4)"
    )
    parser.add_argument(
        "--interval",
        type=float,
        metavar="S",
        help="with --url: scrape twice, S seconds apart, show the window",
    )
    parser.add_argument(
        "--engine", choices=engines.CHOICES, default="auto", help="default: detect from the page"
    )
    parser.add_argument("--timeout", type=float, default=5.0, metavar="S", help="scrape timeout (default 5)")
    parser.add_argument("--json", action="store_true", help="machine-readable output (stable keys)")
    parser.set_defaults(func=run)


def _read(path: str) -> EngineSnapshot:
    """A saved page, read and parsed within the scrape limits (a huge file or line is refused)."""
    limit = promtext.LIMITS.max_page_bytes
    try:
        if path == "-":
            text = getattr(sys.stdin, "buffer", sys.stdin).read(limit + 1)
        else:
            text = untrusted.read_bytes(path, limit, "metrics page", regular=False)  # <(curl ...) too
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return promtext.parse(text, "<stdin>" if path == "-" else path)


def snapshots(args: argparse.Namespace) -> tuple[EngineSnapshot | None, EngineSnapshot]:
    """(earlier page or None, later page) from the command-line sources."""
    if args.interval is not None and not args.url:
        raise InputError("--interval needs --url (two --file pages already make a window)")
    if args.interval is not None and not args.interval > 0:
        raise InputError(f"--interval must be > 0 seconds, got {args.interval:g}")
    if args.sample:
        text = resources.files("specguard.exporters.engines.samples").joinpath(SAMPLE).read_text("utf-8")
        return None, engines.snapshot(promtext.parse(text, f"<sample {SAMPLE}>"), args.engine)
    if args.url:
        url = scrape.metrics_url(args.url, args.engine)
        try:
            first = scrape.scrape_sync(url, engine=args.engine, timeout=args.timeout).snapshot
        except InputError as exc:
            # trtllm-serve answers JSON on /metrics; with --engine auto try its Prometheus path
            trtllm = scrape.metrics_url(args.url, "trtllm")
            if args.engine != "auto" or url == trtllm or "answered JSON" not in str(exc):
                raise
            url = trtllm
            first = scrape.scrape_sync(url, engine=args.engine, timeout=args.timeout).snapshot
        if args.interval is None:
            return None, first
        time.sleep(args.interval)
        second = scrape.scrape_sync(url, engine=first.engine, timeout=args.timeout).snapshot
        return first, second
    if len(args.file) > 2:
        raise InputError(f"--file takes one page (cumulative) or two (a window), got {len(args.file)}")
    pages = [engines.snapshot(_read(path), args.engine) for path in args.file]
    if len(pages) == 1:
        return None, pages[0]
    if pages[0].engine != pages[1].engine:
        raise InputError(
            f"{args.file[0]} is a {pages[0].engine} page but {args.file[1]} is a {pages[1].engine} page"
        )
    return pages[0], pages[1]


def run(args: argparse.Namespace) -> int:
    prev, cur = snapshots(args)
    result = derive.summarize(cur, prev)
    text = json.dumps(result.as_dict(), indent=2) if args.json else render(result, window=prev is not None)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `specguard inspect ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# --- table --------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.2f} ms"


def _rows(d: derive.Derived) -> list[tuple[str, str, str]]:
    per_pos = "-"
    if d.per_position_acceptance:
        per_pos = "  ".join(f"p{i + 1} {p:.3f}" for i, p in enumerate(d.per_position_acceptance))
    return [
        ("verify rounds (drafts)", _num(d.drafts), "rounds that carried drafts"),
        ("draft tokens", _num(d.draft_tokens), "proposed"),
        ("accepted tokens", _num(d.accepted_tokens), "bonus excluded"),
        ("strict accept rate", _num(d.strict_accept_rate), "accepted / proposed drafts"),
        ("accept length", _num(d.accept_length), "output tokens per round, bonus included"),
        ("CI acceptance proxy", _num(d.ci_acceptance_proxy), "accept length / (K + 1)"),
        ("per-position acceptance", per_pos, "share of rounds whose first i drafts were accepted"),
        ("full-rollback ratio", _num(d.full_rollback_ratio), "rounds that accepted no draft (1 - p1)"),
        ("mean step", _ms(d.mean_step_seconds), "one verify/decode step of a request"),
        (
            "time per output token",
            _ms(d.time_per_output_token_seconds),
            "decode time per token, after the first",
        ),
        ("generation tokens", _num(d.generation_tokens), ""),
        (
            "running / waiting",
            f"{_num(d.running_requests)} / {_num(d.waiting_requests)}",
            "requests, at the end",
        ),
    ]


def render(d: derive.Derived, *, window: bool) -> str:
    if d.speculation_enabled is None:
        spec = "speculation: unknown from this page"
    elif d.speculation_enabled:
        spec = (
            f"speculation on, K={d.num_speculative_tokens if d.num_speculative_tokens is not None else '?'}"
        )
    else:
        spec = "speculation off"
    if window:
        resets = ", ".join(d.counter_resets or ()) or "none"
        span = f"window between two pages (counter resets: {resets})"
    else:
        span = "cumulative since the engine started (one page)"
    lines = [f"engine: {d.engine} ({spec})", span, ""]
    rows = _rows(d)
    width = max(len(r[0]) for r in rows)
    value_width = min(40, max(len(r[1]) for r in rows))
    for name, value, note in rows:
        lines.append(f"  {name:<{width}}  {value:<{value_width}}  {note}".rstrip())
    lines.append("  ('-' = not reported by this engine or no data in the window)")
    if d.warnings:
        lines += ["", "warnings (the numbers above are suspect):"]
        lines += [f"  {untrusted.printable(w, 300)}" for w in d.warnings]
    for title, group in (("model", d.models), *((f"label {k}", v) for k, v in d.breakdown.items())):
        if not group:
            continue
        lines += ["", f"per {title}:"]
        header = ("", "rounds", "accept len", "strict", "rollback", "step", "TPOT", "gen tokens")
        table = [header] + [
            (
                name,
                _num(m.drafts),
                _num(m.accept_length),
                _num(m.strict_accept_rate),
                _num(m.full_rollback_ratio),
                _ms(m.mean_step_seconds),
                _ms(m.time_per_output_token_seconds),
                _num(m.generation_tokens),
            )
            for name, m in group.items()
        ]
        lines += columns.aligned(table, indent="  ")
    return "\n".join(lines)
