"""The hub writers under storms, against kubesim with the upstream ClusterProfile and OCM
ManagedClusterAddOn CRDs: writes coalesced per object, sent at the shared rate, and every
object right in the end (issue 22).

Both writers (the ClusterProfile access provider and the OCM ``TunnelConnected`` condition)
run as the gateway runs them: fed by a real :class:`tunnel.registry.SessionRegistry` whose
sessions are stand-ins, sharing one :class:`gateway.hub.hubwrites.HubWrites`. The hub's own
request log (kubesim's ``received``) counts what reached it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from gateway.hub.clusterprofile.writer import AccessProviderWriter
from gateway.hub.hubwrites import HubWriteRate, HubWrites
from gateway.hub.ocm.writer import AddOnConditionWriter
from kubesim.testing import CLUSTERPROFILE_CRD, run_kubesim
from tests.support import eventually
from tunnel.registry import SessionRegistry

pytestmark = pytest.mark.timeout(120)

ADDON_CRD = (CLUSTERPROFILE_CRD.parent / "ocm" /
             "0000_01_addon.open-cluster-management.io_managedclusteraddons.crd.yaml")
PROFILES = "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/fleet/clusterprofiles"
ADDONS = "managedclusteraddons"
GATEWAY = "ServiceAccount:hubproxy:gateway"


class StandIn:
    """A connected agent session, as far as the registry and the writers look."""

    closed = False
    draining = False
    active_streams = 0


def names(n: int) -> list[str]:
    return [f"cluster-{i:04d}" for i in range(n)]


@contextlib.asynccontextmanager
async def hub_with(tmp_path: Path, clusters: list[str]) -> AsyncIterator[Any]:
    async with run_kubesim(tmp_path, name="hub", crds=[CLUSTERPROFILE_CRD, ADDON_CRD]) as sim:
        _populate(sim, clusters)
        yield sim


def _populate(sim: Any, clusters: list[str]) -> None:
    sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}})
    for name in clusters:
        sim.apply([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
             "metadata": {"name": name, "namespace": "fleet"},
             "spec": {"clusterManager": {"name": "ocm"}, "displayName": name}},
            {"apiVersion": "addon.open-cluster-management.io/v1alpha1",
             "kind": "ManagedClusterAddOn",
             "metadata": {"name": "hubproxy", "namespace": name}, "spec": {}}])
    # deploy/hub and deploy/ocm's RBAC (kubesim authorizes a list by resourceNames only with
    # the name in the path, so the add-on list and watch are granted without them here).
    sim.grant(GATEWAY, ["get", "list", "watch"], ["clusterprofiles"], ["multicluster.x-k8s.io"])
    sim.grant(GATEWAY, ["patch"], ["clusterprofiles/status"], ["multicluster.x-k8s.io"])
    sim.grant(GATEWAY, ["get", "list", "watch"], [ADDONS], ["addon.open-cluster-management.io"])
    sim.grant(GATEWAY, ["patch"], [f"{ADDONS}/status"], ["addon.open-cluster-management.io"],
              resource_names=["hubproxy"])


class Writers:
    """One gateway process's writers (and its registry), running until stopped."""

    def __init__(self, api: Any, registry: SessionRegistry, writes: HubWrites,
                 grace: float, ca: bytes) -> None:
        self.registry = registry
        self.profiles = AccessProviderWriter(
            api, provider_name="hubproxy", public_url="https://gw.example:9092",
            ca_bundle=lambda: ca, connected_clusters=registry.clusters, namespaces=["fleet"],
            grace=grace, writes=writes)
        self.addons = AddOnConditionWriter(api, addon="hubproxy",
                                           connected_clusters=registry.clusters, grace=grace,
                                           writes=writes)
        registry.subscribe(self.profiles.cluster_changed)
        registry.subscribe(self.addons.cluster_changed)
        self.tasks = [asyncio.ensure_future(self.profiles.run()),
                      asyncio.ensure_future(self.addons.run())]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def gateway_writers(sim: Any, writes: HubWrites, grace: float,
                          ca: bytes) -> AsyncIterator[Writers]:
    token = sim.mint_token("hubproxy", "gateway")
    async with sim.api_client(token) as api:
        writers = Writers(api, SessionRegistry(), writes, grace, ca)
        try:
            yield writers
        finally:
            await writers.stop()


