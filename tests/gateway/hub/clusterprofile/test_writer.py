"""The access-provider writer against kubesim with the upstream ClusterProfile CRD installed.

The writer runs with a least-privilege hub identity (get/list/watch clusterprofiles, patch
clusterprofiles/status), fills its entry for served clusters, leaves foreign providers and
conditions alone, follows a CA rotation, and removes its entry when a cluster is no longer
served or the feature is disabled.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from gateway.hub.clusterprofile.writer import AccessProviderWriter
from kubesim.testing import CLUSTERPROFILE_CRD, run_kubesim
from tests.support import eventually

API = "multicluster.x-k8s.io/v1alpha1"
FOREIGN = {"name": "open-cluster-management", "cluster": {"server": "https://ocm-proxy/c1"}}
CONDITION = {
    "type": "ControlPlaneHealthy",
    "status": "True",
    "reason": "Healthy",
    "message": "ok",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}


def profile(name: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": API,
        "kind": "ClusterProfile",
        "metadata": {"name": name, "namespace": "fleet"},
        "spec": {"clusterManager": {"name": "ocm"}, "displayName": name},
    }
    if status is not None:
        obj["status"] = status
    return obj


def providers(sim: Any, name: str) -> list[dict[str, Any]]:
    obj = sim.get(API, "clusterprofiles", name, "fleet") or {}
    return list((obj.get("status") or {}).get("accessProviders") or [])


def ours(sim: Any, name: str) -> list[dict[str, Any]]:
    return [p for p in providers(sim, name) if p.get("name") == "hubproxy"]


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Any]:
    async with run_kubesim(tmp_path, name="hub", crds=[CLUSTERPROFILE_CRD]) as sim:
        sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}})
        cluster1 = profile("cluster1", {"accessProviders": [FOREIGN], "conditions": [CONDITION]})
        sim.apply([cluster1, profile("cluster2"), profile("cluster3")])
        sim.apply(cluster1)  # status is ignored on create, as with any status subresource
        assert providers(sim, "cluster1") == [FOREIGN]
        yield sim


@contextlib.asynccontextmanager
async def running(writer: AccessProviderWriter) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(writer.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_writer_fills_updates_and_removes_only_its_entry(hub: Any) -> None:
    token = hub.mint_token("hubproxy", "gateway")
    account = "ServiceAccount:hubproxy:gateway"
    hub.grant(account, ["get", "list", "watch"], ["clusterprofiles"], ["multicluster.x-k8s.io"])
    hub.grant(account, ["patch"], ["clusterprofiles/status"], ["multicluster.x-k8s.io"])

    first_ca, second_ca = trustme.CA(), trustme.CA()
    current_ca = {"pem": first_ca.cert_pem.bytes()}
    connected = {"cluster1", "cluster2"}
    async with hub.api_client(token) as api:
        writer = AccessProviderWriter(
            api,
            provider_name="hubproxy",
            public_url="https://gw.example:9092",
            ca_bundle=lambda: current_ca["pem"],
            connected_clusters=lambda: connected,
            namespaces=["fleet"],
            grace=0.0,
            resync_interval=0.2,
        )
        async with running(writer):
            await eventually(lambda: bool(ours(hub, "cluster1")) and bool(ours(hub, "cluster2")))
            entry = ours(hub, "cluster1")[0]
            assert entry["cluster"]["server"] == "https://gw.example:9092/cluster1"
            assert entry["cluster"]["extensions"] == [
                {"name": "client.authentication.k8s.io/exec",
                 "extension": {"clusterName": "cluster1"}}
            ]
            assert base64.b64decode(entry["cluster"]["certificate-authority-data"]) == (
                first_ca.cert_pem.bytes()
            )
            cluster1 = hub.get(API, "clusterprofiles", "cluster1", "fleet")
            assert cluster1["status"]["accessProviders"][0] == FOREIGN
            assert cluster1["status"]["conditions"] == [CONDITION]
            assert ours(hub, "cluster3") == []

            current_ca["pem"] = second_ca.cert_pem.bytes()
            await eventually(
                lambda: base64.b64decode(ours(hub, "cluster2")[0]["cluster"][
                    "certificate-authority-data"]) == second_ca.cert_pem.bytes()
            )

            connected.discard("cluster2")
            writer.cluster_changed("cluster2", connected=False)
            await eventually(lambda: ours(hub, "cluster2") == [])
            assert len(ours(hub, "cluster1")) == 1

            # A profile created later is picked up by the watch.
            hub.apply(profile("cluster4"))
            connected.add("cluster4")
            writer.cluster_changed("cluster4", connected=True)
            await eventually(lambda: bool(ours(hub, "cluster4")))

            # Converged: resyncs find nothing to change.
            patches_before = writer.patches
            await asyncio.sleep(0.6)
            assert writer.patches == patches_before, "a converged writer keeps patching"

        removed = await writer.remove_all()
        assert removed == 2
        assert providers(hub, "cluster1") == [FOREIGN]
        assert hub.get(API, "clusterprofiles", "cluster1", "fleet")["status"]["conditions"] == [
            CONDITION
        ]
        assert ours(hub, "cluster4") == []


async def test_writer_needs_no_more_than_its_rbac(hub: Any) -> None:
    """Without patch on clusterprofiles/status, nothing is written (and nothing crashes)."""
    token = hub.mint_token("hubproxy", "readonly")
    hub.grant("ServiceAccount:hubproxy:readonly", ["get", "list", "watch"], ["clusterprofiles"],
              ["multicluster.x-k8s.io"])
    async with hub.api_client(token) as api:
        writer = AccessProviderWriter(
            api, provider_name="hubproxy", public_url="https://gw:9092",
            ca_bundle=lambda: trustme.CA().cert_pem.bytes(),
            connected_clusters=lambda: {"cluster2"}, namespaces=["fleet"], resync_interval=0.2,
        )
        async with running(writer):
            await eventually(lambda: ("fleet", "cluster2") in writer.profiles)
            await asyncio.sleep(0.5)
        assert writer.patches == 0
        assert ours(hub, "cluster2") == []
        writes = [r for r in hub.received if r.method == "PATCH"]
        assert writes and all(r.status == 403 for r in writes)
