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
from specguard.errors import ConfigError
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
    if addresses.split_listen(listen) is None:
        raise ConfigError(f"--listen ({listen!r}) must be host:port ([address]:port for IPv6)")
    tap = replace(cfg.exporter.tap, listen=listen)
    return replace(cfg, exporter=replace(cfg.exporter, tap=tap))


def parse_text(text: str, file: str = "<config>") -> SpecguardConfig:
    return parse(configfile.parse_text(text, file))


def load(path: str | Path) -> SpecguardConfig:
    return parse(configfile.load_file(path))


DEFAULT_CONFIG = Path(__file__).with_name("default-config.yaml")


def load_default() -> SpecguardConfig:
    """The shipped example config (matches the simulator's default pools and classes)."""
    return load(DEFAULT_CONFIG)
