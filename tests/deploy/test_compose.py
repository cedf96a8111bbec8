"""deploy/compose: the compose file validates against the Compose Specification schema
(vendored by check-jsonschema, offline) and every file, command and config it refers to is real.
Docker is not needed: the configs are checked with the same tools the containers run
(promtool, amtool, specguard's own config parser and CLI)."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml
from deployhelp import DASHBOARD, DEPLOY, RULES, run_promtool

from specguard import cli
from specguard.monitor import config as specguard_config

COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]


def compose_schema() -> dict:
    ref = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(ref.read_text())


def test_compose_file_validates_against_the_compose_spec():
    jsonschema.validate(COMPOSE, compose_schema())


def test_the_schema_check_rejects_a_typo():
    broken = {"services": {"sim": {**SERVICES["sim"], "comand": ["simulate"]}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, compose_schema())


def test_the_stack_has_every_part():
    assert set(SERVICES) == {"sim", "specguard", "prometheus", "alertmanager", "grafana"}


def bind_mounts() -> list[tuple[str, str, Path]]:
    out = []
    for name, svc in SERVICES.items():
        for vol in svc.get("volumes", []):
            source, target = vol.split(":")[:2]
            if source.startswith("."):
                out.append((name, target, (COMPOSE_DIR / source).resolve()))
    return out


@pytest.mark.parametrize(
    "service,target,source", bind_mounts(), ids=[f"{s}:{t}" for s, t, _ in bind_mounts()]
)
def test_every_bind_mounted_file_exists(service: str, target: str, source: Path):
    assert source.is_file(), f"{service}: {source} (mounted at {target}) does not exist"


def test_ports_are_published_on_loopback_only():
    for name, svc in SERVICES.items():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port}"


def test_specguard_commands_parse_with_the_real_cli():
    parser = cli.build_parser()
    args = parser.parse_args(SERVICES["specguard"]["command"])
    assert args.command == "run" and args.config == "/etc/specguard/specguard.yaml"


def test_simulator_ports_match_the_pools_specguard_is_given(capsys):
    # `specguard simulate ... --print-config` shows the pools and ports the sim service will serve
    assert cli.main([*SERVICES["sim"]["command"], "--print-config"]) == 0
    sim = json.loads(capsys.readouterr().out)
    served = {p["name"]: f"http://sim:{p['port']}" for p in sim["pools"]}
    cfg = specguard_config.load(COMPOSE_DIR / "specguard.yaml")
    assert {p.name: p.url for p in cfg.exporter.pools} == served
    assert {f"{port}" for port in SERVICES["sim"]["expose"]} == {u.rsplit(":", 1)[1] for u in served.values()}
    assert sim["host"] == "0.0.0.0"


def test_dockerfile_builds_from_the_repository_root():
    build = SERVICES["specguard"]["build"]
    root = (COMPOSE_DIR / build["context"]).resolve()
    dockerfile = root / build["dockerfile"]
    assert dockerfile.is_file() and (root / "pyproject.toml").is_file()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (root / src).exists(), src


def test_specguard_config_is_valid_and_points_at_the_simulator():
    cfg = specguard_config.load(COMPOSE_DIR / "specguard.yaml")
    assert {p.name: p.url.rsplit(":", 1)[0] for p in cfg.exporter.pools} == {
        "spec-k4": "http://sim",
        "spec-k2": "http://sim",
        "nospec": "http://sim",
    }
    assert cfg.exporter.tap.listen.endswith(":8090")
    server = cfg.sections["server"]
    assert server.listen == "0.0.0.0:8091"
    roles = {c.name: c.roles for c in server.credentials}
    assert roles == {"alertmanager": ("alertmanager",), "operator": ("operator",)}
    mounted = {t: s for _, t, s in bind_mounts()}
    assert all(mounted[c.token_file].is_file() for c in server.credentials)


def test_prometheus_config_passes_promtool(tmp_path: Path):
    prom = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    (rule_file,) = prom["rule_files"]
    mounted = {t: s for _, t, s in bind_mounts()}
    assert mounted[rule_file] == RULES
    prom["rule_files"] = [str(RULES)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(prom))
    out = run_promtool("check", "config", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert "specguard:8090" in targets


def test_alertmanager_config_passes_amtool_and_routes_to_specguard():
    amtool = shutil.which("amtool")
    assert amtool, "amtool comes with Debian's prometheus-alertmanager"
    path = COMPOSE_DIR / "alertmanager.yml"
    out = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    am = yaml.safe_load(path.read_text())
    (hook,) = next(r for r in am["receivers"] if r["name"] == "specguard")["webhook_configs"]
    assert hook["url"] == "http://specguard:8091/api/v1/alerts" and hook["send_resolved"] is True
    assert hook["http_config"]["authorization"]["type"] == "Bearer"
    mounted = {t: s for _, t, s in bind_mounts()}
    assert mounted[hook["http_config"]["authorization"]["credentials_file"]].is_file()
    routed = subprocess.run(
        [
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={path}",
            "alertname=SpecGuardRelativeCostAboveOne",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert routed.stdout.split() == ["specguard"], routed.stdout + routed.stderr


def test_grafana_provisions_the_shipped_dashboard():
    mounts = {t: s for svc, t, s in bind_mounts() if svc == "grafana"}
    provider = yaml.safe_load((COMPOSE_DIR / "grafana" / "dashboards.yaml").read_text())["providers"][0]
    dashboards = [t for t, s in mounts.items() if s == DASHBOARD]
    assert dashboards and dashboards[0].startswith(provider["options"]["path"] + "/")
    ds = yaml.safe_load((COMPOSE_DIR / "grafana" / "datasources.yaml").read_text())["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
