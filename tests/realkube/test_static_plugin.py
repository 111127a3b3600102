"""The static plugin (deploy/plugin) end to end: real kubectl through the gateway to the real
managed kube-apiserver, with kubeconfigs built the way the consumers build them.

A gateway (--clusterprofiles=on) publishes its access provider on ClusterProfile
`consumers/cluster1`. Each test builds, from that entry or from a consumer guide's manifest
(deploy/examples/), the kubeconfig that consumer's code builds, with the static executable that
deploy/plugin/build.sh made as the exec plugin, and runs kubectl (client-go's exec
authenticator) with it. Nothing else in the kubeconfig holds a credential: a request that
succeeds got its token from the plugin. On this machine the pod's service-account token is a
file the tests name with --token-file (alice's hub token).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.plugin.static import EXEC_EXTENSION, StaticPlugin, built
from tests.realkube.apiserver import KUBECTL, write_private
from tests.realkube.conftest import CLUSTER, PREFIX, Fleet
from tests.realkube.hubproxy import Gateway, start_gateway, wait_connected
from tests.support import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
NAMESPACE = "consumers"
ALICE = f"{PREFIX}system:serviceaccount:fleet:alice"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def plugin() -> StaticPlugin:
    return built()


@pytest.fixture(scope="module")
def entry(fleet: Fleet) -> Iterator[dict[str, Any]]:
    """Our access-provider entry on consumers/cluster1, as a running gateway writes it."""
    fleet.hub.apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
         "metadata": {"name": CLUSTER, "namespace": NAMESPACE},
         "spec": {"clusterManager": {"name": "hubproxy"}, "displayName": CLUSTER}}])
    port = free_port()
    gateway: Gateway = start_gateway(
        fleet.group, fleet.pki, fleet.gateway_kubeconfig, fleet.agent_kubeconfig,
        "--clusterprofiles", "on", "--public-url", f"https://127.0.0.1:{port}",
        "--clusterprofile-namespace", NAMESPACE, front_port=port)
    try:
        wait_connected(gateway, fleet.alice)
        deadline = time.monotonic() + 30
        while True:
            profile = json.loads(fleet.hub.admin("get", "clusterprofile", CLUSTER, "-n", NAMESPACE,
                                                 "-o", "json"))
            ours = [p for p in profile.get("status", {}).get("accessProviders", [])
                    if p["name"] == "hubproxy"]
            if ours:
                yield ours[0]
                break
            assert time.monotonic() < deadline, "the gateway wrote no access provider"
            time.sleep(0.2)
    finally:
        for process in (gateway.agent, gateway.process):
            if process is not None:
                process.stop()


@pytest.fixture(scope="module")
def token_file(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_private(tmp_path_factory.mktemp("sa") / "token", fleet.alice)


def kubectl(kubeconfig: dict[str, Any], directory: Path, *args: str
            ) -> subprocess.CompletedProcess[str]:
    path = write_private(directory / "kubeconfig", yaml.safe_dump(kubeconfig))
    env = {**os.environ, "KUBECONFIG": str(path), "HOME": str(directory)}
    return subprocess.run([KUBECTL, *args], env=env, capture_output=True, text=True, timeout=60)


def single_cluster(cluster: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}


def as_pkg_access_builds_it(entry: dict[str, Any], exec_config: dict[str, Any]
                            ) -> dict[str, Any]:
    """cluster-inventory-api pkg/access BuildConfigFromCP, written as a kubeconfig: the entry's
    server, CA data and proxy URL; the provider's exec config with interactiveMode Never; the
    entry's client.authentication.k8s.io/exec extension as the exec plugin's cluster config."""
    source = entry["cluster"]
    cluster = {"server": source["server"],
               "certificate-authority-data": source["certificate-authority-data"]}
    if source.get("proxy-url"):
        cluster["proxy-url"] = source["proxy-url"]
    extensions = [e for e in source.get("extensions", []) if e["name"] == EXEC_EXTENSION]
    if extensions:
        cluster["extensions"] = extensions
    user = {"exec": {**{k: exec_config[k] for k in ("apiVersion", "command", "args", "env")
                        if exec_config.get(k) is not None},
                     "interactiveMode": "Never",
                     "provideClusterInfo": bool(exec_config.get("provideClusterInfo"))}}
    return single_cluster(cluster, user)


def argocd_cluster(secret_file: str) -> tuple[dict[str, Any], dict[str, Any]]:
    secret = yaml.safe_load((EXAMPLES / "argocd" / secret_file).read_text())
    return secret["stringData"], json.loads(secret["stringData"]["config"])


def as_argocd_builds_it(server: str, ca_data: str, provider: dict[str, Any], *,
                        release_3_5: bool) -> dict[str, Any]:
    """Argo CD's Cluster.RawRestConfig from the Secret's execProviderConfig, written out as
    gitops-engine's NewKubeConfig writes it for kubectl: `config` becomes the cluster's exec
    extension. Before 3.5, provideClusterInfo and config do not exist (they are dropped)."""
    cluster: dict[str, Any] = {"server": server, "certificate-authority-data": ca_data}
    exec_config: dict[str, Any] = {
        "apiVersion": provider["apiVersion"], "command": provider["command"],
        "args": provider.get("args") or [],
        "env": [{"name": k, "value": v} for k, v in (provider.get("env") or {}).items()],
        "installHint": provider.get("installHint", ""), "interactiveMode": "Never"}
    if release_3_5:
        exec_config["provideClusterInfo"] = bool(provider.get("provideClusterInfo"))
        if provider.get("config"):
            cluster["extensions"] = [{"name": EXEC_EXTENSION, "extension": provider["config"]}]
    return single_cluster(cluster, {"exec": exec_config})


def on_this_machine(exec_config: dict[str, Any], plugin: StaticPlugin, token_file: Path
                    ) -> dict[str, Any]:
    """The guide's exec config, with the executable where build.sh put it and the token file
    that a pod would have at the default path."""
    assert exec_config["command"] == "/plugins/hubproxy/bin/hubproxy-plugin"
    return {**exec_config, "command": str(plugin.executable),
            "args": [*(exec_config.get("args") or []), "--token-file", str(token_file)]}


def assert_acts_as_alice(kubeconfig: dict[str, Any], directory: Path) -> None:
    whoami = kubectl(kubeconfig, directory, "auth", "whoami", "-o",
                     "jsonpath={.status.userInfo.username}")
    assert whoami.returncode == 0, whoami.stderr
    assert whoami.stdout == ALICE
    listed = kubectl(kubeconfig, directory, "get", "configmaps", "-n", "team", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    refused = kubectl(kubeconfig, directory, "get", "configmaps", "-n", "other")
    assert refused.returncode != 0 and "Forbidden" in refused.stderr, refused.stderr


def test_multicluster_runtime_provider_file_with_the_static_plugin(
        entry: dict[str, Any], plugin: StaticPlugin, token_file: Path, tmp_path: Path) -> None:
    """The provider file of deploy/examples/multicluster-runtime (MultiKueue's is the same
    exec config), matched to the ClusterProfile entry as pkg/access matches it."""
    config_map = yaml.safe_load((EXAMPLES / "multicluster-runtime" / "provider-config.yaml")
                                .read_text())
    providers = json.loads(config_map["data"]["clusterprofile-provider-file.json"])["providers"]
    provider = next(p for p in providers if p["name"] == entry["name"])
    exec_config = on_this_machine(provider["execConfig"], plugin, token_file)
    assert_acts_as_alice(as_pkg_access_builds_it(entry, exec_config), tmp_path)


def test_multikueue_configuration_with_the_static_plugin(
        entry: dict[str, Any], plugin: StaticPlugin, token_file: Path, tmp_path: Path) -> None:
    config_map = yaml.safe_load((EXAMPLES / "multikueue" / "kueue-manager-config.yaml")
                                .read_text())
    configuration = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
    providers = configuration["multiKueue"]["clusterProfile"]["accessProviders"]
    provider = next(p for p in providers if p["name"] == entry["name"])
    exec_config = on_this_machine(provider["execConfig"], plugin, token_file)
    # The guide's TMPDIR is an emptyDir in the manager; here, a directory of the test's.
    tmpdir = tmp_path / "plugin-tmp"
    tmpdir.mkdir()
    exec_config["env"] = [{"name": e["name"], "value": str(tmpdir) if e["name"] == "TMPDIR"
                           else e["value"]} for e in exec_config.get("env") or []]
    assert_acts_as_alice(as_pkg_access_builds_it(entry, exec_config), tmp_path)
    assert list(tmpdir.iterdir()) == []


def test_argo_cd_3_5_passes_the_cluster_to_the_static_plugin(
        entry: dict[str, Any], plugin: StaticPlugin, token_file: Path, tmp_path: Path) -> None:
    data, config = argocd_cluster("cluster-secret.yaml")
    provider = on_this_machine(config["execProviderConfig"], plugin, token_file)
    assert "--cluster" not in provider["args"]
    assert data["server"].endswith(f"/{CLUSTER}")
    kubeconfig = as_argocd_builds_it(entry["cluster"]["server"],
                                     entry["cluster"]["certificate-authority-data"], provider,
                                     release_3_5=True)
    assert_acts_as_alice(kubeconfig, tmp_path)
    # The same Secret read by an Argo CD before 3.5: no cluster information reaches the plugin.
    older = as_argocd_builds_it(entry["cluster"]["server"],
                                entry["cluster"]["certificate-authority-data"], provider,
                                release_3_5=False)
    refused = kubectl(older, tmp_path, "auth", "whoami")
    assert refused.returncode != 0 and "provideClusterInfo" in refused.stderr, refused.stderr


def test_argo_cd_before_3_5_names_the_cluster_with_a_flag(
        entry: dict[str, Any], plugin: StaticPlugin, token_file: Path, tmp_path: Path) -> None:
    _, config = argocd_cluster("cluster-secret-before-3.5.yaml")
    provider = on_this_machine(config["execProviderConfig"], plugin, token_file)
    kubeconfig = as_argocd_builds_it(entry["cluster"]["server"],
                                     entry["cluster"]["certificate-authority-data"], provider,
                                     release_3_5=False)
    assert_acts_as_alice(kubeconfig, tmp_path)


# --- the guides' manifests, admitted by the real hub kube-apiserver ---

PLUGIN_IMAGE_PREFIX = "ghcr.io/hubproxy/hubproxy-plugin:"


def workload(kind: str, name: str, namespace: str, container: str, *,
             tmp_volume: str | None) -> dict[str, Any]:
    """The consumers' own workloads, reduced to what the patches meet: Kueue's
    config/components/manager/manager.yaml (container `manager`, read-only root, nothing
    mounted) and Argo CD's manifests/base application controller and server (read-only root, an
    emptyDir at /tmp)."""
    spec: dict[str, Any] = {"containers": [{
        "name": container, "image": "registry.example.com/consumer:1",
        "securityContext": {"readOnlyRootFilesystem": True, "runAsNonRoot": True}}]}
    if tmp_volume:
        spec["containers"][0]["volumeMounts"] = [{"name": tmp_volume, "mountPath": "/tmp"}]
        spec["volumes"] = [{"name": tmp_volume, "emptyDir": {}}]
    labels = {"app": name}
    body: dict[str, Any] = {"selector": {"matchLabels": labels},
                            "template": {"metadata": {"labels": labels}, "spec": spec}}
    if kind == "StatefulSet":
        body["serviceName"] = name
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace}, "spec": body}


def dry_run(fleet: Fleet, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each object as the apiserver admits it (create, server-side dry run)."""
    done = fleet.hub.kubectl("create", "--dry-run=server", "--validate=false", "-o", "json",
                             "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": objects}))
    assert done.returncode == 0, done.stderr
    # One JSON document per object, one after the other.
    decoder, text, admitted = json.JSONDecoder(), done.stdout.strip(), []
    while text:
        answer, end = decoder.raw_decode(text)
        admitted += answer["items"] if answer.get("kind") == "List" else [answer]
        text = text[end:].lstrip()
    return admitted


