"""deploy/kubernetes: kustomize renders, the output validates against the Kubernetes API schemas
(kubernetes-validate ships them, offline), and the packaging rules of ops-conventions §5 hold."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from deployhelp import DASHBOARD, DEPLOY, EXPORTED, KUSTOMIZE_DIR, RULES, run_promtool

from specguard.monitor import config as specguard_config

NATIVE_SIDECAR_MIN = "1.29.0"
SCHEMA_VERSIONS = [NATIVE_SIDECAR_MIN, kubernetes_validate.latest_version()]
CRD_KINDS = {"PodMonitor", "PrometheusRule"}


def kustomize(path: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) is needed to render deploy/kubernetes"
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


BASE = kustomize(KUSTOMIZE_DIR)
FALLBACK = kustomize(KUSTOMIZE_DIR / "pre-1.29")


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def engines(docs: list[dict]) -> list[dict]:
    return [
        d
        for d in by_kind(docs, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/name") == "engine"
    ]


def pod_specs(docs: list[dict]) -> list[dict]:
    """Pod specs of the engine Deployments (specguard as a sidecar)."""
    return [d["spec"]["template"]["spec"] for d in engines(docs)]


def guard_spec() -> dict:
    (guard,) = [d for d in by_kind(BASE, "Deployment") if d["metadata"]["name"] == "specguard-guard"]
    return guard["spec"]["template"]["spec"]


def configmap_text(prefix: str, key: str) -> str:
    cm = next(d for d in by_kind(BASE, "ConfigMap") if d["metadata"]["name"].startswith(prefix))
    return cm["data"][key]


def ids(docs: list[dict]) -> list[str]:
    return [f"{d['kind']}/{d['metadata']['name']}" for d in docs]


CORE = [d for d in BASE if d["kind"] not in CRD_KINDS]


def load_sync():
    spec = importlib.util.spec_from_file_location("sync_generated", DEPLOY / "sync_generated.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_render_has_every_piece():
    kinds = sorted({d["kind"] for d in BASE})
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "Lease",
            "NetworkPolicy",
            "PodMonitor",
            "PrometheusRule",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    )
    pools = {d["metadata"]["labels"]["specguard.io/pool"] for d in engines(BASE)}
    assert pools == {"spec-k4", "nospec"}
    assert guard_spec()["containers"][0]["name"] == "specguard"


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("doc", CORE, ids=ids(CORE))
def test_rendered_objects_validate_strictly_against_the_api_schema(doc: dict, version: str):
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("doc", engines(FALLBACK), ids=ids(engines(FALLBACK)))
def test_fallback_validates_on_a_pre_sidecar_cluster(doc: dict):
    kubernetes_validate.validate(doc, "1.25.0", strict=True)


def test_native_sidecar_is_rejected_by_pre_1_29_schema():
    # the schema check is real: restartPolicy on an init container does not exist before 1.28/1.29
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(engines(BASE)[0], "1.25.0", strict=True)


def sidecar(spec: dict) -> dict:
    return next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "specguard")


@pytest.mark.parametrize("spec", pod_specs(BASE), ids=["spec-k4", "nospec"])
def test_specguard_is_a_native_sidecar_with_dependency_free_probes(spec: dict):
    side = sidecar(spec)
    assert side in spec["initContainers"] and side["restartPolicy"] == "Always"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # a readiness probe on a native sidecar gates the pod's readiness: it may only check
        # specguard's own server, never the engine, Prometheus or the API server
        assert side[probe]["httpGet"] == {"path": "/livez", "port": "specguard"}, probe
    assert {c["name"] for c in spec["containers"]} == {"engine"}


def test_fallback_moves_the_sidecar_into_containers():
    for spec in pod_specs(FALLBACK):
        assert "initContainers" not in spec
        assert [c["name"] for c in spec["containers"]] == ["engine", "specguard"]
        assert "restartPolicy" not in sidecar(spec)


@pytest.mark.parametrize("spec", [*pod_specs(BASE), guard_spec()], ids=["spec-k4", "nospec", "guard"])
def test_security_context_and_resources(spec: dict):
    assert spec["securityContext"]["runAsNonRoot"] is True
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], c["name"]
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], c["name"]


def role_of(service_account: str) -> dict:
    (binding,) = [
        b
        for b in by_kind(BASE, "RoleBinding")
        if [(x["kind"], x["name"]) for x in b["subjects"]] == [("ServiceAccount", service_account)]
    ]
    (role,) = [r for r in by_kind(BASE, "Role") if r["metadata"]["name"] == binding["roleRef"]["name"]]
    return role


def test_rbac_is_limited_to_the_one_plan_configmap():
    plan = {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["specguard-plan"]}
    sidecar_sa = {spec["serviceAccountName"] for spec in pod_specs(BASE)}
    assert sidecar_sa == {"specguard"}
    assert role_of("specguard")["rules"] == [{**plan, "verbs": ["get"]}], "sidecars only read the plan"
    assert guard_spec()["serviceAccountName"] == "specguard-guard"
    lease = {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["specguard-guard"],
    }
    assert role_of("specguard-guard")["rules"] == [
        {**plan, "verbs": ["get", "patch"]},
        {**lease, "verbs": ["get", "update"]},
    ]
    (made,) = by_kind(BASE, "Lease")  # created by kustomize: the guard cannot create it
    assert made["metadata"]["name"] == "specguard-guard"
    names = {d["metadata"]["name"] for d in by_kind(BASE, "ConfigMap")}
    assert "specguard-plan" in names, "the plan ConfigMap is created by kustomize (the guard cannot create)"
    assert not by_kind(BASE, "ClusterRole") and not by_kind(BASE, "ClusterRoleBinding")


def test_podmonitor_scrapes_a_port_every_specguard_pod_declares():
    (pm,) = by_kind(BASE, "PodMonitor")
    (expr,) = pm["spec"]["selector"]["matchExpressions"]
    assert expr["key"] == "app.kubernetes.io/name" and expr["operator"] == "In"
    for dep in by_kind(BASE, "Deployment"):
        assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] in expr["values"]
        spec = dep["spec"]["template"]["spec"]
        ports = {
            p["name"] for c in spec.get("initContainers", []) + spec["containers"] for p in c.get("ports", [])
        }
        for ep in pm["spec"]["podMetricsEndpoints"]:
            assert ep["port"] in ports and ep["path"] == "/metrics"
    assert pm["metadata"]["labels"]["release"], "kube-prometheus-stack selects on `release`"


def test_prometheusrule_is_the_rules_file(tmp_path: Path):
    (rule,) = by_kind(BASE, "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert rule["metadata"]["labels"]["release"]
    # and what the operator will load passes promtool
    path = tmp_path / "from-prometheusrule.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = run_promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_configmap_is_labelled_for_the_grafana_sidecar():
    cm = next(d for d in by_kind(BASE, "ConfigMap") if d["metadata"]["name"] == "specguard-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["specguard-overview.json"]) == json.loads(DASHBOARD.read_text())


def test_generated_copies_are_in_sync():
    for path, text in load_sync().outputs().items():
        assert path.read_text() == text, f"{path} is stale: run python3 deploy/sync_generated.py"


def test_sidecar_config_is_a_valid_specguard_config_that_follows_the_plan():
    cm = next(d for d in by_kind(BASE, "ConfigMap") if d["metadata"]["name"].startswith("specguard-config"))
    cfg = specguard_config.parse_text(cm["data"]["specguard.yaml"], "specguard.yaml")
    acts = cfg.sections["actuators"]
    assert acts.follow and acts.router and acts.configmap.name == "specguard-plan"
    services = {d["metadata"]["name"] for d in by_kind(BASE, "Service")}
    for pool in cfg.exporter.pools:
        assert pool.url.split("//")[1].split(":")[0] in services, pool.url
    # the volume that mounts it points at the generated (hashed) ConfigMap name
    for spec in pod_specs(BASE):
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["specguard-config"]["configMap"]["name"] == cm["metadata"]["name"]


def test_guard_patches_exactly_the_configmap_the_role_allows():
    cm = next(
        d for d in by_kind(BASE, "ConfigMap") if d["metadata"]["name"].startswith("specguard-guard-config")
    )
    cfg = specguard_config.parse_text(cm["data"]["guard.yaml"], "guard.yaml")
    target = cfg.sections["actuators"].configmap
    assert not cfg.sections["actuators"].follow and cfg.sections["alertmanager"].enabled
    role = role_of("specguard-guard")
    (binding,) = [b for b in by_kind(BASE, "RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["subjects"][0]["namespace"] == role["metadata"]["namespace"]
    assert [target.name] == role["rules"][0]["resourceNames"]
    assert target.namespace == role["metadata"]["namespace"]
    spec = guard_spec()
    assert {v["name"]: v for v in spec["volumes"]}["config"]["configMap"]["name"] == cm["metadata"]["name"]
    token = cfg.sections["server"].token_file
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    volume = mounts[str(Path(token).parent)]
    secret = next(v for v in spec["volumes"] if v["name"] == volume)["secret"]
    assert secret["optional"] is True, "a missing token Secret must not keep the guard from starting"
    # the guard's PromQL rules read RC across the sidecars (the recording rule), and it elects on
    # the one Lease its Role allows
    for rule in cfg.sections["guard"].rules:
        assert rule.query and "pool_class_load:specguard_relative_cost_per_token:ratio" in rule.query
    election = cfg.sections["actuators"].leader_election
    assert election.mode == "auto" and [election.lease_name] == role["rules"][1]["resourceNames"]
    env = {e["name"] for e in spec["containers"][0]["env"]}
    assert "SPECGUARD_POD_NAME" in env, "the leader election's identity"


DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"


def test_prometheusrule_uses_only_fields_the_operator_knows():
    # the fields of prometheus-operator's monitoring.coreos.com/v1 PrometheusRule (RuleGroup, Rule)
    import re

    (rule,) = by_kind(BASE, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and set(rule["spec"]) == {"groups"}
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "limit", "rules"}, group["name"]
        for r in group["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
            assert ("alert" in r) != ("record" in r)
            for key in ("for", "keep_firing_for"):
                if key in r:
                    assert re.fullmatch(DURATION, r[key]), (key, r[key])
            for key in ("labels", "annotations"):
                assert all(isinstance(v, str) for v in r.get(key, {}).values())


def test_seeded_plan_is_a_plan_the_guard_reads():
    from specguard.monitor import state

    cm = next(d for d in by_kind(BASE, "ConfigMap") if d["metadata"]["name"] == "specguard-plan")
    key = (
        specguard_config.parse_text(
            next(
                d for d in by_kind(BASE, "ConfigMap") if d["metadata"]["name"].startswith("specguard-config")
            )["data"]["specguard.yaml"],
            "specguard.yaml",
        )
        .sections["actuators"]
        .configmap.key
    )
    plan = state.decode(json.loads(cm["data"][key]), "specguard-plan")
    assert plan.version == 0 and not plan.states


def test_guard_promql_rules_parse(tmp_path: Path):
    import re

    cfg = specguard_config.parse_text(configmap_text("specguard-guard-config", "guard.yaml"), "guard.yaml")
    rules = [
        {"record": f"guard:rule_{i}:check", "expr": re.sub(r"\{\{\s*\w+\s*\}\}", "x", rule.query)}
        for i, rule in enumerate(cfg.sections["guard"].rules)
    ]
    path = tmp_path / "guard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "guard", "rules": rules}]}))
    out = run_promtool("check", "rules", str(path))
    assert rules and out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name", ["specguard.yaml", "guard.yaml"])
def test_a_shipped_config_without_a_shorter_k_pool_says_it_cannot_shorten_k(name):
    from specguard.monitor import config as config_mod

    path = KUSTOMIZE_DIR / "base" / name
    ks = sorted(p.num_speculative_tokens for p in config_mod.load(path).exporter.pools)
    shorter = [k for k in ks if 0 < k < max(ks)]
    if shorter:
        return  # a shorter-K pool ships: the guard can shorten K
    assert "cannot shorten K" in path.read_text(), f"{name}: no shorter-K pool, and it does not say so"
    deploy_md = " ".join((KUSTOMIZE_DIR.parents[1] / "docs" / "deploy.md").read_text().split())
    assert "in this deployment the guard cannot shorten K" in deploy_md


AUTOSCALING = kustomize(KUSTOMIZE_DIR / "autoscaling")


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("doc", AUTOSCALING, ids=ids(AUTOSCALING))
def test_the_autoscaling_objects_validate_strictly_against_the_api_schema(doc: dict, version: str):
    kubernetes_validate.validate(doc, version, strict=True)


def test_each_pool_scales_on_the_replicas_specguard_wants_for_it(tmp_path: Path):
    """One HPA per engine Deployment, on specguard_pool_desired_replicas of that Deployment's pool
    with an AverageValue target of 1 (the HPA then scales to exactly the value); the adapter rule
    serves that gauge and its query is valid PromQL once the adapter fills it in."""
    hpas = by_kind(AUTOSCALING, "HorizontalPodAutoscaler")
    pools = {d["metadata"]["name"]: d["metadata"]["labels"]["specguard.io/pool"] for d in engines(BASE)}
    assert sorted(h["spec"]["scaleTargetRef"]["name"] for h in hpas) == sorted(pools)
    (adapter,) = by_kind(AUTOSCALING, "ConfigMap")
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"]
    assert rule["resources"] == {"namespaced": False}  # the gauge carries no namespace of the HPA's
    exprs = []
    for hpa in hpas:
        assert hpa["metadata"]["namespace"] == by_kind(BASE, "Deployment")[0]["metadata"]["namespace"]
        (metric,) = hpa["spec"]["metrics"]
        external = metric["external"]
        name, selector = external["metric"]["name"], external["metric"]["selector"]["matchLabels"]
        assert name in EXPORTED and name == "specguard_pool_desired_replicas"
        assert selector == {"pool": pools[hpa["spec"]["scaleTargetRef"]["name"]]}
        assert external["target"] == {"type": "AverageValue", "averageValue": "1"}
        assert hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 0  # specguard waited
        assert rule["seriesQuery"].startswith(name + "{")
        exprs.append(
            rule["metricsQuery"]
            .replace("<<.Series>>", name)
            .replace("<<.LabelMatchers>>", f'pool="{selector["pool"]}"')
        )
    path = tmp_path / "adapter-queries.yaml"
    records = [{"record": f"adapter:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "adapter", "rules": records}]}))
    out = run_promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
