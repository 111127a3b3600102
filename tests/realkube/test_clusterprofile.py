"""The ClusterProfile access-provider writer against the real CRD on the real hub.

The gateway (`--clusterprofiles=on`, its hub RBAC exactly deploy/hub's) writes its entry into
`status.accessProviders` through the real status subresource, validated by the CRD's OpenAPI
schema; it leaves a foreign provider and `status.conditions` as they were; it writes nothing
for a cluster without an agent; a consumer reaches the cluster with only what the entry says;
and when the front CA rotates on disk, the entry follows and the front door serves the new
certificate, without a restart; and a restarted gateway whose agent comes back keeps the entry
without writing it again (issue 22: a restart storm costs no ClusterProfile write).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realkube.apiserver import KUBECTL, write_private
from tests.realkube.conftest import CLUSTER, Fleet
from tests.realkube.hubproxy import Gateway, init_pki, start_gateway, wait_connected
from tests.support import free_port

FOREIGN = {"name": "open-cluster-management", "cluster": {"server": "https://ocm-proxy/c1"}}
CONDITION = {"type": "ControlPlaneHealthy", "status": "True", "reason": "Healthy",
             "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"}


def profile(name: str) -> dict[str, Any]:
    return {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
            "metadata": {"name": name, "namespace": "fleet"},
            "spec": {"clusterManager": {"name": "ocm"}, "displayName": name}}


def read_profile(fleet: Fleet, name: str) -> dict[str, Any]:
    return dict(json.loads(fleet.hub.admin("get", "clusterprofile", name, "-n", "fleet",
                                           "-o", "json")))


def ours(fleet: Fleet, name: str) -> list[dict[str, Any]]:
    providers = read_profile(fleet, name).get("status", {}).get("accessProviders", [])
    return [p for p in providers if p["name"] == "hubproxy"]


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.2)


WRITER_ARGS = ("--clusterprofiles", "on", "--clusterprofile-namespace", "fleet")


@pytest.fixture(scope="module")
def writer(fleet: Fleet) -> Iterator[Gateway]:
    # Its own copy of the PKI: the rotation below must not change what other tests trust.
    pki = fleet.root / "cp-pki"
    shutil.copytree(fleet.pki, pki)
    fleet.hub.apply([profile(CLUSTER), profile("cluster2")])
    fleet.hub.admin("patch", "clusterprofile", CLUSTER, "-n", "fleet", "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {
                        "accessProviders": [FOREIGN], "conditions": [CONDITION]}}))
    port = free_port()
    gateway = start_gateway(
        fleet.group, pki, fleet.gateway_kubeconfig, fleet.agent_kubeconfig, *WRITER_ARGS,
        "--public-url", f"https://127.0.0.1:{port}", front_port=port)
    try:
        wait_connected(gateway, fleet.alice)
        wait_until(lambda: bool(ours(fleet, CLUSTER)), "our entry written")
        yield gateway
    finally:
        for process in (gateway.agent, gateway.process):
            if process is not None:
                process.stop()


def kubeconfig_from_entry(fleet: Fleet, path: Path) -> Path:
    """What a ClusterProfile consumer builds from our entry, plus its own hub token."""
    cluster = ours(fleet, CLUSTER)[0]["cluster"]
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "cp",
              "clusters": [{"name": "cp", "cluster": {
                  "server": cluster["server"],
                  "certificate-authority-data": cluster["certificate-authority-data"]}}],
              "users": [{"name": "alice", "user": {"token": fleet.alice}}],
              "contexts": [{"name": "cp", "context": {"cluster": "cp", "user": "alice"}}]}
    return write_private(path, yaml.safe_dump(config))


def whoami(kubeconfig: Path) -> str:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(kubeconfig.parent)}
    done = subprocess.run(
        [KUBECTL, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_entry_is_written_next_to_foreign_providers_and_conditions(
        fleet: Fleet, writer: Gateway) -> None:
    status = read_profile(fleet, CLUSTER)["status"]
    assert status["conditions"] == [CONDITION]
    assert status["accessProviders"][0] == FOREIGN and len(status["accessProviders"]) == 2
    entry = ours(fleet, CLUSTER)[0]["cluster"]
    assert entry["server"] == f"{writer.front}/{CLUSTER}"
    assert base64.b64decode(entry["certificate-authority-data"]) == writer.ca_file.read_bytes()
    assert entry["extensions"] == [{"name": "client.authentication.k8s.io/exec",
                                    "extension": {"clusterName": CLUSTER}}]
    assert ours(fleet, "cluster2") == []  # no agent for cluster2
    kubeconfig = kubeconfig_from_entry(fleet, fleet.root / "cp-consumer.kubeconfig")
    assert whoami(kubeconfig) == "cluster:hub:system:serviceaccount:fleet:alice"


def test_entry_follows_a_rotated_front_ca(fleet: Fleet, writer: Gateway) -> None:
    old_ca = writer.ca_file.read_bytes()
    fresh = init_pki(fleet.root / "rotated-pki")
    new_ca = (fresh / "front-ca" / "ca.crt").read_bytes()
    # A rotation as cert-manager does it: the new leaf, and for a while both CAs in ca.crt.
    # Each file is replaced atomically; the gateway reloads when it sees them change.
    target = writer.pki / "gateway"
    for name, data in (("ca.crt", new_ca + old_ca),
                       ("tls.key", (fresh / "gateway" / "tls.key").read_bytes()),
                       ("tls.crt", (fresh / "gateway" / "tls.crt").read_bytes())):
        write_private(target / f".{name}.new", data).replace(target / name)
    wait_until(lambda: writer.curl(f"/{CLUSTER}/version", fleet.alice,
                                   ca_file=fresh / "front-ca" / "ca.crt")[0] == 200,
               "the front door serves the new certificate")
    # The writer re-reads the CA on every reconcile: any ClusterProfile event starts one at
    # once (otherwise its 30 s resync would, which this test does not wait for).
    fleet.hub.admin("annotate", "clusterprofile", CLUSTER, "-n", "fleet", "rotated=yes")
    wait_until(lambda: base64.b64decode(ours(fleet, CLUSTER)[0]["cluster"][
        "certificate-authority-data"]) == new_ca + old_ca, "the new CA bundle published")
    assert read_profile(fleet, CLUSTER)["status"]["conditions"] == [CONDITION]
    kubeconfig = kubeconfig_from_entry(fleet, fleet.root / "cp-rotated.kubeconfig")
    assert whoami(kubeconfig) == "cluster:hub:system:serviceaccount:fleet:alice"


def test_writer_stays_within_its_rbac(fleet: Fleet, writer: Gateway) -> None:
    """The hub's audit log: the writer only read ClusterProfiles and patched their status."""
    events = [e for e in fleet.hub.audit_events()
              if e["user"]["username"] == "system:serviceaccount:hubproxy:hubproxy-gateway"]
    touched = {(e["verb"], e["objectRef"].get("resource"), e["objectRef"].get("subresource"))
               for e in events if e["objectRef"].get("resource") == "clusterprofiles"}
    assert ("patch", "clusterprofiles", "status") in touched
    assert {verb for verb, _, sub in touched if sub != "status"} <= {"get", "list", "watch"}
    # Nothing it tried was forbidden (a 409 from the resourceVersion guard would be fine).
    assert [e["requestURI"] for e in events if e["responseStatus"]["code"] == 403] == []


