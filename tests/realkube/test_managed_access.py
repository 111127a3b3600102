"""Through the gateway and the agent (deploy/agent's RBAC) to the real managed apiserver.

The managed cluster sees the hub identity prefixed, with its uid, and its own RBAC for that
identity decides: a Role grants get/list/watch/apply on ConfigMaps in one namespace; outside
it, or for a verb it does not list, the real authorizer refuses, naming the prefixed user.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.realkube.apiserver import KUBECTL
from tests.realkube.conftest import PREFIX, Fleet

ALICE = f"{PREFIX}system:serviceaccount:fleet:alice"


@pytest.fixture(scope="module")
def alice(fleet: Fleet) -> Path:
    return fleet.user_kubeconfig("alice", fleet.alice)


def configmap(name: str, namespace: str = "team", **data: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "namespace": namespace}, "data": data})


def jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def test_whoami_is_the_prefixed_hub_identity_with_its_uid(fleet: Fleet, alice: Path) -> None:
    done = fleet.gateway.kubectl(alice, "auth", "whoami", "-o", "json")
    assert done.returncode == 0, done.stderr
    user = json.loads(done.stdout)["status"]["userInfo"]
    assert user["username"] == ALICE
    assert user["uid"] == fleet.alice_uid
    # The hub groups, prefixed (the gateway drops the hub's system:authenticated), and the
    # managed apiserver's own system:authenticated, which it adds to every impersonated user.
    assert sorted(user["groups"]) == [f"{PREFIX}system:serviceaccounts",
                                      f"{PREFIX}system:serviceaccounts:fleet",
                                      "system:authenticated"]
    # The hub token's credential id (its jti) travels as an impersonated extra, renamed so it
    # cannot pass for the managed cluster's own authentication.kubernetes.io/credential-id.
    jti = jwt_claims(fleet.alice)["jti"]
    assert user["extra"]["hubproxy.dev/hub-credential-id"] == [f"JTI={jti}"]
    assert "authentication.kubernetes.io/credential-id" not in user["extra"]


def test_apply_get_list_in_the_granted_namespace(fleet: Fleet, alice: Path) -> None:
    kubectl = fleet.gateway.kubectl
    created = kubectl(alice, "apply", "--validate=false", "-f", "-",
                      input=configmap("settings", color="blue"))
    assert created.returncode == 0, created.stderr
    assert "configmap/settings created" in created.stdout
    server_side = kubectl(alice, "apply", "--server-side", "--validate=false", "-f", "-",
                          input=configmap("settings", color="green"))
    assert server_side.returncode == 0, server_side.stderr
    got = kubectl(alice, "get", "configmap", "settings", "-n", "team", "-o", "json",
                  "--show-managed-fields")
    assert got.returncode == 0, got.stderr
    obj = json.loads(got.stdout)
    assert obj["data"] == {"color": "green"}
    # Server-side apply ran (field manager "kubectl", operation Apply) as alice's identity.
    assert ("kubectl", "Apply") in {(m["manager"], m["operation"])
                                    for m in obj["metadata"]["managedFields"]}
    listed = kubectl(alice, "get", "configmaps", "-n", "team", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert "configmap/settings" in listed.stdout.split()


def test_watch_streams_events_through_the_tunnel(fleet: Fleet, alice: Path) -> None:
    env = {**os.environ, "KUBECONFIG": str(alice), "HOME": str(alice.parent)}

    def watches_started() -> int:
        return sum(e["verb"] == "watch" and e["stage"] == "ResponseStarted"
                   and e.get("impersonatedUser", {}).get("username") == ALICE
                   and e["objectRef"].get("namespace") == "team"
                   for e in fleet.managed.audit_events())

    # Other tests (earlier in the session) may have watched here too: wait for a new one.
    before = watches_started()
    watcher = subprocess.Popen(
        [KUBECTL, "get", "configmaps", "-n", "team", "--watch-only", "--output-watch-events",
         "-o", "custom-columns=TYPE:.type,NAME:.object.metadata.name", "--no-headers"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue[list[str]] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln.split()) for ln in watcher.stdout or []],
                     daemon=True).start()
    try:
        # The watch is open once the apiserver has started its response (audit stage
        # ResponseStarted, as alice's mapped identity): only then is an event sure to be seen.
        deadline = time.monotonic() + 20
        while watches_started() <= before:
            assert time.monotonic() < deadline, "the watch never reached the apiserver"
            time.sleep(0.1)
        fleet.managed.admin("create", "configmap", "watched", "-n", "team", "--from-literal=k=v")
        assert lines.get(timeout=15) == ["ADDED", "watched"]
        fleet.managed.admin("delete", "configmap", "watched", "-n", "team")
        assert lines.get(timeout=15) == ["DELETED", "watched"]
    finally:
        watcher.terminate()
        watcher.wait(10)


def test_the_managed_rbac_denies_what_it_does_not_grant(fleet: Fleet, alice: Path) -> None:
    other = fleet.gateway.kubectl(alice, "get", "configmaps", "-n", "other")
    assert other.returncode != 0
    assert (f'User "{ALICE}" cannot list resource "configmaps" in API group "" in the '
            f'namespace "other"') in other.stderr
    delete = fleet.gateway.kubectl(alice, "delete", "configmap", "settings", "-n", "team")
    assert delete.returncode != 0
    assert f'User "{ALICE}" cannot delete resource "configmaps"' in delete.stderr
    secrets = fleet.gateway.kubectl(alice, "get", "secrets", "-n", "team")
    assert secrets.returncode != 0 and "forbidden" in secrets.stderr


def test_a_managed_role_grants_access_when_it_is_bound(fleet: Fleet, alice: Path) -> None:
    fleet.managed.admin("create", "namespace", "late")
    before = fleet.gateway.kubectl(alice, "get", "pods", "-n", "late")
    assert before.returncode != 0 and "forbidden" in before.stderr
    fleet.managed.admin("create", "role", "pod-reader", "-n", "late", "--verb=get,list",
                        "--resource=pods")
    fleet.managed.admin("create", "rolebinding", "alice-reads-pods", "-n", "late",
                        "--role=pod-reader", f"--user={ALICE}")
    deadline = time.monotonic() + 10
    while True:  # RBAC reaches the authorizer through an informer: a moment later
        after = fleet.gateway.kubectl(alice, "get", "pods", "-n", "late")
        if after.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert after.returncode == 0, after.stderr
    assert "No resources found in late namespace." in after.stderr
