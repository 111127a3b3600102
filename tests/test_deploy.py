"""deploy/: the kustomize bases render with the real kubectl and grant least privilege."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from certs import layout

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBECTL = shutil.which("kubectl")
IMAGE = "ghcr.io/hubproxy/hubproxy:0.1.0"

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")


def kustomize(path: Path) -> list[dict]:
    result = subprocess.run(
        [KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def rules_of(docs: list[dict]) -> list[tuple]:
    (role,) = by_kind(docs)["ClusterRole"]
    return sorted(
        (tuple(r.get("apiGroups", [])), tuple(sorted(r.get("resources", []))),
         tuple(sorted(r["verbs"])), tuple(r.get("resourceNames", [])),
         tuple(r.get("nonResourceURLs", [])))
        for r in role["rules"]
    )


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


@pytest.fixture(scope="module")
def hub() -> list[dict]:
    return kustomize(DEPLOY / "hub")


@pytest.fixture(scope="module")
def agent() -> list[dict]:
    return kustomize(DEPLOY / "agent")


def test_hub_renders_every_kind(hub: list[dict]) -> None:
    kinds = by_kind(hub)
    assert sorted(kinds) == sorted([
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment",
        "Service", "PodDisruptionBudget",
    ])
    assert kinds["Namespace"][0]["metadata"]["name"] == "hubproxy"
    for doc in hub:
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "hubproxy", doc["metadata"]


def test_hub_rbac_is_exactly_what_the_gateway_calls(hub: list[dict]) -> None:
    assert rules_of(hub) == sorted([
        (("authentication.k8s.io",), ("tokenreviews",), ("create",), (), ()),
        (("authorization.k8s.io",), ("subjectaccessreviews",), ("create",), (), ()),
        (("multicluster.x-k8s.io",), ("clusterprofiles",), ("get", "list", "watch"), (), ()),
        (("multicluster.x-k8s.io",), ("clusterprofiles/status",), ("get", "patch", "update"),
         (), ()),
        # The cluster inventory on an OCM hub (--cluster-inventory): names only, no get.
        (("cluster.open-cluster-management.io",), ("managedclusters",), ("list", "watch"),
         (), ()),
    ])
    (binding,) = by_kind(hub)["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == by_kind(hub)["ClusterRole"][0]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "hubproxy-gateway", "namespace": "hubproxy"}
    ]
    assert not [d for d in hub if d["kind"] in ("Role", "RoleBinding")]


def test_agent_rbac_is_impersonation_only(agent: list[dict]) -> None:
    assert rules_of(agent) == sorted([
        # No serviceaccounts: prefixed hub users are never service-account names.
        (("",), ("groups", "users"), ("impersonate",), (), ()),
        # "*" because RBAC cannot wildcard userextras/<key>; verb impersonate only.
        (("authentication.k8s.io",), ("*",), ("impersonate",), (), ()),
    ])
    (binding,) = by_kind(agent)["ClusterRoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "hubproxy-agent", "namespace": "hubproxy-agent"}
    ]
    rbac_text = (DEPLOY / "agent/rbac.yaml").read_text()
    for documented in ("users", "groups", "uids", "userextras"):
        assert documented in rbac_text


def assert_hardened(deployment: dict, command: list[str]) -> dict:
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert container["command"] == command
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"]["path"] == path
        port = container[probe]["httpGet"]["port"]
        assert port == "health"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == 8000
    assert env_of(container)["HUBPROXY_HEALTH_LISTEN"] == "0.0.0.0:8000"
    return container


def secret_mounts(deployment: dict) -> dict[str, str]:
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    return {
        secrets[m["name"]]: m["mountPath"] for m in container["volumeMounts"]
        if m["name"] in secrets and m.get("readOnly")
    }


def test_hub_deployment(hub: list[dict]) -> None:
    kinds = by_kind(hub)
    (deployment,) = kinds["Deployment"]
    container = assert_hardened(deployment, ["hubproxy", "gateway"])
    env = env_of(container)
    mounts = secret_mounts(deployment)
    assert mounts == {
        "hubproxy-gateway-tls": env["HUBPROXY_TLS_DIR"],
        "hubproxy-tunnel-tls": env["HUBPROXY_TUNNEL_TLS_DIR"],
    }
    assert env["HUBPROXY_AGENT_CA"] == env["HUBPROXY_TUNNEL_TLS_DIR"] + "/ca.crt"
    assert env["HUBPROXY_LISTEN"].endswith(":9092")
    assert env["HUBPROXY_TUNNEL_LISTEN"].endswith(":8091")
    assert all(name.startswith("HUBPROXY_") for name in env)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "hubproxy-gateway"

    selector = deployment["spec"]["selector"]["matchLabels"]
    services = {s["metadata"]["name"]: s for s in kinds["Service"]}
    assert {
        name: [(p["port"], p["targetPort"]) for p in s["spec"]["ports"]]
        for name, s in services.items()
    } == {"hubproxy-gateway": [(9092, "https")], "hubproxy-tunnel": [(8091, "tunnel")]}
    for service in services.values():
        assert service["spec"]["selector"] == selector
    (pdb,) = kinds["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_agent_deployment(agent: list[dict]) -> None:
    kinds = by_kind(agent)
    assert kinds["Namespace"][0]["metadata"]["name"] == "hubproxy-agent"
    assert "Service" not in kinds, "the agent only dials out"
    (deployment,) = kinds["Deployment"]
    container = assert_hardened(deployment, ["hubproxy", "agent"])
    env = env_of(container)
    assert set(env) >= {"HUBPROXY_HUB", "HUBPROXY_CLUSTER", "HUBPROXY_TLS_DIR"}
    assert secret_mounts(deployment) == {"hubproxy-agent-tls": env["HUBPROXY_TLS_DIR"]}
    (pdb,) = kinds["PodDisruptionBudget"]
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_example_overlay_sets_hub_and_cluster() -> None:
    docs = kustomize(DEPLOY / "examples/agent-cluster1")
    (deployment,) = by_kind(docs)["Deployment"]
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["HUBPROXY_HUB"] == "tunnel.hub.example.com:8091"
    assert env["HUBPROXY_CLUSTER"] == "cluster1"


def readme_secret_commands() -> list[list[str]]:
    text = (DEPLOY / "README.md").read_text().replace("\\\n", " ")
    commands = [line.strip() for line in text.splitlines()
                if re.match(r"\s*kubectl -n \S+ create secret generic", line)]
    return [shlex.split(c) for c in commands]


def test_readme_secret_commands_work_with_certs_init_output(tmp_path: Path) -> None:
    layout.init(tmp_path / "pki", layout.InitOptions(clusters=["cluster1"]))
    commands = readme_secret_commands()
    assert len(commands) == 3
    made: dict[str, dict] = {}
    for argv in commands:
        argv = [a.replace("=pki/", f"={tmp_path}/pki/") for a in argv]
        result = subprocess.run(
            [KUBECTL, *argv[1:], "--dry-run=client", "-o", "json"],
            capture_output=True, text=True, timeout=60, env={"KUBECONFIG": "/dev/null",
                                                             "PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == 0, (argv, result.stderr)
        secret = json.loads(result.stdout)
        assert secret["type"] == "kubernetes.io/tls"
        assert sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
        made[secret["metadata"]["name"]] = secret
    assert sorted(made) == ["hubproxy-agent-tls", "hubproxy-gateway-tls", "hubproxy-tunnel-tls"]


def test_read_only_profile_has_no_legacy_impersonation() -> None:
    """The constrained profile (issue 14 item 9): no `impersonate` verb survives the patch
    (the apiserver would fall back to it), and the actions exposed are reads only."""
    rendered = kustomize(DEPLOY / "examples/agent-read-only")
    assert rules_of(rendered) == sorted([
        (("authentication.k8s.io",), ("*",), ("impersonate:user-info",), (), ()),
        (("*",), ("*",), ("impersonate-on:user-info:get", "impersonate-on:user-info:list",
                          "impersonate-on:user-info:watch"), (), ()),
        ((), (), ("impersonate-on:user-info:get",), (), ("*",)),
    ])
    # Everything else is the base, unchanged.
    base = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(DEPLOY / "agent")}
    for doc in rendered:
        if doc["kind"] != "ClusterRole":
            assert doc == base[(doc["kind"], doc["metadata"]["name"])]
    assert len(rendered) == len(base)
