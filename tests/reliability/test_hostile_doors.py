"""The data listener's doors: what the tap forwards to an engine, with which credentials.

An engine's admin endpoints (vLLM's ``/sleep``, ``/collective_rpc``, adapter loading, the
profiler...) sit next to its OpenAI API; the tap must forward only the inference API (plus what
``tap.forward_paths`` adds), answer everything else itself, never hand the client's credential
to a pool, and authenticate to a pool that has a key with that key only.
"""

from __future__ import annotations

import json
import os

import aiohttp
import pytest
import yarl
from aiohttp import web
from prometheus_client import CollectorRegistry

from specguard.errors import ConfigError
from specguard.monitor import config
from specguard.monitor.app import Monitor
from tests.reliability import relkit

KEY = "engine-key-0123456789"


class Recorder:
    """An engine that answers everything and records what reached it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []  # method, raw path, Authorization

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.seen.append((request.method, request.rel_url.raw_path, request.headers.get("Authorization")))
        if request.path == "/metrics":
            return web.Response(text="# nothing\n", content_type="text/plain")
        return web.json_response(relkit.COMPLETION)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


ADMIN = [
    ("POST", "/sleep"),
    ("POST", "/wake_up"),
    ("POST", "/collective_rpc"),
    ("POST", "/reset_prefix_cache"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/start_profile"),
    ("POST", "/stop_profile"),
    ("GET", "/is_sleeping"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/models/../../sleep"),
    ("POST", "/v1/chat%2Fcompletions"),
    ("POST", "//v1/chat/completions"),
]
WRONG_METHOD = [
    ("DELETE", "/v1/models"),
    ("TRACE", "/v1/chat/completions"),
    ("GET", "/v1/chat/completions"),
    ("PUT", "/v1/completions"),
]


async def test_only_the_inference_api_is_forwarded_and_never_with_the_clients_credential(tmp_path):
    engine = Recorder()
    key_file = tmp_path / "engine-key"
    key_file.write_text(f"  {KEY}\n")
    async with relkit.serving(engine.app()) as engine_url, relkit.serving(Recorder().app()) as open_url:
        cfg = config.parse_text(
            "pools:\n"
            f'  - {{name: nospec, url: "{engine_url}", engine: vllm, api_key_file: "{key_file}"}}\n'
            f'  - {{name: spec, url: "{open_url}", engine: vllm, num_speculative_tokens: 4}}\n'
            "tap:\n  probe_share: 0\n  holdout_share: 0\n"
            "  forward_paths:\n    - {path: /tokenize, methods: [POST]}\n"
            "scrape: {interval_seconds: 3600, timeout_seconds: 1}\n",
            "doors.yaml",
        )
        registry = CollectorRegistry()
        monitor = Monitor(cfg, registry=registry)
        url = await monitor.start("127.0.0.1", 0)
        try:
            client = {"Authorization": "Bearer client-secret"}
            async with aiohttp.ClientSession(headers=client) as session:
                refused = {}
                for method, path in ADMIN + WRONG_METHOD:
                    raw = yarl.URL(url + path, encoded=True)  # sent as written: no client-side clean-up
                    async with session.request(method, raw, data=b"{}") as response:
                        body = await response.read()
                        refused[(method, path)] = response.status
                        assert response.content_type == "application/json", (method, path, body)
                        assert "error" in json.loads(body), (method, path, body)
                # not one of them reached the engine (only the scrape loop's first page read did)
                assert [(m, p) for m, p, _ in engine.seen if p != "/metrics"] == []
                assert {k: v for k, v in refused.items() if k in ADMIN} == {k: 404 for k in ADMIN}
                wrong = {k: v for k, v in refused.items() if k in WRONG_METHOD}
                assert wrong == {k: 405 for k in WRONG_METHOD}
                # the inference API, the configured extra path, and the monitor's own endpoints
                for method, path in [
                    ("POST", "/v1/chat/completions"),
                    ("POST", "/v1/completions"),
                    ("GET", "/v1/models"),
                    ("POST", "/tokenize"),
                ]:
                    async with session.request(method, url + path, json=relkit.chat_body()) as response:
                        assert response.status == 200, (method, path, await response.text())
                for path in ("/metrics", "/healthz", "/livez"):
                    async with session.get(url + path) as response:
                        assert response.status in (200, 503), path
                await monitor.loops[0].scrape_once()
        finally:
            await monitor.stop()
    forwarded = [(m, p) for m, p, _ in engine.seen if p != "/metrics"]
    assert forwarded == [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/models"),
        ("POST", "/tokenize"),
    ]
    assert [p for _, p, _ in engine.seen].count("/metrics") >= 2  # the start-up scrape and ours
    # the pool's own key on every request and scrape, never the client's
    assert {auth for _, _, auth in engine.seen} == {f"Bearer {KEY}"}
    value = registry.get_sample_value
    assert value("specguard_tap_refused_requests_total", {"reason": "path"}) == 12
    # /v1/chat%2Fcompletions: it decodes to an allowed path, but the engine would be asked another
    assert value("specguard_tap_refused_requests_total", {"reason": "encoded_path"}) == 1
    assert value("specguard_tap_refused_requests_total", {"reason": "method"}) == len(WRONG_METHOD)


async def test_a_pool_without_a_key_gets_no_authorization_at_all():
    engine = Recorder()
    async with relkit.serving(engine.app()) as engine_url:
        monitor = Monitor(relkit.monitor_config({"nospec": engine_url}))
        url = await monitor.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                headers = {"Authorization": "Bearer client-secret"}
                async with session.post(url + "/v1/completions", json={"prompt": "x"}, headers=headers) as r:
                    assert r.status == 200
        finally:
            await monitor.stop()
    assert [seen for seen in engine.seen if seen[1] != "/metrics"] == [("POST", "/v1/completions", None)]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{path: sleep}", "tap.forward_paths[0].path: ('sleep') must be an exact path"),
        ("{path: /a/../sleep}", "tap.forward_paths[0].path: ('/a/../sleep') must be an exact path"),
        ("{path: '/x?y=1'}", "must be an exact path"),
        ("{path: /x, methods: [TRACE]}", "tap.forward_paths[0].methods[0]: ('TRACE') must be one of GET"),
        ("{path: /x, methods: []}", "tap.forward_paths[0].methods: must list at least one method"),
        ("{path: /x, verbs: [GET]}", "tap.forward_paths[0].verbs: unknown key"),
        ("{methods: [GET]}", "tap.forward_paths[0].path: is required"),
    ],
)
def test_a_bad_forward_path_is_a_config_error_with_its_place(entry, message):
    pools = 'pools:\n  - {name: nospec, url: "http://127.0.0.1:1"}\n'
    text = pools + "tap:\n  forward_paths:\n    - " + entry + "\n"
    with pytest.raises(ConfigError) as caught:
        config.parse_text(text, "bad.yaml")
    assert "bad.yaml:5:" in str(caught.value) and message in str(caught.value), str(caught.value)


@pytest.mark.parametrize("kind", ["missing", "fifo", "empty", "two_words"])
def test_a_bad_api_key_file_is_refused_at_start_with_its_key(tmp_path, kind):
    path = tmp_path / "key"
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading would block start-up forever
    elif kind == "empty":
        path.write_text("\n")
    elif kind == "two_words":
        path.write_text("a b\n")
    cfg = config.parse_text(
        f'pools:\n  - {{name: nospec, url: "http://127.0.0.1:1", api_key_file: "{path}"}}\n', "k.yaml"
    )
    with pytest.raises(ConfigError, match=r"pools\[0\]\.api_key_file: "):
        Monitor(cfg)
