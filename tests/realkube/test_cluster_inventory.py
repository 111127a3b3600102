"""The hub's cluster inventory decides 404 or 503 at once (issue 14 item 10), on the real hub.

Gateways here run with the default 60 s --unknown-cluster-grace and deploy/hub's RBAC. Without
an inventory a cluster nobody has seen is 503 for that minute; with one, a cluster the
inventory does not list is 404 within seconds of start, one it lists but that is not connected
is 503, and the watch follows objects added and deleted later.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.realkube.conftest import Fleet
from tests.realkube.hubproxy import Gateway, start_gateway, wait_connected

NAMESPACE = "inventory"  # ClusterProfiles of this module only (--clusterprofile-namespace)
OFFLINE_MANAGED = "offline-managed"  # a ManagedCluster whose agent never connects
OFFLINE_PROFILED = "offline-profiled"  # a ClusterProfile whose agent never connects
UNKNOWN = "no-such-cluster"


def managed_cluster(name: str) -> dict[str, Any]:
    return {"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": {"name": name}, "spec": {"hubAcceptsClient": True}}


def cluster_profile(name: str) -> dict[str, Any]:
    return {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"clusterManager": {"name": "test"}}}


@pytest.fixture(scope="module")
def caller(fleet: Fleet) -> str:
    """A hub user who may use every cluster (alice may use cluster1 only: 403 elsewhere)."""
    fleet.hub.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "fleet-admin", "namespace": "fleet"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "use-every-cluster"},
         "rules": [{"apiGroups": ["cluster.open-cluster-management.io"],
                    "resources": ["managedclusters/proxy"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "fleet-admin-uses-every-cluster"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "use-every-cluster"},
         "subjects": [{"kind": "ServiceAccount", "name": "fleet-admin", "namespace": "fleet"}]},
    ])
    token = fleet.hub.create_token("fleet", "fleet-admin")
    fleet.tokens.append(token)
    return token


@pytest.fixture(scope="module")
def inventory(fleet: Fleet) -> None:
    fleet.hub.apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        managed_cluster(OFFLINE_MANAGED), cluster_profile(OFFLINE_PROFILED)])


@pytest.fixture(scope="module")
def gateways(fleet: Fleet, inventory: None, caller: str) -> Iterator[dict[str, Gateway]]:
    started = {}
    for mode in ("managedclusters", "clusterprofiles", "auto", "none"):
        started[mode] = start_gateway(
            fleet.group, fleet.pki, fleet.gateway_kubeconfig, fleet.agent_kubeconfig,
            "--cluster-inventory", mode, "--clusterprofile-namespace", NAMESPACE)
    for gateway in started.values():
        wait_connected(gateway, fleet.alice)
    yield started
    for gateway in started.values():
        for process in (gateway.agent, gateway.process):
            if process is not None:
                process.stop()


def status(gateway: Gateway, token: str, cluster: str) -> int:
    return gateway.curl(f"/{cluster}/version", token)[0]


def settles(gateway: Gateway, token: str, cluster: str, expected: int,
            timeout: float = 15.0) -> float:
    """Seconds until ``cluster`` answers ``expected`` (well within the 60 s grace)."""
    started = time.monotonic()
    while (got := status(gateway, token, cluster)) != expected:
        assert time.monotonic() - started < timeout, (
            f"{cluster}: {got}, not {expected}\n{gateway.logs()[-2000:]}")
        time.sleep(0.2)
    return time.monotonic() - started


def test_managedclusters_decide_at_once(caller: str, gateways: dict[str, Gateway]) -> None:
    gateway = gateways["managedclusters"]
    settles(gateway, caller, UNKNOWN, 404)
    assert status(gateway, caller, OFFLINE_MANAGED) == 503
    # Not a ManagedCluster: this inventory does not know a ClusterProfile's cluster.
    assert status(gateway, caller, OFFLINE_PROFILED) == 404
    code, body = gateway.curl_json(f"/{OFFLINE_MANAGED}/version", caller)
    assert (code, body["message"]) == (503, f'cluster "{OFFLINE_MANAGED}" is not connected')
    assert "inventory: ManagedCluster objects on the hub decide" in gateway.logs()


def test_the_watch_follows_objects_added_and_deleted(fleet: Fleet, caller: str,
                                                     gateways: dict[str, Gateway]) -> None:
    gateway = gateways["managedclusters"]
    settles(gateway, caller, UNKNOWN, 404)
    fleet.hub.apply(managed_cluster("joins-later"))
    settles(gateway, caller, "joins-later", 503)
    fleet.hub.admin("delete", "managedcluster", "joins-later")
    settles(gateway, caller, "joins-later", 404)


def test_clusterprofiles_decide_at_once(caller: str, gateways: dict[str, Gateway]) -> None:
    gateway = gateways["clusterprofiles"]
    settles(gateway, caller, UNKNOWN, 404)
    assert status(gateway, caller, OFFLINE_PROFILED) == 503
    assert status(gateway, caller, OFFLINE_MANAGED) == 404


def test_auto_picks_the_managedclusters_of_an_ocm_hub(caller: str,
                                                      gateways: dict[str, Gateway]) -> None:
    gateway = gateways["auto"]
    settles(gateway, caller, UNKNOWN, 404)
    assert status(gateway, caller, OFFLINE_MANAGED) == 503


def test_without_an_inventory_the_grace_still_applies(caller: str,
                                                      gateways: dict[str, Gateway]) -> None:
    gateway = gateways["none"]
    for _ in range(5):  # an unknown name is "maybe reconnecting" for the whole grace
        assert status(gateway, caller, UNKNOWN) == 503
        time.sleep(0.5)


def test_connected_clusters_are_served_whatever_the_inventory(
        caller: str, gateways: dict[str, Gateway]) -> None:
    # cluster1 is in no inventory here, but its agent's certificate names it.
    for gateway in gateways.values():
        assert status(gateway, caller, "cluster1") == 200
