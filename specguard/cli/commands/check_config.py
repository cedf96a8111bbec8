"""``specguard check-config FILE``: validate a config file and name the place of every error."""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from specguard.errors import ConfigError
from specguard.exporters.config import PoolConfig
from specguard.monitor import config

PROBE_SECONDS = 3.0
"""How long each pool's /metrics gets to answer the reachability check."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check-config",
        help="validate a config file (every error with file:line:col: path)",
        description="Validate a specguard config file; every error is printed with its file, line, "
        "column and key path. Exit status 2 when there are errors. Each pool's metrics page is "
        "fetched once: a pool that does not answer is a warning (exit status 0).",
    )
    parser.add_argument("file", help="the YAML config file")
    parser.add_argument(
        "--no-connect", action="store_true", help="check the file only: do not try to reach the pools"
    )
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
    if not args.no_connect:
        sys.stdout.flush()
        with ThreadPoolExecutor(max_workers=min(8, len(ex.pools))) as pool:
            problems = list(pool.map(unreachable, ex.pools))
        for found, problem in zip(ex.pools, problems, strict=True):
            if problem:
                print(
                    f"warning: pool {found.name} ({found.display_url}): {problem}; is the engine up? "
                    "`specguard run` keeps it marked down until it answers",
                    file=sys.stderr,
                )
    return 0


def unreachable(pool: PoolConfig, timeout: float = PROBE_SECONDS) -> str | None:
    """Why ``pool``'s metrics page cannot be read now (None when it answers 200)."""
    url = pool.url + pool.metrics_path
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read(1)
    except urllib.error.HTTPError as exc:
        return f"{pool.metrics_path} answers HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        text = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
        return f"unreachable ({text.lower() or type(reason).__name__})"
    return None


def _check_profile(cfg: config.SpecguardConfig) -> None:
    """The calibration profile the config names is read as ``run`` reads it (ConfigError if bad)."""
    from specguard.rules import cost_config, profile

    settings = cfg.sections.get("cost")
    path = cost_config.resolve_profile_path(settings, cfg.file) if settings is not None else None
    if path is not None:
        profile.load_profile(path)
