"""deploy/kubernetes, locked: who may reach which port (the NetworkPolicies, evaluated as the API
server defines them), the engines' API key held only by the tap, pod hardening, and the image the
manifests name built from the repository's Dockerfile."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from deployhelp import KUSTOMIZE_DIR, ROOT
from test_kubernetes import BASE, by_kind, configmap_text, engines, guard_spec, pod_specs, sidecar

from specguard.monitor import config as specguard_config

NAMESPACE = "llm-serving"


@dataclass(frozen=True)
class Peer:
    """A pod that opens a connection: its namespace's labels and its own."""

    name: str
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}


def selects(selector: dict, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels", "matchExpressions"}
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", "only In expressions are evaluated here"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def peer_matches(rule_peer: dict, peer: Peer, policy_namespace: str) -> bool:
    """NetworkPolicyPeer: a podSelector alone means the policy's namespace; both together mean
    pods matching the podSelector in namespaces matching the namespaceSelector."""
    assert "ipBlock" not in rule_peer
    ns_sel = rule_peer.get("namespaceSelector")
    if ns_sel is None:
        in_namespace = peer.namespace == policy_namespace
    else:
        in_namespace = selects(ns_sel, peer.namespace_labels)
    return in_namespace and selects(rule_peer.get("podSelector", {}), peer.labels)


def pod_template(deployment: dict) -> tuple[dict[str, str], dict[str, int]]:
    """The pod's labels (as rendered) and its named container ports."""
    template = deployment["spec"]["template"]
    spec = template["spec"]
    containers = spec.get("initContainers", []) + spec["containers"]
    ports = {p["name"]: p["containerPort"] for c in containers for p in c.get("ports", [])}
    return template["metadata"]["labels"], ports


POLICIES = by_kind(BASE, "NetworkPolicy")
DEPLOYMENTS = {d["metadata"]["name"]: d for d in by_kind(BASE, "Deployment")}


def allowed(peer: Peer, target: str, port_name: str) -> bool:
    """Would the cluster admit a TCP connection from `peer` to Deployment `target`'s named port?
    Ingress is allowed when no policy selects the pod, or when any selecting policy admits it."""
    labels, ports = pod_template(DEPLOYMENTS[target])
    assert port_name in ports, f"{target} declares no port {port_name!r}"
    selecting = [
        p
        for p in POLICIES
        if selects(p["spec"]["podSelector"], labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            port_ok = not rule.get("ports") or any(
                p.get("port") in (port_name, ports[port_name]) and p.get("protocol", "TCP") == "TCP"
                for p in rule["ports"]
            )
            peers = rule.get("from")
            peer_ok = not peers or any(peer_matches(rp, peer, NAMESPACE) for rp in peers)
            if port_ok and peer_ok:
                return True
    return False


ENGINE_POD = Peer("tap sidecar", NAMESPACE, {"app.kubernetes.io/name": "engine"})
GUARD_POD = Peer("decider", NAMESPACE, {"app.kubernetes.io/name": "specguard-guard"})
CLIENT = Peer("client in another namespace", "apps", {"app": "chat-frontend"})
NEIGHBOUR = Peer("other pod in the namespace", NAMESPACE, {"app": "batch-job"})
PROMETHEUS = Peer("prometheus", "monitoring", {"app.kubernetes.io/name": "prometheus"})
ALERTMANAGER = Peer("alertmanager", "monitoring", {"app.kubernetes.io/name": "alertmanager"})
FAKE_AM = Peer(
    "pod calling itself alertmanager elsewhere", "apps", {"app.kubernetes.io/name": "alertmanager"}
)

ENGINES = [d["metadata"]["name"] for d in engines(BASE)]
# (peer, deployment, port): may it connect?
MATRIX = [
    *[(who, e, "specguard", True) for e in ENGINES for who in (CLIENT, NEIGHBOUR, PROMETHEUS)],
    *[(who, e, "http", True) for e in ENGINES for who in (ENGINE_POD, GUARD_POD)],
    *[(who, e, "http", False) for e in ENGINES for who in (CLIENT, NEIGHBOUR, PROMETHEUS, ALERTMANAGER)],
    (PROMETHEUS, "specguard-guard", "specguard", True),
    (CLIENT, "specguard-guard", "specguard", False),
    (ALERTMANAGER, "specguard-guard", "control", True),
    (ENGINE_POD, "specguard-guard", "control", True),
    (CLIENT, "specguard-guard", "control", False),
    (NEIGHBOUR, "specguard-guard", "control", False),
    (FAKE_AM, "specguard-guard", "control", False),
    (PROMETHEUS, "specguard-guard", "control", False),
]


@pytest.mark.parametrize(
    ("peer", "target", "port", "expected"),
    MATRIX,
    ids=[f"{p.name}->{t}:{port}" for p, t, port, _ in MATRIX],
)
def test_network_policies_admit_exactly_the_callers_each_port_serves(peer, target, port, expected):
    assert allowed(peer, target, port) is expected


def test_every_pod_of_the_kustomization_is_under_a_default_deny():
    (deny,) = [p for p in POLICIES if not p["spec"].get("ingress")]
    for name, dep in DEPLOYMENTS.items():
        labels, _ = pod_template(dep)
        assert selects(deny["spec"]["podSelector"], labels), (
            f"{name} is not selected by {deny['metadata']['name']}"
        )


def test_every_named_port_a_policy_uses_is_declared_by_the_pods_it_selects():
    for policy in POLICIES:
        targets = [
            d for d in DEPLOYMENTS.values() if selects(policy["spec"]["podSelector"], pod_template(d)[0])
        ]
        assert targets, policy["metadata"]["name"]
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                for dep in targets:
                    assert port["port"] in pod_template(dep)[1], (policy["metadata"]["name"], port)


def test_the_engine_key_reaches_the_engine_and_the_tap_only():
    sidecar_cfg = specguard_config.parse_text(
        configmap_text("specguard-config", "specguard.yaml"), "specguard.yaml"
    )
    key_files = {pool.name: pool.api_key_file for pool in sidecar_cfg.exporter.pools}
    assert all(key_files.values()), f"every pool's key is configured: {key_files}"
    for spec in pod_specs(BASE):
        (engine,) = spec["containers"]
        assert "--api-key=$(ENGINE_API_KEY)" in engine["args"]
        (env,) = [e for e in engine["env"] if e["name"] == "ENGINE_API_KEY"]
        secret = env["valueFrom"]["secretKeyRef"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        side = sidecar(spec)
        for path in set(key_files.values()):
            directory, _, key = path.rpartition("/")
            (mount,) = [m for m in side["volumeMounts"] if m["mountPath"] == directory]
            assert mount.get("readOnly") is True
            assert volumes[mount["name"]]["secret"]["secretName"] == secret["name"] and key == secret["key"]
        # no other container of the pod sees the key's volume
        holders = [
            c["name"]
            for c in spec.get("initContainers", []) + spec["containers"]
            if any(
                volumes.get(m["name"], {}).get("secret", {}).get("secretName") == secret["name"]
                for m in c.get("volumeMounts", [])
            )
        ]
        assert holders == ["specguard"]


@pytest.mark.parametrize("spec", [*pod_specs(BASE), guard_spec()], ids=["spec-k4", "nospec", "guard"])
def test_pods_run_non_root_with_the_runtime_default_seccomp_profile(spec):
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}


def dockerfile_user() -> str:
    (user,) = re.findall(r"^USER\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    return user


def test_the_image_the_manifests_run_is_built_from_the_repository_dockerfile():
    images = {
        c["image"]
        for d in by_kind(BASE, "Deployment")
        for c in d["spec"]["template"]["spec"].get("initContainers", [])
        + d["spec"]["template"]["spec"]["containers"]
        if c["name"] == "specguard"
    }
    (image,) = images
    deploy_md = (ROOT / "docs" / "deploy.md").read_text()
    assert f"docker build -t {image} ." in deploy_md, "docs/deploy.md gives the command that builds it"
    assert f"docker build -t {image} ." in (ROOT / "Dockerfile").read_text()
    repo, _, tag = image.rpartition(":")
    assert "kustomize edit set image " + repo + "=" in deploy_md, "and how to point the manifests at yours"
    assert tag == specguard_config_version(), "the image tag is the package version"
    # the uid the image runs as is the one the manifests require
    for spec in [*pod_specs(BASE), guard_spec()]:
        assert str(spec["securityContext"]["runAsUser"]) == dockerfile_user()
    compose = (ROOT / "deploy" / "compose" / "compose.yaml").read_text()
    assert "dockerfile: Dockerfile" in compose and "context: ../.." in compose


def specguard_config_version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_dockerignore_keeps_the_build_context_to_what_the_dockerfile_copies():
    copied = set()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            copied.update(p.rstrip("/") for p in line.split()[1:-1])
    kept = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert copied == kept and (ROOT / ".dockerignore").read_text().splitlines()[1] == "*"
    assert KUSTOMIZE_DIR.exists()
