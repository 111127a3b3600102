"""The hub of ``python -m bench fleet``: a real kube-apiserver that takes the gateway's writes.

etcd + kube-apiserver from the real-apiserver test tier (``tests/realkube/apiserver.py``, the
binaries as ``tests/realkube/binaries.py`` finds them), with:

* ``deploy/ocm`` applied (it includes ``deploy/hub``): the gateway runs as that ServiceAccount,
  with exactly that RBAC (TokenReview, ClusterProfiles, its instance Lease, add-on status);
* every CRD of ``../shared/crds`` (ClusterProfile, OCM's ManagedClusterAddOn among them);
* for each of the N clusters a ClusterProfile (namespace ``fleet``) and a namespace holding a
  ManagedClusterAddOn ``hubproxy``, so both writers have work for every cluster;
* a ServiceAccount ``fleet/bench`` whose token (TokenRequest) the load sends: a real hub token.

The hub counts what the gateway asks of it: the apiserver's audit log (Metadata level, every
request once, written before the response) has each request's user, verb, resource and time,
so :meth:`Hub.gateway_requests` gives exact counts and per-second rates of the gateway's
ServiceAccount alone (the benchmark's own listing is another user).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.fleetpki import cluster_name

NAMESPACE = "hubproxy"  # deploy/hub's: its Role grants the Leases there
PROFILE_NAMESPACE = "fleet"
ADDON = "hubproxy"  # the gateway's --ocm-addon-name default
USER_SA = ("fleet", "bench")
GATEWAY_USER = "system:serviceaccount:hubproxy:hubproxy-gateway"
PROVIDER = "hubproxy"  # the gateway's --access-provider-name default
CREATE_CONCURRENCY = 16
READ_VERBS = frozenset({"get", "list", "watch"})
# Created per request, not per object: the gateway's authentication, not a write to the hub.
REVIEWS = frozenset({"tokenreviews", "subjectaccessreviews"})
PROFILES = "/apis/multicluster.x-k8s.io/v1alpha1"
ADDONS = "/apis/addon.open-cluster-management.io/v1alpha1"


@dataclass(frozen=True)
class HubRequest:
    at: float  # time.monotonic() of the stage timestamp (the response)
    verb: str
    resource: str  # "clusterprofiles/status", "leases", ...


@dataclass
class Hub:
    root: Path
    kube: Any = None  # tests.realkube.apiserver.RealKube
    group: Any = None  # tests.support.ProcessGroup
    gateway_kubeconfig: Path = field(init=False)
    user_token: str = ""
    # time.time() - time.monotonic(): audit timestamps are wall-clock
    wall_offset: float = field(default_factory=lambda: time.time() - time.monotonic())
    _audit_offset: int = 0
    _requests: list[HubRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gateway_kubeconfig = self.root / "gateway.kubeconfig"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.group.started] if self.group else []

    def start(self) -> None:
        from tests.realkube.apiserver import launch_apiserver, start_etcd, wait_ready
        from tests.realkube.binaries import REPO, find_binaries
        from tests.support import ProcessGroup

        binaries = find_binaries()
        self.group = ProcessGroup()
        etcd = start_etcd(self.group, binaries, self.root / "hub")
        self.kube = launch_apiserver(self.group, binaries, "hub", self.root / "hub" / "api",
                                     etcd)
        wait_ready(self.kube)
        crds = REPO.parent / "shared" / "crds"
        for path in sorted(crds.rglob("*.yaml")):
            self.kube.admin("apply", "--validate=false", "--server-side", "-f", str(path))
        self.kube.admin("wait", "--for=condition=Established", "crd", "--all",
                        "--timeout=60s")
        self.kube.admin("apply", "--validate=false", "-k", str(REPO / "deploy" / "ocm"))
        ns, name = USER_SA
        self.kube.apply([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": name, "namespace": ns}}])
        self.kube.kubeconfig(self.gateway_kubeconfig,
                             token=self.kube.create_token(NAMESPACE, "hubproxy-gateway",
                                                          duration="24h"))
        self.user_token = self.kube.create_token(ns, name, duration="24h")

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop_all()

    # --- the fleet's objects ---------------------------------------------------------------

    def create_fleet(self, clusters: int) -> float:
        """A ClusterProfile, a namespace and a ManagedClusterAddOn per cluster; seconds taken."""
        started = time.monotonic()
        asyncio.run(self._create_fleet(clusters))
        return time.monotonic() - started

    async def _create_fleet(self, clusters: int) -> None:
        import aiohttp

        def profile(name: str) -> tuple[str, dict[str, Any]]:
            return (f"{PROFILES}/namespaces/{PROFILE_NAMESPACE}/clusterprofiles", {
                "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
                "metadata": {"name": name, "namespace": PROFILE_NAMESPACE},
                "spec": {"clusterManager": {"name": "bench"}, "displayName": name}})

        def namespace(name: str) -> tuple[str, dict[str, Any]]:
            return ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": name}})

        def addon(name: str) -> tuple[str, dict[str, Any]]:
            return (f"{ADDONS}/namespaces/{name}/managedclusteraddons", {
                "apiVersion": "addon.open-cluster-management.io/v1alpha1",
                "kind": "ManagedClusterAddOn",
                "metadata": {"name": ADDON, "namespace": name}, "spec": {}})

        names = [cluster_name(i) for i in range(clusters)]
        context = ssl.create_default_context(cafile=str(self.kube.ca_file))
        headers = {"Authorization": f"Bearer {self.kube.admin_token}"}
        connector = aiohttp.TCPConnector(ssl=context, limit=CREATE_CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
            async def create(path: str, body: dict[str, Any]) -> None:
                for attempt in range(5):
                    async with session.post(self.kube.url + path, json=body) as answer:
                        if answer.status in (201, 409):  # 409: there from an earlier attempt
                            return
                        text = await answer.text()
                    await asyncio.sleep(0.2 * (attempt + 1))
                raise RuntimeError(f"creating {path}: {answer.status} {text[:300]}")

            async def create_all(objects: list[tuple[str, dict[str, Any]]]) -> None:
                queue = iter(objects)

                async def worker() -> None:
                    for path, body in queue:
                        await create(path, body)

                await asyncio.gather(*(worker() for _ in range(CREATE_CONCURRENCY)))

            await create_all([profile(n) for n in names] + [namespace(n) for n in names])
            await create_all([addon(n) for n in names])

    def check_fleet(self, clusters: int, public_url: str) -> dict[str, int]:
        """How many ClusterProfiles carry our entry for their cluster and how many add-ons say
        ``TunnelConnected=True`` (one paginated LIST each, as the benchmark's admin user)."""
        return asyncio.run(self._check_fleet(clusters, public_url))

    async def _check_fleet(self, clusters: int, public_url: str) -> dict[str, int]:
        import aiohttp

        context = ssl.create_default_context(cafile=str(self.kube.ca_file))
        headers = {"Authorization": f"Bearer {self.kube.admin_token}"}
        base = public_url.rstrip("/")
        names = {cluster_name(i) for i in range(clusters)}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context),
                                         headers=headers) as session:
            async def items(path: str) -> list[dict[str, Any]]:
                out: list[dict[str, Any]] = []
                token = ""
                while True:
                    url = f"{self.kube.url}{path}?limit=2000" + (
                        f"&continue={token}" if token else "")
                    async with session.get(url) as answer:
                        body = await answer.json()
                    out += body.get("items") or []
                    token = (body.get("metadata") or {}).get("continue") or ""
                    if not token:
                        return out

            profiles = await items(f"{PROFILES}/namespaces/{PROFILE_NAMESPACE}/clusterprofiles")
            addons = await items(f"{ADDONS}/managedclusteraddons")
        right_profiles = 0
        for item in profiles:
            name = item["metadata"]["name"]
            entries = [e for e in (item.get("status") or {}).get("accessProviders") or []
                       if e.get("name") == PROVIDER]
            if name in names and len(entries) == 1 and \
                    entries[0].get("cluster", {}).get("server") == f"{base}/{name}":
                right_profiles += 1
        right_addons = 0
        for item in addons:
            if item["metadata"]["namespace"] not in names:
                continue
            conditions = (item.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "TunnelConnected" and c.get("status") == "True"
                   for c in conditions):
                right_addons += 1
        return {"profiles": right_profiles, "addons": right_addons}

    # --- what the gateway asked of the hub ------------------------------------------------

    def read_audit(self) -> None:
        """Take the audit events written since the last call (the gateway's only)."""
        path = self.kube.audit_log
        if not path.exists():
            return
        with path.open("rb") as log:
            log.seek(self._audit_offset)
            data = log.read()
        end = data.rfind(b"\n") + 1  # a line being written is taken next time
        self._audit_offset += end
        for line in data[:end].splitlines():
            if GATEWAY_USER.encode() not in line:
                continue
            event = json.loads(line)
            if (event.get("user") or {}).get("username") != GATEWAY_USER:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource") or event.get("requestURI", "?").split("?")[0]
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            stamp = datetime.datetime.fromisoformat(
                event["stageTimestamp"].replace("Z", "+00:00")).timestamp()
            self._requests.append(HubRequest(stamp - self.wall_offset, event["verb"], resource))

    def gateway_requests(self, start: float, end: float) -> dict[str, Any]:
        """The gateway's requests to the hub between two monotonic times: writes and reads by
        verb and resource, writes per second (mean, and the busiest one-second window). Token
        and access reviews are counted apart: they follow the users' requests, not the fleet."""
        self.read_audit()
        seen = [r for r in self._requests if start <= r.at < end]
        reviews = [r for r in seen if r.resource in REVIEWS]
        reads = [r for r in seen if r.verb in READ_VERBS]
        writes = [r for r in seen if r.verb not in READ_VERBS and r.resource not in REVIEWS]
        by_second = Counter(int(r.at - start) for r in writes)
        seconds = max(end - start, 1e-9)
        return {
            "seconds": round(seconds, 2),
            "writes": len(writes),
            "writes_by_resource": dict(sorted(Counter(
                f"{r.verb} {r.resource}" for r in writes).items())),
            "reads": len(reads),
            "reads_by_resource": dict(sorted(Counter(
                f"{r.verb} {r.resource}" for r in reads).items())),
            "reviews": len(reviews),
            "writes_per_s": round(len(writes) / seconds, 1),
            "writes_per_s_peak": max(by_second.values(), default=0),
        }
