"""A real vLLM engine SIGKILLed during load: its traffic fails over, and comes back when it does.

A third engine (``victim``: the same model, no speculation) is started for this test alone, a
class is planned onto it, and it is killed (SIGKILL to its process group) while load runs
through the tap, then started again on the same port. Only the requests in flight on it may
fail; nothing sent after it was marked down fails; the class is served by the real no-spec
engine meanwhile and goes back to the victim once it answers. The figures go into
docs/reliability.md (run with ``-s``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import pytest
from conftest import provision, server_command, server_env, stop
from vllmkit import MODEL_NAME

from specguard.lab import failover, loadgen
from tests import realfailover

pytestmark = pytest.mark.vllm

CONCURRENCY = 4
MIX = [
    loadgen.RequestClass("creative", temperature=1.0, max_tokens=24, prompt_tokens=20, chat=False),
    loadgen.RequestClass("code", temperature=0.0, max_tokens=24, prompt_tokens=20, chat=False),
]


class VllmVictim:
    """A no-speculation vLLM engine of this test's own, on a fixed port, killed with SIGKILL."""

    pool = "victim"

    def __init__(self, logdir):
        self.venv, self.model = provision()
        self.port = failover.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logdir = logdir
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    async def restart(self) -> None:
        self.starts += 1
        log = open(self.logdir / f"victim-{self.starts}.log", "wb")  # noqa: SIM115 - the child's
        with log:
            self.proc = subprocess.Popen(
                server_command(self.venv, self.model, self.port, spec=False),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server_env(sorted(os.sched_getaffinity(0))[-1]),
                cwd=self.logdir,
                start_new_session=True,
            )
        try:
            await failover.wait_healthy(self.url, 300.0, self.proc)
        except RuntimeError as exc:  # say why: the engine's own last lines
            tail = (self.logdir / f"victim-{self.starts}.log").read_bytes()[-3000:].decode(errors="replace")
            raise RuntimeError(f"{exc} (start {self.starts}); its log ends:\n{tail}") from exc

    async def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            await asyncio.to_thread(self.proc.wait, 30)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


async def test_a_real_engine_killed_during_load_fails_over_and_comes_back(vllm_engines, tmp_path):
    victim = VllmVictim(tmp_path)
    outcome, records = await realfailover.kill_during_load(
        "vllm",
        vllm_engines.spec.url,
        vllm_engines.nospec.url,
        4,
        victim,
        MIX,
        CONCURRENCY,
        before_s=5,
        down_s=3,
        after_s=5,
        max_down_s=40,  # dead longer until a request planned on it was served elsewhere
        load_during_restart=False,  # see kill_during_load: a starved start took > 300 s in CI
    )
    print("real vLLM failover outcome:", outcome.to_json(), "model", MODEL_NAME)  # shown with -s
    realfailover.assert_failed_over(outcome, records, CONCURRENCY, 40)
