"""Hostile files and smaller cases: YAML bombs and deep nesting in
every file specguard reads, a live config swapped for a bomb, ``inspect`` on impossible pages,
bounded secrets, ``--listen`` on IPv6, a taken port, and the simulator's strictness.

Memory peaks are measured in this process (the CLI runs in-process through ``cli.main``); the
live-reload attack measures normal traffic through the tap as a ratio to the same traffic
without it; nothing may log a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from specguard import cli, configfile
from specguard.errors import ConfigError
from specguard.lab import scenario
from specguard.monitor import config, guard_wiring
from specguard.monitor.app import Monitor
from specguard.rules import profile
from specguard.sim import cluster
from specguard.sim import config as sim_config
from tests.reliability import hostkit, relkit
from tests.reliability.hostkit import MB

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def laughs(levels: int) -> str:
    """A billion-laughs document: ``levels`` lists of nine aliases of the level below."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


HOSTILE = {
    "billion-laughs": (laughs(6), "expands to more than"),  # 600 bytes; 325 MB before the limit
    "self-alias": ("a: &a [*a, *a]\n", "nested deeper than"),
    "deep": ("a: " + "[" * 20_000 + "]" * 20_000 + "\n", "nested deeper than"),
    "huge": ("a: '" + "x" * (5 * MB) + "'\n", "larger than"),
    "duplicate-key": ("pools: []\ntap: {}\npools: [1]\n", "3:1: pools: duplicate key (first at line 1)"),
}
LOADERS = {
    "config": config.load,
    "calibration-profile": profile.load_profile,
    "scenario": scenario.load_scenario,
    "simulator-config": sim_config.load,
}


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_every_file_specguard_reads_refuses_bombs_quickly_in_bounded_memory(loader, kind, tmp_path, caplog):
    text, message = HOSTILE[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    reference = time.perf_counter()
    config.load_default()  # the shipped config: what reading a real file costs here, now
    reference = time.perf_counter() - reference
    with hostkit.PeakRSS() as rss:
        started = time.perf_counter()
        with pytest.raises(ConfigError) as info:
            LOADERS[loader](str(path))
        seconds = time.perf_counter() - started
    assert message in str(info.value) and str(path) in str(info.value)
    assert rss.growth < 40 * MB, f"peak memory grew {rss.growth / MB:.0f} MB"
    assert seconds < 40 * reference, f"{seconds:.2f} s to refuse, {reference:.3f} s for the shipped config"
    assert hostkit.tracebacks(caplog) == []


def test_run_with_a_calibration_profile_bomb_exits_at_once(tmp_path, capsys):
    (tmp_path / "bomb.yaml").write_text(laughs(9))  # the review's 9-level file: > 90 s, 850 MB before
    cfg = tmp_path / "specguard.yaml"
    cfg.write_text(
        'pools: [{name: a, url: "http://127.0.0.1:9"}]\ncost: {calibration_profile: bomb.yaml}\n'
        'tap: {listen: "127.0.0.1:0"}\n'
    )
    with hostkit.PeakRSS() as rss:
        code = cli.main(["check-config", str(cfg)])
    out = capsys.readouterr()
    assert code == 2 and "expands to more than" in out.out + out.err
    assert rss.growth < 40 * MB


async def test_a_bomb_written_into_the_live_config_changes_nothing_and_slows_nothing(tmp_path, caplog):
    engine = hostkit.Engine()
    async with relkit.serving(engine.app()) as engine_url:
        path = tmp_path / "specguard.yaml"
        good = (
            f'pools: [{{name: spec-k4, url: "{engine_url}", engine: vllm, num_speculative_tokens: 4}},\n'
            f'        {{name: nospec, url: "{engine_url}", engine: vllm, num_speculative_tokens: 0}}]\n'
            "scrape: {interval_seconds: 3600}\nguard: {interval_seconds: 3600}\n"
            "server: {insecure_loopback: true}\n"
        )
        path.write_text(good)
        cfg = config.load(path)
        monitor = Monitor(cfg, registry=CollectorRegistry())
        guard = guard_wiring.configure(monitor, cfg)
        url = await monitor.start("127.0.0.1", 0)
        before = guard.policy.version
        try:
            bombs = [laughs(6), "guard: " + "[" * 20_000 + "]" * 20_000 + "\n"]

            async def swap_in_bombs() -> None:  # 200 times the reload job's rate (every 10 s)
                for n in range(10_000):
                    path.write_text(good + bombs[n % 2] + f"# {n}\n")
                    await guard._reload()
                    await asyncio.sleep(0.05)

            with caplog.at_level(logging.INFO, logger="specguard"), hostkit.PeakRSS() as rss:
                slower = await hostkit.latency_ratio(url, swap_in_bombs)
        finally:
            await monitor.stop()
    assert guard.policy.version == before and "refused" in (guard.reload_error or "")
    assert rss.growth < 40 * MB, f"peak memory grew {rss.growth / MB:.0f} MB"
    assert slower < 2.0, f"normal traffic {slower:.2f}x slower while bombs were reloaded"
    assert hostkit.tracebacks(caplog) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            'pools: [{name: a, url: "http://127.0.0.1:99999"}]\n', "port must be 1-65535", id="port-99999"
        ),
        pytest.param(
            "server: {token_file: /dev/zero}\n",
            "server.token_file: /dev/zero: token file is a character device",
            id="token-dev-zero",
        ),
    ],
)
def test_impossible_settings_are_config_errors(text, message, tmp_path):
    base = 'pools: [{name: a, url: "http://127.0.0.1:8000"}]\n' if "pools" not in text else ""
    with hostkit.PeakRSS() as rss:
        with pytest.raises(ConfigError, match=message):
            cfg = config.parse_text(base + text, "x.yaml")
            cfg.sections["server"].token()
    assert rss.growth < 8 * MB


