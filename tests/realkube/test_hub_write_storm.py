"""The hub writers under a storm on the real hub (issue 22): 200 clusters' ClusterProfiles and
ManagedClusterAddOns, written with exactly deploy/hub's and deploy/ocm's RBAC.

The writers run in this process as the gateway runs them (one shared write rate, a real
SessionRegistry whose agent sessions are stand-ins). The hub's audit log counts what they sent:
each object is written once as the fleet forms, never faster than the rate, and a restarted
gateway whose agents come back writes nothing. The add-ons are read with one list (a
``metadata.name`` field selector, which deploy/ocm's ``resourceNames`` rule allows on a real
apiserver), not a GET each.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import trustme

from gateway.hub.admission.auth import build_hub_api_client
from gateway.hub.clusterprofile.writer import AccessProviderWriter
from gateway.hub.hubwrites import HubWriteRate, HubWrites
from gateway.hub.ocm.writer import AddOnConditionWriter
from tests.realkube.binaries import REPO
from tests.realkube.conftest import GATEWAY_SA, Fleet
from tunnel.registry import SessionRegistry

N = 200
NAMESPACE = "storm"
QPS, BURST = 100.0, 20
GATEWAY_USER = f"system:serviceaccount:{GATEWAY_SA[0]}:{GATEWAY_SA[1]}"


class StandIn:
    closed = False
    draining = False
    active_streams = 0


def names() -> list[str]:
    return [f"storm-{i:03d}" for i in range(N)]


def objects() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": NAMESPACE}}]
    for name in names():
        out += [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
                 "metadata": {"name": name, "namespace": NAMESPACE},
                 "spec": {"clusterManager": {"name": "ocm"}, "displayName": name}},
                {"apiVersion": "addon.open-cluster-management.io/v1alpha1",
                 "kind": "ManagedClusterAddOn",
                 "metadata": {"name": "hubproxy", "namespace": name}, "spec": {}}]
    return out


def ours(event: dict[str, Any]) -> bool:
    ref = event.get("objectRef") or {}
    return (event["user"]["username"] == GATEWAY_USER and event.get("stage") == "ResponseComplete"
            and ((ref.get("resource") == "clusterprofiles"
                  and ref.get("namespace") == NAMESPACE)
                 or (ref.get("resource") == "managedclusteraddons"
                     and str(ref.get("namespace", "")).startswith("storm-"))
                 or (ref.get("resource") == "managedclusteraddons"
                     and not ref.get("namespace"))))  # the list of every add-on


def at(event: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(
        event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()


async def run_writers(fleet: Fleet, ca: bytes, connect: list[str],
                      settle: float) -> tuple[float, float]:
    """One gateway process's writers: start them, let ``connect`` connect, wait until no
    object waits for a write, and ``settle`` seconds at least, stop. (start, end) times."""
    api = await build_hub_api_client(str(fleet.gateway_kubeconfig))
    registry = SessionRegistry()
    writes = HubWrites(HubWriteRate(QPS, BURST))
    profiles = AccessProviderWriter(api, provider_name="hubproxy",
                                    public_url="https://gw.example:9092", ca_bundle=lambda: ca,
                                    connected_clusters=registry.clusters,
                                    namespaces=[NAMESPACE], grace=60.0, writes=writes)
    addons = AddOnConditionWriter(api, addon="hubproxy", connected_clusters=registry.clusters,
                                  grace=60.0, writes=writes)
    registry.subscribe(profiles.cluster_changed)
    registry.subscribe(addons.cluster_changed)
    started = time.time()
    tasks = [asyncio.ensure_future(profiles.run()), asyncio.ensure_future(addons.run())]
    try:
        deadline = time.monotonic() + 60
        while len(profiles.profiles) < N or addons.listing is None:
            assert time.monotonic() < deadline, "the writers did not read the hub"
            await asyncio.sleep(0.1)
        for name in connect:
            registry.add(name, StandIn())
        deadline = time.monotonic() + 90
        while (time.monotonic() < deadline
               and (sum(writes.pending().values()) or time.time() - started < settle)):
            await asyncio.sleep(0.2)
        assert addons.listing is True, "deploy/ocm's RBAC should let the writer list"
        assert sum(writes.pending().values()) == 0, writes.pending()
        return started, time.time()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await api.close()


def wrong(fleet: Fleet) -> list[str]:
    out = []
    _, profiles = fleet.hub.request(
        "GET", f"/apis/multicluster.x-k8s.io/v1alpha1/namespaces/{NAMESPACE}/clusterprofiles")
    for item in profiles["items"]:
        if [p["name"] for p in item.get("status", {}).get("accessProviders", [])] != \
                ["hubproxy"]:
            out.append(item["metadata"]["name"])
    _, addons = fleet.hub.request(
        "GET", "/apis/addon.open-cluster-management.io/v1alpha1/managedclusteraddons")
    for item in addons["items"]:
        if not item["metadata"]["namespace"].startswith("storm-"):
            continue
        conditions = {c["type"]: c["status"] for c in
                      item.get("status", {}).get("conditions", [])}
        if conditions.get("TunnelConnected") != "True":
            out.append(f"addon {item['metadata']['namespace']}")
    return out


def test_a_storm_writes_each_object_once_at_the_rate_and_a_restart_writes_nothing(
        fleet: Fleet) -> None:
    hub = fleet.hub
    hub.admin("apply", "--validate=false", "-k", str(REPO / "deploy" / "ocm"))
    hub.apply(objects())
    ca = trustme.CA().cert_pem.bytes()

    started, ended = asyncio.run(run_writers(fleet, ca, names(), settle=0))
    assert wrong(fleet) == []
    events = [e for e in hub.audit_events() if ours(e) and started <= at(e) <= ended]
    written = sorted((e for e in events if e["verb"] == "patch"), key=at)
    assert len(written) == 2 * N, len(written)  # one per profile, one per add-on
    assert all(e["responseStatus"]["code"] == 200 for e in written)
    first = at(written[0])
    for count, event in enumerate(written, start=1):
        # The hub's clock, to the microsecond: writes so far <= burst + qps * t (+ slack for
        # requests in flight when the clock was read).
        assert count <= BURST + QPS * (at(event) - first) + 3, count
    listed = [e for e in events if e["verb"] == "list"
              and e["objectRef"].get("resource") == "managedclusteraddons"]
    assert listed and all(e["responseStatus"]["code"] == 200 for e in listed)
    assert not [e for e in events if e["verb"] == "get"
                and e["objectRef"].get("resource") == "managedclusteraddons"]
    assert [e["requestURI"] for e in events if e["responseStatus"]["code"] == 403] == []

    # The gateway restarts: its agents come back; what its predecessor wrote is right.
    started, ended = asyncio.run(run_writers(fleet, ca, names(), settle=3.0))
    events = [e for e in hub.audit_events() if ours(e) and started <= at(e) <= ended]
    assert [e["objectRef"] for e in events if e["verb"] == "patch"] == []
    assert [e["requestURI"] for e in events if e["responseStatus"]["code"] == 403] == []
    assert wrong(fleet) == []
