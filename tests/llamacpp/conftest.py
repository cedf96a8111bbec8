"""Real llama.cpp servers for the llama.cpp tier (tests marked ``llamacpp``).

One session starts two ``llama-server`` processes on SmolLM2-135M-Instruct (Q4_1 GGUF), built and
fetched by ``scripts/provision-llamacpp`` (this fixture runs it too, so pytest alone works), each
through ``scripts/serve-llamacpp`` with one thread, pinned to its own core:

- ``spec``: speculative decoding with the same model as its own draft (draft-simple, K = 4);
- ``nospec``: the same model without speculation (the real no-speculation baseline).

They are always stopped at the end of the session (SIGTERM, then SIGKILL to the process group). A
start failure fails the tests with the server's log; a server that dies during the session adds
its log tail to the report of every test that fails afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import llamacppkit as kit
import pytest

_STARTED: dict[str, kit.Server] = {}


@dataclass(frozen=True)
class Servers:
    spec: kit.Server
    nospec: kit.Server


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed and "llamacpp_servers" in getattr(item, "fixturenames", ()):
        for name, server in _STARTED.items():
            if server.proc.poll() is not None:
                report.sections.append(
                    (f"llama-server '{name}' exited with code {server.proc.returncode}", server.tail())
                )
    return report


def provision() -> dict:
    try:
        return kit.provision()
    except kit.ProvisionError as exc:
        pytest.fail(str(exc), pytrace=False)


def warm_up(server: kit.Server) -> None:
    """One short request: the first one pays for buffer allocation and the prompt cache."""
    kit.post(
        f"{server.url}/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0},
    )


@pytest.fixture(scope="session")
def llamacpp_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    provision()
    logdir = tmp_path_factory.mktemp("llamacpp-logs")
    cpus = sorted(os.sched_getaffinity(0))
    started: list[kit.Server] = []
    try:
        for name, cpu, k in (("spec", cpus[0], kit.K), ("nospec", cpus[-1], 0)):
            server = kit.start(name, logdir, cpu, k)
            started.append(server)
            _STARTED[name] = server
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(kit.wait_healthy, s) for s in started]
            errors = [str(f.exception()) for f in futures if f.exception() is not None]
        if errors:
            pytest.fail("\n\n".join(errors), pytrace=False)
        for server, future in zip(started, futures, strict=True):
            server.start_seconds = future.result()
            warm_up(server)
        for server in started:  # shown with -s; the figures in docs/engines.md
            print(
                f"llama-server {server.name}: healthy after {server.start_seconds:.2f} s, "
                f"RSS {server.rss_bytes() / 1e6:.0f} MB"
            )
        yield Servers(spec=started[0], nospec=started[1])
    finally:
        for server in started:
            kit.stop(server)
            _STARTED.pop(server.name, None)
