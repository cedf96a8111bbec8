"""The command line as a user meets it: help, errors without tracebacks, pipes."""

from __future__ import annotations

import subprocess
import sys

from specguard import cli


def specguard(*args: str) -> list[str]:
    return [sys.executable, "-m", "specguard", *args]


def test_help_lists_every_command():
    done = subprocess.run(specguard("--help"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for command in (name.replace("_", "-") for name in cli.COMMANDS):
        assert command in done.stdout


def test_a_reader_that_leaves_early_is_no_error():
    # `specguard cost ... --json | head -0`: the reader is gone before anything is written
    proc = subprocess.Popen(
        specguard("cost", "--alpha", "0.6", "--rho", "0.2", "--k", "1", "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err, err.decode()


def test_user_mistake_is_one_error_line_and_exit_2():
    done = subprocess.run(
        specguard("inspect", "--file", "/nonexistent/page.txt"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.startswith("Error: ") and "Traceback" not in done.stderr
