"""``specguard sweep --launch``: start one engine per K from a command template, sweep it, stop it.

``sweep --http`` needs every pool already running. Here the sweep owns the engines: for each K in
turn it fills ``{k}`` and ``{port}`` into the command template (the no-spec template for K = 0),
starts the engine in its own process group on a free loopback port, waits until ``ready_path``
answers 200, sends a few warm-up requests (JIT, caches), runs the pool's (geometry, concurrency)
cells, and stops the engine: SIGTERM to the group, then SIGKILL after ``stop_timeout_s``. An
engine that exits or never gets ready stops the sweep with the tail of its log.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specguard.errors import ConfigError, SourceError
from specguard.lab import sweep


@dataclass(frozen=True)
class LaunchSpec:
    """How to start the engine of each K."""

    template: str  # command with {k} and {port}, e.g. "... --port {port} ... {k} ..."
    ks: tuple[int, ...]
    log_dir: Path
    nospec_template: str | None = None  # command for K = 0 (no speculation), with {port}
    ready_path: str = "/health"
    ready_timeout_s: float = 600.0
    stop_timeout_s: float = 30.0
    warmup_requests: int = 2

    def pool(self, k: int) -> sweep.PoolSpec:
        return sweep.PoolSpec("nospec" if k == 0 else f"spec-k{k}", k)

    def command(self, k: int, port: int) -> list[str]:
        template = self.nospec_template if k == 0 else self.template
        assert template is not None  # check() made sure
        text = template.replace("{k}", str(k)).replace("{port}", str(port))
        return shlex.split(text)

    def check(self) -> None:
        """All problems with the templates and K list, before any engine starts."""
        if not self.ks:
            raise ConfigError("--ks: no K given")
        if any(k < 0 for k in self.ks) or len(set(self.ks)) != len(self.ks):
            raise ConfigError(f"--ks {list(self.ks)}: every K must be >= 0 and listed once")
        if 0 not in self.ks:
            raise ConfigError("--ks: RC needs K = 0 (the no-speculation engine) in the list")
        if any(k > 0 for k in self.ks):
            _needs(self.template, "--launch", ("{k}", "{port}"))
        if 0 in self.ks:
            if not self.nospec_template:
                raise ConfigError("--launch-nospec: K = 0 is in --ks but no no-spec command template given")
            _needs(self.nospec_template, "--launch-nospec", ("{port}",))


def _needs(template: str, flag: str, placeholders: Sequence[str]) -> None:
    missing = [p for p in placeholders if p not in template]
    if missing:
        raise ConfigError(f"{flag} {template!r}: the command template must contain {' and '.join(missing)}")
    try:
        shlex.split(template)
    except ValueError as exc:
        raise ConfigError(f"{flag} {template!r}: cannot split into arguments: {exc}") from exc


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


class LaunchedEngine:
    """One engine process group; a context manager that always stops it."""

    def __init__(self, spec: LaunchSpec, k: int):
        self.spec, self.k = spec, k
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = spec.log_dir / f"engine-k{k}.log"
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        self.returncode: int | None = None
        self.leftover = 0  # processes of the group still running after stop()

    def __enter__(self) -> LaunchedEngine:
        command = self.spec.command(self.k, self.port)
        self.spec.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            try:
                self.proc = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own process group: stopped as a whole
                )
            except OSError as exc:
                raise SourceError(f"K={self.k}: cannot start {command[0]!r}: {exc.strerror}") from exc
        self.pid = self.proc.pid
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def wait_ready(self) -> float:
        """Seconds until ``ready_path`` answered 200; raises SourceError with the log tail."""
        assert self.proc is not None
        t0 = time.monotonic()
        deadline = t0 + self.spec.ready_timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise SourceError(
                    f"engine K={self.k} exited with code {code} before it was ready; "
                    f"log {self.log_path}:\n{tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(self.url + self.spec.ready_path, timeout=2) as resp:
                    if resp.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise SourceError(
            f"engine K={self.k}: {self.url}{self.spec.ready_path} not ready after "
            f"{self.spec.ready_timeout_s:.0f} s; log {self.log_path}:\n{tail(self.log_path)}"
        )

    def stop(self) -> None:
        """SIGTERM to the process group; SIGKILL to whatever of it still runs after
        ``stop_timeout_s`` (or after the server itself exited); idempotent."""
        proc = self.proc
        if proc is None:
            return
        _killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.spec.stop_timeout_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + self.spec.stop_timeout_s
        while live_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # the server's own children finishing their shutdown
        _killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while live_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.returncode = proc.returncode
        self.leftover = len(live_members(proc.pid))
        self.proc = None


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def live_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that still run. Zombies do not count: children orphaned by the
    server are reaped by PID 1 in its own time, and ``killpg(pgid, 0)`` still sees them until then."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: fall back on the signal test (zombies count there)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(name))
    return out


@dataclass(frozen=True)
class Launched:
    """One engine the sweep started: its process group id (= pid), how long it took to get ready
    its exit status after the stop (negative: the signal that ended it) and how many processes of
    its group still ran after the stop (0 unless something ignores SIGKILL)."""

    k: int
    url: str
    pid: int
    ready_seconds: float
    exit_status: int | None
    leftover_processes: int


def run_launched(
    spec: LaunchSpec,
    levels: Sequence[int],
    mix: Sequence[sweep.MixEntry],
    driver: sweep.Driver,
    *,
    geometries: Sequence[sweep.Geometry] = (sweep.MIX_GEOMETRY,),
    requests_per_level: Callable[[int], int] = lambda c: max(64, 8 * c),
    progress: Callable[[int, int, str], None] | None = None,
    on_ready: Callable[[int, str, float], None] | None = None,
) -> tuple[list[sweep.Sample], list[sweep.PoolSpec], list[Launched]]:
    """Each K in turn: start, wait ready, warm up, sweep, stop. Returns (samples, pools, engines)."""
    spec.check()
    counter = sweep.Counter(len(spec.ks) * len(geometries) * len(levels), progress)
    cells = {"geometries": geometries, "requests_per_level": requests_per_level, "step": counter}
    samples: list[sweep.Sample] = []
    pools = []
    launched = []
    for k in spec.ks:
        with LaunchedEngine(spec, k) as engine:
            seconds = engine.wait_ready()
            if on_ready:
                on_ready(k, engine.url, seconds)
            pool = sweep.PoolSpec(spec.pool(k).name, k, engine.url)
            first = geometries[0].apply(mix) if geometries[0] is not sweep.MIX_GEOMETRY else list(mix)
            if spec.warmup_requests:
                driver(pool, 1, first, spec.warmup_requests)  # JIT, caches; not measured
            samples.extend(sweep.run_pool(pool, levels, mix, driver, **cells))
            pools.append(pool)
        assert engine.pid is not None
        launched.append(Launched(k, engine.url, engine.pid, seconds, engine.returncode, engine.leftover))
    return samples, pools, launched
