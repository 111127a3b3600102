"""ClusterProfile consumers through a running gateway (issue 6), end to end.

A kubesim hub with the upstream ClusterProfile CRD, a kubesim managed cluster, `hubproxy
gateway --clusterprofiles=on --token-passthrough` and an agent, all real processes on 127.0.0.1:

* the gateway publishes its access-provider entry for the connected cluster only, next to a
  foreign provider it leaves alone;
* kubectl with a kubeconfig built from that entry and `exec: hubproxy-creds` reaches the managed
  cluster, which sees the impersonated hub identity;
* the cp-creds-compatible Secret mode works with --token-passthrough (the managed cluster's
  own service-account token, no impersonation);
* the Python consumer helper connects with a provider file and the ClusterProfile read from
  the hub;
* `--clusterprofiles=off` removes our entry and only ours.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs import layout
from gateway.access.clusterprofile import build_configuration, load_providers
from gateway.fixtures import (
    AGENT_USER,
    DEMO_USER,
    GATEWAY_USER,
    agent_args,
    agent_kubeconfig,
    gateway_args,
    hub_rbac,
    managed_rbac,
    sample_pod,
    write_private,
)
from kubesim.testing import CLUSTERPROFILE_CRD, RunningKubeSim, run_kubesim_in_thread
from tests.support import ProcessGroup, eventually_blocking, free_port, wait_for_port

API = "multicluster.x-k8s.io/v1alpha1"
FOREIGN = {"name": "open-cluster-management", "cluster": {"server": "https://ocm-proxy/cluster1"}}
PLUGIN = [sys.executable, "-m", "gateway.access.creds"]


@dataclass
class Fleet:
    root: Path
    pki: Path
    hub: RunningKubeSim
    cluster1: RunningKubeSim
    group: ProcessGroup
    front: str
    hub_kubeconfig: Path
    demo_token_file: Path
    managed_sa_token: str
    gateway: Any = None

    def profile(self, name: str) -> dict[str, Any]:
        return self.hub.get(API, "clusterprofiles", name, "fleet") or {}

    def ours(self, name: str) -> list[dict[str, Any]]:
        providers = (self.profile(name).get("status") or {}).get("accessProviders") or []
        return [p for p in providers if p.get("name") == "hubproxy"]


def profile(name: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ClusterProfile",
            "metadata": {"name": name, "namespace": "fleet"},
            "spec": {"clusterManager": {"name": "ocm"}}}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("clusterprofile")
    pki = root / "pki"
    layout.init(pki, layout.InitOptions(clusters=["cluster1"]))
    gateway_token = "gw-" + os.urandom(12).hex()
    agent_token = "agent-" + os.urandom(12).hex()
    group = ProcessGroup()
    with contextlib.ExitStack() as stack:
        hub = stack.enter_context(run_kubesim_in_thread(
            root, name="hub", users=[(gateway_token, GATEWAY_USER, "gw")], rbac=hub_rbac(),
            crds=[CLUSTERPROFILE_CRD]))
        cluster1 = stack.enter_context(run_kubesim_in_thread(
            root, name="cluster1", users=[(agent_token, AGENT_USER, "agent")],
            rbac=managed_rbac()))
        cluster1.apply(sample_pod())
        # Least privilege for the writer, as in deploy/hub/rbac.yaml.
        hub.grant(f"User:{GATEWAY_USER}", ["get", "list", "watch"], ["clusterprofiles"],
                  ["multicluster.x-k8s.io"])
        hub.grant(f"User:{GATEWAY_USER}", ["patch"], ["clusterprofiles/status"],
                  ["multicluster.x-k8s.io"])
        hub.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}})
        with_foreign = {**profile("cluster1"), "status": {"accessProviders": [FOREIGN]}}
        hub.apply([with_foreign, profile("cluster2")])
        hub.apply(with_foreign)  # status is ignored on create
        # A managed-serviceaccount token of cluster1, synced into the hub as OCM does.
        managed_sa_token = cluster1.mint_token("kueue", "msa")
        cluster1.grant("ServiceAccount:kueue:msa", ["get", "list"], ["pods"])
        hub.apply({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "cluster1-msa", "namespace": "fleet"},
                   "data": {"token": base64.b64encode(managed_sa_token.encode()).decode()}})
        reader = hub.mint_token("fleet", "kueue-controller", expiration_seconds=7200)
        hub.grant("ServiceAccount:fleet:kueue-controller", ["get"], ["secrets"],
                  namespace="fleet")
        hub_reader_kc = hub.write_kubeconfig(root / "hub-reader.kubeconfig", token=reader)
        demo_token_file = write_private(root / "demo.token",
                                        hub.mint_token("demo", "demo", expiration_seconds=7200))
        token_file = write_private(root / "agent.token", agent_token)
        agent_kc = write_private(root / "agent.kubeconfig", yaml.safe_dump(
            agent_kubeconfig(cluster1.url, cluster1.ca_file, str(token_file))))
        hub_kc = write_private(root / "hub.kubeconfig", yaml.safe_dump(
            hub.kubeconfig(gateway_token)))
        front_port, tunnel_port = free_port(), free_port()
        front = f"https://127.0.0.1:{front_port}"
        stack.callback(group.stop_all)
        gateway = group.hubproxy(
            *gateway_args(pki, listen=f"127.0.0.1:{front_port}",
                          tunnel_listen=f"127.0.0.1:{tunnel_port}",
                          health_listen=f"127.0.0.1:{free_port()}", hub_kubeconfig=hub_kc),
            "--clusterprofiles", "on", "--public-url", front,
            "--clusterprofile-namespace", "fleet", "--token-passthrough")
        wait_for_port(front_port, timeout=20)
        wait_for_port(tunnel_port, timeout=20)
        group.hubproxy(*agent_args(pki, "cluster1", hub=f"127.0.0.1:{tunnel_port}",
                                   kubeconfig=agent_kc, health_listen="off"))
        fleet = Fleet(root, pki, hub, cluster1, group, front, hub_reader_kc, demo_token_file,
                      managed_sa_token, gateway)
        try:
            eventually_blocking(lambda: bool(fleet.ours("cluster1")), 30,
                                "access provider entry", interval=0.1)
        except AssertionError:
            raise AssertionError(gateway.output[-4000:]) from None
        yield fleet


def test_gateway_publishes_its_entry_for_connected_clusters_only(fleet: Fleet) -> None:
    entry = fleet.ours("cluster1")[0]["cluster"]
    assert entry["server"] == f"{fleet.front}/cluster1"
    assert base64.b64decode(entry["certificate-authority-data"]) == (
        fleet.pki / "front-ca" / "ca.crt").read_bytes()
    assert entry["extensions"] == [{"name": "client.authentication.k8s.io/exec",
                                    "extension": {"clusterName": "cluster1"}}]
    providers = fleet.profile("cluster1")["status"]["accessProviders"]
    assert providers[0] == FOREIGN and len(providers) == 2
    assert fleet.ours("cluster2") == []  # no agent for cluster2


def kubeconfig_from_profile(fleet: Fleet, path: Path, args: list[str],
                            env: list[dict[str, str]] | None = None) -> Path:
    """What a ClusterProfile consumer builds: server, CA and exec extension from our entry."""
    cluster = fleet.ours("cluster1")[0]["cluster"]
    exec_config: dict[str, Any] = {
        "apiVersion": "client.authentication.k8s.io/v1", "command": PLUGIN[0],
        "args": [*PLUGIN[1:], *args], "provideClusterInfo": True, "interactiveMode": "Never"}
    if env:
        exec_config["env"] = env
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "cluster1",
        "clusters": [{"name": "cluster1", "cluster": cluster}],
        "contexts": [{"name": "cluster1", "context": {"cluster": "cluster1", "user": "cp"}}],
        "users": [{"name": "cp", "user": {"exec": exec_config}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HUBPROXY_CREDS_ACTIVE"}
    env.update(KUBECONFIG=str(kubeconfig), HOME=str(kubeconfig.parent))
    return subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=60)


def test_kubectl_with_hubproxy_creds_is_the_impersonated_hub_identity(fleet: Fleet) -> None:
    kc = kubeconfig_from_profile(fleet, fleet.root / "exec.kubeconfig",
                                 ["--token-file", str(fleet.demo_token_file)])
    result = kubectl(kc, "auth", "whoami", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"]["userInfo"]["username"] == DEMO_USER
    pods = kubectl(kc, "get", "pods", "-o", "name")
    assert pods.returncode == 0 and "pod/demo" in pods.stdout, pods.stderr
    hub_token = fleet.demo_token_file.read_text()
    assert all(hub_token not in str(r.headers) for r in fleet.cluster1.received)


def test_cp_creds_secret_mode_with_token_passthrough(fleet: Fleet) -> None:
    kc = kubeconfig_from_profile(
        fleet, fleet.root / "msa.kubeconfig",
        ["--managed-serviceaccount=msa", "--hub-kubeconfig", str(fleet.hub_kubeconfig)],
        env=[{"name": "NAMESPACE", "value": "fleet"}])
    result = kubectl(kc, "auth", "whoami", "-o", "json")
    assert result.returncode == 0, result.stderr
    # Passthrough: the managed cluster authenticates its own token; no impersonation, no prefix.
    assert json.loads(result.stdout)["status"]["userInfo"]["username"] == (
        "system:serviceaccount:kueue:msa")
    seen = [r for r in fleet.cluster1.received if r.user == "system:serviceaccount:kueue:msa"]
    assert seen and all(not r.header("Impersonate-User") for r in seen)


async def test_python_helper_connects_with_provider_file_and_hub_profile(fleet: Fleet) -> None:
    providers_file = fleet.root / "providers.json"
    providers_file.write_text(json.dumps({"providers": [
        {"name": "some-other-provider", "execConfig": {
            "command": "/bin/false", "apiVersion": "client.authentication.k8s.io/v1"}},
        {"name": "hubproxy", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": PLUGIN[0],
            "args": [*PLUGIN[1:], "--token-file", str(fleet.demo_token_file)],
            "provideClusterInfo": True}},
    ]}))
    from kubernetes_asyncio import client

    async with fleet.hub.api_client() as hub_api:
        cp = await client.CustomObjectsApi(hub_api).get_namespaced_custom_object(
            "multicluster.x-k8s.io", "v1alpha1", "fleet", "clusterprofiles", "cluster1")
    configuration = await build_configuration(cp, load_providers(providers_file))
    async with client.ApiClient(configuration) as api:
        pods = await client.CoreV1Api(api).list_namespaced_pod("default")
    assert [p.metadata.name for p in pods.items] == ["demo"]


def test_clusterprofiles_off_removes_only_our_entry(fleet: Fleet) -> None:
    """The operator disables the feature: the gateway restarts with --clusterprofiles=off."""
    assert fleet.ours("cluster1")
    fleet.gateway.stop()
    hub_kc = fleet.root / "hub.kubeconfig"
    off = fleet.group.hubproxy(
        *gateway_args(fleet.pki, listen=f"127.0.0.1:{free_port()}",
                      tunnel_listen=f"127.0.0.1:{free_port()}", health_listen="off",
                      hub_kubeconfig=hub_kc),
        "--clusterprofiles", "off", "--clusterprofile-namespace", "fleet")
    try:
        eventually_blocking(lambda: fleet.ours("cluster1") == [], 20, "entry removed", interval=0.1)
    except AssertionError:
        raise AssertionError(off.output[-3000:]) from None
    finally:
        off.stop()
    assert fleet.profile("cluster1")["status"]["accessProviders"] == [FOREIGN]
