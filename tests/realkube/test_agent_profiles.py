"""The agent's two RBAC profiles on the real managed kube-apiserver (issue 14 item 9).

`fleet`'s agent holds deploy/agent's legacy profile (verb `impersonate`). Here a second agent,
with its own ServiceAccount bound to exactly the ClusterRole deploy/examples/agent-read-only
renders (constrained impersonation, KEP-5284, reads only), serves a second gateway. The same
hub user, alice, whose managed RBAC lets her create ConfigMaps in `team`, reads through both,
but her write through the read-only agent is refused by the managed apiserver itself, naming
the constrained verb the agent lacks, while through the legacy agent it succeeds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.realkube.apiserver import write_private
from tests.realkube.binaries import REPO
from tests.realkube.conftest import Fleet
from tests.realkube.hubproxy import CLUSTER, Gateway, start_gateway, wait_connected
from tests.support import eventually_blocking

NAMESPACE = "hubproxy-agent"
ACCOUNT = "read-only-agent"
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"


def read_only_role(fleet: Fleet) -> dict[str, Any]:
    rendered = yaml.safe_load_all(fleet.hub.admin(
        "kustomize", str(REPO / "deploy" / "examples" / "agent-read-only")))
    (role,) = [d for d in rendered if d and d["kind"] == "ClusterRole"]
    return {"apiVersion": role["apiVersion"], "kind": "ClusterRole",
            "metadata": {"name": "hubproxy-agent-read-only"}, "rules": role["rules"]}


@pytest.fixture(scope="module")
def read_only(fleet: Fleet) -> Iterator[Gateway]:
    managed = fleet.managed
    role = read_only_role(fleet)
    managed.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}},
        role,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "hubproxy-agent-read-only"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": role["metadata"]["name"]},
         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]},
    ])
    root = fleet.root / "read-only"
    token = managed.create_token(NAMESPACE, ACCOUNT)
    fleet.tokens.append(token)
    kubeconfig = managed.kubeconfig(root / "agent.kubeconfig",
                                    token_file=write_private(root / "agent.token", token))
    gateway = start_gateway(fleet.group, fleet.pki, fleet.gateway_kubeconfig, kubeconfig,
                            "--token-cache-ttl", "1s")
    wait_connected(gateway, fleet.alice)
    yield gateway
    for process in (gateway.agent, gateway.process):
        if process is not None:
            process.stop()


def configmap(name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "namespace": "team"}, "data": {"k": "v"}})


def wait_for_log(gateway: Gateway, text: str, timeout: float = 20.0) -> str:
    def line() -> str:
        agent_log = gateway.agent.output if gateway.agent else ""
        return next((line for line in agent_log.splitlines() if text in line), "")

    try:
        return eventually_blocking(line, timeout, f"{text!r} in the agent log", interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{gateway.logs()[-3000:]}") from None


def test_read_only_profile_reads_and_watches(fleet: Fleet, read_only: Gateway) -> None:
    alice = fleet.user_kubeconfig("alice-ro", fleet.alice, read_only)
    # kubectl's discovery (/api, /apis: non-resource GETs) and a list, as alice.
    listed = read_only.kubectl(alice, "get", "configmaps", "-n", "team", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    code, body = read_only.curl(
        f"/{CLUSTER}/api/v1/namespaces/team/configmaps?watch=1&timeoutSeconds=1", fleet.alice)
    assert code == 200, body


def test_read_only_profile_refuses_a_write_the_user_may_make(fleet: Fleet,
                                                            read_only: Gateway) -> None:
    name = "written-through-read-only"
    alice = fleet.user_kubeconfig("alice-ro", fleet.alice, read_only)
    refused = read_only.kubectl(alice, "create", "--validate=false", "-f", "-",
                                input=configmap(name))
    assert refused.returncode != 0
    # The managed apiserver's constrained-impersonation check, naming the agent's account.
    assert (f'User "{AGENT_USER}" cannot impersonate-on:user-info:create resource '
            f'"configmaps"') in refused.stderr, refused.stderr
    assert "NotFound" in fleet.managed.kubectl("get", "configmap", name, "-n", "team").stderr
    # It reached the managed apiserver, which answered 403 to the agent (not the gateway).
    assert any(e["verb"] == "create" and e["user"]["username"] == AGENT_USER
               and e["objectRef"].get("resource") == "configmaps"
               and e["responseStatus"]["code"] == 403
               for e in fleet.managed.audit_events())

    # alice's own managed RBAC allows it: through the legacy agent the same write succeeds.
    legacy = fleet.user_kubeconfig("alice", fleet.alice)
    created = fleet.gateway.kubectl(legacy, "create", "--validate=false", "-f", "-",
                                     input=configmap(name))
    assert created.returncode == 0, created.stderr
    fleet.managed.admin("delete", "configmap", name, "-n", "team")


def test_agent_reports_its_profile_at_start(fleet: Fleet, read_only: Gateway) -> None:
    constrained = wait_for_log(read_only, "impersonation profile:")
    assert "impersonation profile: constrained" in constrained
    assert "every resource: get, list, watch;" in constrained
    legacy = wait_for_log(fleet.gateway, "impersonation profile:")
    assert "impersonation profile: legacy" in legacy
