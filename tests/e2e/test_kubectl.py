"""Real clients through the gateway: kubectl, curl, kubernetes-asyncio.

Every request goes client -> gateway :front (TLS, TokenReview on the hub) -> tunnel -> agent ->
kubesim (impersonating the prefixed hub identity).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from queue import Empty, Queue

import pytest

from tests.e2e.conftest import System, split_status
from tests.support import free_port

USER = "cluster:hub:system:serviceaccount:demo:demo"


def read_lines(proc: subprocess.Popen[str], want: int, timeout: float = 15) -> list[str]:
    """Up to ``want`` more lines of ``proc``'s stdout within ``timeout`` (fewer at EOF).

    A reader thread per process feeds a queue: polling the pipe with select() cannot work,
    because one read of the file object takes every line the pipe holds (kubectl printing a
    list, or a list and an event together on a slow machine) and select() knows nothing of the
    lines left in its buffer: they were never returned.
    """
    queue = _stdout_lines(proc)
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while len(lines) < want:
        try:
            line = queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except Empty:
            break
        if line is None:
            queue.put(None)  # EOF stays EOF for the next call
            break
        lines.append(line.rstrip("\n"))
    return lines


_readers: weakref.WeakKeyDictionary[subprocess.Popen[str], Queue[str | None]] = (
    weakref.WeakKeyDictionary())


def _stdout_lines(proc: subprocess.Popen[str]) -> Queue[str | None]:
    if proc not in _readers:
        stdout = proc.stdout
        assert stdout is not None
        lines: Queue[str | None] = Queue()

        def pump() -> None:
            with contextlib.suppress(ValueError, OSError):  # closed by stop()
                for line in stdout:
                    lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        _readers[proc] = lines
    return _readers[proc]


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_kubectl_get_and_list(system: System) -> None:
    got = system.kubectl("get", "pods", "-o", "name")
    assert got.returncode == 0, got.stderr
    assert "pod/demo" in got.stdout
    got = system.kubectl("get", "pod", "demo", "-o", "json", context="cluster2")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["metadata"]["name"] == "demo"


def test_kubectl_create_apply_delete(system: System) -> None:
    got = system.kubectl("create", "configmap", "e2e-created", "--from-literal=a=1")
    assert got.returncode == 0, got.stderr
    manifest = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "e2e-applied", "namespace": "default"},
                           "data": {"k": "v"}})
    got = system.kubectl("apply", "-f", "-", input=manifest)
    assert got.returncode == 0, got.stderr
    assert system.clusters["cluster1"].get("v1", "configmaps", "e2e-applied", "default")
    got = system.kubectl("delete", "configmap", "e2e-created", "e2e-applied")
    assert got.returncode == 0, got.stderr
    assert system.clusters["cluster1"].get("v1", "configmaps", "e2e-applied", "default") is None
    # The writes ran as the impersonated hub identity, authenticated with the agent's token.
    writes = [r for r in system.clusters["cluster1"].received
              if r.method in ("POST", "PATCH", "DELETE") and "configmaps" in r.path]
    assert writes and all(r.user == "hubproxy-agent" and r.acting_as == USER for r in writes)


def test_kubectl_watch(system: System) -> None:
    proc = system.kubectl_popen("get", "configmaps", "-w", "-o", "name", context="cluster2")
    try:
        time.sleep(1.0)
        system.clusters["cluster2"].apply({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "e2e-watched", "namespace": "default"}})
        lines: list[str] = []
        deadline = time.monotonic() + 15
        while "configmap/e2e-watched" not in lines and time.monotonic() < deadline:
            lines += read_lines(proc, 1, timeout=1)
        assert "configmap/e2e-watched" in lines
    finally:
        stop(proc)


def test_kubectl_logs_follow(system: System) -> None:
    proc = system.kubectl_popen("logs", "-f", "demo")
    try:
        lines = read_lines(proc, 12, timeout=20)
        assert len(lines) == 12, lines
        assert lines[0].startswith("line ") and lines[0].endswith("demo/main")
    finally:
        stop(proc)


def test_kubectl_exec_websocket(system: System) -> None:
    got = system.kubectl("exec", "demo", "--", "echo", "hello", "over", "websocket")
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "hello over websocket"
    got = system.kubectl("exec", "-i", "demo", "--", "cat", input="stdin through the tunnel\n")
    assert got.returncode == 0, got.stderr
    assert got.stdout == "stdin through the tunnel\n"
    got = system.kubectl("exec", "demo", "--", "sh", "-c", "exit 3")
    assert got.returncode == 3


def test_kubectl_exec_spdy(system: System) -> None:
    env = system.env(KUBECTL_REMOTE_COMMAND_WEBSOCKETS="false")
    got = system.kubectl("exec", "demo", "--", "echo", "hello", "over", "spdy", env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "hello over spdy"
    upgrades = [r for r in system.clusters["cluster1"].received
                if "/exec" in r.path and any(v.lower().startswith("spdy")
                                             for v in r.header("Upgrade"))]
    assert upgrades


def test_kubectl_port_forward(system: System) -> None:
    port = free_port()
    proc = system.kubectl_popen("port-forward", "pod/demo", f"{port}:8080")
    try:
        assert read_lines(proc, 1, timeout=20), proc.stderr.read() if proc.stderr else ""
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            payload = os.urandom(100_000)
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            received = bytearray()
            while len(received) < len(payload):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        assert bytes(received) == payload
    finally:
        stop(proc)


def test_kubectl_auth_whoami(system: System) -> None:
    got = system.kubectl("auth", "whoami", "-o", "json", context="cluster2")
    assert got.returncode == 0, got.stderr
    info = json.loads(got.stdout)["status"]["userInfo"]
    assert info["username"] == USER
    assert "cluster:hub:system:serviceaccounts" in info["groups"]
    assert "cluster:hub:system:serviceaccounts:demo" in info["groups"]
    assert "system:authenticated" in info["groups"]  # added by the managed cluster itself
    assert not [g for g in info["groups"] if g.startswith("system:serviceaccounts")]


def test_kubectl_auth_can_i(system: System) -> None:
    assert system.kubectl("auth", "can-i", "create", "pods").stdout.strip() == "yes"
    denied = system.kubectl("auth", "can-i", "get", "secrets")
    assert denied.stdout.strip() == "no" and denied.returncode == 1


def test_curl_get_and_post(system: System) -> None:
    code, body = split_status(system.curl("/cluster1/api/v1/namespaces/default/pods"))
    assert code == 200
    assert [p["metadata"]["name"] for p in json.loads(body)["items"]] == ["demo"]
    payload = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "e2e-curl"}, "data": {"x": "y"}})
    code, body = split_status(system.curl(
        "/cluster2/api/v1/namespaces/default/configmaps", "-X", "POST",
        "-H", "Content-Type: application/json", "-H", "Transfer-Encoding: chunked",
        "--data-binary", payload))
    assert code == 201, body
    assert json.loads(body)["metadata"]["name"] == "e2e-curl"


def test_path_and_query_forwarded_byte_for_byte(system: System) -> None:
    path = "/api/v1/namespaces/default/pods?labelSelector=app%3Ddemo&limit=5"
    code, body = split_status(system.curl("/cluster1" + path))
    assert code == 200, body
    assert [p["metadata"]["name"] for p in json.loads(body)["items"]] == ["demo"]
    assert any(r.path == path for r in system.clusters["cluster1"].received)


async def test_kubernetes_asyncio_from_generated_kubeconfig(system: System) -> None:
    from kubernetes_asyncio import client, config

    for context in ("cluster1", "cluster2"):
        api_client = await config.new_client_from_config(
            config_file=str(system.kubeconfig), context=context)
        async with api_client:
            pods = await client.CoreV1Api(api_client).list_namespaced_pod("default")
            assert [p.metadata.name for p in pods.items] == ["demo"]
            created = await client.CoreV1Api(api_client).create_namespaced_config_map(
                "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="e2e-kac")))
            assert created.metadata.name == "e2e-kac"
            await client.CoreV1Api(api_client).delete_namespaced_config_map("e2e-kac", "default")


def test_managed_cluster_never_sees_a_hub_token(system: System) -> None:
    # Runs after the flows above; also run a token-bearing WebSocket exec to include upgrades.
    assert system.kubectl("exec", "demo", "--", "true").returncode == 0
    hub_tokens = [system.token, system.unprivileged_token, system.gateway_token]
    for name, sim in system.clusters.items():
        received = sim.received
        assert received, name
        for r in received:
            for header, value in r.headers:
                assert not any(t in value for t in hub_tokens), (name, r.path, header)
            assert not any(t in r.path for t in hub_tokens)
            assert r.header("Authorization") in ([], [f"Bearer {system.agent_tokens[name]}"])


@pytest.mark.parametrize("context", ["cluster1", "cluster2"])
def test_each_context_reaches_its_own_cluster(system: System, context: str) -> None:
    got = system.kubectl("version", "-o", "json", context=context)
    assert got.returncode == 0, got.stderr
    assert context in json.loads(got.stdout)["serverVersion"]["gitVersion"]


def test_kubectl_get_raw_without_the_cluster_prefix_gets_a_hint(system: System) -> None:
    """kubectl get --raw drops the server URL's path (/cluster1): the gateway says so."""
    got = system.kubectl("get", "--raw", "/version")
    assert got.returncode != 0
    assert 'cluster "version"' in got.stderr
    assert "--raw /<cluster>/version" in got.stderr, got.stderr
    fixed = system.kubectl("get", "--raw", "/cluster1/version")
    assert fixed.returncode == 0 and '"gitVersion"' in fixed.stdout, fixed.stderr


