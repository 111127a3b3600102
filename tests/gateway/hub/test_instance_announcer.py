"""The instance Lease under a storm (issue 22): 10,000 clusters arriving over a few seconds cost
about one Lease write a second, and the Lease names all of them (compressed past 128 KiB),
against kubesim."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway.hub.instances import leases
from gateway.hub.instances.announcer import PUBLISH_GAP, InstanceAnnouncer
from kubesim.testing import run_kubesim
from tests.support import eventually
from tunnel.registry import SessionRegistry

pytestmark = pytest.mark.timeout(120)

# kubesim serves no coordination.k8s.io; a CRD of that group stands in for Leases here (the
# real thing: tests/realkube/test_instances.py).
LEASE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "leases.coordination.k8s.io"},
    "spec": {"group": "coordination.k8s.io", "scope": "Namespaced",
             "names": {"kind": "Lease", "plural": "leases", "singular": "lease",
                       "listKind": "LeaseList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                 "openAPIV3Schema": {"type": "object",
                                     "x-kubernetes-preserve-unknown-fields": True}}}]}}


class StandIn:
    closed = False
    draining = False
    active_streams = 0


async def test_a_storm_of_clusters_costs_about_one_lease_write_a_second(
        tmp_path: Path) -> None:
    async with run_kubesim(tmp_path, name="hub", crds=[LEASE_CRD]) as sim:
        sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hubproxy"}})
        registry = SessionRegistry()
        async with sim.api_client() as api:
            announcer = InstanceAnnouncer(api, "hubproxy", 0x1234, registry.clusters,
                                          on_change=lambda peers: None, ready_wait=0)
            registry.subscribe(announcer.cluster_changed)
            announcer.start()
            try:
                await eventually(lambda: announcer.listed)
                started = time.time()
                names = [f"cluster-{i:05d}" for i in range(10_000)]
                for start in range(0, len(names), 250):  # 10,000 clusters over 4 s
                    for name in names[start:start + 250]:
                        registry.add(name, StandIn())
                    await asyncio.sleep(0.1)
                lease_path = "/apis/coordination.k8s.io/v1/namespaces/hubproxy/leases/"

                def published() -> frozenset[str] | None:
                    lease = sim.get("coordination.k8s.io/v1", "leases",
                                    leases.lease_name(0x1234), "hubproxy") or {}
                    return leases.published_clusters(lease["metadata"].get("annotations")
                                                      or {})

                await eventually(lambda: published() == frozenset(names), timeout=15)
                elapsed = time.time() - started
                writes = [r for r in sim.received if r.method == "PUT" and r.at >= started
                          and r.path.startswith(lease_path)]
                assert len(writes) <= elapsed / PUBLISH_GAP + 2, (len(writes), elapsed)
                lease = sim.get("coordination.k8s.io/v1", "leases", leases.lease_name(0x1234),
                                "hubproxy")
                assert leases.COMPRESSED_CLUSTERS_ANNOTATION in lease["metadata"]["annotations"]
                assert announcer.writes.snapshot()["writes"][-1][:2] == ["leases", "ok"]
            finally:
                await announcer.stop()