def patched(fleet: Fleet, base: dict[str, Any], patch_file: Path,
            tmp_path: Path) -> dict[str, Any]:
    """`kubectl patch --patch-file` as the guide says, applied locally to `base`."""
    base_file = tmp_path / f"{base['metadata']['name']}.json"
    base_file.write_text(json.dumps(base))
    done = fleet.hub.kubectl("patch", "--local", "--type=strategic", "-f", str(base_file),
                             "--patch-file", str(patch_file), "-o", "json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def plugin_mounts(pod_spec: dict[str, Any], container: str) -> dict[str, dict[str, Any]]:
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    (target,) = [c for c in pod_spec["containers"] if c["name"] == container]
    return {m["mountPath"]: volumes[m["name"]] for m in target.get("volumeMounts", [])}


@pytest.mark.parametrize(("patch", "kind", "name", "namespace", "container", "tmp_volume"), [
    ("multikueue/manager-image-volume.yaml", "Deployment", "kueue-controller-manager",
     "kueue-system", "manager", None),
    ("multikueue/manager-init-container.yaml", "Deployment", "kueue-controller-manager",
     "kueue-system", "manager", None),
    ("argocd/application-controller-plugin.yaml", "StatefulSet", "argocd-application-controller",
     "argocd", "argocd-application-controller", "argocd-application-controller-tmp"),
    ("argocd/server-plugin.yaml", "Deployment", "argocd-server", "argocd", "argocd-server",
     "tmp"),
])
def test_workload_patches_are_admitted_with_the_plugin_volume(
        fleet: Fleet, tmp_path: Path, patch: str, kind: str, name: str, namespace: str,
        container: str, tmp_volume: str | None) -> None:
    fleet.hub.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    base = workload(kind, name, namespace, container, tmp_volume=tmp_volume)
    (admitted,) = dry_run(fleet, [patched(fleet, base, EXAMPLES / patch, tmp_path)])
    spec = admitted["spec"]["template"]["spec"]
    mounts = plugin_mounts(spec, container)
    plugin_volume = mounts["/plugins/hubproxy"]
    if "initContainers" in spec:  # the fallback: the plugin image copies itself
        (init,) = spec["initContainers"]
        assert init["image"].startswith(PLUGIN_IMAGE_PREFIX)
        assert init["command"][-1] == "/plugins/hubproxy/bin/hubproxy-plugin"
        assert "emptyDir" in plugin_volume
    else:  # kept as written (an apiserver without image volumes would have dropped it)
        assert plugin_volume["image"]["reference"].startswith(PLUGIN_IMAGE_PREFIX)
    # Somewhere writable for the plugin to unpack itself: the patch's emptyDir, or Argo CD's.
    assert any("emptyDir" in volume and path.startswith("/tmp")
               for path, volume in mounts.items()), mounts


def test_other_guide_objects_are_admitted(fleet: Fleet) -> None:
    objects = []
    for name in ("multikueue/kueue-manager-config.yaml", "multikueue/multikueuecluster.yaml",
                 "argocd/cluster-secret.yaml", "argocd/cluster-secret-before-3.5.yaml",
                 "multicluster-runtime/provider-config.yaml",
                 "multicluster-runtime/controller.yaml"):
        objects += [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    # No CRD for Kueue's types here (tests/plugin/test_consumer_guides.py checks the fields).
    kueue = [o for o in objects if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert [o["kind"] for o in kueue] == ["MultiKueueCluster"]
    rest = [o for o in objects if o not in kueue]
    for namespace in sorted({o["metadata"].get("namespace") for o in rest} - {None}):
        fleet.hub.apply({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": namespace}})
    admitted = dry_run(fleet, rest)
    assert [(o["kind"], o["metadata"]["name"]) for o in admitted] == \
        [(o["kind"], o["metadata"]["name"]) for o in rest]
    controller = next(o for o in admitted if o["kind"] == "Deployment")
    mounts = plugin_mounts(controller["spec"]["template"]["spec"], "controller")
    assert mounts["/plugins/hubproxy"]["image"]["reference"].startswith(PLUGIN_IMAGE_PREFIX)
