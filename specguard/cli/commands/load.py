"""``specguard load``: send the demo's mixed traffic through a tap for a while, then summarise it.

Enough traffic for a hand-run guard to show RC per class (``specguard status``); works against any
OpenAI-compatible URL. Exit 0 when every request succeeded, 1 when some failed, 2 when nothing
answers at ``--url``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    from specguard.lab import traffic

    parser = subparsers.add_parser(
        "load",
        help="send a mixed request mix (code, extraction, chat, creative) through a tap",
        description=(
            "Closed-loop clients send chat completions for four task types (x-task-type header), "
            "each asking for its own task: code to rewrite and invoice fields to copy at temperature 0, "
            "a question (chat) at 0.7, a poem (creative) at 1.0, in equal shares, until --duration or "
            "--requests; then print requests, failures and mean TPOT per class. The model is the one "
            "the URL lists at /v1/models unless --model names one. Ctrl-C stops early (requests in "
            "flight finish)."
        ),
    )
    parser.add_argument(
        "--url",
        default=traffic.DEFAULT_URL,
        help=f"base URL of the tap or engine (default {traffic.DEFAULT_URL})",
    )
    parser.add_argument("--clients", type=int, default=32, help="concurrent closed-loop clients (default 32)")
    parser.add_argument(
        "--duration", type=float, default=60.0, metavar="SECONDS", help="seconds (default 60)"
    )
    parser.add_argument("--requests", type=int, metavar="N", help="stop after N requests (default: no cap)")
    parser.add_argument(
        "--model", default=None, help="the body's model (default: the first one the URL lists at /v1/models)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=256, metavar="N", help="max_tokens of each request (default 256)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the class draws and prompts (default 0)")
    parser.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stream responses (default: yes)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specguard.lab import traffic

    if args.max_tokens < 1:
        raise traffic.flag_error(f"--max-tokens ({args.max_tokens}) must be >= 1")
    summary = asyncio.run(
        traffic.send(
            args.url,
            clients=args.clients,
            duration_s=args.duration,
            requests=args.requests,
            model=args.model or None,
            seed=args.seed,
            stream=args.stream,
            max_tokens=args.max_tokens,
        )
    )
    if args.json:
        json.dump(summary.to_json(), sys.stdout, indent=2, sort_keys=True)
        print()
    else:
        print(summary.render())
    return 1 if summary.failed else 0
