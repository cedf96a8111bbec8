"""Security: authentication of the mutating endpoints, body limits, no client-controlled upstream,
tokens never logged, and the Kubernetes manifests' pod security and RBAC."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from specguard.errors import ConfigError
from specguard.monitor import control_auth, guard_wiring
from specguard.monitor.app import Monitor
from tests.reliability import relkit

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "rel-7c1e9b52d0a4f3"


# ------------------------------------------------------------------ token required
def guard_config(urls, tmp_path, server: str, listen: str = "127.0.0.1:0"):
    extra = (
        f'tap: {{listen: "{listen}"}}\nguard: {{interval_seconds: 3600}}\n'
        f'actuators: {{plan_file: "{tmp_path / "plan.json"}", audit_log: "{tmp_path / "audit.jsonl"}"}}\n'
        f"server: {server}\n"
    )
    return relkit.monitor_config(urls, extra=extra)


ALERT = {
    "version": "4",
    "status": "firing",
    "alerts": [{"status": "firing", "labels": {"alertname": "X", "task_type": "chat"}, "fingerprint": "f"}],
}
OVERRIDE = {"action": "pause", "task_type": "chat"}


@pytest.fixture
async def pool():
    upstream = relkit.Misbehaving("ok")
    async with relkit.serving(upstream.app()) as url:
        yield url


async def start_with_guard(cfg):
    """(monitor, tap URL, control URL) of a running monitor with the guard."""
    monitor = Monitor(cfg)
    guard_wiring.configure(monitor, cfg)
    tap = await monitor.start("127.0.0.1", 0)
    return monitor, tap, monitor.control_url


@pytest.mark.parametrize(
    ("server", "headers", "status"),
    [
        pytest.param("{}", {}, 401, id="no-token-configured"),
        pytest.param("{}", {"Authorization": f"Bearer {TOKEN}"}, 401, id="no-token-configured-any-bearer"),
        pytest.param("TOKENFILE", {}, 401, id="token-missing"),
        pytest.param("TOKENFILE", {"Authorization": f"Bearer {TOKEN[:-1]}x"}, 401, id="token-last-char"),
        pytest.param("TOKENFILE", {"Authorization": f"Bearer {TOKEN}x"}, 401, id="token-longer"),
        pytest.param("TOKENFILE", {"Authorization": f"Basic {TOKEN}"}, 401, id="wrong-scheme"),
        pytest.param("TOKENFILE", {"Authorization": f"Bearer {TOKEN}"}, 200, id="token-right"),
        pytest.param("{insecure_loopback: true}", {}, 200, id="insecure-loopback"),
    ],
)
async def test_mutating_endpoints_need_a_token(pool, tmp_path, server, headers, status, caplog):
    if server == "TOKENFILE":
        (tmp_path / "token").write_text(TOKEN + "\n")
        server = f'{{token_file: "{tmp_path / "token"}"}}'
    cfg = guard_config({"spec-k4": pool}, tmp_path, server)
    with caplog.at_level(logging.DEBUG):
        monitor, _, url = await start_with_guard(cfg)
        try:
            async with aiohttp.ClientSession() as session:
                got = []
                for path, body in (("/api/v1/alerts", ALERT), ("/api/v1/overrides", OVERRIDE)):
                    async with session.post(url + path, json=body, headers=headers) as response:
                        got.append(response.status)
                async with session.get(url + "/status") as response:
                    status_text = await response.text()
                async with session.get(url + "/metrics") as response:
                    metrics_text = await response.text()
        finally:
            await monitor.stop()
    assert got == [status, status]
    guard = monitor.guard
    assert bool(len(guard.alerts)) is (status == 200)
    assert any(s.paused for s in guard.states.values()) is (status == 200)
    # the token never appears in logs, /status or /metrics
    for text in (caplog.text, status_text, metrics_text, repr(cfg.sections.get("server"))):
        assert TOKEN not in text and TOKEN[:-1] not in text


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "10.1.2.3:8090", "[::]:0", "example.com:80"])
def test_insecure_mode_refuses_a_non_loopback_address(tmp_path, listen):
    server = f'{{insecure_loopback: true, listen: "{listen}"}}'  # the control listener is what counts
    cfg = guard_config({"spec-k4": "http://127.0.0.1:9"}, tmp_path, server, listen)
    with pytest.raises(ConfigError, match="not loopback"):
        guard_wiring.build(Monitor(cfg), cfg)


def test_listen_override_cannot_expose_insecure_api(tmp_path):
    """``specguard run --control-listen`` overrides server.listen before the guard is wired, so the
    loopback check of ``server.insecure_loopback: true`` sees the address actually bound: refused,
    exit 2."""
    cfg = tmp_path / "specguard.yaml"
    cfg.write_text(
        'pools: [{name: a, url: "http://127.0.0.1:9", engine: vllm}]\n'
        'tap: {listen: "127.0.0.1:0"}\nscrape: {interval_seconds: 3600}\n'
        "server: {insecure_loopback: true}\n"
    )
    port = relkit.closed_port()
    command = [sys.executable, "-m", "specguard", "run", "--config", str(cfg)]
    proc = subprocess.Popen(
        [*command, "--control-listen", f"0.0.0.0:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        _, stderr = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.communicate(timeout=10)
        raise AssertionError("specguard run served an insecure API on 0.0.0.0") from None
    assert proc.returncode == 2 and "not loopback" in stderr, stderr


def test_unreadable_token_refuses_to_start(tmp_path):
    """``specguard run`` with a token file that is missing or empty: exit 2 and a clear error."""
    (tmp_path / "empty").write_text("\n")
    for name, expect in (("missing", "cannot read"), ("empty", "is empty")):
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(
            'pools: [{name: a, url: "http://127.0.0.1:9", engine: vllm}]\n'
            'tap: {listen: "127.0.0.1:0"}\n'
            f'server: {{token_file: "{tmp_path / name}"}}\n'
        )
        done = relkit.run_specguard(cfg)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("Error: ") and "server.token_file: " in done.stderr
        assert expect in done.stderr
        assert "Traceback" not in done.stderr


def test_token_comparison_is_constant_time():
    """``hmac.compare_digest`` at the control listener's door, and no ``==``/``!=`` on a token anywhere."""
    source = inspect.getsource(control_auth.Gate.identify)
    assert "hmac.compare_digest(" in source
    offenders = []
    for path in sorted((ROOT / "specguard").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            if not any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
                continue
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Constant) and s.value is None for s in sides):
                continue
            text = ast.unparse(node)
            if "token" in text.lower() and "tokens" not in text.lower():
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert offenders == []


