"""The whole specguard config file: every top-level section, each parsed by its owner.

``load(path)`` returns a ``SpecguardConfig`` or raises one ``ConfigError`` listing every
problem in the file (``file:line:col: path: message``). Other layers add their sections by
registering a parser in ``SECTIONS`` (name -> callable(root Section) -> value); the value
lands in ``SpecguardConfig.sections[name]``. Unknown top-level keys are errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specguard import configfile
from specguard.configfile import Document, Section
from specguard.errors import ConfigError, ConfigIssue
from specguard.exporters import addresses
from specguard.exporters import config as exporter_config
from specguard.monitor import guard_wiring
from specguard.rules import cost_config

# Exporter sections (parsed together by exporters.config.parse_exporter).
EXPORTER_SECTIONS = ("pools", "classes", "tap", "scrape")

# Hooks for the other sections: name -> parser(root) -> parsed value. The parser reads
# ``root.section(name)`` (or ``root.items(name)``), records issues on the document and
# returns its frozen config object. Owners register here:
#   cost:       rules.cost settings
#   guard:      the policy
#   server:, actuators:, alertmanager: the guard's wiring
SectionParser = Callable[[Section], Any]
SECTIONS: dict[str, SectionParser] = {}
SECTIONS["cost"] = cost_config.parse_root  # cost: -> rules.cost_config.CostSettings
guard_wiring.register_sections(SECTIONS)  # guard:, server:, actuators:, alertmanager:

# Sections another engineer will own but whose parser is not registered yet: accepted as-is
# (a mapping) so that a config written for the full product does not fail on them.
RESERVED = ("cost", "guard", "server", "actuators", "alertmanager")


@dataclass(frozen=True)
class SpecguardConfig:
    file: str
    exporter: exporter_config.ExporterConfig
    sections: dict[str, Any] = field(default_factory=dict)  # parsed by SECTIONS parsers
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # the document's plain data


def parse(doc: Document) -> SpecguardConfig:
    """Parse every section of a document; raises ConfigError with all issues at once."""
    root = doc.root()
    exporter = exporter_config.parse_exporter(root)
    sections: dict[str, Any] = {}
    for name, parser in SECTIONS.items():
        sections[name] = parser(root)
    for name in RESERVED:
        if name not in SECTIONS and name in root:
            root.section(name)
    root.reject_unknown()
    doc.raise_if_issues()
    data = doc.data if isinstance(doc.data, dict) else {}
    return SpecguardConfig(doc.file, exporter, sections, data)


def with_listen(cfg: SpecguardConfig, listen: str) -> SpecguardConfig:
    """``cfg`` with ``tap.listen`` overridden (``specguard run --listen``).

    Applied before anything is built from the config, so every check of the listen address
    (e.g. ``server.insecure_loopback`` needs loopback) sees the address actually bound.
    """
    problem = addresses.listen_problem(listen)
    if problem is not None:
        raise ConfigError(ConfigIssue("--listen", None, None, "", f"({listen!r}) {problem}"))
    tap = replace(cfg.exporter.tap, listen=listen)
    return replace(cfg, exporter=replace(cfg.exporter, tap=tap))


def with_port_base(cfg: SpecguardConfig, base: int) -> SpecguardConfig:
    """``cfg`` with every port moved by the step that puts its first pool on ``base``
    (``specguard run --port-base``): the pools' URLs and ``tap.listen`` alike, so the shipped
    config follows ``specguard simulate --port-base`` with one number. A ``tap.listen`` port of 0
    (any free port) stays 0."""
    pools = cfg.exporter.pools
    if not pools:
        return cfg
    first = addresses.shift_url_port(pools[0].url, 0)[1]
    step = base - first
    moved, bad = [], []
    for pool in pools:
        url, port = addresses.shift_url_port(pool.url, step)
        moved.append(replace(pool, url=url))
        if not 1 <= port <= 65535:
            bad.append(f"pool {pool.name} to {port}")
    tap = cfg.exporter.tap
    listen = tap.listen
    if tap.port:
        listen = addresses.join_listen(tap.host, tap.port + step)
        if not 1 <= tap.port + step <= 65535:
            bad.append(f"tap.listen to {tap.port + step}")
    sections = dict(cfg.sections)
    server = sections.get("server")
    control = addresses.split_listen(server.listen) if server is not None and server.listen else None
    if server is not None and control is not None and control[1]:
        # an explicit server.listen moves with the rest (the default follows tap.listen by itself)
        sections["server"] = replace(server, listen=addresses.join_listen(control[0], control[1] + step))
        if not 1 <= control[1] + step <= 65535:
            bad.append(f"server.listen to {control[1] + step}")
    if bad or not 1 <= base <= 65535:
        why = f"moves {', '.join(bad)}" if bad else "is not a port number"
        message = f"({base}) {why}: out of range (1-65535)"
        raise ConfigError(ConfigIssue("--port-base", None, None, "", message))
    exporter = replace(cfg.exporter, pools=tuple(moved), tap=replace(tap, listen=listen))
    return replace(cfg, exporter=exporter, sections=sections)


def with_control_listen(cfg: SpecguardConfig, listen: str) -> SpecguardConfig:
    """``cfg`` with ``server.listen`` overridden (``specguard run --control-listen``)."""
    from specguard.monitor import guard_config

    problem = addresses.listen_problem(listen)
    if problem is not None:
        raise ConfigError(ConfigIssue("--control-listen", None, None, "", f"({listen!r}) {problem}"))
    server = cfg.sections.get("server") or guard_config.ServerSettings()
    return replace(cfg, sections={**cfg.sections, "server": replace(server, listen=listen)})


def control_listen(cfg: SpecguardConfig) -> str:
    """The control listener's HOST:PORT for ``cfg`` (``server.listen`` or its default)."""
    from specguard.monitor import guard_config

    server = cfg.sections.get("server") or guard_config.ServerSettings()
    tap = cfg.exporter.tap
    return guard_config.control_listen(server, tap.host, tap.port)


