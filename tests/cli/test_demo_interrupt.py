"""Ctrl-C in the demo: it says what it had finished and why nothing more is shown, and exits 130
(128 + SIGINT, as a shell reports it), without a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def test_ctrl_c_says_what_is_done_and_exits_130():
    # a paced replay (--duration 60: about 36 s of it) is still running when Ctrl-C comes, however
    # fast or loaded the machine; unbuffered, so that "2/3" arrives when it is printed
    argv = [sys.executable, "-m", "specguard", "demo", "--no-live", "--duration", "60"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # as from a terminal: a shell's background job (CI's, say) starts with SIGINT ignored, and
        # an ignored signal stays ignored through exec
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # Ctrl-C once the calibration is done and the replay runs
            if line.startswith("2/3 "):
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted (Ctrl-C): done so far: calibration (7 concurrency levels per pool)" in err
    assert "`specguard demo --no-live` skips the live run" in err
