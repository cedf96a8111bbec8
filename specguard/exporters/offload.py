"""CPU-bound work kept off the event loop that serves traffic.

A small job runs in a worker thread. A large one (a metrics page of megabytes) runs in a worker
process: in a thread it would hold the GIL in 5 ms slices for seconds, and every request the
loop relays in that time would wait for each slice (the convoy effect), however briefly the
loop itself needs to run. The process is started on first use, lives until ``shutdown()``, is
replaced after a given number of jobs (its memory goes back to the system) and after a crash.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from specguard.errors import SourceError

log = logging.getLogger("specguard.offload")

T = TypeVar("T")
PROCESS_ABOVE = 256 * 1024
"""Jobs weighing more than this (bytes of input) go to the worker process."""
JOBS_PER_PROCESS = 200

_lock = threading.Lock()
_pool: concurrent.futures.ProcessPoolExecutor | None = None


def _executor() -> concurrent.futures.ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),  # no fork of a threaded process
                max_tasks_per_child=JOBS_PER_PROCESS,
            )
        return _pool


async def run(func: Callable[..., T], *args: Any, weight: int) -> T:
    """``func(*args)`` off the loop: in a thread, or in the worker process when ``weight`` (the
    input's size in bytes) is above ``PROCESS_ABOVE``. ``func`` and its arguments and result
    must pickle for the process. Exceptions of ``func`` are raised here."""
    if weight <= PROCESS_ABOVE:
        return await asyncio.to_thread(func, *args)
    pool = _executor()
    try:
        return await asyncio.wrap_future(pool.submit(func, *args))
    except BrokenProcessPool as exc:  # the worker died (killed, out of memory): a new one next time
        _discard(pool)
        raise SourceError(f"the page parser process died ({exc})") from exc


def _discard(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
    pool.shutdown(wait=False, cancel_futures=True)


def shutdown() -> None:
    """Stop the worker process, if one was started (a later job starts a new one)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