# ------------------------------------------------------------------ body limits
async def chunked(data: bytes, size: int = 4096):
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize("mode", ["content-length", "chunked"])
async def test_body_size_limits(pool, tmp_path, mode):
    (tmp_path / "token").write_text(TOKEN)
    server = f'{{token_file: "{tmp_path / "token"}", max_body_bytes: 2048}}'
    cfg = relkit.monitor_config({"spec-k4": pool}, extra=f"tap: {{max_body_bytes: 4096}}\nserver: {server}\n")
    monitor, tap, control = await start_with_guard(cfg)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    big_tap = json.dumps({**relkit.chat_body(), "pad": "x" * 8000}).encode()
    big_alert = json.dumps({**ALERT, "pad": "x" * 4000}).encode()
    try:
        async with aiohttp.ClientSession() as session:
            statuses = []
            for path, data in (
                ("/v1/chat/completions", big_tap),
                ("/api/v1/alerts", big_alert),
                ("/api/v1/overrides", big_alert),
            ):
                payload = chunked(data) if mode == "chunked" else data
                url = tap if path.startswith("/v1/") else control
                async with session.post(url + path, data=payload, headers=headers) as response:
                    statuses.append(response.status)
            async with session.post(tap + "/v1/chat/completions", json=relkit.chat_body()) as response:
                statuses.append(response.status)  # a normal request afterwards is fine
    finally:
        await monitor.stop()
    assert statuses == [413, 413, 413, 200]
    assert len(monitor.guard.alerts) == 0


