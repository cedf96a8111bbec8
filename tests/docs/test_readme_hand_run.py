"""The README's "Try it by hand" block, run as a newcomer would paste it into bash: the curl gets a
streamed completion, and ``specguard status`` afterwards shows a numeric RC on a live baseline.

It uses the README's own fixed ports (8001-8003 for the simulator, 8090 for the tap); when one is
taken the test fails saying which. Every process the block starts shares one process group, killed
at the end whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PORTS = (8001, 8002, 8003, 8090)
# a status row: CLASS  LOAD  POOL  K  PHASE  RC (BASELINE, POOL)
LIVE_RC = re.compile(r"^\S+/\S+\s+\S+\s+\S+\s+\d+\s+\S+\s+(\d+\.\d+) \(live, [^)]+\)", re.M)


def hand_run_block() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Try it by hand", 1)
    assert len(section) == 2, 'README.md: no "## Try it by hand" section'
    found = re.search(r"^```bash\n(.*?)^```", section[1].split("\n## ", 1)[0], re.S | re.M)
    assert found, 'README.md: no ```bash block under "Try it by hand"'
    return found.group(1)


def taken(port: int) -> str | None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no owner
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return f"{port} ({exc.strerror})"
    return None


def kill_group(pgid: int) -> None:
    """SIGTERM the group, then SIGKILL whatever is left after 10 s."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def test_readme_hand_run_shows_rc_on_a_live_baseline(tmp_path):
    block = hand_run_block()
    busy = [p for p in map(taken, PORTS) if p]
    if busy:
        pytest.fail(f"the README's hand run needs ports {PORTS} free on 127.0.0.1; taken: {', '.join(busy)}")
    # `specguard` as installed: this checkout's package under this interpreter
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    entry = bin_dir / "specguard"
    entry.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m specguard "$@"\n')
    entry.chmod(0o755)
    script = tmp_path / "hand-run.sh"
    script.write_text(block)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
    }
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    started = time.monotonic()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            ["bash", str(script)], cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True
        )
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            pass
        finally:
            kill_group(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
    elapsed = time.monotonic() - started
    stdout = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")
    shown = f"after {elapsed:.0f} s\n--- stdout\n{stdout[-6000:]}\n--- stderr\n{stderr[-6000:]}"
    print(shown)  # shown by pytest -s (and with any failure)
    assert proc.returncode is not None and proc.returncode >= 0, f"the block did not finish; {shown}"
    assert "Traceback" not in stdout + stderr, shown
    lost = re.search(r"^Error: .*cannot listen on .*$", stderr, re.M)
    assert not lost, f"a port was taken while the block ran ({lost and lost.group(0)}); {shown}"
    # the curl: a 200 stream with text in it, to its end
    chunks = re.findall(r'^data: (\{.*"choices".*\})$', stdout, re.M)
    assert any(re.search(r'"content": ?"[^"]+"', c) for c in chunks), f"the curl got no completion; {shown}"
    assert "data: [DONE]" in stdout, f"the curl's stream did not end; {shown}"
    # specguard status: at least one class with a numeric RC on a live no-spec baseline
    assert "RC (BASELINE)" in stdout, f"specguard status printed no plan; {shown}"
    assert LIVE_RC.search(stdout), f"no class has a numeric RC on a live baseline; {shown}"
