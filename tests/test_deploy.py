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
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
        "RoleBinding", "Deployment", "Service", "PodDisruptionBudget",
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
    # Instance Leases (--lease-namespace): a Role, so only Leases of its own namespace.
    (role,) = by_kind(hub)["Role"]
    assert role["metadata"]["namespace"] == "hubproxy"
    assert [(r["apiGroups"], r["resources"], sorted(r["verbs"])) for r in role["rules"]] == [
        (["coordination.k8s.io"], ["leases"],
         ["create", "delete", "get", "list", "update", "watch"])]
    (role_binding,) = by_kind(hub)["RoleBinding"]
    assert role_binding["roleRef"]["name"] == role["metadata"]["name"]
    assert role_binding["subjects"] == binding["subjects"]


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


def images_of(docs: list[dict]) -> set[str]:
    return {c["image"] for d in docs if d["kind"] == "Deployment"
            for c in d["spec"]["template"]["spec"]["containers"]}


def test_one_images_knob_sets_the_image_of_hub_agents_and_overlays(tmp_path: Path) -> None:
    """deploy/image is the one place: changing it changes every rendered Deployment."""
    import shutil

    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    knob = copy / "image" / "kustomization.yaml"
    config = yaml.safe_load(knob.read_text())
    assert config["kind"] == "Component"
    (entry,) = config["images"]
    entry.update(newName="registry.example.com/hubproxy", newTag="1.2.3")
    knob.write_text(yaml.safe_dump(config))
    for base in ("hub", "agent", "examples/agent-cluster1", "ocm"):
        assert images_of(kustomize(copy / base)) == {"registry.example.com/hubproxy:1.2.3"}
    # deploy/ocm installs agents through its AddOnTemplate: the knob reaches them too.
    assert "image: registry.example.com/hubproxy:1.2.3" in subprocess.run(
        [KUBECTL, "kustomize", str(copy / "ocm")], capture_output=True, text=True,
        timeout=60).stdout.split("kind: AddOnTemplate")[1]
    # An overlay can still pin its own, by the name the knob produces.
    overlay = copy / "examples" / "pinned"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../agent-cluster1"],
        "images": [{"name": "registry.example.com/hubproxy", "newTag": "1.2.4"}]}))
    assert images_of(kustomize(overlay)) == {"registry.example.com/hubproxy:1.2.4"}
    for base in ("hub", "agent", "ocm"):
        assert "images:" not in (DEPLOY / base / "kustomization.yaml").read_text()


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


# --- deploy/examples/callers: the caller Role and the Argo CD cluster Secret of the README ---

CALLERS = DEPLOY / "examples" / "callers"


async def test_caller_role_example_grants_exactly_its_cluster(tmp_path: Path) -> None:
    """The example binding, applied to a hub, lets its subjects through the gateway's
    SubjectAccessReview for cluster1 and for nothing else."""
    from gateway.fixtures import api
    from kubesim.testing import run_kubesim

    rbac = list(yaml.safe_load_all((CALLERS / "rbac.yaml").read_text()))
    async with run_kubesim(tmp_path, name="hub", rbac=rbac) as hub:
        async def allowed(cluster: str, **who: object) -> bool:
            review = await api(hub.url, hub.ca_file, hub.admin_token, "POST",
                               "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
                                   "apiVersion": "authorization.k8s.io/v1",
                                   "kind": "SubjectAccessReview",
                                   "spec": {**who, "resourceAttributes": {
                                       "group": "cluster.open-cluster-management.io",
                                       "resource": "managedclusters", "subresource": "proxy",
                                       "name": cluster, "verb": "get"}}})
            return bool(review["status"].get("allowed"))

        argocd = {"user": "system:serviceaccount:argocd:argocd-application-controller",
                  "groups": ["system:serviceaccounts", "system:serviceaccounts:argocd"]}
        person = {"user": "oidc:alice@example.com", "groups": ["oidc:platform-team"]}
        assert await allowed("cluster1", **argocd)
        assert await allowed("cluster1", **person)
        assert not await allowed("cluster2", **argocd)
        assert not await allowed("cluster1", user="oidc:bob@example.com", groups=["oidc:x"])


def test_argocd_cluster_secret_example_names_its_cluster_for_hubproxy_creds() -> None:
    """The form for Argo CD before 3.5 (no provideClusterInfo): --cluster names the cluster."""
    from gateway.access.creds import build_parser, parse_exec_info

    secret = yaml.safe_load((DEPLOY / "examples" / "argocd" / "cluster-secret-before-3.5.yaml")
                            .read_text())
    assert secret["metadata"]["labels"]["argocd.argoproj.io/secret-type"] == "cluster"
    data = secret["stringData"]
    config = json.loads(data["config"])
    provider = config["execProviderConfig"]
    assert provider["command"] == "/plugins/hubproxy/bin/hubproxy-plugin"
    args = build_parser().parse_args(provider["args"])
    assert data["server"].endswith("/" + args.cluster) and data["name"] == args.cluster
    # What client-go sends Argo CD's plugin: no cluster information; --cluster fills it in.
    sent = json.dumps({"apiVersion": provider["apiVersion"], "kind": "ExecCredential",
                       "spec": {"interactive": False}})
    assert parse_exec_info(sent, args.cluster).cluster_name == "cluster1"
    assert "caData" in config["tlsClientConfig"]


def test_join_component_adds_only_its_secret_role_and_flag() -> None:
    """deploy/join (issue 12): the base's gateway reads no Secret; with joining on, a Role in
    its own namespace only, and the flag that names the CA Secret."""
    docs = kustomize(DEPLOY / "examples/hub-join")
    base = kustomize(DEPLOY / "hub")
    in_base = {(d["kind"], d["metadata"]["name"]) for d in base}
    extra = [d for d in docs if (d["kind"], d["metadata"]["name"]) not in in_base]
    assert len(docs) == len(base) + 2
    assert sorted(d["kind"] for d in extra) == ["Role", "RoleBinding"]
    role = next(d for d in extra if d["kind"] == "Role")
    assert role["metadata"]["namespace"] == "hubproxy"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "verbs": ["get", "list", "watch", "update"]}]
    binding = next(d for d in extra if d["kind"] == "RoleBinding")
    assert binding["metadata"]["namespace"] == "hubproxy"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "hubproxy-gateway", "namespace": "hubproxy"}]
    (deployment,) = by_kind(docs)["Deployment"]
    assert env_of(deployment["spec"]["template"]["spec"]["containers"][0])[
        "HUBPROXY_JOIN_CA_SECRET"] == "hubproxy-tunnel-ca"
