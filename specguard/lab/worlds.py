"""Simulator worlds: overlays on the shipped simulator config (``sim/default.yaml``).

Each world changes one thing a deployment can differ in: the drafter's cost, where the GPU turns
compute-bound, the acceptance of each task type, or a drafter so cheap that K=4 dominates. The
demo sweeps one of them for its stale calibration profile; ``bench/bench_matrix.py`` runs its
scenarios in all of them. A world is a YAML file read with ``sim.config.load`` (partial sections
are merged key by key with the shipped default).
"""

from __future__ import annotations

from pathlib import Path

from specguard.errors import ConfigError
from specguard.sim import config as sim_config
from specguard.sim.config import SimConfig

DIRECTORY = Path(__file__).with_name("worlds")
DEFAULT = "default"


def names() -> list[str]:
    """``default`` (the shipped simulator) and every world shipped here, by file name."""
    return [DEFAULT, *sorted(p.stem for p in DIRECTORY.glob("*.yaml"))]


def load(name_or_path: str | None) -> SimConfig:
    """A world by name (``names()``), or a simulator config file; None or ``default``: the shipped one."""
    if name_or_path in (None, DEFAULT):
        return sim_config.load()
    shipped = DIRECTORY / f"{name_or_path}.yaml"
    if shipped.exists():
        return sim_config.load(shipped)
    if not Path(str(name_or_path)).exists():
        raise ConfigError(
            f"world {name_or_path!r} is neither a shipped world ({', '.join(names())}) nor a readable file"
        )
    return sim_config.load(name_or_path)