def test_laptop_kubeconfig_mints_a_token_with_the_persons_hub_credentials(
        system: System) -> None:
    """The README's laptop recipe: `hubproxy kubeconfig --exec` whose hubproxy-creds mints a
    service-account token with TokenRequest through the person's own hub kubeconfig."""
    from kubesim.auth import DEFAULT_ISSUER

    person = system.hub.write_kubeconfig(system.root / "person-hub.kubeconfig",
                                         token=system.hub.admin_token)
    creds = system.root / "hubproxy-creds"
    creds.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gateway.access.creds "$@"\n')
    creds.chmod(0o755)
    made = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "kubeconfig", "--server", system.front,
         "--ca", str(system.ca_file), "--cluster", "cluster1", "--exec",
         "--exec-command", str(creds),
         f"--exec-arg=--token-request-audience={DEFAULT_ISSUER}",
         "--exec-arg=--service-account=demo/demo", f"--exec-arg=--hub-kubeconfig={person}"],
        capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    laptop = system.root / "laptop.kubeconfig"
    laptop.write_text(made.stdout)
    env = {k: v for k, v in system.env(KUBECONFIG=str(laptop)).items()
           if k != "KUBERNETES_SERVICE_HOST"}  # a laptop is not a pod
    got = system.kubectl("auth", "whoami", env=env)
    assert got.returncode == 0, got.stderr
    assert "cluster:hub:system:serviceaccount:demo:demo" in got.stdout
