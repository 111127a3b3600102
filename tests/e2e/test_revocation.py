"""Revocation reaches open exec sessions: kubectl through real gateway and agent processes
(issue 14 item 5). kubesim is the hub and the managed cluster here because the real tier has no
kubelet to exec into; the watch case against the real hub is tests/realkube/test_revocation.py.

A gateway of this module caches reviews for 1 s. Each test's caller is a fresh hub
ServiceAccount that may use cluster1 and exec into the demo pod; the hub then takes its
managedclusters/proxy access away (its ClusterRoleBinding is deleted).
"""

from __future__ import annotations

import secrets
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from gateway.access.kubeconfig import build_kubeconfig
from gateway.demo import agent_args, gateway_args, write_private
from tests.e2e.conftest import KUBECTL, System
from tests.support import BackgroundProcess, free_port, wait_for_port

LIMIT = 1.0 + 15.0  # --token-cache-ttl + 15 s
EXEC_PATH = "/api/v1/namespaces/default/pods/demo/exec"


@dataclass
class ShortCacheGateway:
    front_port: int
    process: BackgroundProcess
    agent: BackgroundProcess

    def logs(self) -> str:
        return self.process.output + self.agent.output


@pytest.fixture(scope="module")
def gateway(system: System) -> Iterator[ShortCacheGateway]:
    front, tunnel = free_port(), free_port()
    process = system.group.hubproxy(*gateway_args(
        system.pki, listen=f"127.0.0.1:{front}", tunnel_listen=f"127.0.0.1:{tunnel}",
        health_listen=f"127.0.0.1:{free_port()}", hub_kubeconfig=system.root / "hub.kubeconfig"),
        "--token-cache-ttl", "1s")
    wait_for_port(front, timeout=20)
    wait_for_port(tunnel, timeout=20)
    agent = system.group.hubproxy(*agent_args(
        system.pki, "cluster1", hub=f"127.0.0.1:{tunnel}",
        kubeconfig=system.root / "agents" / "cluster1" / "kubeconfig",
        health_listen=f"127.0.0.1:{free_port()}"))
    yield ShortCacheGateway(front, process, agent)
    agent.stop()
    process.stop()


@dataclass
class Caller:
    name: str
    user: str  # as the managed cluster sees it
    kubeconfig: Path


def hub_delete(system: System, path: str) -> None:
    request = urllib.request.Request(system.hub.url + path, method="DELETE", headers={
        "Authorization": f"Bearer {system.hub.admin_token}"})
    context = ssl.create_default_context(cafile=str(system.hub.ca_file))
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        assert answer.status == 200


@pytest.fixture
def caller(system: System, gateway: ShortCacheGateway) -> Caller:
    name = f"exec-{secrets.token_hex(3)}"
    token = system.hub.mint_token("demo", name, expiration_seconds=3600)
    system.hub.apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "hubproxy-demo-proxy"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "demo"}]})
    user = f"cluster:hub:system:serviceaccount:demo:{name}"
    cluster = system.clusters["cluster1"]
    cluster.grant(f"User:{user}", ["get", "list"], ["pods"], namespace="default")
    cluster.grant(f"User:{user}", ["get", "create"], ["pods/exec"], namespace="default")
    front = f"https://127.0.0.1:{gateway.front_port}"
    kubeconfig = write_private(system.root / "users" / name / "kubeconfig", yaml.safe_dump(
        build_kubeconfig(front, system.ca_file.read_bytes(), ["cluster1"], token=token)))
    deadline = time.monotonic() + 30
    while subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), "--context", "cluster1",
                          "get", "pod", "demo"], capture_output=True,
                         timeout=30).returncode != 0:
        assert time.monotonic() < deadline, gateway.logs()[-3000:]
        time.sleep(0.3)
    return Caller(name, user, kubeconfig)