# ------------------------------------------------------------------ no client-controlled upstream
class Recorder:
    """An upstream that records what reached it (and can answer with a redirect)."""

    def __init__(self, redirect_to: str | None = None):
        self.seen: list[tuple[str, str, str]] = []
        self.redirect_to = redirect_to

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.raw_path, request.headers.get("Host", "")))
        if self.redirect_to and request.path != "/metrics":  # (a scrape may follow, like Prometheus)
            raise web.HTTPTemporaryRedirect(self.redirect_to)
        return web.json_response({"ok": True})

    def app(self):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


async def raw_request(url: str, head: str, body: bytes = b"") -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.encode() + body)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1 << 16), 10)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_tap_forwards_only_to_configured_pools():
    evil, pool_side = Recorder(), Recorder()
    async with relkit.serving(evil.app()) as evil_url, relkit.serving(pool_side.app()) as pool_url:
        redirector = Recorder(redirect_to=evil_url + "/stolen")
        async with relkit.serving(redirector.app()) as redirect_url:
            # no holdout or probe draws: the redirecting pool must get the class every time
            cfg = relkit.monitor_config(
                {"spec-k4": pool_url, "nospec": redirect_url},
                extra="tap: {holdout_share: 0, probe_share: 0}\n",
            )
            monitor = Monitor(cfg)
            monitor.router.set_plan({("other", "high", "low"): "nospec"})
            url = await monitor.start("127.0.0.1", 0)
            evil_hostport = evil_url.removeprefix("http://")
            body = json.dumps(relkit.chat_body()).encode()
            answers = []
            try:
                targets = [
                    f"{evil_url}/v1/chat/completions",  # absolute-form request target
                    f"//{evil_hostport}/v1/chat/completions",
                    f"/..//{evil_hostport}/v1/chat/completions",
                    "/%2e%2e/%2e%2e/v1/chat/completions",
                    f"/v1/chat/completions?next=//{evil_hostport}/",
                    f"@{evil_hostport}/v1/chat/completions",
                    f"/\\{evil_hostport}/v1/models",
                ]
                for target in targets:
                    for method in ("POST", "GET"):
                        head = (
                            f"{method} {target} HTTP/1.1\r\nHost: {evil_hostport}\r\n"
                            f"X-Forwarded-Host: {evil_hostport}\r\nContent-Type: application/json\r\n"
                            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                        )
                        answers.append(((method, target), await raw_request(url, head, body)))
                head = (
                    f"CONNECT {evil_hostport} HTTP/1.1\r\nHost: {evil_hostport}\r\nConnection: close\r\n\r\n"
                )
                answers.append((("CONNECT", evil_hostport), await raw_request(url, head)))
                async with aiohttp.ClientSession() as session:  # a pool redirecting elsewhere
                    redirect_body = {**relkit.chat_body(), "temperature": 1.0}
                    async with session.post(
                        f"{url}/v1/chat/completions", json=redirect_body, allow_redirects=False
                    ) as response:
                        redirected = (response.status, response.headers.get("Location"))
            finally:
                await monitor.stop()
    assert evil.seen == []  # nothing ever reached a host that is not a configured pool
    assert redirected == (307, evil_url + "/stolen")  # passed back to the client, not followed
    assert redirector.seen and all(
        host == redirect_url.removeprefix("http://") for _, _, host in redirector.seen
    )
    pool_host = pool_url.removeprefix("http://")
    assert pool_side.seen and all(host == pool_host for _, _, host in pool_side.seen)
    statuses = {key: int(answer.split(b" ", 2)[1]) for key, answer in answers}
    evil_hostport = evil_url.removeprefix("http://")
    served = {f"{evil_url}/v1/chat/completions", f"/v1/chat/completions?next=//{evil_hostport}/"}
    expected = {}
    for method, target in statuses:
        if target.startswith("@"):
            expected[(method, target)] = 400  # not a request target at all
        elif target in served:  # the inference API: POST served by the pool, any other method 405
            expected[(method, target)] = 200 if method == "POST" else 405
        else:  # another spelling of a path (or CONNECT): not on the tap's allowlist
            expected[(method, target)] = 404
    assert statuses == expected
    assert all(path.startswith("/") for _, path, _ in pool_side.seen)


