"""``specguard run``: the standalone process serves the tap, /metrics and /healthz, and stops cleanly."""

from __future__ import annotations

import asyncio
import re
import signal
import sys

import aiohttp

from specguard import cli
from specguard.sim import cluster

K = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}


async def test_run_serves_the_tap_until_sigterm(tmp_path):
    async with cluster.SimCluster.from_config(None, seed=0, dialect="vllm", time_scale=0.02) as sim:
        pools = "\n".join(
            f'  - {{name: {n}, url: "{u}", engine: auto, num_speculative_tokens: {K[n]}}}'
            for n, u in sim.urls.items()
        )
        path = tmp_path / "specguard.yaml"
        scrape = "scrape: {interval_seconds: 1, timeout_seconds: 1}"
        tap = "tap: {listen: '127.0.0.1:0', holdout_share: 0, probe_share: 0}"  # the request stays on spec-k4
        path.write_text(f"pools:\n{pools}\n{tap}\n{scrape}\n")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "specguard", "run", "--config", str(path), stderr=asyncio.subprocess.PIPE
        )
        log = []
        try:
            url = None
            while url is None:
                line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
                assert line, "".join(log)
                log.append(line)
                found = re.search(r"specguard tap on (http://127\.0\.0\.1:\d+)", line)
                url = found.group(1) if found else None
            async with aiohttp.ClientSession() as session:
                for _ in range(300):  # engine: auto is resolved by the first scrape of each pool
                    async with session.get(url + "/healthz") as r:
                        pools_up = (await r.json())["pools_up"]
                    if all(pools_up.values()):
                        break
                    await asyncio.sleep(0.1)
                assert all(pools_up.values()), pools_up
                body = {"model": sim.config.model_name, "prompt": "hello", "max_tokens": 8, "stream": True}
                async with session.post(
                    url + "/v1/completions", json=body, headers={"x-task-type": "code"}
                ) as r:
                    assert r.status == 200
                    assert (await r.read()).endswith(b"data: [DONE]\n\n")
                async with session.get(url + "/metrics") as r:
                    text = await r.text()
            counted = [line for line in text.splitlines() if re.match(r"specguard_\w*requests_total\{", line)]
            assert re.search(
                r'specguard_spec_requests_total\{[^}]*pool="spec-k4",task_type="code"[^}]*\} 1\.0', text
            ), counted
            assert 'specguard_engine_up{pool="nospec"} 1.0' in text
        finally:
            proc.send_signal(signal.SIGTERM)
            rest = await asyncio.wait_for(proc.stderr.read(), 30)
            code = await asyncio.wait_for(proc.wait(), 30)
        assert code == 0, "".join(log) + rest.decode()
        assert "Traceback" not in rest.decode()


def test_run_with_a_bad_config_exits_2_without_traceback(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("pools:\n  - {name: a, url: nowhere}\n")
    assert cli.main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2:" in err and "pools[0].url" in err and "Traceback" not in err
