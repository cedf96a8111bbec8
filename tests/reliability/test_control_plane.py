"""The control plane's doors: its own listener, credentials per role, an operator token made when
none is configured, failed-auth throttling, webhook and override rate limits, and the caller's
identity in the audit log."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import socket
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from specguard import cli
from specguard.monitor import audit as audit_mod
from specguard.monitor import config, control_auth, guard_wiring
from specguard.monitor.app import CONTROL_PATHS, Monitor
from tests.reliability import relkit

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {"am": "am-4f0c2a9d", "ops": "ops-81b7e3c5", "fleet": "fleet-2d9a6b10"}
ALERT = {
    "version": "4",
    "status": "firing",
    "groupKey": '{}:{alertname="SpecGuardRelativeCostAboveOne"}',
    "externalURL": "http://alertmanager.example:9093",
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "SpecGuardRelativeCostAboveOne", "task_type": "chat"},
            "fingerprint": "f1",
        }
    ],
}
OVERRIDE = {"action": "pause", "task_type": "chat", "reason": "INC-9"}


class Recorder:
    """An engine that records every request that reached it."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        if request.path != "/metrics":
            self.seen.append(f"{request.method} {request.path}")
        return web.json_response({"ok": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


def role_server(tmp_path: Path, extra: str = "") -> str:
    for name, token in TOKENS.items():
        (tmp_path / f"{name}.token").write_text(token + "\n")
    roles = {"am": "alertmanager", "ops": "operator", "fleet": "follower"}
    entries = ", ".join(
        f'{{name: {name}, role: {role}, token_file: "{tmp_path / f"{name}.token"}"}}'
        for name, role in roles.items()
    )
    return f"{{credentials: [{entries}]{extra}}}"


def guard_config(url: str, tmp_path: Path, server: str):
    extra = (
        "guard: {interval_seconds: 3600}\n"
        f'actuators: {{plan_file: "{tmp_path / "plan.json"}", audit_log: "{tmp_path / "audit.jsonl"}"}}\n'
        f"server: {server}\n"
    )
    return relkit.monitor_config({"spec-k4": url}, extra=extra)


@contextlib.asynccontextmanager
async def running(cfg):
    monitor = Monitor(cfg, registry=CollectorRegistry())
    guard_wiring.configure(monitor, cfg)
    tap = await monitor.start("127.0.0.1", 0)
    try:
        yield monitor, tap, monitor.control_url
    finally:
        await monitor.stop()


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


async def call(session, method: str, url: str, headers=None, body=None) -> tuple[int, dict]:
    async with session.request(method, url, json=body, headers=headers or {}) as response:
        text = await response.text()
        return response.status, dict(response.headers) | {"_body": text}


# ------------------------------------------------------------------ a listener of its own
async def test_control_paths_answer_404_on_the_data_listener_and_are_never_proxied(tmp_path):
    engine = Recorder()
    async with (
        relkit.serving(engine.app()) as url,
        running(guard_config(url, tmp_path, role_server(tmp_path))) as (
            monitor,
            tap,
            control,
        ),
    ):
        assert control is not None and control != tap
        async with aiohttp.ClientSession() as session:
            on_tap = {}
            for path in CONTROL_PATHS:
                for method in ("GET", "POST", "DELETE"):
                    status, _ = await call(session, method, tap + path, bearer("ops"), {})
                    on_tap[(method, path)] = status
            on_control = {
                path: (await call(session, "GET", control + path, bearer("ops")))[0]
                for path in ("/status", "/api/v1/overrides", "/api/v1/plan")
            }
            # the data listener still serves the tap, /metrics, /healthz, /livez
            served = {
                path: (await call(session, "GET", tap + path))[0]
                for path in ("/metrics", "/livez", "/healthz")
            }
            chat = (await call(session, "POST", tap + "/v1/chat/completions", body=relkit.chat_body()))[0]
            metrics_on_control = (await call(session, "GET", control + "/metrics", bearer("ops")))[0]
    assert set(on_tap.values()) == {404}, on_tap
    assert engine.seen == ["POST /v1/chat/completions"]  # no control path reached an engine
    assert on_control == {"/status": 200, "/api/v1/overrides": 200, "/api/v1/plan": 200}
    assert served["/metrics"] == 200 and served["/livez"] == 200 and chat == 200
    assert metrics_on_control == 404  # the control listener serves the control endpoints only


def test_default_control_listener_follows_the_tap_and_port_base():
    cfg = config.load_default()
    assert config.control_listen(cfg) == "127.0.0.1:8091"
    moved = config.with_port_base(cfg, 9001)
    assert moved.exporter.tap.listen == "127.0.0.1:9090" and config.control_listen(moved) == "127.0.0.1:9091"
    bare = config.parse_text('pools: [{name: a, url: "http://127.0.0.1:7001", num_speculative_tokens: 0}]\n')
    assert config.control_listen(bare) == "127.0.0.1:8091"  # the tap's default port + 1
    assert config.control_listen(config.with_port_base(bare, 8001)) == "127.0.0.1:9091"


def test_a_taken_control_port_names_server_listen_and_exits_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = tmp_path / "specguard.yaml"
        cfg.write_text(
            'pools: [{name: a, url: "http://127.0.0.1:9", engine: vllm}]\n'
            'tap: {listen: "127.0.0.1:0"}\nscrape: {interval_seconds: 3600}\n'
            f'server:\n  listen: "127.0.0.1:{port}"\n'
        )
        command = [sys.executable, "-m", "specguard", "run", "--config", str(cfg)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
        flag = subprocess.run(
            [*command, "--control-listen", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"Error: {cfg}:5:3: server.listen: cannot listen on 127.0.0.1:{port}")
    assert "address already in use" in done.stderr and "--control-listen HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr
    assert flag.returncode == 2 and flag.stderr.startswith("Error: --control-listen: cannot listen")


# ------------------------------------------------------------------ credentials per role
@pytest.mark.parametrize(
    ("who", "expected"),
    [
        pytest.param(
            "am", {"alerts": 200, "override": 403, "overrides": 403, "status": 403, "plan": 403}, id="am"
        ),
        pytest.param(
            "ops",
            {"alerts": 403, "override": 200, "overrides": 200, "status": 200, "plan": 200},
            id="operator",
        ),
        pytest.param(
            "fleet",
            {"alerts": 403, "override": 403, "overrides": 403, "status": 403, "plan": 200},
            id="follower",
        ),
        pytest.param(
            None, {k: 401 for k in ("alerts", "override", "overrides", "status", "plan")}, id="none"
        ),
        pytest.param(
            "wrong", {k: 401 for k in ("alerts", "override", "overrides", "status", "plan")}, id="wrong"
        ),
    ],
)
async def test_each_role_may_call_only_its_endpoints(tmp_path, who, expected):
    engine = Recorder()
    headers = bearer(who) if who in TOKENS else ({"Authorization": "Bearer nope"} if who else {})
    async with (
        relkit.serving(engine.app()) as url,
        running(guard_config(url, tmp_path, role_server(tmp_path))) as (
            monitor,
            _,
            control,
        ),
    ):
        async with aiohttp.ClientSession() as session:
            got = {
                "alerts": (await call(session, "POST", control + "/api/v1/alerts", headers, ALERT))[0],
                "override": (await call(session, "POST", control + "/api/v1/overrides", headers, OVERRIDE))[
                    0
                ],
                "overrides": (await call(session, "GET", control + "/api/v1/overrides", headers))[0],
                "status": (await call(session, "GET", control + "/status", headers))[0],
                "plan": (await call(session, "GET", control + "/api/v1/plan", headers))[0],
            }
        guard = monitor.guard
    assert got == expected
    # a refused request changed nothing
    assert bool(len(guard.alerts)) is (expected["alerts"] == 200)
    assert any(s.paused for s in guard.states.values()) is (expected["override"] == 200)


def test_credential_config_errors_name_the_key(tmp_path):
    text = (
        'pools: [{name: a, url: "http://127.0.0.1:9", num_speculative_tokens: 0}]\n'
        "server:\n"
        "  credentials:\n"
        "    - {name: am, role: admin, token_file: /x}\n"
        "    - {name: am, role: operator}\n"
        "  listen: nowhere\n"
    )
    with pytest.raises(config.ConfigError) as caught:
        config.parse_text(text, "c.yaml")
    message = str(caught.value)
    assert "c.yaml:4:18: server.credentials[0].role: ('admin') must be one of" in message
    assert "server.credentials[1].name: ('am') names another credential too" in message
    assert "server.credentials[1].token_file: set token_file or token_env" in message
    assert "server.listen: ('nowhere')" in message


# ------------------------------------------------------------------ secure by default
async def test_no_credential_configured_makes_an_operator_token_the_cli_reads(tmp_path, monkeypatch):
    engine = Recorder()
    async with (
        relkit.serving(engine.app()) as url,
        running(guard_config(url, tmp_path, "{}")) as (
            monitor,
            _,
            control,
        ),
    ):
        path = control_auth.generated_token_path(monitor.control_port)
        mode = stat.S_IMODE(path.stat().st_mode)
        token = path.read_text().strip()
        async with aiohttp.ClientSession() as session:
            anonymous = (await call(session, "GET", control + "/status"))[0]
            alerts = (
                await call(
                    session, "POST", control + "/api/v1/alerts", {"Authorization": f"Bearer {token}"}, ALERT
                )
            )[0]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = await asyncio.to_thread(cli.main, ["status", "--url", control, "--json"])
    assert anonymous == 401 and alerts == 403  # the generated token is an operator's, not Alertmanager's
    assert mode == 0o600 and len(token) >= 32
    assert code == 0 and "classes" in json.loads(out.getvalue())
    assert not path.exists()  # removed at stop


# ------------------------------------------------------------------ throttling and rate limits
async def test_failed_auth_is_throttled_per_peer_with_one_log_line_per_burst(tmp_path, caplog):
    engine = Recorder()
    server = role_server(tmp_path, ", failed_auth_limit: 10, failed_auth_window_seconds: 30")
    async with (
        relkit.serving(engine.app()) as url,
        running(guard_config(url, tmp_path, server)) as (
            monitor,
            _,
            control,
        ),
    ):
        with caplog.at_level(logging.INFO, logger="specguard"):
            async with aiohttp.ClientSession() as session:
                answers = [
                    await call(session, "GET", control + "/status", {"Authorization": f"Bearer guess-{i}"})
                    for i in range(100)
                ]
                right = (await call(session, "GET", control + "/status", bearer("ops")))[0]
        gate_metrics = {
            reason: monitor.registry.get_sample_value(
                "specguard_control_refused_requests_total", {"reason": reason}
            )
            for reason in control_auth.REASONS
        }
    statuses = [status for status, _ in answers]
    assert statuses == [401] * 10 + [429] * 90
    assert all(int(headers["Retry-After"]) >= 1 for status, headers in answers if status == 429)
    assert right == 429  # the peer waits out its window, even with a right token
    lines = [r for r in caplog.records if r.name == "specguard.control"]
    assert len(lines) == 1, [r.getMessage() for r in lines]  # one line for the burst, not one per request
    assert gate_metrics["unauthenticated"] == 10 and gate_metrics["throttled"] == 91
    assert "guess-" not in caplog.text  # an offered token is never logged


async def test_webhook_and_override_floods_get_429_with_retry_after(tmp_path):
    engine = Recorder()
    server = role_server(
        tmp_path, ", alerts_per_second: 1, alerts_burst: 20, overrides_per_second: 1, overrides_burst: 5"
    )
    async with (
        relkit.serving(engine.app()) as url,
        running(guard_config(url, tmp_path, server)) as (
            monitor,
            _,
            control,
        ),
    ):
        async with aiohttp.ClientSession() as session:
            flips = []
            for i in range(100):  # on/off flips of one alert, as fast as they go
                status = "firing" if i % 2 == 0 else "resolved"
                alert = {**ALERT, "status": status, "alerts": [{**ALERT["alerts"][0], "status": status}]}
                flips.append(await call(session, "POST", control + "/api/v1/alerts", bearer("am"), alert))
            pins = [
                await call(session, "POST", control + "/api/v1/overrides", bearer("ops"), OVERRIDE)
                for _ in range(20)
            ]
    accepted = [s for s, _ in flips if s == 200]
    assert 20 <= len(accepted) <= 23 and {s for s, _ in flips} == {200, 429}
    assert all(int(h["Retry-After"]) >= 1 for s, h in flips if s == 429)
    assert 5 <= sum(s == 200 for s, _ in pins) <= 7 and {s for s, _ in pins} == {200, 429}
    assert monitor.registry.get_sample_value(
        "specguard_control_refused_requests_total", {"reason": "rate_limited"}
    ) == len(flips) - len(accepted) + sum(s == 429 for s, _ in pins)


# ------------------------------------------------------------------ who did it
async def test_every_accepted_webhook_and_override_records_its_caller(tmp_path):
    engine = Recorder()
    async with (
        relkit.serving(engine.app()) as url,
        running(guard_config(url, tmp_path, role_server(tmp_path))) as (
            monitor,
            _,
            control,
        ),
    ):
        async with aiohttp.ClientSession() as session:
            webhook = (await call(session, "POST", control + "/api/v1/alerts", bearer("am"), ALERT))[0]
            override = (await call(session, "POST", control + "/api/v1/overrides", bearer("ops"), OVERRIDE))[
                0
            ]
            refused = (await call(session, "POST", control + "/api/v1/overrides", bearer("am"), OVERRIDE))[0]
    records, torn = audit_mod.read(tmp_path / "audit.jsonl")
    assert (webhook, override, refused) == (200, 200, 403) and torn == []
    hooks = [r for r in records if r.get("event") == "webhook"]
    assert hooks == [
        {
            "event": "webhook",
            "at": hooks[0]["at"],
            "caller": {
                "credential": "am",
                "peer": "127.0.0.1",
                "group_key": ALERT["groupKey"],
                "external_url": ALERT["externalURL"],
            },
            "accepted": 1,
            "outcomes": {"new": 1},
        }
    ]
    decisions = audit_mod.decisions(records)
    assert decisions and all(d["action"] == "pause" for d in decisions)
    assert all(d["caller"] == {"credential": "ops", "peer": "127.0.0.1"} for d in decisions)


# ------------------------------------------------------------------ plan_http: a follower's door
class ForgedDecider:
    """A 'decider' answering a fixed plan (any version it likes), recording the Authorization it got."""

    def __init__(self, doc) -> None:
        self.doc = doc
        self.auth: list[str | None] = []

    async def get(self, request: web.Request) -> web.Response:
        from specguard.monitor import planhttp

        self.auth.append(request.headers.get("Authorization"))
        body, etag = planhttp.render(self.doc)
        return web.Response(body=body, content_type="application/json", headers={"ETag": etag})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/plan", self.get)
        return app


async def test_a_follower_sends_its_token_and_takes_only_a_newer_plan(tmp_path):
    from specguard.exporters.routing import Router
    from specguard.monitor import daemon, planhttp
    from specguard.monitor import state as state_mod
    from specguard.monitor.actuators import RouterActuator
    from tests.monitor.guardkit import CREATIVE, POOLS
    from tests.monitor.test_daemon import POLICY, Clock

    (tmp_path / "follower.token").write_text(TOKENS["fleet"] + "\n")
    settings = guard_wiring.guard_config.PlanHttpSettings(
        ("http://127.0.0.1:1",), token_file=str(tmp_path / "follower.token")
    )
    pinned = state_mod.PlanDocument(
        7, 0.0, {CREATIVE: daemon.guard.initial_state(CREATIVE, POLICY)}, dict(POLICY.pools)
    )
    router = Router(POOLS, default_pool="spec-k4", nospec_pool="nospec")
    decider = ForgedDecider(pinned)
    async with relkit.serving(decider.app()) as url:
        source = guard_wiring.plan_source(settings)
        source.urls = [planhttp.plan_url(url)]
        follower = daemon.Guard(
            POLICY,
            actuators=[RouterActuator(router)],
            store=state_mod.PlanStore(tmp_path / "plan.json"),
            clock=Clock(),
            follow=source,
        )
        try:
            await follower.evaluate()
            assert follower.version == 7 and follower.counters.plans_ignored == 0
            # the same URL now answers an older version and a forged equal one: both ignored
            older = state_mod.PlanDocument(3, 0.0, {}, dict(POLICY.pools))
            decider.doc = older
            source.etag = None
            await follower.evaluate()
            forged = state_mod.PlanDocument(7, 0.0, {}, dict(POLICY.pools))
            decider.doc = forged
            source.etag = None
            await follower.evaluate()
            kept = follower.version, set(follower.states)
        finally:
            await follower.stop()
    assert decider.auth[0] == f"Bearer {TOKENS['fleet']}"
    assert kept == (7, {CREATIVE}) and follower.counters.plans_ignored == 2


async def test_the_plan_endpoint_needs_a_follower_credential(tmp_path):
    from specguard.errors import SourceError
    from specguard.monitor import planhttp

    engine = Recorder()
    async with (
        relkit.serving(engine.app()) as url,
        running(guard_config(url, tmp_path, role_server(tmp_path))) as (
            _,
            _,
            control,
        ),
    ):
        anonymous = planhttp.HttpPlanSource([control])
        follower = planhttp.HttpPlanSource([control], token=TOKENS["fleet"])
        try:
            with pytest.raises(SourceError, match="HTTP 401"):
                await anonymous.read_plan()
            doc = await follower.read_plan()
        finally:
            await anonymous.close()
            await follower.close()
    assert doc is not None and doc.version >= 0


# ------------------------------------------------------------------ TLS and mTLS
def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["/usr/bin/openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(where: Path) -> None:
    """A CA; a server certificate for 127.0.0.1; a client certificate whose CN is ``ops``."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.crt", cwd=where)  # fmt: skip
    for name, cn, ext in (("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1"), ("client", "ops", None)):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=where)  # fmt: skip
        extra = ["-extfile", f"{name}.ext"] if ext else []
        if ext:
            (where / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-out", f"{name}.crt", *extra, cwd=where)  # fmt: skip


async def test_mtls_control_listener_requires_a_client_cert_and_reloads_its_own(tmp_path):
    import ssl

    assert Path("/usr/bin/openssl").exists(), "the mTLS test makes its certificates with openssl"
    make_certs(tmp_path)
    tls = (
        f', tls: {{cert_file: "{tmp_path / "server.crt"}", key_file: "{tmp_path / "server.key"}",'
        f' client_ca_file: "{tmp_path / "ca.crt"}"}}'
    )
    engine = Recorder()
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    client.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
    no_cert = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

    async def serial(url: str) -> int:
        host, port = url.removeprefix("https://").rsplit(":", 1)
        _, writer = await asyncio.open_connection(host, int(port), ssl=client)
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        finally:
            writer.close()
        return hash(der)

    async with (
        relkit.serving(engine.app()) as url,
        running(guard_config(url, tmp_path, role_server(tmp_path, tls))) as (
            monitor,
            _,
            control,
        ),
    ):
        assert control.startswith("https://")
        async with aiohttp.ClientSession() as session:
            # the client certificate's CN (ops) names the operator credential: no bearer needed
            with_cert = (await session.get(control + "/status", ssl=client)).status
            am_token = (
                await session.post(control + "/api/v1/alerts", json=ALERT, headers=bearer("am"), ssl=client)
            ).status
            with pytest.raises(aiohttp.ClientError):
                await session.get(control + "/status", ssl=no_cert, headers=bearer("ops"))
        before = await serial(control)
        (tmp_path / "server.crt").unlink()
        openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "3", "-out", "server.crt", "-extfile", "server.ext", cwd=tmp_path)  # fmt: skip
        reloaded = await asyncio.to_thread(monitor.tls.check)
        after = await serial(control)
    assert with_cert == 200 and am_token == 200  # a bearer token still names its own credential
    assert reloaded and before != after


def test_a_bad_tls_file_is_a_config_error_at_start(tmp_path):
    cfg = tmp_path / "specguard.yaml"
    cfg.write_text(
        'pools: [{name: a, url: "http://127.0.0.1:9", engine: vllm}]\n'
        'tap: {listen: "127.0.0.1:0"}\nscrape: {interval_seconds: 3600}\n'
        f'server: {{tls: {{cert_file: "{tmp_path / "none.crt"}", key_file: "{tmp_path / "none.key"}"}}}}\n'
    )
    done = relkit.run_specguard(cfg)
    assert done.returncode == 2 and done.stderr.startswith(f"Error: {cfg}: server.tls: cannot load"), (
        done.stderr
    )
    assert "Traceback" not in done.stderr
