"""Revocation reaches open watches, with the real hub deciding (issue 14 item 5).

`fleet`'s gateway caches reviews for 1 s. A hub ServiceAccount of this module watches ConfigMaps
on the managed cluster through it (curl, and kubectl's own watch); then the hub takes its access
away, the way an operator would: the ServiceAccount is deleted (its token stops being valid) or
its ClusterRoleBinding for managedclusters/proxy is. The watch ends cleanly (curl sees the
terminating chunk: exit code 0, not "transfer closed with outstanding read data") well within
TTL + 15 s, and the re-list is refused with 401 or 403.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.realkube.apiserver import KUBECTL, write_private
from tests.realkube.conftest import PREFIX, Fleet
from tests.realkube.hubproxy import CLUSTER, CURL

LIMIT = 1.0 + 15.0  # --token-cache-ttl of the fleet gateway + 15 s
WATCH = f"/{CLUSTER}/api/v1/namespaces/team/configmaps?watch=1"


@dataclass
class Caller:
    name: str
    token: str


def make_caller(fleet: Fleet, name: str) -> Caller:
    """A hub ServiceAccount that may use CLUSTER and read ConfigMaps in `team` there."""
    fleet.hub.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": "fleet"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{name}-uses-{CLUSTER}"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": f"use-{CLUSTER}"},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "fleet"}]},
    ])
    fleet.managed.apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"{name}-edits-configmaps", "namespace": "team"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "configmap-editor"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": f"{PREFIX}system:serviceaccount:fleet:{name}"}]})
    token = fleet.hub.create_token("fleet", name)
    fleet.tokens.append(token)
    return Caller(name, token)


@pytest.fixture
def watch(fleet: Fleet) -> Iterator[subprocess.Popen[str]]:
    """Filled in by each test: the curl watch, stopped if the test fails before it ends."""
    started: list[subprocess.Popen[str]] = []
    yield started  # type: ignore[misc]
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(5)


def start_watch(fleet: Fleet, caller: Caller, started: list) -> subprocess.Popen[str]:
    # The token from a file (curl -H @FILE), never in argv or a failure's message.
    header = write_private(fleet.root / "users" / f"{caller.name}.header",
                           f"Authorization: Bearer {caller.token}\n")
    process = subprocess.Popen(
        [CURL, "-sS", "--no-buffer", "--cacert", str(fleet.gateway.ca_file),
         "-H", f"@{header}", "-w", "\n%{http_code}", fleet.gateway.front + WATCH],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started.append(process)
    return process


def wait_watching(fleet: Fleet, caller: Caller) -> None:
    """Until the managed apiserver has started the watch response for the caller."""
    user = f"{PREFIX}system:serviceaccount:fleet:{caller.name}"
    deadline = time.monotonic() + 20
    while not any(e["verb"] == "watch" and e["stage"] == "ResponseStarted"
                  and e.get("impersonatedUser", {}).get("username") == user
                  for e in fleet.managed.audit_events()):
        assert time.monotonic() < deadline, "the watch never reached the managed apiserver"
        time.sleep(0.1)


def ended_within(process: subprocess.Popen[str], since: float) -> tuple[float, int, str]:
    out, err = process.communicate(timeout=LIMIT + 10)
    took = time.monotonic() - since
    return took, process.returncode, out + err


@pytest.mark.parametrize("revocation", ["delete-serviceaccount", "delete-clusterrolebinding"])
def test_revocation_ends_an_open_watch(fleet: Fleet, watch: list, revocation: str) -> None:
    caller = make_caller(fleet, f"revokee-{revocation.split('-')[1]}")
    process = start_watch(fleet, caller, watch)
    wait_watching(fleet, caller)
    time.sleep(3)  # several revalidations while still allowed: the watch stays open
    assert process.poll() is None
    fleet.managed.admin("create", "configmap", f"seen-by-{caller.name}", "-n", "team")

    revoked_at = time.monotonic()
    if revocation == "delete-serviceaccount":
        fleet.hub.admin("delete", "serviceaccount", caller.name, "-n", "fleet")
    else:
        fleet.hub.admin("delete", "clusterrolebinding", f"{caller.name}-uses-{CLUSTER}")
    took, code, output = ended_within(process, revoked_at)
    print(f"{revocation}: watch ended {took:.1f}s after the revocation")
    assert took < LIMIT, took
    # curl's exit code 0: the chunked body was complete (a cut connection is exit 18).
    assert code == 0, output
    assert output.rstrip().endswith("200")
    assert f"seen-by-{caller.name}" in output  # the event before revocation was relayed
    fleet.managed.admin("delete", "configmap", f"seen-by-{caller.name}", "-n", "team")

    # The client's re-list is refused by the gateway.
    status, body = fleet.gateway.curl_json(f"/{CLUSTER}/api/v1/namespaces/team/configmaps",
                                           caller.token)
    expected = 401 if revocation == "delete-serviceaccount" else 403
    assert (status, body["code"]) == (expected, expected), body


def test_kubectl_watch_ends_once_access_is_revoked(fleet: Fleet) -> None:
    """client-go (kubectl get --watch) sees the end, and the re-list's refusal."""
    caller = make_caller(fleet, "revokee-kubectl")
    kubeconfig = fleet.user_kubeconfig(caller.name, caller.token)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(kubeconfig.parent)}
    process = subprocess.Popen([KUBECTL, "get", "configmaps", "-n", "team", "--watch"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        wait_watching(fleet, caller)
        revoked_at = time.monotonic()
        fleet.hub.admin("delete", "clusterrolebinding", f"{caller.name}-uses-{CLUSTER}")
        took, _code, output = ended_within(process, revoked_at)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    print(f"kubectl get --watch ended {took:.1f}s after the revocation: {output.strip()!r}")
    assert took < LIMIT, (took, output)