# ------------------------------------------------------------------ Kubernetes manifests
def rendered() -> list[tuple[str, list[dict]]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) renders deploy/kubernetes"
    out = []
    for variant in ("deploy/kubernetes", "deploy/kubernetes/pre-1.29"):
        done = subprocess.run(
            [kubectl, "kustomize", str(ROOT / variant)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        out.append((variant, [d for d in yaml.safe_load_all(done.stdout) if d]))
    return out


@pytest.fixture(scope="module")
def manifests():
    return rendered()


def test_pods_run_non_root_with_read_only_root_fs(manifests):
    checked = 0
    for variant, docs in manifests:
        for doc in docs:
            if doc["kind"] not in ("Deployment", "StatefulSet", "DaemonSet", "Job", "Pod"):
                continue
            spec = doc["spec"]["template"]["spec"] if doc["kind"] != "Pod" else doc["spec"]
            pod = spec.get("securityContext") or {}
            where = f"{variant}: {doc['kind']}/{doc['metadata']['name']}"
            assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), where
            assert not any("hostPath" in v for v in spec.get("volumes", [])), where
            assert pod.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost"), where
            for container in spec.get("initContainers", []) + spec["containers"]:
                sc = {**pod, **(container.get("securityContext") or {})}
                name = f"{where} container {container['name']}"
                assert sc.get("runAsNonRoot") is True, name
                assert sc.get("runAsUser", 1) != 0 and sc.get("runAsGroup", 1) != 0, name
                assert sc.get("readOnlyRootFilesystem") is True, name
                assert sc.get("allowPrivilegeEscalation") is False, name
                assert not sc.get("privileged"), name
                assert sc.get("capabilities", {}).get("drop") == ["ALL"], name
                assert not sc.get("capabilities", {}).get("add"), name
                checked += 1
    assert checked >= 4


def test_rbac_is_least_privilege(manifests):
    for variant, docs in manifests:
        kinds = {d["kind"] for d in docs}
        assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds, variant
        roles = [d for d in docs if d["kind"] == "Role"]
        assert roles, variant
        plan_maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
        leases = {d["metadata"]["name"] for d in docs if d["kind"] == "Lease"}
        for role in roles:
            for rule in role["rules"]:
                if rule["apiGroups"] == ["coordination.k8s.io"]:  # leader election on its one Lease
                    assert rule["resources"] == ["leases"] and set(rule["verbs"]) <= {"get", "update"}, rule
                    assert rule.get("resourceNames") and set(rule["resourceNames"]) <= leases, rule
                    continue
                assert rule["apiGroups"] == [""] and rule["resources"] == ["configmaps"], rule
                assert set(rule["verbs"]) <= {"get", "patch", "update", "watch"}, rule
                assert rule.get("resourceNames") and set(rule["resourceNames"]) <= plan_maps, rule
                assert "*" not in json.dumps(rule), rule
        for binding in (d for d in docs if d["kind"] == "RoleBinding"):
            assert binding["roleRef"]["kind"] == "Role"
            assert all(s["kind"] == "ServiceAccount" for s in binding["subjects"])


def test_shipped_configs_never_run_the_api_insecure(manifests):
    """No shipped config serves the mutating API without a token; one that receives alerts has one."""
    seen = 0
    for variant, docs in manifests:
        for doc in docs:
            if doc["kind"] != "ConfigMap":
                continue
            for name, text in (doc.get("data") or {}).items():
                data = yaml.safe_load(text) if name.endswith((".yaml", ".yml")) else None
                if not isinstance(data, dict) or "pools" not in data:
                    continue
                seen += 1
                where = f"{variant}: ConfigMap {doc['metadata']['name']} key {name}"
                server = data.get("server") or {}
                assert not server.get("insecure_loopback"), where
                assert not re.search(r"(?m)^\s*token\s*:", text), where  # no inline token key
                receives_alerts = (data.get("alertmanager") or {}).get("enabled", True)
                follower = (data.get("actuators") or {}).get("follow", False)
                if receives_alerts and not follower:
                    assert server.get("token_file") or server.get("token_env"), where
    assert seen >= 2