def wrong(sim: Any, connected: set[str], clusters: list[str]) -> list[str]:
    """Objects that do not say what they should yet."""
    out = []
    for name in clusters:
        profile = sim.get("multicluster.x-k8s.io/v1alpha1", "clusterprofiles", name, "fleet")
        ours = [p for p in (profile.get("status") or {}).get("accessProviders") or []
                if p.get("name") == "hubproxy"]
        if bool(ours) != (name in connected):
            out.append(f"profile {name}")
        addon = sim.get("addon.open-cluster-management.io/v1alpha1", ADDONS, "hubproxy", name)
        status = {c["type"]: c["status"] for c in
                  (addon.get("status") or {}).get("conditions") or []}.get("TunnelConnected")
        if status != ("True" if name in connected else "False"):
            out.append(f"addon {name}: {status}")
    return out


def patches(sim: Any, since: float = 0.0) -> list[Any]:
    return [r for r in sim.received if r.method == "PATCH" and r.at >= since]


PROFILE_STATUS = "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/fleet/clusterprofiles/c1/status"
ADDON_STATUS = ("/apis/addon.open-cluster-management.io/v1alpha1/namespaces/c1/"
                "managedclusteraddons/hubproxy/status")


async def test_a_thousand_flaps_of_one_cluster_are_one_write_of_its_final_state(
        tmp_path: Path) -> None:
    """The rate's token is spent first, so the writers wait for the next while the agent
    connects and disconnects 1,000 times (the event loop running between flaps). Ending where
    it started (disconnected, no entry), the profile costs no write, though the first flap
    marked it while connected; ending connected, each object is written once, connected."""
    async with hub_with(tmp_path, ["c1"]) as sim:
        rate = HubWriteRate(2.0, 1)
        async with gateway_writers(sim, HubWrites(rate), grace=0.0,
                                   ca=trustme.CA().cert_pem.bytes()) as writers:
            await eventually(lambda: ("fleet", "c1") in writers.profiles.profiles
                             and writers.addons.listing is True)
            session = StandIn()

            async def flaps(end_connected: bool) -> list[str]:
                await rate.take()  # the next token comes in 0.5 s
                started = time.time()
                for flap in range(1000):
                    writers.registry.add("c1", session)
                    if flap % 50 == 0:  # the writers run while it is connected
                        await asyncio.sleep(0)
                    writers.registry.remove("c1", session)
                if end_connected:
                    writers.registry.add("c1", session)
                await asyncio.sleep(2.0)  # four tokens' worth
                return sorted(r.path.partition("?")[0] for r in patches(sim, started))

            # Seen now and disconnected: the add-on says False; the profile had no entry.
            assert await flaps(end_connected=False) == [ADDON_STATUS]
            assert writers.profiles.patches == 0
            assert await flaps(end_connected=True) == [ADDON_STATUS, PROFILE_STATUS]
            assert not wrong(sim, {"c1"}, ["c1"])
            assert writers.profiles.patches == 1 and writers.addons.patches == 2


