"""Suite-wide setup: the Hypothesis profile, the xdist groups, and the time per tier.

``scripts/test`` runs pytest-xdist with ``--dist loadgroup``: each xdist group is one unit of work,
run whole by one worker. Every test module is its own group unless it names one (so a module's
fixtures start once); the real tiers' tests share one group (each tier's engines start once, in
one worker, one tier after the other); tests that bind the same fixed ports share a group too.
"""

from __future__ import annotations

import os
from collections import defaultdict

import pytest
from hypothesis import settings

from tests import propkit

settings.load_profile(propkit.profile())

# Markers of the real tiers. Their tests run in one worker, one tier after the other (group
# REAL_ENGINES): each tier pins its engines to the machine's cores (spec on the first, no-spec on
# the last), so two tiers at once would load one side of each A/B more than the other.
REAL_TIERS = ("vllm", "llamacpp")
REAL_ENGINES = "real-engines"
# Modules that bind fixed ports (the README's 8001-8003 and 8090; docs/commands.md's simulator).
FIXED_PORTS = "fixed-ports"
FIXED_PORT_MODULES = ("tests/docs/test_readme_hand_run.py", "tests/docs/test_examples.py")


def xdist_group(item: pytest.Item) -> str:
    """The group ``item`` runs in: its own mark, its real tier, its fixed ports, else its module."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if any(item.get_closest_marker(tier) is not None for tier in REAL_TIERS):
        return REAL_ENGINES
    module = item.nodeid.split("::", 1)[0]
    return FIXED_PORTS if module in FIXED_PORT_MODULES else module


def start_order(item: pytest.Item) -> int:
    """Longest groups first, so no long one is left for the end: real tiers, then the tests on a
    real Prometheus (``stack``) and on fixed ports, then the rest in collection order."""
    group = xdist_group(item)
    if group == REAL_ENGINES:
        return 0
    return 1 if group == FIXED_PORTS or item.get_closest_marker("stack") is not None else 2


@pytest.hookimpl(tryfirst=True)  # before xdist appends the group to each node id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the order units are handed out in (scripts/test
        items.sort(key=start_order)  # passes --no-loadscope-reorder); one process keeps its order


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, in the controller
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Fail the run, loudly, when xdist did not apply the groups: each worker's node ids carry
    ``@group``. Without them the real tiers and the fixed-port tests run at once and fail at random
    (pytest 9.2 with pytest-xdist 3.8 drops them silently; pyproject.toml keeps pytest below it)."""
    lost = [i for i in ids if "@" not in i]
    if node.config.getvalue("dist") == "loadgroup" and lost:
        pytest.exit(
            f"pytest-xdist did not apply the test groups on {node.gateway.id} ({len(lost)} of {len(ids)} "
            f"tests, e.g. {lost[0]}): this pytest and pytest-xdist do not work together with --dist "
            "loadgroup; install the versions pyproject.toml asks for (pip install -e '.[dev]')",
            returncode=3,
        )


def tier(nodeid: str) -> str:
    """``tests/<dir>`` of a node id (``tests`` for top-level modules)."""
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Seconds spent per tier (setup + call + teardown), to see which tier a slow run came from."""
    spent: dict[str, float] = defaultdict(float)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                spent[tier(report.nodeid)] += report.duration
    if spent:
        rows = sorted(spent.items(), key=lambda kv: -kv[1])
        terminalreporter.write_sep("=", "seconds per tier (summed over tests)")
        terminalreporter.write_line("  ".join(f"{name} {seconds:.0f}" for name, seconds in rows))


@pytest.fixture(autouse=True)
def _own_runtime_dir(tmp_path_factory, monkeypatch):
    """Each test's generated control tokens go to its own directory, never the user's."""
    runtime = tmp_path_factory.mktemp("runtime")
    runtime.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("SPECGUARD_TOKEN", raising=False)
