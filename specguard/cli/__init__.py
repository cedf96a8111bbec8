"""The ``specguard`` command line: dispatch to one module per subcommand.

A user's mistake prints ``Error: <message>`` and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from specguard import __version__
from specguard.errors import SpecguardError

# Subcommand modules under specguard.cli.commands, in the order `--help` lists them.
COMMANDS = (
    "demo",
    "run",
    "simulate",
    "load",
    "inspect",
    "cost",
    "sweep",
    "check_config",
    "status",
    "report",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specguard",
        description="Measure whether speculative decoding pays per traffic class, and guard it.",
    )
    parser.add_argument("--version", action="version", version=f"specguard {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"specguard.cli.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"specguard.cli.commands.{name}":
                continue  # command not built in this version
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SpecguardError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `specguard status --json | head`: the reader left, nothing is wrong
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout at exit
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
