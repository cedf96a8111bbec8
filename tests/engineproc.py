"""Stopping a real engine the tiers started in a session of its own (process group id = pid)."""

from __future__ import annotations

import os
import signal
import subprocess


def stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM (the engine stops its own workers), then SIGKILL to whatever of its process group
    is left behind."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
