"""The agent to the real kube-apiserver over HTTP/2 (issue 15 item 2).

kube-apiserver offers ``h2`` in ALPN. Most tests run the agent with ``--apiserver-protocol h2``,
which sends every request as a stream on a few shared connections and refuses a server
without h2; the default ``auto`` does the same when the server offers h2 (its own test). The
agent's ``/metrics`` counts its dials by negotiated protocol and its HTTP/2 connections and
streams. Requests go through the gateway (real curl, real kubectl) and reach the real managed
apiserver, whose answers, errors, watch events, big lists and server-side apply come back
intact; upgrades (a real ``kubectl exec``) still use HTTP/1.1. The HTTP/2 client is our own
core (``gateway/wire/h2client.py``): this is its test against a real server.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.realkube.conftest import PREFIX, Fleet
from tests.realkube.hubproxy import CLUSTER, Gateway, start_gateway, wait_connected
from tests.support import LOOPBACK, ProcessGroup, free_port

STREAMS_PER_CONNECTION = 8  # --apiserver-h2-streams: small, so a few watches need 3 connections
ALICE = f"{PREFIX}system:serviceaccount:fleet:alice"


@dataclass
class Agent:
    gateway: Gateway
    health_port: int

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.health_port}/metrics",
                                    timeout=10) as answer:
            text = answer.read().decode()
        values = {}
        for line in text.splitlines():
            if line.startswith("hubproxy_agent_upstream"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def wait_metric(self, name: str, expected: float, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while (value := self.metrics().get(name)) != expected:
            assert time.monotonic() < deadline, f"{name} is {value}, not {expected}"
            time.sleep(0.1)


def start_agent(fleet: Fleet, group: ProcessGroup, *agent_args: str) -> Agent:
    port = free_port()
    gateway = start_gateway(group, fleet.pki, fleet.gateway_kubeconfig, fleet.agent_kubeconfig,
                            agent_args=("--health-listen", f"{LOOPBACK}:{port}", *agent_args))
    wait_connected(gateway, fleet.alice)
    return Agent(gateway, port)


@pytest.fixture(scope="module")
def agent(fleet: Fleet) -> Iterator[Agent]:
    group = ProcessGroup()
    try:
        # h2: every request as a stream, so that short ones prove the translation too.
        yield start_agent(fleet, group, "--apiserver-protocol", "h2",
                          "--apiserver-h2-streams", str(STREAMS_PER_CONNECTION))
    finally:
        group.stop_all()


H2_DIALS = 'hubproxy_agent_upstream_protocol_dials_total{protocol="h2"}'
H1_DIALS = 'hubproxy_agent_upstream_protocol_dials_total{protocol="h1"}'
H2_CONNECTIONS = "hubproxy_agent_upstream_h2_connections"
H2_STREAMS = "hubproxy_agent_upstream_h2_streams"


def configmap(name: str, **data: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "namespace": "team"}, "data": data})


def test_get_list_apply_and_errors_ride_h2_to_the_apiserver(fleet: Fleet, agent: Agent,
                                                             tmp_path: Path) -> None:
    gateway = agent.gateway
    kubeconfig = gateway.kubeconfig(tmp_path / "alice", fleet.alice)
    applied = gateway.kubectl(kubeconfig, "apply", "--validate=false", "-f", "-",
                              input=configmap("agent-h2", via="h2"))
    assert applied.returncode == 0, applied.stderr
    got = gateway.kubectl(kubeconfig, "get", "configmap", "agent-h2", "-n", "team", "-o", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["data"] == {"via": "h2"}
    listed = gateway.kubectl(kubeconfig, "get", "configmaps", "-n", "team", "-o", "name")
    assert "configmap/agent-h2" in listed.stdout.split()
    # The real authorizer's refusal and a 404, as Status, through the h2 streams.
    status, body = gateway.curl_json(f"/{CLUSTER}/api/v1/namespaces/other/configmaps",
                                     fleet.alice)
    assert status == 403 and body["kind"] == "Status" and ALICE in body["message"]
    status, body = gateway.curl_json(f"/{CLUSTER}/api/v1/namespaces/team/configmaps/nope",
                                     fleet.alice)
    assert status == 404 and body["reason"] == "NotFound"
    # A body-less DELETE-like verb and a PATCH body: merge-patch the ConfigMap.
    status, body = gateway.curl_json(
        f"/{CLUSTER}/api/v1/namespaces/team/configmaps/agent-h2", fleet.alice, "-X", "PATCH",
        "-H", "Content-Type: application/merge-patch+json", "--data", '{"data":{"via":"h2!"}}')
    assert status == 200 and body["data"] == {"via": "h2!"}
    metrics = agent.metrics()
    assert metrics[H2_DIALS] >= 1
    assert metrics[H1_DIALS] == 0  # nothing went over HTTP/1.1
    assert "speaks HTTP/2" in (gateway.agent.output if gateway.agent else "")


def open_watch(gateway: Gateway, token: str, path: str) -> ssl.SSLSocket:
    """A watch through the gateway on a raw TLS socket, its response head read."""
    context = ssl.create_default_context(cafile=str(gateway.ca_file))
    sock = context.wrap_socket(socket.create_connection((LOOPBACK, gateway.front_port), 10),
                               server_hostname=LOOPBACK)
    sock.sendall(f"GET /{CLUSTER}{path} HTTP/1.1\r\nHost: gw\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(4096)
        assert data, "the watch ended before its response head"
        head += data
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return sock


def apiserver_watches(fleet: Fleet) -> float:
    """Watches of ConfigMaps the managed apiserver is serving now (its own metric)."""
    context = ssl.create_default_context(cafile=str(fleet.managed.ca_file))
    request = urllib.request.Request(fleet.managed.url + "/metrics", headers={
        "Authorization": f"Bearer {fleet.managed.admin_token}"})
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        text = answer.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line \
                and 'resource="configmaps"' in line:
            total += float(line.rpartition(" ")[2])
    return total


def test_many_watches_share_few_connections_and_cancel_on_the_apiserver(
        fleet: Fleet, agent: Agent) -> None:
    before = apiserver_watches(fleet)
    count = 2 * STREAMS_PER_CONNECTION + 4  # 20 watches: 3 connections of at most 8 streams
    watches = [open_watch(agent.gateway, fleet.alice,
                          "/api/v1/namespaces/team/configmaps?watch=1&allowWatchBookmarks=false")
               for _ in range(count)]
    try:
        agent.wait_metric(H2_STREAMS, count)
        metrics = agent.metrics()
        assert metrics[H2_CONNECTIONS] == 3
        assert metrics['hubproxy_agent_upstream_h2_streams_max{of="busiest"}'] \
            == STREAMS_PER_CONNECTION
        assert metrics[H1_DIALS] == 0
        assert apiserver_watches(fleet) - before == count
        # Every watch is live: one change reaches all of them.
        fleet.managed.admin("create", "configmap", "agent-h2-watched", "-n", "team")
        for sock in watches:
            sock.settimeout(15)
            seen = b""
            while b"agent-h2-watched" not in seen:
                data = sock.recv(65536)
                assert data, "a watch ended"
                seen += data
    finally:
        for sock in watches:
            sock.close()
    # The clients went away: the agent reset their streams, and the apiserver ended the watches.
    agent.wait_metric(H2_STREAMS, 0)
    deadline = time.monotonic() + 15
    while apiserver_watches(fleet) != before:
        assert time.monotonic() < deadline, "the apiserver still serves the cancelled watches"
        time.sleep(0.2)


BIG_VALUE = "x" * 40_000


@pytest.fixture(scope="module")
def big_configmaps(fleet: Fleet) -> list[str]:
    """24 ConfigMaps of 40 KB: a list of about 1 MB, many times the 64 KiB stream window."""
    names = [f"agent-h2-big-{i}" for i in range(24)]
    fleet.managed.apply([{**json.loads(configmap(name, blob=BIG_VALUE)),
                          "metadata": {"name": name, "namespace": "team",
                                       "labels": {"agent-h2-big": "1"}}} for name in names])
    return names


BIG_LIST = f"/{CLUSTER}/api/v1/namespaces/team/configmaps?labelSelector=agent-h2-big%3D1"


def check_big_list(body: bytes | str, names: list[str]) -> None:
    items = {item["metadata"]["name"]: item.get("data") for item in json.loads(body)["items"]}
    assert sorted(items) == sorted(names)
    assert all(data == {"blob": BIG_VALUE} for data in items.values())


def test_a_list_larger_than_the_flow_control_windows_arrives_whole(
        fleet: Fleet, agent: Agent, big_configmaps: list[str]) -> None:
    code, body = agent.gateway.curl(BIG_LIST, fleet.alice)
    assert code == 200
    check_big_list(body, big_configmaps)


def test_a_reader_that_stops_holds_up_no_other_request(
        fleet: Fleet, agent: Agent, big_configmaps: list[str]) -> None:
    context = ssl.create_default_context(cafile=str(agent.gateway.ca_file))
    slow = context.wrap_socket(socket.create_connection((LOOPBACK, agent.gateway.front_port),
                                                        10), server_hostname=LOOPBACK)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    dials = agent.metrics()[H2_DIALS]
    try:
        slow.sendall(f"GET {BIG_LIST} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                     f"Authorization: Bearer {fleet.alice}\r\n\r\n".encode())
        time.sleep(1)  # the list is on its way and stuck behind a reader that does not read
        # Meanwhile, on the same HTTP/2 connection to the apiserver, other requests flow.
        for _ in range(5):
            started = time.monotonic()
            code, _ = agent.gateway.curl(f"/{CLUSTER}/api/v1/namespaces/team/configmaps/"
                                         "agent-h2-big-0", fleet.alice)
            assert code == 200 and time.monotonic() - started < 5
        assert agent.metrics()[H2_DIALS] == dials  # the same connection carried them
        slow.settimeout(30)
        received = b""
        while data := slow.recv(1 << 20):
            received += data
    finally:
        slow.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    if b"chunked" in head.lower():
        body = dechunk(body)
    check_big_list(body, big_configmaps)


def dechunk(body: bytes) -> bytes:
    out, rest = b"", body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if not size:
            return out
        out, rest = out + rest[:size], rest[size + 2:]


def test_upgrades_use_http1_connections(fleet: Fleet, agent: Agent) -> None:
    h1_before = agent.metrics()[H1_DIALS]
    # A WebSocket exec (what kubectl exec sends): there is no such pod, so the apiserver
    # answers 404 before upgrading; the point is which connection carried it.
    code, body = agent.gateway.curl(
        f"/{CLUSTER}/api/v1/namespaces/team/pods/nopod/exec?command=true&stdout=true",
        fleet.alice, "--http1.1", "-H", "Connection: Upgrade", "-H", "Upgrade: websocket",
        "-H", "Sec-WebSocket-Version: 13", "-H", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "-H", "Sec-WebSocket-Protocol: v5.channel.k8s.io")
    assert code in (403, 404), body  # alice may not exec; either way the apiserver answered
    assert re.search(r'"kind":\s*"Status"', body)
    assert agent.metrics()[H1_DIALS] == h1_before + 1


def test_auto_sends_requests_and_watches_over_one_h2_connection(fleet: Fleet) -> None:
    # As client-go does: since the agent has its own HTTP/2 core a short request costs it no
    # more CPU as a stream than on a pooled HTTP/1.1 connection (bench agentproto).
    group = ProcessGroup()
    try:
        auto = start_agent(fleet, group)  # the default, --apiserver-protocol auto
        for _ in range(3):
            code, _ = auto.gateway.curl(f"/{CLUSTER}/api/v1/namespaces/team/configmaps",
                                        fleet.alice)
            assert code == 200
        metrics = auto.metrics()
        assert metrics[H2_DIALS] == 1 and metrics[H1_DIALS] == 0
        watches = [open_watch(auto.gateway, fleet.alice,
                              "/api/v1/namespaces/team/configmaps?watch=1") for _ in range(4)]
        try:
            metrics = auto.metrics()
            assert metrics[H2_DIALS] == 1 and metrics[H2_STREAMS] == 4
            assert metrics[H1_DIALS] == 0
        finally:
            for sock in watches:
                sock.close()
    finally:
        group.stop_all()


def test_apiserver_protocol_h1_keeps_to_http1(fleet: Fleet) -> None:
    group = ProcessGroup()
    try:
        h1 = start_agent(fleet, group, "--apiserver-protocol", "h1")
        code, _ = h1.gateway.curl(f"/{CLUSTER}/api/v1/namespaces/team/configmaps", fleet.alice)
        assert code == 200
        metrics = h1.metrics()
        assert metrics[H2_DIALS] == 0 and metrics[H1_DIALS] >= 1
    finally:
        group.stop_all()


def test_server_side_apply_rides_h2(fleet: Fleet, agent: Agent, tmp_path: Path) -> None:
    gateway = agent.gateway
    kubeconfig = gateway.kubeconfig(tmp_path / "alice", fleet.alice)
    h1_dials = agent.metrics()[H1_DIALS]
    for color in ("blue", "green"):
        applied = gateway.kubectl(kubeconfig, "apply", "--server-side", "--validate=false",
                                  "-f", "-", input=configmap("agent-h2-ssa", color=color))
        assert applied.returncode == 0, applied.stderr
    got = gateway.kubectl(kubeconfig, "get", "configmap", "agent-h2-ssa", "-n", "team",
                          "-o", "json", "--show-managed-fields")
    assert got.returncode == 0, got.stderr
    obj = json.loads(got.stdout)
    assert obj["data"] == {"color": "green"}
    # the apiserver ran server-side apply (manager kubectl, operation Apply) as alice
    assert ("kubectl", "Apply") in {(m["manager"], m["operation"])
                                    for m in obj["metadata"]["managedFields"]}
    assert agent.metrics()[H1_DIALS] == h1_dials  # PATCHes with a body, all over h2


EXEC_NS = "agent-h2-exec"


def test_kubectl_exec_with_the_h2_agent_reaches_the_apiserver(fleet: Fleet, agent: Agent,
                                                              tmp_path: Path) -> None:
    # A real kubectl exec: the GET of the pod rides h2, the upgrade (WebSocket, then SPDY
    # when kubectl falls back) an HTTP/1.1 connection. There is no kubelet here, so the pod
    # is never scheduled and the apiserver's own answer to the exec says so.
    user = f"{PREFIX}system:serviceaccount:fleet:alice"
    fleet.managed.apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": EXEC_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "default", "namespace": EXEC_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "exec", "namespace": EXEC_NS},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                   {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "alice-execs", "namespace": EXEC_NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "exec"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "idle", "namespace": EXEC_NS},
         "spec": {"automountServiceAccountToken": False,
                  "containers": [{"name": "c", "image": "busybox"}]}},
    ])
    kubeconfig = agent.gateway.kubeconfig(tmp_path / "alice", fleet.alice)
    before = agent.metrics()
    done = agent.gateway.kubectl(kubeconfig, "exec", "-n", EXEC_NS, "idle", "--", "true")
    assert done.returncode != 0
    assert 'pod idle does not have a host assigned' in done.stderr, done.stderr
    after = agent.metrics()
    assert after[H1_DIALS] > before[H1_DIALS]  # the upgrade: HTTP/1.1 (the GET: h2, required)