def test_a_restarted_gateway_keeps_the_entry_and_writes_nothing(
        fleet: Fleet, writer: Gateway) -> None:
    """The grace runs from the gateway's start: its predecessor's entry stays while the agent
    comes back, instead of being removed and written again."""
    before = read_profile(fleet, CLUSTER)["status"]["accessProviders"]
    assert any(p["name"] == "hubproxy" for p in before)
    for process in (writer.agent, writer.process):
        if process is not None:
            process.stop()
    restarted = time.time()
    again = start_gateway(fleet.group, writer.pki, fleet.gateway_kubeconfig,
                          fleet.agent_kubeconfig, *WRITER_ARGS, "--public-url", writer.front,
                          front_port=writer.front_port)
    try:
        # The front door serves the rotated certificate now: watch the log, not a request.
        wait_until(lambda: f"cluster {CLUSTER} connected" in again.process.output,
                   "the agent is back")
        time.sleep(3)  # the new writer has listed the profiles and seen the agent
        assert read_profile(fleet, CLUSTER)["status"]["accessProviders"] == before
        writes = [e["requestURI"] for e in fleet.hub.audit_events()
                  if e["user"]["username"] == "system:serviceaccount:hubproxy:hubproxy-gateway"
                  and e["verb"] == "patch"
                  and e["objectRef"].get("resource") == "clusterprofiles"
                  and _at(e) >= restarted]
        assert writes == []
    finally:
        for process in (again.agent, again.process):
            if process is not None:
                process.stop()


def _at(event: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(
        event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
