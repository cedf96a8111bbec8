"""``specguard check-config FILE``: validate a config file and name the place of every error."""

from __future__ import annotations

import argparse
import sys

from specguard.errors import ConfigError
from specguard.monitor import config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check-config",
        help="validate a config file (every error with file:line:col: path)",
        description="Validate a specguard config file; every error is printed with its file, line, "
        "column and key path. Exit status 2 when there are errors.",
    )
    parser.add_argument("file", help="the YAML config file")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config.load(args.file)
        _check_profile(cfg)
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        count = len(exc.issues)
        print(f"{args.file}: {count} error{'s' if count != 1 else ''}", file=sys.stderr)
        return 2
    ex = cfg.exporter
    pools = ", ".join(f"{p.name} ({p.engine}, K={p.num_speculative_tokens})" for p in ex.pools)
    classes = ex.classes
    print(f"OK {args.file}")
    print(f"  pools: {pools}")
    print(f"  task types: {', '.join(classes.task_labels)}")
    print(f"  temperature buckets: {', '.join(b.name for b in classes.temperature_buckets)}")
    print(f"  load buckets: {', '.join(b.name for b in classes.load_buckets)}")
    print(f"  tap: {ex.tap.listen} (default pool {ex.tap.default_pool}, no-spec pool {ex.tap.nospec_pool})")
    policy = cfg.sections.get("guard")
    if policy is not None:
        rules = ", ".join(r.name + (" (report only)" if r.dry_run else "") for r in policy.rules) or "none"
        where = " (the shipped defaults: the guard section sets no rules)" if policy.default_rules else ""
        print(f"  guard rules: {rules}{where}{'; dry-run' if policy.dry_run else ''}")
    extra = sorted(cfg.sections)
    if extra:
        print(f"  sections: {', '.join(extra)}")
    return 0


def _check_profile(cfg: config.SpecguardConfig) -> None:
    """The calibration profile the config names is read as ``run`` reads it (ConfigError if bad)."""
    from specguard.rules import cost_config, profile

    settings = cfg.sections.get("cost")
    path = cost_config.resolve_profile_path(settings, cfg.file) if settings is not None else None
    if path is not None:
        profile.load_profile(path)
