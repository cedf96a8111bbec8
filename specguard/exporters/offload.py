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
        job = pool.submit(func, *args)
        return await asyncio.wrap_future(job)
    except BrokenProcessPool as exc:  # the worker died (killed, out of memory): a new one next time
        _discard(pool)
        raise SourceError(f"the page parser process died ({exc})") from exc
    except RuntimeError as exc:  # submitted while another user shut the pool down
        raise SourceError(f"the page parser process is stopping ({exc})") from exc
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if job.cancelled() and task is not None and not task.cancelling():  # the pool was shut down
            raise SourceError("the page parser process was stopped") from None
        raise


def _discard(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
    pool.shutdown(wait=False, cancel_futures=True)


_users = 0


def acquire() -> None:
    """One more user of the worker process (each running Monitor is one)."""
    global _users
    with _lock:
        _users += 1


def release() -> None:
    """One user fewer; the last one out stops the worker process (a later job starts a new one)."""
    global _users, _pool
    with _lock:
        _users = max(0, _users - 1)
        if _users:
            return
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
