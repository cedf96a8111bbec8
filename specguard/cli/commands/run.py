"""``specguard run --config FILE``: serve the tap, the scrape loops and ``/metrics`` until stopped."""

from __future__ import annotations

import argparse
import asyncio
import logging

from specguard import signals
from specguard.exporters.addresses import join_listen
from specguard.monitor import app as monitor_app
from specguard.monitor import config, guard_wiring

log = logging.getLogger("specguard.run")

# Other components hook in here: each is called with the Monitor before it starts
# (attach background jobs, add routes, register collectors). The guard adds its own.
CONFIGURERS: list = [guard_wiring.configure]  # the guard


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the tap + exporter + guard (standalone mode)",
        description="Run the request tap in front of the configured pools, scrape each pool's "
        "/metrics and serve /metrics and /healthz on tap.listen, and the guard's control endpoints "
        "(/status, /api/v1/alerts, /api/v1/overrides, /api/v1/plan) on server.listen.",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="the YAML config file")
    parser.add_argument("--listen", metavar="HOST:PORT", help="override tap.listen")
    parser.add_argument(
        "--control-listen",
        metavar="HOST:PORT",
        help="override server.listen (the control listener; default 127.0.0.1, tap.listen's port + 1)",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        metavar="PORT",
        help="move every port of the config (pool URLs, tap.listen, server.listen) by the step that "
        "puts the first pool on PORT: with the shipped config, the same PORT as "
        "`specguard simulate --port-base`",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)  # a bad file is reported (exit 2) before anything starts
    if args.port_base is not None:
        cfg = config.with_port_base(cfg, args.port_base)
    if args.listen:
        # override tap.listen before the guard is wired: its checks must see the bound address
        cfg = config.with_listen(cfg, args.listen)
    control_flag = None
    if args.control_listen:
        cfg = config.with_control_listen(cfg, args.control_listen)
        control_flag = "--control-listen"
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    flag = "--listen" if args.listen else "--port-base" if args.port_base is not None else None
    control_flag = control_flag or ("--port-base" if args.port_base is not None and not args.listen else None)
    return asyncio.run(serve(cfg, listen_flag=flag, control_flag=control_flag))


async def serve(
    cfg: config.SpecguardConfig,
    host: str | None = None,
    port: int | None = None,
    *,
    listen_flag: str | None = None,
    control_flag: str | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM; ``host``/``port`` override ``tap.listen`` (checked like it).

    The port is bound before anything else starts, so a taken one is reported first, naming
    ``listen_flag`` (the flag that set the address) or the config file's ``tap.listen``."""
    if host is not None or port is not None:
        tap = cfg.exporter.tap
        listen = join_listen(host or tap.host, tap.port if port is None else port)
        cfg = config.with_listen(cfg, listen)
    monitor = monitor_app.Monitor(cfg)
    try:
        await monitor.listen()
    except monitor_app.ControlListenError as exc:
        raise config.control_listen_error(cfg, exc, control_flag) from exc
    except OSError as exc:
        raise config.listen_error(cfg, exc, listen_flag) from exc
    try:
        for configure in CONFIGURERS:
            configure(monitor, cfg)
        stop = asyncio.Event()
        with signals.stop_on(stop):
            url = await monitor.start()
            pools = ", ".join(f"{p.name}={p.display_url}" for p in cfg.exporter.pools)
            log.info("specguard tap on %s (metrics %s/metrics); pools: %s", url, url, pools)
            if monitor.control_url:
                log.info("control listener on %s (/status, /api/v1/*)", monitor.control_url)
            await stop.wait()
            log.info("shutting down")
    finally:
        await monitor.stop()
    return 0