def control_listen_error(cfg: SpecguardConfig, exc: OSError, flag: str | None = None) -> ConfigError:
    """A taken control listener port, naming ``server.listen`` (its line, or its default) or the flag."""
    listen, reason = control_listen(cfg), addresses.bind_reason(exc)
    if flag == "--control-listen":
        message = f"cannot listen on {listen} (the control listener): {reason}; choose another HOST:PORT"
        return ConfigError(ConfigIssue(flag, None, None, "", message))
    server = cfg.sections.get("server")
    explicit = server is not None and server.listen
    where = "server.listen" if explicit else "server.listen (unset: tap.listen's port + 1)"
    how = "choose another port in server.listen, or --control-listen HOST:PORT"
    if flag is not None:
        message = (
            f"cannot listen on {listen} (where {flag} puts {where}): {reason}; "
            f"choose another {flag}, or {how}"
        )
        return ConfigError(ConfigIssue(flag, None, None, "", message))
    message = f"cannot listen on {listen} (the control listener, {where}): {reason}; {how}"
    line = column = None
    try:
        line, column = configfile.load_file(cfg.file).where("server.listen" if explicit else "tap.listen")
    except (OSError, ConfigError):
        pass
    return ConfigError(ConfigIssue(cfg.file, line, column, "server.listen", message))


def listen_error(cfg: SpecguardConfig, exc: OSError, flag: str | None = None) -> ConfigError:
    """A taken (or forbidden) ``tap.listen`` port, naming where the address came from: ``flag``
    (``--listen``, ``--port-base``) or the config file's ``tap.listen`` line, and how to move it."""
    listen, reason = cfg.exporter.tap.listen, addresses.bind_reason(exc)
    if flag == "--listen":
        message = f"cannot listen on {listen}: {reason}; choose another HOST:PORT"
        return ConfigError(ConfigIssue(flag, None, None, "", message))
    if flag is not None:
        message = (
            f"cannot listen on {listen} (where {flag} puts tap.listen): {reason}; choose another "
            f"{flag}, or --listen HOST:PORT for the tap alone"
        )
        return ConfigError(ConfigIssue(flag, None, None, "", message))
    message = (
        f"cannot listen on {listen}: {reason}; choose another port with --listen HOST:PORT, or move "
        "every port of the config with --port-base PORT"
    )
    line = column = None
    try:
        line, column = configfile.load_file(cfg.file).where("tap.listen")
    except (OSError, ConfigError):
        pass  # no file to point into (a config built in code): the key path alone
    return ConfigError(ConfigIssue(cfg.file, line, column, "tap.listen", message))


def parse_text(text: str, file: str = "<config>") -> SpecguardConfig:
    return parse(configfile.parse_text(text, file))


def load(path: str | Path) -> SpecguardConfig:
    return parse(configfile.load_file(path))


DEFAULT_CONFIG = Path(__file__).with_name("default-config.yaml")


def load_default() -> SpecguardConfig:
    """The shipped example config (matches the simulator's default pools and classes)."""
    return load(DEFAULT_CONFIG)