async def test_a_storm_writes_each_changed_object_once_at_the_rate_and_converges(
        tmp_path: Path) -> None:
    clusters = names(150)
    ca = trustme.CA().cert_pem.bytes()
    qps, burst = 150.0, 10
    async with hub_with(tmp_path, clusters) as sim:
        # 1. The fleet forms: every object needs one write, and gets exactly one, at the rate.
        writes = HubWrites(HubWriteRate(qps, burst))
        async with gateway_writers(sim, writes, grace=60.0, ca=ca) as writers:
            await eventually(lambda: len(writers.profiles.profiles) == len(clusters))
            started = time.time()
            sessions = {name: StandIn() for name in clusters}
            for name in clusters:
                writers.registry.add(name, sessions[name])
            await eventually(lambda: not wrong(sim, set(clusters), clusters), timeout=30)
            formed = patches(sim, started)
            assert len(formed) == 2 * len(clusters)  # one per profile, one per add-on
            assert all(r.status == 200 for r in formed)
            for count, request in enumerate(sorted(formed, key=lambda r: r.at), start=1):
                # The hub's clock: writes so far <= burst + qps * t (+ scheduling slack).
                assert count <= burst + qps * (request.at - started) + 5, count
            # 2. A storm of flaps within the grace: no write at all.
            quiet_from = time.time()
            for _ in range(5):
                for name in clusters:
                    writers.registry.remove(name, sessions[name])
                await asyncio.sleep(0.05)
                for name in clusters:
                    writers.registry.add(name, sessions[name])
            await asyncio.sleep(1.0)
            assert patches(sim, quiet_from) == []
            assert writes.snapshot()["pending"] == {"clusterprofiles": 0,
                                                    "managedclusteraddons": 0}
            # Someone else removes our condition and our entry: the watches see it, and each
            # is written again (no resync needed, and nothing else is written).
            repaired_from = time.time()
            victim = clusters[7]
            addon = sim.get("addon.open-cluster-management.io/v1alpha1", ADDONS, "hubproxy",
                            victim)
            addon["status"] = {"conditions": []}
            sim.apply(addon)
            profile = sim.get("multicluster.x-k8s.io/v1alpha1", "clusterprofiles", victim,
                              "fleet")
            profile["status"] = {"accessProviders": []}
            sim.apply(profile)
            await eventually(lambda: not wrong(sim, set(clusters), clusters), timeout=10)
            assert len(patches(sim, repaired_from)) == 2

        # 3. The gateway restarts: new writers, an empty registry, agents coming back. The
        # entries and conditions its predecessor wrote stay (the grace runs from the start):
        # no write, and the add-ons are read with one list, not a GET each.
        restarted = time.time()
        writes = HubWrites(HubWriteRate(qps, burst))
        async with gateway_writers(sim, writes, grace=60.0, ca=ca) as writers:
            await eventually(lambda: len(writers.profiles.profiles) == len(clusters)
                             and writers.addons.listing is True)
            for name in clusters:
                writers.registry.add(name, StandIn())
            await asyncio.sleep(1.0)
            assert patches(sim, restarted) == []
            assert not wrong(sim, set(clusters), clusters)
            gets = [r for r in sim.received if r.at >= restarted and r.method == "GET"
                    and "/managedclusteraddons/" in r.path]
            assert gets == []

        # 4. Half the fleet goes away for longer than the grace: those objects, and only
        # those, are written once each.
        writes = HubWrites(HubWriteRate(qps, burst))
        async with gateway_writers(sim, writes, grace=0.5, ca=ca) as writers:
            await eventually(lambda: len(writers.profiles.profiles) == len(clusters)
                             and writers.addons.listing is True)
            stay = set(clusters[::2])
            for name in clusters:
                writers.registry.add(name, sessions[name])
            await asyncio.sleep(0.2)
            gone_at = time.time()
            for name in clusters:
                if name not in stay:
                    writers.registry.remove(name, sessions[name])
            await eventually(lambda: not wrong(sim, stay, clusters), timeout=30)
            await asyncio.sleep(0.5)
            assert len(patches(sim, gone_at)) == 2 * (len(clusters) - len(stay))


async def test_without_the_list_permission_the_addons_are_read_one_by_one(
        tmp_path: Path) -> None:
    """deploy/ocm's rule names the add-on (resourceNames): a hub that does not let it list
    (kubesim, or an older RBAC) still gets its conditions, each add-on read before it is
    written."""
    clusters = names(5)
    async with hub_with(tmp_path, []) as sim:
        for name in clusters:
            sim.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                       {"apiVersion": "addon.open-cluster-management.io/v1alpha1",
                        "kind": "ManagedClusterAddOn",
                        "metadata": {"name": "hubproxy", "namespace": name}, "spec": {}}])
        token = sim.mint_token("hubproxy", "narrow")
        account = "ServiceAccount:hubproxy:narrow"
        sim.grant(account, ["get", "list"], [ADDONS], ["addon.open-cluster-management.io"],
                  resource_names=["hubproxy"])
        sim.grant(account, ["patch"], [f"{ADDONS}/status"],
                  ["addon.open-cluster-management.io"], resource_names=["hubproxy"])
        registry = SessionRegistry()
        async with sim.api_client(token) as api:
            writer = AddOnConditionWriter(api, addon="hubproxy",
                                          connected_clusters=registry.clusters, grace=60.0)
            registry.subscribe(writer.cluster_changed)
            task = asyncio.ensure_future(writer.run())
            try:
                for name in clusters:
                    registry.add(name, StandIn())
                await eventually(lambda: writer.patches == len(clusters), timeout=20)
                assert writer.listing is False
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for name in clusters:
            addon = sim.get("addon.open-cluster-management.io/v1alpha1", ADDONS, "hubproxy",
                            name)
            assert addon["status"]["conditions"][0]["status"] == "True"
