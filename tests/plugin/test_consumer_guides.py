"""The consumer guides' manifests (deploy/examples/{multikueue,argocd,multicluster-runtime}) as
written: their fields are those the consumers' code reads, and the exec command they configure
runs where their volumes put the plugin.

What is validated against what:
* Kueue's manager configuration is decoded strictly by Kueue (pkg/config: EnableStrict), and
  there is no CRD for it here: its fields are checked against Kueue's Go types
  (apis/config/v1beta2 Configuration, MultiKueue, ClusterProfile, ClusterProfileAccessProvider,
  at the release that added accessProviders, 0.19) and client-go's clientcmd/api.ExecConfig.
  MultiKueueCluster likewise (apis/kueue/v1beta2). Nothing checks them against a running Kueue.
* Argo CD reads the cluster Secret's `config` with encoding/json, which ignores unknown fields:
  the fields are checked against ExecProviderConfig of Argo CD 3.5 (provideClusterInfo and
  config added by argoproj/argo-cd#27976) and of the releases before it.
* multicluster-runtime's provider file is checked with our reading of cluster-inventory-api's
  pkg/access format (gateway.access.clusterprofile.parse_providers).
* The workload patches and the other Kubernetes objects are admitted by a real kube-apiserver
  in tests/realkube/test_static_plugin.py.

Then, for each guide, the consumer's container is reproduced with the volumes the manifest
mounts (the plugin image as an image volume, emptyDirs, or the initContainer that fills one), in
a read-only root that holds nothing else, and the configured command and environment are run
with KUBERNETES_EXEC_INFO as client-go writes it for that configuration.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.access.clusterprofile import parse_providers
from gateway.ops.version import version
from tests.plugin.static import (
    StaticPlugin,
    Volume,
    built,
    exec_info,
    image_root,
    run_isolated,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
PLUGIN_IMAGE = f"ghcr.io/hubproxy/hubproxy-plugin:{version()}"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN = "hub-service-account-token"

# k8s.io/client-go/tools/clientcmd/api.ExecConfig, as JSON (Kueue embeds this type).
EXEC_CONFIG_FIELDS = {"command", "args", "env", "apiVersion", "installHint",
                      "provideClusterInfo", "interactiveMode"}
# Kueue apis/config/v1beta2 at v0.19.0: Configuration's own fields (without those of the inlined
# ControllerManager, which the guide does not set), MultiKueue's and ClusterProfile's.
KUEUE_CONFIGURATION_FIELDS = {"apiVersion", "kind", "namespace", "manageJobsWithoutQueueName",
                              "managedJobsNamespaceSelector", "internalCertManagement",
                              "waitForPodsReady", "clientConnection", "integrations",
                              "multiKueue", "fairSharing", "admissionFairSharing", "resources",
                              "featureGates", "objectRetentionPolicies", "visibilityServer"}
KUEUE_MULTIKUEUE_FIELDS = {"gcInterval", "origin", "workerLostTimeout", "dispatcherName",
                           "externalFrameworks", "clusterProfile", "incrementalDispatcherConfig"}
KUEUE_CLUSTERPROFILE_FIELDS = {"accessProviders", "credentialsProviders"}
# Argo CD pkg/apis/application/v1alpha1.ExecProviderConfig.
ARGOCD_EXEC_FIELDS_BEFORE_3_5 = {"command", "args", "env", "apiVersion", "installHint"}
ARGOCD_EXEC_FIELDS_3_5 = ARGOCD_EXEC_FIELDS_BEFORE_3_5 | {"provideClusterInfo", "config"}


@pytest.fixture(scope="module")
def plugin() -> StaticPlugin:
    return built()


@pytest.fixture(scope="module")
def image_files(plugin: StaticPlugin) -> Iterator[Path]:
    with image_root(plugin.tag) as root:
        yield root


def load(*parts: str) -> Any:
    return yaml.safe_load((EXAMPLES.joinpath(*parts)).read_text())


def pod_spec(patch: dict[str, Any]) -> dict[str, Any]:
    return dict(patch["spec"]["template"]["spec"])


class Pod:
    """A pod's volumes on this machine: an image volume is the plugin image's files, an
    emptyDir a directory shared by the pod's containers."""

    def __init__(self, spec: dict[str, Any], image_files: Path, tmp_path: Path) -> None:
        self.volumes = {v["name"]: v for v in spec.get("volumes", [])}
        self.image_files = image_files
        self.tmp_path = tmp_path
        self.emptydirs: dict[str, Path] = {}

    def mounts(self, container: dict[str, Any]) -> list[Volume]:
        mounted = []
        for mount in container.get("volumeMounts", []):
            volume = self.volumes[mount["name"]]
            if "image" in volume:
                assert volume["image"]["reference"] == PLUGIN_IMAGE
                mounted.append(Volume(mount["mountPath"], self.image_files, read_only=True))
            elif "emptyDir" in volume:
                directory = self.emptydirs.get(mount["name"])
                if directory is None:
                    directory = self.tmp_path / f"emptydir-{mount['name']}"
                    directory.mkdir(mode=0o777)
                    directory.chmod(0o777)
                    self.emptydirs[mount["name"]] = directory
                mounted.append(Volume(mount["mountPath"], directory,
                                      read_only=bool(mount.get("readOnly"))))
            else:  # a ConfigMap, say: nothing the plugin reads
                continue
        return mounted


