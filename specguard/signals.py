"""SIGINT/SIGTERM stop a long-running command cleanly, and a late signal prints no traceback.

The handlers are removed before the event loop closes: CPython's ``loop.close()`` closes the loop's
self-pipe first and removes the handlers after it, so a second signal in between (``kill`` twice,
a supervisor's SIGTERM during shutdown) printed ``Exception ignored when trying to write to the
signal wakeup fd ... OSError: [Errno 9] Bad file descriptor`` with a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_on(stop: asyncio.Event, signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Set ``stop`` on ``signals`` while the block runs (in the running loop); the default handlers
    are back when it ends. Where the loop cannot handle signals (not the main thread, Windows), no-op."""
    loop = asyncio.get_running_loop()
    added = []
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            added.append(sig)
    try:
        yield
    finally:
        for sig in added:
            loop.remove_signal_handler(sig)
