"""A real llama-server SIGKILLed during load: its traffic fails over, and comes back when it does.

A third server (``victim``: the same model, no speculation) is started for this test alone, a
class is planned onto it, and it is killed (SIGKILL to its process group) while load runs through
the tap, then started again on the same port. Only the requests in flight on it may fail; nothing
sent after it was marked down fails; the class is served by the real no-spec server meanwhile and
goes back to the victim once it answers.
"""

from __future__ import annotations

import asyncio
import os

import llamacppkit as kit
import pytest

from specguard.lab import loadgen
from tests import realfailover

pytestmark = pytest.mark.llamacpp

CONCURRENCY = 4
# dead for 6 s, and longer (up to MAX_DOWN_S) until a request planned on it was served elsewhere:
# with the vLLM tier on the same 2 cores a request can take seconds, so 6 s may see none
DOWN_S = 6
MAX_DOWN_S = 40
MIX = [
    loadgen.RequestClass("creative", temperature=1.0, max_tokens=16, prompt_tokens=20, prompts="task"),
    loadgen.RequestClass("code", temperature=0.0, max_tokens=16, prompt_tokens=40, prompts="task"),
]


class LlamacppVictim:
    """A no-speculation llama-server of this test's own, on a fixed port, killed with SIGKILL."""

    pool = "victim"

    def __init__(self, logdir):
        self.logdir = logdir
        self.port = kit.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: kit.Server | None = None
        self.starts = 0

    async def restart(self) -> None:
        self.starts += 1
        cpu = sorted(os.sched_getaffinity(0))[-1]
        self.server = kit.start(f"victim-{self.starts}", self.logdir, cpu, 0, port=self.port)
        await asyncio.to_thread(kit.wait_healthy, self.server)

    async def kill(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(kit.kill, self.server)

    def stop(self) -> None:
        if self.server is not None:
            kit.stop(self.server)


async def test_a_real_server_killed_during_load_fails_over_and_comes_back(llamacpp_servers, tmp_path):
    servers = llamacpp_servers
    victim = LlamacppVictim(tmp_path)
    outcome, records = await realfailover.kill_during_load(
        "llamacpp",
        servers.spec.url,
        servers.nospec.url,
        kit.K,
        victim,
        MIX,
        CONCURRENCY,
        before_s=4,
        down_s=DOWN_S,
        after_s=4,
        max_down_s=MAX_DOWN_S,
    )
    print("real llama.cpp failover outcome:", outcome.to_json())  # shown with -s
    realfailover.assert_failed_over(outcome, records, CONCURRENCY, MAX_DOWN_S)