# ------------------------------------------------------------------ inspect
def page_with(name: str, value: str) -> str:
    lines = []
    for line in (FIXTURES / name).read_text().splitlines():
        if line and not line.startswith("#"):
            line = line.rsplit(" ", 1)[0] + " " + value
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.metrics.txt")))
@pytest.mark.parametrize("value", ["1e308", "1e-320", "-5"])
def test_inspect_survives_extreme_counters_and_flags_them(fixture, value, tmp_path, capsys):
    path = tmp_path / "page.txt"
    path.write_text(page_with(fixture, value))
    for extra in ([], ["--json"]):
        code = cli.main(["inspect", "--file", str(path), *extra])
        out = capsys.readouterr()
        assert code == 0 and "Traceback" not in out.err, out.err
    if value == "-5":  # a negative counter is impossible: said so
        assert json.loads(out.out)["warnings"] or fixture.startswith(("llamacpp", "tgi", "trtllm"))


def test_inspect_flags_repeated_series_and_impossible_values(tmp_path, capsys):
    page = (FIXTURES / "vllm-0.32-cpu-ngram-k4.metrics.txt").read_text()
    drafts = next(line for line in page.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total"))
    accepted = next(
        line for line in page.splitlines() if line.startswith("vllm:spec_decode_num_accepted_tokens_total")
    )
    page = page.replace(accepted, accepted.rsplit(" ", 1)[0] + " 99999") + drafts + "\n"
    (tmp_path / "page.txt").write_text(page)
    assert cli.main(["inspect", "--json", "--file", str(tmp_path / "page.txt")]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["drafts"] == 192  # the repeated series is not summed
    assert any("a repeated series" in w for w in found["warnings"])
    assert any("accepted tokens (99999) exceed draft tokens (671)" in w for w in found["warnings"])


def test_inspect_refuses_a_page_with_a_huge_line_in_bounded_memory(tmp_path, capsys):
    path = tmp_path / "page.txt"
    path.write_text('vllm:num_requests_running{model_name="' + "x" * (2 * MB) + '"} 1\n')
    with hostkit.PeakRSS() as rss:
        code = cli.main(["inspect", "--file", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "line longer than 16384 bytes" in err
    assert rss.growth < 24 * MB, f"peak memory grew {rss.growth / MB:.0f} MB (340 MB before the limit)"


# ------------------------------------------------------------------ specguard run: --listen, bind, logs
def free_port(family: int = socket.AF_INET, host: str = "127.0.0.1") -> int:
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def test_run_listens_on_ipv6_masks_credentials_and_fails_cleanly_on_a_taken_port(tmp_path):
    port = free_port(socket.AF_INET6, "::1")
    cfg = tmp_path / "specguard.yaml"
    cfg.write_text(
        'pools: [{name: a, url: "http://scraper:s3cret-pw@127.0.0.1:9", engine: vllm}]\n'
        "scrape: {interval_seconds: 3600, timeout_seconds: 1}\nguard: {enabled: false}\n"
        f'server: {{listen: "[::1]:{free_port(socket.AF_INET6, "::1")}"}}\n'  # a free port of its own
    )
    command = [sys.executable, "-m", "specguard", "run", "--config", str(cfg), "--listen", f"[::1]:{port}"]
    first = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        health = asyncio.run(_get(f"http://[::1]:{port}/livez"))
        second = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        first.terminate()
        _, log = first.communicate(timeout=20)
    assert health["status"] == "alive"
    assert "s3cret-pw" not in log and "scraper:*****@127.0.0.1:9" in log
    assert second.returncode == 2 and "cannot listen on [::1]" in second.stderr
    assert "Unclosed client session" not in second.stderr and "Traceback" not in second.stderr + log


async def _get(url: str) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        for _ in range(300):
            try:
                async with session.get(url) as response:
                    return await response.json()
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never answered")


# ------------------------------------------------------------------ the simulator
async def test_the_simulator_reads_requests_as_vllm_does_and_aborts_on_disconnect(caplog):
    async with cluster.SimCluster.from_config(None, seed=0, dialect="vllm", time_scale=1.0) as sim:
        url = sim.urls["spec-k4"] + "/v1/chat/completions"
        chat = {k: v for k, v in hostkit.chat().items() if k != "model"}
        async with aiohttp.ClientSession() as session:

            async def post(body: dict | bytes) -> tuple[int, bytes]:
                kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
                async with session.post(url, **kwargs) as response:
                    return response.status, await response.read()

            stream = {**chat, "stream": True}
            _, plain = await post({**stream, "stream_options": {"include_usage": "no"}})
            _, usage = await post({**stream, "stream_options": {"include_usage": "yes"}})
            bad_flag = await post({**stream, "stream_options": {"include_usage": "maybe"}})
            big = json.dumps(chat).replace('"temperature": 0', '"temperature": ' + "1" * 5000).encode()
            big_number = await post(big)
            before = sim.truth()["pools"]["spec-k4"]["totals"]["requests_aborted"]
            slow = {**chat, "max_tokens": 500, "ignore_eos": True}  # seconds of decoding at time scale 1
            with pytest.raises(TimeoutError):
                async with session.post(url, json=slow, timeout=aiohttp.ClientTimeout(total=0.3)) as r:
                    await r.read()
            for _ in range(50):
                await asyncio.sleep(0.1)
                if sim.truth()["pools"]["spec-k4"]["totals"]["requests_aborted"] > before:
                    break
            after = sim.truth()["pools"]["spec-k4"]["totals"]["requests_aborted"]
    assert b'"usage"' not in plain and b'"usage"' in usage
    assert bad_flag[0] == 400 and b"include_usage" in bad_flag[1]
    assert big_number[0] == 400
    assert after == before + 1  # the non-streamed request was aborted when its client went away
    assert hostkit.tracebacks(caplog) == []


def test_duplicate_keys_name_both_places():
    with pytest.raises(ConfigError) as info:
        configfile.parse_text("a: 1\nb:\n  c: 2\n  c: 3\n", "d.yaml").raise_if_issues()
    assert str(info.value) == "d.yaml:4:3: b.c: duplicate key (first at line 3)"
