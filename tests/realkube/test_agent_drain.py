"""Issue 13 item 4: the agent's PodDisruptionBudget never blocks a node drain because of a hub
outage, checked with the real eviction API.

During a hub outage no agent pod is Ready (readiness says "connected to the hub"), so the
disruption controller reports 0 healthy of 1 desired. The eviction API refuses such an eviction
(429) under the default policy; with deploy/agent's ``unhealthyPodEvictionPolicy: AlwaysAllow``
an unready pod may always go. There is no kubelet or controller-manager here: the test writes
the pod's and the budget's status the way they would.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from tests.realkube.binaries import REPO
from tests.realkube.conftest import Fleet

NAMESPACE = "hubproxy-agent"  # deploy/agent


def deployed_pdb() -> dict[str, Any]:
    return yaml.safe_load((REPO / "deploy" / "agent" / "pdb.yaml").read_text())


def unready_agent_pod(fleet: Fleet, name: str, app: str) -> None:
    """A Running agent pod whose readiness failed (the hub is unreachable)."""
    kube = fleet.managed
    code, body = kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": app}},
        "spec": {"serviceAccountName": "hubproxy-agent", "automountServiceAccountToken": False,
                 "nodeName": "node-1",
                 # deploy/agent's namespace enforces the restricted Pod Security Standard.
                 "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                     "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{"name": "agent", "image": "hubproxy", "securityContext": {
                     "allowPrivilegeEscalation": False,
                     "capabilities": {"drop": ["ALL"]}}}]}})
    assert code == 201, body.get("message")
    code, body = kube.request(
        "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status",
        {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "False", "reason": "HubUnreachable"}]}},
        headers={"Content-Type": "application/merge-patch+json"})
    assert code == 200, body


def budget_in_hub_outage(fleet: Fleet, pdb: dict[str, Any]) -> None:
    """Create ``pdb`` and give it the status the disruption controller computes while no agent
    is Ready: 0 healthy of 1 desired, no disruption allowed."""
    kube = fleet.managed
    name = pdb["metadata"]["name"]
    code, created = kube.request("POST", f"/apis/policy/v1/namespaces/{NAMESPACE}/"
                                 "poddisruptionbudgets", pdb)
    assert code == 201, created
    code, body = kube.request(
        "PATCH", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/{name}/status",
        {"status": {"observedGeneration": created["metadata"]["generation"],
                    "currentHealthy": 0, "desiredHealthy": 1, "expectedPods": 1,
                    "disruptionsAllowed": 0}},
        headers={"Content-Type": "application/merge-patch+json"})
    assert code == 200, body


def evict(fleet: Fleet, pod: str) -> tuple[int, Any]:
    return fleet.managed.request(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction",
        {"apiVersion": "policy/v1", "kind": "Eviction",
         "metadata": {"name": pod, "namespace": NAMESPACE}})


def test_agent_pdb_lets_a_drain_evict_agents_that_lost_the_hub(fleet: Fleet) -> None:
    pdb = deployed_pdb()
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # deploy/agent's budget (applied by the fleet fixture) with its status in a hub outage,
    # over a pod of its own label that is not Ready.
    fleet.managed.admin("delete", "pdb", pdb["metadata"]["name"], "-n", NAMESPACE,
                        "--ignore-not-found")
    budget_in_hub_outage(fleet, {**pdb, "metadata": {**pdb["metadata"], "namespace": NAMESPACE}})
    unready_agent_pod(fleet, "agent-drained", pdb["spec"]["selector"]["matchLabels"][
        "app.kubernetes.io/name"])
    code, body = evict(fleet, "agent-drained")
    assert code == 201, body

    # The same budget without the policy (the default, IfHealthyBudget) blocks that drain:
    # what deploy/agent did before.
    blocking = copy.deepcopy(pdb)
    del blocking["spec"]["unhealthyPodEvictionPolicy"]
    blocking["metadata"] = {"name": "agent-blocking", "namespace": NAMESPACE}
    blocking["spec"]["selector"] = {"matchLabels": {"app.kubernetes.io/name": "agent-blocking"}}
    budget_in_hub_outage(fleet, blocking)
    unready_agent_pod(fleet, "agent-stuck", "agent-blocking")
    code, body = evict(fleet, "agent-stuck")
    assert code == 429, body
