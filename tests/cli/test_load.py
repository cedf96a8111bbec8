"""``specguard load``: the mixed traffic reaches the engines through a real ``specguard run`` tap with
its task types and temperatures; failures are counted and named; nothing listening is exit 2."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import sys

import pytest

from specguard.sim import cluster

K = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}


@pytest.fixture
async def sim():
    async with cluster.SimCluster.from_config(None, seed=0, dialect="vllm", time_scale=0.02) as running:
        yield running


async def specguard(*args: str, timeout: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "specguard",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def start_tap(sim, tmp_path) -> tuple[asyncio.subprocess.Process, str]:
    pools = "\n".join(
        f'  - {{name: {n}, url: "{u}", engine: vllm, num_speculative_tokens: {K[n]}}}'
        for n, u in sim.urls.items()
    )
    path = tmp_path / "specguard.yaml"
    path.write_text(f"pools:\n{pools}\ntap: {{listen: '127.0.0.1:0'}}\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specguard", "run", "--config", str(path), stderr=asyncio.subprocess.PIPE
    )
    assert proc.stderr is not None
    log = []
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        assert line, "".join(log)
        log.append(line)
        found = re.search(r"specguard tap on (http://127\.0\.0\.1:\d+)", line)
        if found:
            return proc, found.group(1)


async def test_the_mix_goes_through_the_tap_with_its_classes(sim, tmp_path):
    proc, url = await start_tap(sim, tmp_path)
    try:
        code, out, err = await specguard(
            "load", "--url", url, "--clients", "8", "--requests", "120", "--seed", "3", "--json"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        rest = (await asyncio.wait_for(proc.stderr.read(), 30)).decode()
        await asyncio.wait_for(proc.wait(), 30)
    assert code == 0, out + err
    assert "Traceback" not in err + rest
    summary = json.loads(out)
    assert (summary["sent"], summary["ok"], summary["failed"], summary["first_error"]) == (120, 120, 0, None)
    assert summary["model"] == sim.config.model_name
    classes = {(c["task_type"], c["temperature"]): c for c in summary["classes"]}
    assert set(classes) == {("code", 0.0), ("extraction", 0.0), ("chat", 0.7), ("creative", 1.0)}
    assert all(c["ok"] == c["requests"] > 0 and c["tpot_mean_ms"] > 0 for c in classes.values())
    # the engines saw each class (x-task-type and temperature passed through the tap) as often as sent
    seen: dict[str, int] = {}
    for pool in sim.truth()["pools"].values():
        for name, c in pool["classes"].items():
            seen[name] = seen.get(name, 0) + c["requests"]
    assert seen == {f"{t}@{temp:g}": c["requests"] for (t, temp), c in classes.items()}


async def test_failures_are_counted_and_named(sim):
    code, out, err = await specguard(
        "load", "--url", sim.urls["nospec"], "--requests", "6", "--clients", "2", "--model", "no-such-model"
    )
    assert code == 1 and "Traceback" not in err, out + err
    assert out.startswith(f"6 requests to {sim.urls['nospec']} in ")
    assert "0 ok, 6 failed" in out
    assert re.search(r"^first error: HTTP 404: .*no-such-model", out, re.M), out


async def test_plain_summary_without_streams(sim):
    code, out, err = await specguard("load", "--url", sim.urls["spec-k2"], "--requests", "8", "--no-stream")
    assert code == 0, out + err
    assert "8 ok, 0 failed" in out
    assert re.search(r"^TASK\s+TEMP\s+REQUESTS\s+OK\s+MEAN TPOT$", out, re.M), out
    assert "ms" not in out.split("MEAN TPOT", 1)[1]  # no streams, no TPOT: shown as "-"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "http://127.0.0.1:{port}"], "Error: cannot reach http://127.0.0.1:{port}"),
        (["--url", "127.0.0.1:8090"], "Error: specguard load: --url '127.0.0.1:8090': give a base URL"),
        (["--url", "http://127.0.0.1:{port}", "--clients", "0"], "Error: specguard load: --clients (0)"),
    ],
)
async def test_nothing_listening_or_a_bad_flag_is_exit_2(args, message):
    port = free_port()
    code, out, err = await specguard("load", *(a.format(port=port) for a in args), timeout=60)
    assert code == 2 and out == "", out + err
    assert err.startswith(message.format(port=port)) and "Traceback" not in err, err


async def test_the_model_is_the_one_the_url_serves_and_each_class_asks_its_own_task():
    """Real engines answer 404 to a model they do not serve (the simulator's name was the default);
    and a real model's acceptance follows what it is asked, so each class asks for its task."""
    from dataclasses import replace

    from specguard.lab import loadgen, traffic
    from specguard.sim import config as simconfig

    served = replace(simconfig.load(None), model_name="smollm2")
    async with cluster.SimCluster.from_config(served, seed=1, dialect="vllm", time_scale=0.02) as other:
        code, out, err = await specguard("load", "--url", other.urls["nospec"], "--requests", "8", "--json")
    assert code == 0, out + err
    summary = json.loads(out)
    assert (summary["model"], summary["ok"]) == ("smollm2", 8)
    prompts = {cls.task_type: loadgen.prompt_for(cls, 0, 0) for cls in traffic.default_mix()}
    assert "Invoice number" in prompts["extraction"] and "def " in prompts["code"]
    assert "tips for" in prompts["chat"] and "poem" in prompts["creative"]
    assert len(set(prompts.values())) == 4
