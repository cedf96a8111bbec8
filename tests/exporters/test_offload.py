"""Work kept off the serving loop: a thread for small jobs, a worker process for large ones."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from specguard.errors import SourceError
from specguard.exporters import offload


def where(_: bytes) -> int:
    return os.getpid()


def linger(_: bytes) -> int:
    time.sleep(30)
    return 0


@pytest.fixture
def user():
    offload.acquire()
    yield
    offload.release()


async def test_small_jobs_run_in_a_thread_large_ones_in_a_worker_process(user):
    assert await offload.run(where, b"x", weight=10) == os.getpid()
    worker = await offload.run(where, b"x", weight=offload.PROCESS_ABOVE + 1)
    assert worker != os.getpid()
    assert await offload.run(where, b"x", weight=offload.PROCESS_ABOVE + 1) == worker  # kept


async def test_a_worker_that_dies_is_a_source_error_and_is_replaced(user):
    heavy = offload.PROCESS_ABOVE + 1
    first = await offload.run(where, b"x", weight=heavy)
    job = asyncio.ensure_future(offload.run(linger, b"x", weight=heavy))
    await asyncio.sleep(0.5)
    os.kill(first, signal.SIGKILL)
    with pytest.raises(SourceError, match="died"):
        await job
    assert await offload.run(where, b"x", weight=heavy) not in (first, os.getpid())


async def test_the_last_user_stops_the_worker():
    offload.acquire()
    offload.acquire()
    pid = await offload.run(where, b"x", weight=offload.PROCESS_ABOVE + 1)
    offload.release()
    assert await offload.run(where, b"x", weight=offload.PROCESS_ABOVE + 1) == pid  # one user left
    offload.release()
    assert offload._pool is None
