"""A fixed run for the report tests: Prometheus's answers recorded from a real stack, replayed.

Recording (about a minute; the fixture is checked in, so only rerun to change the run), and the
report rendered from the recording (its RC figure is the picture in docs/commands.md):

    PYTHONPATH=. python3 tests/lab/reportrun.py tests/fixtures/report-run.json
    PYTHONPATH=. python3 tests/lab/reportrun.py --html report.html
    PYTHONPATH=. python3 tests/lab/reportrun.py --png docs/images/report.png

The stack: the engine simulator's three pools, specguard in process (tap, cost model, guard with
the relative-cost rule acting) and Debian's Prometheus scraping it every second. An operator pin
is taken before Prometheus's first scrape; then four classes of traffic run, creative (temperature
1) loses on speculation and the guard moves it off. `report.collect` then runs against the real
server through a recorder that keeps every answer; `Replay` gives them back to `PromData`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "report-run.json"


class Replay:
    """Stands in for PrometheusConnect with recorded answers (PromData's ``connect``)."""

    def __init__(self, recorded: dict[str, Any]):
        self.recorded = recorded

    def custom_query(self, query: str, params: dict | None = None) -> list:
        return self.recorded["instant"][query]

    def custom_query_range(self, query: str, **_: Any) -> list:
        return self.recorded["range"][query]

    def close(self) -> None:
        pass


def load(path: Path = FIXTURE) -> dict[str, Any]:
    return json.loads(path.read_text())


class _Recorder:
    def __init__(self, prom):
        self.prom = prom
        self.recorded: dict[str, dict] = {"instant": {}, "range": {}}

    def custom_query(self, query, params=None):
        out = self.recorded["instant"][query] = self.prom.custom_query(query, params=params)
        return out

    def custom_query_range(self, query, **kw):
        out = self.recorded["range"][query] = self.prom.custom_query_range(query, **kw)
        return out

    def close(self):
        self.prom.close()


# the holdout runs the no-spec engine at about the K=4 engine's load (0.45 each), so its like-for-like
# baseline is read where it was measured: at 0.2 the no-spec engine ran a quarter of K=4's load and
# one run in a full suite (two workers) got no live baseline for any class
CONFIG = """
pools:
  - {{name: spec-k4, url: "{k4}", engine: vllm, num_speculative_tokens: 4}}
  - {{name: spec-k2, url: "{k2}", engine: vllm, num_speculative_tokens: 2}}
  - {{name: nospec, url: "{k0}", engine: vllm, num_speculative_tokens: 0}}
tap:
  {{listen: "127.0.0.1:0", default_pool: spec-k4, nospec_pool: nospec, holdout_share: 0.45,
    probe_share: 0.1, window_seconds: 60}}
scrape: {{interval_seconds: 1, timeout_seconds: 1}}
guard:
  interval_seconds: 1
  window_seconds: 30
  min_samples: 5
  consecutive_failure_limit: 0
  cooldown_seconds: 1
  rules:
    - {{name: relative-cost, measure: rc_lower, direction: above, threshold: 1.0,
       restore_measure: rc_upper, restore_threshold: 0.95}}
cost: {{min_samples: 5, baseline_min_samples: 5, confidence: 0.5}}  # a 20 s run moves creative (RC ~1.1)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_prometheus(tmp: Path, target: str) -> tuple[subprocess.Popen, str]:
    """Debian's Prometheus scraping ``target`` (host:port) every second; (process, its URL)."""
    port = free_port()
    cfg = tmp / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: specguard\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    proc = subprocess.Popen(
        [shutil.which("prometheus") or "prometheus", f"--config.file={cfg}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


async def _run(tmp: Path) -> dict[str, Any]:
    from prometheus_api_client import PrometheusConnect

    from specguard.lab import loadgen, report
    from specguard.lab.report_data import PromData
    from specguard.monitor import app, config, guard_wiring
    from specguard.sim.cluster import SimCluster

    async with SimCluster.from_config(None, seed=0, time_scale=0.25) as sim:
        text = CONFIG.format(k4=sim.urls["spec-k4"], k2=sim.urls["spec-k2"], k0=sim.urls["nospec"])
        cfg = config.parse_text(text, "report-run.yaml")
        monitor = app.Monitor(cfg)
        guard = guard_wiring.configure(monitor, cfg)
        url = await monitor.start(port=0)
        start = time.time()
        await guard.override("pin", "extraction", "greedy", "low", pool="spec-k2", reason="before scraping")
        await asyncio.sleep(3)  # the pin is older than Prometheus's first scrape
        prom, prom_url = start_prometheus(tmp, url.removeprefix("http://"))
        try:
            mix = [
                loadgen.RequestClass("code", temperature=0.0, max_tokens=64),
                loadgen.RequestClass("creative", weight=2, temperature=1.0, max_tokens=64),
                loadgen.RequestClass("chat", temperature=0.7, max_tokens=64),
                loadgen.RequestClass("extraction", temperature=0.0, max_tokens=48),
            ]
            await loadgen.run_load(url, mix, concurrency=8, duration_s=40, stream=True, seed=4)
            await asyncio.sleep(4)
            end = time.time()
            recorder = _Recorder(PrometheusConnect(url=prom_url, disable_ssl=True))
            source = PromData(prom_url, connect=recorder)
            data = await asyncio.to_thread(report.collect, source, start - 10, end, 1.0, "5s")
        finally:
            prom.terminate()
            prom.wait(timeout=10)
            await monitor.stop()
    meta = {"url": "http://prometheus.example:9090", "start": data.start, "end": data.end, "step": 1.0}
    return {"meta": {**meta, "window": "5s"}, **recorder.recorded}


def recorded_data():
    from specguard.lab import report
    from specguard.lab.report_data import PromData

    recorded = load()
    meta = recorded["meta"]
    source = PromData(meta["url"], connect=Replay(recorded))
    return report.collect(source, meta["start"], meta["end"], meta["step"], meta["window"])


def render(html_path: Path) -> None:
    from specguard.lab import report

    html_path.write_text(report.render_html(recorded_data()))


def render_png(png_path: Path) -> None:
    """The report's RC figure of the recorded run, as the HTML embeds it."""
    from specguard.lab import report

    fig = report.build_figures(recorded_data())["Relative cost per token per class"]
    fig.savefig(png_path, dpi=90, bbox_inches="tight")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--html"]:
        render(Path(sys.argv[2]))
        sys.exit(0)
    if sys.argv[1:2] == ["--png"]:
        render_png(Path(sys.argv[2]))
        sys.exit(0)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE
    with tempfile.TemporaryDirectory() as tmp:
        recorded = asyncio.run(_run(Path(tmp)))
    out.write_text(json.dumps(recorded, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")
