"""``specguard inspect``: files, windows, a live URL on loopback, the bundled sample, bad input."""

from __future__ import annotations

import http.server
import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from specguard import cli
from specguard.exporters import derive, scrape

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
K4 = FIXTURES / "vllm-0.32-cpu-ngram-k4.metrics.txt"
NOSPEC = FIXTURES / "vllm-0.32-cpu-nospec.metrics.txt"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_one_file_json_has_the_stable_keys(capsys):
    code, out, _ = run_cli(capsys, "--file", str(K4), "--json")
    assert code == 0
    data = json.loads(out)
    assert tuple(data) == derive.KEYS
    assert data["engine"] == "vllm" and data["speculation_enabled"] is True
    assert data["num_speculative_tokens"] == 4 and data["drafts"] == 192
    assert data["accepted_per_position"] == [176, 150, 109, 93]
    assert data["accept_length"] == pytest.approx(3.75) and data["ci_acceptance_proxy"] == pytest.approx(0.75)
    assert data["counter_resets"] is None and data["models"] == {}


def test_nospec_page_json_nulls(capsys):
    code, out, _ = run_cli(capsys, "--file", str(NOSPEC), "--json", "--engine", "vllm")
    data = json.loads(out)
    assert code == 0 and data["speculation_enabled"] is False and data["num_speculative_tokens"] == 0
    assert (
        data["drafts"] is None and data["strict_accept_rate"] is None and data["full_rollback_ratio"] is None
    )
    assert data["time_per_output_token_seconds"] > 0


def test_two_files_make_a_window_with_resets(tmp_path, capsys):
    text = K4.read_text()
    earlier = tmp_path / "earlier.txt"
    earlier.write_text(
        text.replace(
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="tinyllm"} 192.0',
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="tinyllm"} 92.0',
        ).replace(
            'vllm:generation_tokens_total{engine="0",model_name="tinyllm"} 1156.0',
            'vllm:generation_tokens_total{engine="0",model_name="tinyllm"} 5000.0',
        )
    )
    code, out, _ = run_cli(capsys, "--file", str(earlier), "--file", str(K4), "--json")
    data = json.loads(out)
    assert code == 0 and data["drafts"] == 100 and data["generation_tokens"] == 1156
    assert data["counter_resets"] == ["vllm:generation_tokens_total"]
    code, out, _ = run_cli(capsys, "--file", str(earlier), "--file", str(K4))
    assert code == 0 and "counter resets: vllm:generation_tokens_total" in out


def test_page_from_stdin(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(K4.read_text()))
    code, out, _ = run_cli(capsys, "--file", "-", "--json")
    assert code == 0 and json.loads(out)["accepted_tokens"] == 528


def test_table_output_is_readable(capsys):
    code, out, _ = run_cli(capsys, "--sample")
    assert code == 0
    assert out.startswith("engine: vllm (speculation on, K=4)")
    assert "accept length            3.750" in out
    assert "p1 0.917  p2 0.781  p3 0.568  p4 0.484" in out
    assert "time per output token    2.47 ms" in out


def test_table_lists_models_and_labels(capsys):
    code, out, _ = run_cli(capsys, "--file", str(FIXTURES / "vllm-dp2-two-models-multiproc.metrics.txt"))
    assert code == 0 and "per model:" in out and "alpha" in out and "beta" in out
    code, out, _ = run_cli(capsys, "--file", str(FIXTURES / "sglang-0.5.23-reconstructed.metrics.txt"))
    assert code == 0 and "per label task:" in out and "code" in out


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('foo 1\nvllm:x{a="b} 2\n', "bad.txt:2:"),
        ("foo 1\nbar_total 2\n", "families seen (2): foo, bar_total"),
        ('{"iterations": []}', "expected a metric name"),
    ],
)
def test_bad_files_exit_2_with_a_message(tmp_path, capsys, content, expected):
    path = tmp_path / "bad.txt"
    path.write_text(content)
    code, out, err = run_cli(capsys, "--file", str(path))
    assert code == 2 and out == ""
    assert err.startswith("Error: ") and expected in err and "Traceback" not in err