def start_exec(system: System, caller: Caller, *, websocket: bool) -> subprocess.Popen[str]:
    env = system.env(KUBECONFIG=str(caller.kubeconfig),
                     KUBECTL_REMOTE_COMMAND_WEBSOCKETS="true" if websocket else "false")
    process = subprocess.Popen([KUBECTL, "--context", "cluster1", "exec", "demo", "--",
                                "sleep", "120"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    cluster = system.clusters["cluster1"]
    deadline = time.monotonic() + 20
    while not any(r.path.startswith(EXEC_PATH) and r.acting_as == caller.user
                  for r in cluster.received):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the exec never reached the managed cluster"
        time.sleep(0.1)
    time.sleep(0.5)  # the upgrade answered and spliced
    return process


def revoke(system: System, caller: Caller) -> float:
    hub_delete(system, f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{caller.name}")
    return time.monotonic()


def ended(process: subprocess.Popen[str], since: float) -> tuple[float, int, str]:
    try:
        _out, err = process.communicate(timeout=LIMIT + 10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    return time.monotonic() - since, process.returncode, err


def test_websocket_exec_ends_with_the_hubs_refusal(system: System, caller: Caller) -> None:
    process = start_exec(system, caller, websocket=True)
    took, code, err = ended(process, revoke(system, caller))
    print(f"websocket exec ended {took:.1f}s after the revocation: {err.strip()!r}")
    assert took < LIMIT
    assert code != 0
    # kubectl prints the Status the gateway put on the exec's error channel, and only that.
    assert err.strip() == 'error: access to cluster "cluster1" was revoked on the hub', err


def test_spdy_exec_is_closed(system: System, caller: Caller) -> None:
    process = start_exec(system, caller, websocket=False)
    took, code, err = ended(process, revoke(system, caller))
    print(f"spdy exec ended {took:.1f}s after the revocation: {err.strip()!r}")
    assert took < LIMIT
    assert code != 0
    # The Status went on the error stream the client opened (found in its SYN_STREAM headers).
    assert err.strip() == 'error: access to cluster "cluster1" was revoked on the hub', err


def test_hub_errors_leave_the_exec_open(system: System, caller: Caller) -> None:
    async def hub_down(request: web.Request) -> web.StreamResponse | None:
        if request.path.endswith(("/tokenreviews", "/subjectaccessreviews")):
            return web.Response(status=500, text="the hub is having a bad day")
        return None

    process = start_exec(system, caller, websocket=True)
    undo = system.hub.intercept(hub_down)
    try:
        revoke(system, caller)  # the hub would now say no, but it cannot answer at all
        time.sleep(6)  # 6 x the cache TTL: revalidation tried and got only errors
        assert process.poll() is None, process.communicate()
    finally:
        undo()
    took, code, err = ended(process, time.monotonic())
    print(f"exec ended {took:.1f}s after the hub answered again: {err.strip()!r}")
    assert took < LIMIT and code != 0
    assert "was revoked on the hub" in err, err


def test_a_hub_group_change_ends_a_watch_the_old_group_allowed(
        system: System, gateway: ShortCacheGateway) -> None:
    """Issue 24: a stream kept the groups it was opened with. A hub user whose group grants
    reading ConfigMaps on cluster1 watches them; the hub moves the user to another group (the
    token stays valid). The watch ends cleanly (curl sees the terminating chunk), and the next
    request impersonates the new group, which the managed cluster refuses."""
    name = f"grp-{secrets.token_hex(3)}"
    token = f"static-hub-token-{secrets.token_hex(16)}"
    system.hub.add_user(token, name, ["team-a"], uid=f"uid-{name}")
    system.hub.grant(f"User:{name}", ["get"], ["managedclusters/proxy"],
                     api_groups=["cluster.open-cluster-management.io"])
    cluster = system.clusters["cluster1"]
    cluster.grant("Group:cluster:hub:team-a", ["list", "watch"], ["configmaps"],
                  namespace="default")
    header = write_private(system.root / "users" / f"{name}.header",
                           f"Authorization: Bearer {token}\n")
    path = "/cluster1/api/v1/namespaces/default/configmaps"
    url = f"https://127.0.0.1:{gateway.front_port}{path}"
    curl = ["curl", "-sS", "--cacert", str(system.ca_file), "-H", f"@{header}",
            "-w", "\n%{http_code}"]
    user = f"cluster:hub:{name}"
    deadline = time.monotonic() + 30
    while not subprocess.run([*curl, url], capture_output=True, text=True,
                             timeout=30).stdout.endswith("\n200"):  # the agent connected
        assert time.monotonic() < deadline, gateway.logs()[-3000:]
        time.sleep(0.3)
    since = time.time()
    watch = subprocess.Popen([*curl, "--no-buffer", url + "?watch=1"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not [r for r in cluster.received if r.at >= since and r.acting_as == user]:
            assert watch.poll() is None, watch.communicate()
            assert time.monotonic() < deadline, gateway.logs()[-3000:]
            time.sleep(0.1)
        [opened] = [r for r in cluster.received if r.at >= since and r.acting_as == user]
        assert opened.header("Impersonate-Group") == ["cluster:hub:team-a"]
        time.sleep(2.5)  # rechecked with the same groups: still open
        assert watch.poll() is None
        system.hub.add_user(token, name, ["team-b"], uid=f"uid-{name}")  # the hub moves it
        moved = time.monotonic()
        out, err = watch.communicate(timeout=LIMIT + 10)
        took = time.monotonic() - moved
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(5)
    print(f"the watch ended {took:.1f}s after the group change")
    assert took < LIMIT
    assert watch.returncode == 0 and out.endswith("\n200"), (watch.returncode, err)
    since = time.time()
    listed = subprocess.run([*curl, url], capture_output=True, text=True, timeout=30)
    assert listed.stdout.endswith("\n403"), listed.stdout
    [relisted] = [r for r in cluster.received if r.at >= since and r.acting_as == user]
    assert relisted.header("Impersonate-Group") == ["cluster:hub:team-b"]
