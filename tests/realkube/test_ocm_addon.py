"""The gateway keeps the TunnelConnected condition of its add-on's ManagedClusterAddOn on a real
hub with the OCM CRDs, with exactly the RBAC of deploy/ocm.

A second gateway (``--ocm-addon-conditions``, a one-second grace) runs as the deploy/hub
ServiceAccount after deploy/ocm is applied; its agent connects, then stops. The condition the
addon-manager owns stays as it was throughout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.realkube.binaries import REPO
from tests.realkube.conftest import Fleet
from tests.realkube.hubproxy import CLUSTER, start_gateway
from tests.support import ProcessGroup

ADDON_PATH = (f"/apis/addon.open-cluster-management.io/v1alpha1/namespaces/{CLUSTER}"
              "/managedclusteraddons/hubproxy")
AVAILABLE = {"type": "Available", "status": "True", "reason": "ManifestWorkAvailable",
             "message": "written by the addon-manager", "lastTransitionTime":
             "2026-01-01T00:00:00Z"}


def conditions(fleet: Fleet) -> dict[str, dict[str, Any]]:
    status, addon = fleet.hub.request("GET", ADDON_PATH)
    assert status == 200, addon
    return {c["type"]: c for c in (addon.get("status") or {}).get("conditions") or []}


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_tunnel_connected_follows_the_agent(fleet: Fleet) -> None:
    hub = fleet.hub
    hub.admin("apply", "--validate=false", "-k", str(REPO / "deploy" / "ocm"))
    hub.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CLUSTER}},
               {"apiVersion": "addon.open-cluster-management.io/v1alpha1",
                "kind": "ManagedClusterAddOn",
                "metadata": {"name": "hubproxy", "namespace": CLUSTER}, "spec": {}}])
    status, _ = hub.request("PATCH", ADDON_PATH + "/status",
                            {"status": {"conditions": [AVAILABLE]}},
                            headers={"Content-Type": "application/merge-patch+json"})
    assert status == 200

    group = ProcessGroup()
    try:
        gateway = start_gateway(group, fleet.pki, fleet.gateway_kubeconfig,
                                fleet.agent_kubeconfig, "--ocm-addon-conditions",
                                "--ocm-addon-grace", "1")
        wait_until(lambda: conditions(fleet).get("TunnelConnected", {}).get("status") == "True",
                   f"TunnelConnected never became True\n{gateway.logs()[-3000:]}")
        up = conditions(fleet)
        assert up["TunnelConnected"]["reason"] == "TunnelUp"
        assert up["Available"] == AVAILABLE
        # The add-ons were read with one list (field selector metadata.name=hubproxy), which
        # deploy/ocm's resourceNames rule allows on a real apiserver: no GET per cluster.
        lists = [e for e in hub.audit_events()
                 if e["user"]["username"] == "system:serviceaccount:hubproxy:hubproxy-gateway"
                 and e["verb"] == "list" and e.get("stage") == "ResponseComplete"
                 and e["objectRef"].get("resource") == "managedclusteraddons"]
        assert lists and all(e["responseStatus"]["code"] == 200 for e in lists), lists[-1:]

        assert gateway.agent is not None
        gateway.agent.stop()
        wait_until(lambda: conditions(fleet)["TunnelConnected"]["status"] == "False",
                   f"TunnelConnected never became False\n{gateway.logs()[-3000:]}")
        down = conditions(fleet)
        assert down["TunnelConnected"]["reason"] == "TunnelDown"
        assert down["TunnelConnected"]["lastTransitionTime"] >= \
            up["TunnelConnected"]["lastTransitionTime"]
        assert down["Available"] == AVAILABLE
        assert "condition not written" not in gateway.process.output  # RBAC was enough
    finally:
        group.stop_all()