def test_argument_mistakes(tmp_path, capsys):
    assert run_cli(capsys, "--file", str(tmp_path / "missing.txt"))[2].startswith("Error: cannot read")
    code, _, err = run_cli(capsys, "--file", str(K4), "--interval", "1")
    assert code == 2 and "--interval needs --url" in err
    code, _, err = run_cli(capsys, "--file", str(K4), "--file", str(K4), "--file", str(K4))
    assert code == 2 and "got 3" in err
    code, _, err = run_cli(capsys, "--url", "ftp://x")
    assert code == 2 and "http:// or https://" in err
    code, _, err = run_cli(capsys, "--url", "http://127.0.0.1:port")
    assert code == 2 and "Port could not be cast" in err
    code, _, err = run_cli(
        capsys, "--file", str(K4), "--file", str(FIXTURES / "sglang-0.5.23-reconstructed.metrics.txt")
    )
    assert code == 2 and "is a vllm page but" in err


class _Pages:
    """Serves a list of pages on 127.0.0.1, one per GET (the last one repeats)."""

    def __init__(self, pages: list[tuple[int, str]]):
        self.pages = pages
        self.paths: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server API)
                owner.paths.append(self.path)
                status, body = owner.pages[min(len(owner.paths), len(owner.pages)) - 1]
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)


@pytest.fixture
def serve() -> Iterator:
    servers: list[_Pages] = []

    def start(*pages: tuple[int, str]) -> _Pages:
        server = _Pages(list(pages))
        server.thread.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.server.shutdown()
        server.server.server_close()


def test_url_scrape_and_interval_window(serve, capsys):
    text = K4.read_text()
    earlier = text.replace(
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tinyllm"} 192.0',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tinyllm"} 150.0',
    )
    server = serve((200, earlier), (200, text))
    code, out, _ = run_cli(capsys, "--url", server.url, "--interval", "0.05", "--json")
    data = json.loads(out)
    assert code == 0 and data["drafts"] == 42 and data["counter_resets"] == []
    assert server.paths == ["/metrics", "/metrics"]  # http://host:port gets the engine's path


def test_url_errors_name_the_url_and_reason(serve, capsys):
    server = serve((404, "not here"))
    code, _, err = run_cli(capsys, "--url", server.url + "/metrics")
    assert code == 2 and f"{server.url}/metrics: HTTP 404" in err
    server.server.shutdown()
    server.server.server_close()
    code, _, err = run_cli(capsys, "--url", server.url, "--timeout", "2")
    assert code == 2 and f"{server.url}/metrics: unreachable: " in err and "Traceback" not in err
    json_server = serve((200, '{"gpu_mem": 1}'))
    code, _, err = run_cli(capsys, "--url", json_server.url, "--engine", "trtllm")
    assert code == 2 and "/prometheus/metrics: answered JSON" in err


def test_auto_engine_follows_trtllm_to_its_prometheus_path(serve, capsys):
    trt = (FIXTURES / "trtllm-reconstructed.metrics.txt").read_text()
    server = serve((200, '{"iterations": []}'), (200, trt))
    code, out, err = run_cli(capsys, "--url", server.url, "--json")
    assert code == 0, err
    assert json.loads(out)["engine"] == "trtllm"
    assert server.paths == ["/metrics", "/prometheus/metrics"]


async def test_async_fetch_snapshot(serve):
    server = serve((200, K4.read_text()))
    snap = await scrape.fetch_snapshot(server.url + "/metrics", timeout=5)
    assert snap.drafts == 192 and snap.engine == "vllm"
    assert scrape.metrics_url("http://h:1", "trtllm") == "http://h:1/prometheus/metrics"
    assert scrape.metrics_url("http://h:1/custom/path", "trtllm") == "http://h:1/custom/path"


def test_installed_command_runs_the_bundled_sample():
    result = subprocess.run(
        [sys.executable, "-m", "specguard", "inspect", "--sample", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["drafts"] == 192
