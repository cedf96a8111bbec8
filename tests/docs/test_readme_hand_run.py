"""The README's "Try it by hand" block, run as a newcomer would paste it into bash: the curl gets a
streamed completion, and ``specguard status`` afterwards shows a numeric RC on a live baseline and
at least one class the guard moved, with its reason.

Run twice: as written, on the README's own fixed ports (8001-8003 for the simulator, 8090 for the
tap; when one is taken the test fails saying which), and with those ports held by another process,
changed as the README says (``--port-base``, the tap's URL). The second run checks the moved ports
(the curl, the load and ``status`` reach the moved tap and control listener), not the decision the
first run already checked, so its load is 15 s instead of the minute. Every process the block starts
shares one process group, killed at the end whatever happened.
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
PORTS = (8001, 8002, 8003, 8090, 8091)
TAP_STEP = 8090 - 8001  # the tap keeps its place beside the pools when --port-base moves them
CONTROL_STEP = 8091 - 8001  # and the control listener its place beside the tap
# a status row: CLASS  LOAD  POOL  K  PHASE (hold: words)  RC [INTERVAL] (BASELINE, POOL)
LIVE_RC = re.compile(
    r"^\S+/\S+ +\S+ +\S+ +\d+ +\S+(?: [a-z,() ]+?)? +(\d+\.\d+) \[[^]]+\] \(live, [^)]+\)", re.M
)
# a decision that moved a class: "  2026-...Z  creative/high at load low: off, spec-k4 -> nospec"
MOVED = re.compile(r"^  \S+Z  (\S+/\S+) at load (\S+): (\w+), (\S+) -> (\S+)\n {6}(\S.*)$", re.M)


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


def moved_block(block: str, base: int) -> str:
    """The block with its ports moved as the README says: ``--port-base BASE`` for ``--port-base
    8001``, the tap's URL in the curl and ``specguard load``, the control listener's for ``status``."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    said = (
        "Give both `--port-base 9001` instead of `--port-base 8001`: the pools move to 9001-9003 and the "
        "tap, which keeps its place beside them, to 9090; then use `http://127.0.0.1:9090` in the curl and "
        "add `--url http://127.0.0.1:9090` to `specguard load`, and `--url http://127.0.0.1:9091` (the "
        "control listener, beside the tap) to `specguard status`."
    )
    assert said in readme, "README.md no longer says how to move the hand run's ports as this test does"
    tap = f"http://127.0.0.1:{base + TAP_STEP}"
    control = f"http://127.0.0.1:{base + CONTROL_STEP}"
    out = block.replace("--port-base 8001", f"--port-base {base}").replace("http://127.0.0.1:8090", tap)
    out = re.sub(r"^specguard load\b", rf"specguard load --url {tap}", out, flags=re.M)
    out = re.sub(r"^specguard status\b", rf"specguard status --url {control}", out, flags=re.M)
    assert out.count(f"--port-base {base}") == 2 and out.count(f"--url {tap}") == 1, out
    assert out.count(f"--url {control}") == 1, out
    return out


def free_base() -> int:
    """A port base whose pools (base..base+2), tap (base+89) and control listener (base+90) are free,
    from the README's 9001."""
    for base in range(9001, 20001, 100):
        if not any(taken(p) for p in (base, base + 1, base + 2, base + TAP_STEP, base + CONTROL_STEP)):
            return base
    raise AssertionError("no free port base for the moved hand run")


@contextlib.contextmanager
def held(ports):
    """Another process on ``ports``: a listener each, in a child process of its own."""
    code = (
        "import socket, sys, time\n"
        "socks = []\n"
        "for p in sys.argv[1:]:\n"
        "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "    s.bind(('127.0.0.1', int(p))); s.listen(); socks.append(s)\n"
        "print('held', flush=True); time.sleep(3600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, ports)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held", (
            "could not hold the ports"
        )
        yield
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_readme_hand_run_ends_in_a_decision_with_its_reason(tmp_path):
    busy = [p for p in map(taken, PORTS) if p]
    if busy:
        pytest.fail(f"the README's hand run needs ports {PORTS} free on 127.0.0.1; taken: {', '.join(busy)}")
    check_hand_run(tmp_path, hand_run_block())


def test_readme_hand_run_with_the_default_ports_taken(tmp_path):
    busy = [p for p in map(taken, PORTS) if p]
    if busy:
        pytest.fail(f"this test holds {PORTS} itself; taken already: {', '.join(busy)}")
    block = moved_block(hand_run_block(), free_base())
    shorter = re.sub(r"^(specguard load .*)--duration 60\b", r"\1--duration 15", block, flags=re.M)
    assert shorter != block, "the hand run's load no longer says --duration 60"
    with held(PORTS):
        check_hand_run(tmp_path, shorter, decision=False)


def check_hand_run(tmp_path: Path, block: str, decision: bool = True) -> None:
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
    assert "RC [INTERVAL] (BASELINE, POOL)" in stdout, f"specguard status printed no plan; {shown}"
    assert LIVE_RC.search(stdout), f"no class has a numeric RC on a live baseline; {shown}"
    if not decision:
        return
    # ... and it ends in a decision: a class moved, with its reason whole under it
    moves = [m for m in MOVED.finditer(stdout) if m.group(4) != m.group(5)]
    assert moves, f"specguard status shows no class moved with its reason; {shown}"
    assert "no decisions yet" not in stdout, shown
