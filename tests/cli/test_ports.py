"""Ports, as a user on a busy machine meets them: one flag moves every port of the hand run, and a
taken port is the first and only thing reported, naming the flag or the config key (and the real
file, line and column) that set it."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from specguard.errors import ConfigError
from specguard.monitor import config

DEFAULT = str(config.DEFAULT_CONFIG)


def specguard(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "specguard", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


@contextmanager
def occupied() -> Iterator[int]:
    """A port another process (here: this one) listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_port_base_moves_every_port_of_the_config_with_the_first_pool():
    cfg = config.with_port_base(config.load_default(), 9001)
    assert [p.url for p in cfg.exporter.pools] == [
        "http://127.0.0.1:9001",
        "http://127.0.0.1:9002",
        "http://127.0.0.1:9003",
    ]
    assert cfg.exporter.tap.listen == "127.0.0.1:9090"  # the tap keeps its place beside the pools
    same = config.with_port_base(config.load_default(), 8001)
    assert same.exporter == config.load_default().exporter
    with pytest.raises(ConfigError, match=r"--port-base: \(65500\) moves .*tap.listen to 65589"):
        config.with_port_base(config.load_default(), 65500)


def test_a_listen_port_out_of_range_is_named_as_such(tmp_path: Path):
    done = specguard("run", "--config", DEFAULT, "--listen", "127.0.0.1:99999")
    assert done.returncode == 2
    assert done.stderr.strip() == "Error: --listen: ('127.0.0.1:99999') port 99999 is out of range (0-65535)"
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(DEFAULT).read_text().replace("listen: 127.0.0.1:8090", "listen: 127.0.0.1:99999"))
    done = specguard("check-config", "--no-connect", str(bad))
    assert (
        done.returncode == 2 and "tap.listen: ('127.0.0.1:99999') port 99999 is out of range" in done.stderr
    )


def test_a_taken_tap_port_is_reported_first_with_the_file_line_and_key(tmp_path: Path):
    with occupied() as port:
        moved = tmp_path / "moved.yaml"
        moved.write_text(Path(DEFAULT).read_text().replace("127.0.0.1:8090", f"127.0.0.1:{port}"))
        done = specguard("run", "--config", str(moved))
        assert done.returncode == 2
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr  # nothing started, nothing logged before the error
        line = next(i for i, x in enumerate(moved.read_text().splitlines(), 1) if x.startswith("  listen:"))
        assert lines[0].startswith(
            f"Error: {moved}:{line}:3: tap.listen: cannot listen on 127.0.0.1:{port}: "
        )
        assert "address already in use" in lines[0] and "--listen HOST:PORT" in lines[0]
        assert "--port-base PORT" in lines[0] and "<config>" not in lines[0]

        done = specguard("run", "--config", DEFAULT, "--listen", f"127.0.0.1:{port}")
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
        assert done.stderr.startswith(
            f"Error: --listen: cannot listen on 127.0.0.1:{port}: address already in use"
        )


def on_our_port(argv: Callable[[int], list[str]]) -> tuple[int, subprocess.CompletedProcess]:
    """Run ``argv(port)`` with ``port`` taken; again on a new port when the error names another.

    The flag's other ports are free when picked but not held, so the other xdist worker can take
    one in between: the error then names that port, rightly, and the run says nothing of ours.
    """
    for _ in range(5):
        with occupied() as port:
            done = specguard(*argv(port))
        if f"127.0.0.1:{port} " in done.stderr:
            return port, done
    pytest.fail(f"in 5 tries another process always held a neighbouring port: {done.stderr}")


def test_a_taken_port_under_port_base_names_the_flag():
    # the tap lands on the taken port
    port, done = on_our_port(lambda port: ["run", "--config", DEFAULT, "--port-base", str(port - 89)])
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(
        f"Error: --port-base: cannot listen on 127.0.0.1:{port} (where --port-base puts tap.listen): "
        "address already in use"
    )
    # the second pool lands on it
    port, done = on_our_port(lambda port: ["simulate", "--port-base", str(port - 1)])
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.startswith(
        f"Error: --port-base: cannot listen on 127.0.0.1:{port} for pool spec-k2: address already in use"
    )
    assert "choose free ports with --port-base PORT" in done.stderr


def test_check_config_warns_for_a_pool_that_does_not_answer(tmp_path: Path):
    with occupied() as port:  # bound, then closed: nothing listens there afterwards
        pass
    cfg = tmp_path / "dead.yaml"
    cfg.write_text(Path(DEFAULT).read_text().replace("http://127.0.0.1:8002", f"http://127.0.0.1:{port}"))
    done = specguard("check-config", str(cfg))
    assert done.returncode == 0 and done.stdout.startswith(f"OK {cfg}")  # a warning, not an error
    assert f"warning: pool spec-k2 (http://127.0.0.1:{port}): unreachable (connection refused)" in done.stderr
    quiet = specguard("check-config", "--no-connect", str(cfg))
    assert quiet.returncode == 0 and "warning" not in quiet.stderr
