"""deploy/ocm: the OCM add-on renders into what OCM's addon framework and the gateway expect.

The server-side dry run against a real kube-apiserver with the OCM CRDs is in
tests/realkube/test_deploy_dry_run.py; here: the contracts between our manifests and OCM.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy" / "ocm")],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return {f'{d["kind"]}/{d["metadata"]["name"]}': d for d in yaml.safe_load_all(out) if d}


def manifests(rendered: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    template = rendered["AddOnTemplate/hubproxy"]
    return {f'{m["kind"]}/{m["metadata"]["name"]}': m
            for m in template["spec"]["agentSpec"]["workload"]["manifests"]}


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_cluster_scoped_objects_carry_no_namespace(rendered: dict[str, dict[str, Any]]) -> None:
    for key in ("AddOnTemplate/hubproxy", "ClusterManagementAddOn/hubproxy",
                "ClusterRole/hubproxy-gateway-ocm", "ClusterRoleBinding/hubproxy-gateway-ocm"):
        assert "namespace" not in rendered[key]["metadata"], key


def test_the_agent_reads_its_certificate_where_ocm_mounts_it(
        rendered: dict[str, dict[str, Any]]) -> None:
    """OCM's template addon mounts a CustomSigner's certificate at /managed/<signer name with
    '/' as '-'>; the agent must look there, and name itself the way the gateway checks."""
    template = rendered["AddOnTemplate/hubproxy"]
    (registration,) = template["spec"]["registration"]
    assert registration["type"] == "CustomSigner"
    signer = registration["customSigner"]["signerName"]
    assert registration["customSigner"]["signingCA"] == {"name": "hubproxy-tunnel-ca",
                                                         "namespace": "hubproxy"}
    agent = manifests(rendered)["Deployment/hubproxy-agent"]
    container = agent["spec"]["template"]["spec"]["containers"][0]
    settings = env(container)
    assert settings["HUBPROXY_TLS_DIR"] == "/managed/" + signer.replace("/", "-")
    assert settings["HUBPROXY_AGENT_IDENTITY"] == "ocm"
    assert settings["HUBPROXY_OCM_ADDON_NAME"] == template["spec"]["addonName"]
    assert settings["HUBPROXY_CLUSTER"] == "{{CLUSTER_NAME}}"
    variables = {v["name"] for v in rendered["AddOnDeploymentConfig/hubproxy"]["spec"]
                 ["customizedVariables"]}
    assert settings["HUBPROXY_HUB"] == "{{HUB_TUNNEL_ADDRESS}}"
    assert "HUB_TUNNEL_ADDRESS" in variables


def test_the_hub_ca_and_the_image_reach_the_agent(rendered: dict[str, dict[str, Any]]) -> None:
    bundle = rendered["ConfigMap/hubproxy-tunnel-ca-bundle"]["data"]["ca.crt"]
    inside = manifests(rendered)
    assert inside["ConfigMap/hubproxy-hub-ca"]["data"]["ca.crt"] == bundle
    assert "BEGIN CERTIFICATE" in bundle
    gateway = rendered["Deployment/hubproxy-gateway"]["spec"]["template"]["spec"]
    agent = inside["Deployment/hubproxy-agent"]["spec"]["template"]["spec"]
    assert gateway["containers"][0]["image"] == agent["containers"][0]["image"]
    assert agent["containers"][0]["image"] != "hubproxy"  # the images: knob applied


def test_the_gateway_names_agents_the_ocm_way_and_writes_conditions(
        rendered: dict[str, dict[str, Any]]) -> None:
    gateway = env(rendered["Deployment/hubproxy-gateway"]["spec"]["template"]["spec"]
                  ["containers"][0])
    assert gateway["HUBPROXY_AGENT_IDENTITY"] == "ocm"
    assert gateway["HUBPROXY_OCM_ADDON_CONDITIONS"] == "true"
    rules = rendered["ClusterRole/hubproxy-gateway-ocm"]["rules"]
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in rules} == {
        # list and watch: one paginated list and then what changes, not a GET per cluster
        (("managedclusteraddons",), ("get", "list", "watch")),
        (("managedclusteraddons/status",), ("patch",))}
    assert all(r.get("resourceNames") == ["hubproxy"] for r in rules)


def test_only_the_addon_manager_may_read_the_signing_ca(
        rendered: dict[str, dict[str, Any]]) -> None:
    role = rendered["Role/hubproxy-tunnel-ca-signer"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": ["hubproxy-tunnel-ca"], "verbs": ["get"]}]
    (subject,) = rendered["RoleBinding/hubproxy-tunnel-ca-signer"]["subjects"]
    assert subject == {"kind": "ServiceAccount", "name": "addon-manager-controller-sa",
                       "namespace": "open-cluster-management-hub"}


def test_readme_signing_ca_command_makes_the_secret_ocm_reads(tmp_path: Path) -> None:
    """The walk-through's `create secret tls hubproxy-tunnel-ca` on `certs init` output gives
    the kubernetes.io/tls Secret the AddOnTemplate names as signing CA: the tunnel CA."""
    import base64
    import json
    import re
    import shlex

    from certs import layout

    text = (ROOT / "deploy" / "README.md").read_text().replace("\\\n", " ")
    (line,) = [m for m in text.splitlines() if "create secret tls hubproxy-tunnel-ca" in m]
    argv = [a.replace("=pki/", f"={tmp_path}/pki/") for a in shlex.split(line.strip())]
    layout.init(tmp_path / "pki", layout.InitOptions())
    done = subprocess.run([*argv, "--dry-run=client", "-o", "json"], capture_output=True,
                          text=True, timeout=60, env={"KUBECONFIG": "/dev/null",
                                                      "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    secret = json.loads(done.stdout)
    assert secret["type"] == "kubernetes.io/tls"
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == (
        "hubproxy-tunnel-ca", "hubproxy")
    ca = (tmp_path / "pki" / "tunnel-ca" / "ca.crt").read_bytes()
    assert base64.b64decode(secret["data"]["tls.crt"]) == ca
    assert re.search(rb"PRIVATE KEY", base64.b64decode(secret["data"]["tls.key"]))