def service_account(tmp_path: Path) -> Volume:
    directory = tmp_path / "serviceaccount"
    directory.mkdir(exist_ok=True)
    (directory / "token").write_text(TOKEN)
    return Volume(SA_DIR, directory, read_only=True)


def run_exec_plugin(root: Path, command: str, args: list[str], env: dict[str, str],
                    api_version: str, cluster_name: str | None,
                    volumes: list[Volume]) -> dict[str, Any]:
    done = run_isolated(root, [command, *args],
                        {**env, "KUBERNETES_EXEC_INFO": exec_info(api_version, cluster_name)},
                        volumes)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    assert answer["apiVersion"] == api_version and answer["status"]["token"] == TOKEN
    return answer


def empty_root(tmp_path: Path, name: str) -> Path:
    """The consumer's own image as far as the plugin is concerned: nothing it can use."""
    root = tmp_path / name
    root.mkdir()
    return root


# --- MultiKueue ---


def kueue_access_provider() -> dict[str, Any]:
    config_map = load("multikueue", "kueue-manager-config.yaml")
    assert config_map["metadata"] == {"name": "kueue-manager-config", "namespace": "kueue-system"}
    configuration = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
    assert configuration["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert configuration["kind"] == "Configuration"
    assert set(configuration) == {"apiVersion", "kind", "featureGates", "multiKueue"}
    assert set(configuration) <= KUEUE_CONFIGURATION_FIELDS
    assert configuration["featureGates"] == {"MultiKueueClusterProfile": True}
    multikueue = configuration["multiKueue"]
    assert set(multikueue) <= KUEUE_MULTIKUEUE_FIELDS
    assert set(multikueue["clusterProfile"]) <= KUEUE_CLUSTERPROFILE_FIELDS
    assert set(multikueue["clusterProfile"]) == {"accessProviders"}  # not the deprecated one
    (provider,) = multikueue["clusterProfile"]["accessProviders"]
    assert set(provider) == {"name", "execConfig"} and provider["name"] == "hubproxy"
    exec_config: dict[str, Any] = provider["execConfig"]
    assert set(exec_config) <= EXEC_CONFIG_FIELDS, set(exec_config)
    assert all(set(e) == {"name", "value"} for e in exec_config.get("env", []))
    assert exec_config["provideClusterInfo"] is True
    assert exec_config["interactiveMode"] == "Never"
    return exec_config


def test_multikueuecluster_points_at_the_clusterprofile_in_kueues_namespace() -> None:
    docs = {d["kind"]: d for d in yaml.safe_load_all(
        (EXAMPLES / "multikueue" / "multikueuecluster.yaml").read_text())}
    profile, cluster = docs["ClusterProfile"], docs["MultiKueueCluster"]
    assert profile["metadata"]["namespace"] == "kueue-system"
    assert cluster["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    # apis/kueue/v1beta2: spec.clusterSource is exactly one of kubeConfig, clusterProfileRef.
    assert cluster["spec"] == {"clusterSource": {"clusterProfileRef": {
        "name": profile["metadata"]["name"]}}}
    subjects = docs["ClusterRoleBinding"]["subjects"]
    assert subjects == [{"kind": "ServiceAccount", "name": "kueue-controller-manager",
                         "namespace": "kueue-system"}]


def test_multikueue_manager_runs_the_plugin_from_the_image_volume(
        image_files: Path, tmp_path: Path) -> None:
    exec_config = kueue_access_provider()
    spec = pod_spec(load("multikueue", "manager-image-volume.yaml"))
    (manager,) = spec["containers"]
    assert manager["name"] == "manager"  # Kueue's container in kueue-controller-manager
    pod = Pod(spec, image_files, tmp_path)
    run_exec_plugin(empty_root(tmp_path, "manager"), exec_config["command"],
                    exec_config.get("args") or [],
                    {e["name"]: e["value"] for e in exec_config.get("env", [])},
                    exec_config["apiVersion"], "cluster1",
                    [*pod.mounts(manager), service_account(tmp_path)])
    assert all(not any(d.iterdir()) for d in pod.emptydirs.values())


def test_multikueue_manager_runs_the_copy_its_init_container_made(
        image_files: Path, tmp_path: Path) -> None:
    exec_config = kueue_access_provider()
    spec = pod_spec(load("multikueue", "manager-init-container.yaml"))
    pod = Pod(spec, image_files, tmp_path)
    (init,) = spec["initContainers"]
    assert init["image"] == PLUGIN_IMAGE
    init_root = tmp_path / "init"
    shutil.copytree(image_files, init_root, symlinks=True)  # the plugin image is its root
    done = run_isolated(init_root, init["command"],
                        {e["name"]: e["value"] for e in init.get("env", [])}, pod.mounts(init))
    assert done.returncode == 0, done.stderr
    (manager,) = spec["containers"]
    run_exec_plugin(empty_root(tmp_path, "manager"), exec_config["command"],
                    exec_config.get("args") or [],
                    {e["name"]: e["value"] for e in exec_config.get("env", [])},
                    exec_config["apiVersion"], "cluster1",
                    [*pod.mounts(manager), service_account(tmp_path)])


# --- Argo CD ---


def argocd_exec_provider(secret_file: str) -> dict[str, Any]:
    secret = load("argocd", secret_file)
    assert secret["metadata"]["labels"] == {"argocd.argoproj.io/secret-type": "cluster"}
    config = json.loads(secret["stringData"]["config"])
    assert set(config) == {"execProviderConfig", "tlsClientConfig"}
    provider: dict[str, Any] = config["execProviderConfig"]
    return provider


# Argo CD's own manifests (manifests/base/application-controller and server) mount an emptyDir
# at /tmp in both containers, with a read-only root filesystem.
ARGOCD_TMP = Volume("/tmp")


@pytest.mark.parametrize(("patch_file", "container"), [
    ("application-controller-plugin.yaml", "argocd-application-controller"),
    ("server-plugin.yaml", "argocd-server"),
])
def test_argo_cd_3_5_runs_the_plugin_in_both_workloads(
        image_files: Path, tmp_path: Path, patch_file: str, container: str) -> None:
    provider = argocd_exec_provider("cluster-secret.yaml")
    assert set(provider) <= ARGOCD_EXEC_FIELDS_3_5, set(provider)
    assert provider["provideClusterInfo"] is True and "args" not in provider
    spec = pod_spec(load("argocd", patch_file))
    (patched,) = spec["containers"]
    assert patched["name"] == container
    pod = Pod(spec, image_files, tmp_path)
    # client-go passes `config` as spec.cluster.config: here {"clusterName": "cluster1"}.
    run_exec_plugin(empty_root(tmp_path, container), provider["command"], [],
                    dict(provider.get("env") or {}), provider["apiVersion"],
                    provider["config"]["clusterName"],
                    [*pod.mounts(patched), ARGOCD_TMP, service_account(tmp_path)])


def test_argo_cd_before_3_5_names_the_cluster_with_a_flag(
        image_files: Path, tmp_path: Path) -> None:
    provider = argocd_exec_provider("cluster-secret-before-3.5.yaml")
    assert set(provider) <= ARGOCD_EXEC_FIELDS_BEFORE_3_5, set(provider)
    assert provider["command"] == argocd_exec_provider("cluster-secret.yaml")["command"]
    spec = pod_spec(load("argocd", "application-controller-plugin.yaml"))
    pod = Pod(spec, image_files, tmp_path)
    run_exec_plugin(empty_root(tmp_path, "controller"), provider["command"], provider["args"],
                    {}, provider["apiVersion"], None,
                    [*pod.mounts(spec["containers"][0]), ARGOCD_TMP, service_account(tmp_path)])


# --- multicluster-runtime ---


def test_multicluster_runtime_controller_reads_the_provider_file_and_runs_the_plugin(
        image_files: Path, tmp_path: Path) -> None:
    config_map = load("multicluster-runtime", "provider-config.yaml")
    (key,) = config_map["data"]
    (provider,) = parse_providers(json.loads(config_map["data"][key]))
    assert provider.name == "hubproxy"
    assert set(provider.exec_config) <= EXEC_CONFIG_FIELDS
    deployment = load("multicluster-runtime", "controller.yaml")
    spec = pod_spec(deployment)
    (controller,) = spec["containers"]
    # cluster-inventory-api's access.SetupProviderFileFlag: -clusterprofile-provider-file.
    config_mount = next(m for m in controller["volumeMounts"] if m["name"] == "provider-config")
    assert spec_volume(spec, "provider-config")["configMap"]["name"] == \
        config_map["metadata"]["name"]
    assert f"-clusterprofile-provider-file={config_mount['mountPath']}/{key}" in \
        controller["args"]
    pod = Pod(spec, image_files, tmp_path)
    run_exec_plugin(empty_root(tmp_path, "controller"), provider.exec_config["command"], [],
                    {}, provider.exec_config["apiVersion"], "cluster1",
                    [*pod.mounts(controller), service_account(tmp_path)])


def spec_volume(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(next(v for v in spec["volumes"] if v["name"] == name))
