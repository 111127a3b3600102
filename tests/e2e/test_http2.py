"""HTTP/2 at the front door with real clients (issue 15): kubectl negotiates h2 for get, watch
and apply, and HTTP/1.1 for exec (client-go's choice for upgrades); curl --http2 works. The
gateway's audit line says which protocol each request used."""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import CURL, System
from tests.e2e.test_kubectl import read_lines, stop
from tests.support import eventually_blocking


def audit_protocols(system: System, needle: str) -> set[str]:
    """Protocols of the gateway's audit records whose path contains ``needle``."""
    found: set[str] = set()
    assert system.gateway is not None
    for line in system.gateway.output.splitlines():
        start = line.find("{")
        if start < 0 or needle not in line:
            continue
        try:
            record = json.loads(line[start:])
        except ValueError:
            continue
        if needle in str(record.get("path", "")) and "protocol" in record:
            found.add(record["protocol"])
    return found


def eventually_protocols(system: System, needle: str, timeout: float = 10) -> set[str]:
    return eventually_blocking(lambda: audit_protocols(system, needle), timeout,
                               f"an audit line for {needle}")


def test_kubectl_get_watch_apply_negotiate_h2(system: System) -> None:
    got = system.kubectl("get", "pods", "-o", "name", "-l", "e2e-h2-get=1")
    assert got.returncode == 0, got.stderr
    assert eventually_protocols(system, "e2e-h2-get") == {"h2"}

    manifest = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "e2e-h2-applied", "namespace": "default"},
                           "data": {"k": "v"}})
    got = system.kubectl("apply", "-f", "-", input=manifest)
    assert got.returncode == 0, got.stderr
    assert "e2e-h2-applied" in got.stdout
    assert eventually_protocols(system, "configmaps/e2e-h2-applied") == {"h2"}
    assert system.kubectl("delete", "configmap", "e2e-h2-applied").returncode == 0

    proc = system.kubectl_popen("get", "configmaps", "-w", "-o", "name", "-l", "e2e-h2-w=1",
                                context="cluster2")
    try:
        time.sleep(1.0)
        system.clusters["cluster2"].apply({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "e2e-h2-watched", "namespace": "default",
                         "labels": {"e2e-h2-w": "1"}}})
        lines: list[str] = []
        deadline = time.monotonic() + 15
        while "configmap/e2e-h2-watched" not in lines and time.monotonic() < deadline:
            lines += read_lines(proc, 1, timeout=1)
        assert "configmap/e2e-h2-watched" in lines
    finally:
        stop(proc)
    # The watch's stream_start/stream_end records (and the list before it) say h2.
    assert eventually_protocols(system, "e2e-h2-w") == {"h2"}


def test_kubectl_exec_stays_on_http1(system: System) -> None:
    got = system.kubectl("exec", "demo", "--", "echo", "e2e-h2-exec")
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "e2e-h2-exec"
    assert eventually_protocols(system, "e2e-h2-exec") == {"h1"}


def test_curl_http2(system: System) -> None:
    import subprocess

    got = subprocess.run(
        [CURL, "-sS", "--http2", "--cacert", str(system.ca_file), "-w", "\n%{http_version}",
         "-H", f"Authorization: Bearer {system.token}",
         system.front + "/cluster1/api/v1/namespaces/default/pods?labelSelector=e2e-h2-curl"],
        capture_output=True, text=True, timeout=30)
    assert got.returncode == 0, got.stderr
    body, _, version = got.stdout.rpartition("\n")
    assert version == "2"
    assert json.loads(body)["kind"] == "PodList"
    assert eventually_protocols(system, "e2e-h2-curl") == {"h2"}


def test_kubectl_logs_follow_over_h2_and_port_forward_over_http1(system: System) -> None:
    import socket

    from tests.support import free_port

    proc = system.kubectl_popen("logs", "-f", "demo", "--since=1h")
    try:
        lines = read_lines(proc, 3, timeout=20)
        assert len(lines) == 3, lines
    finally:
        stop(proc)
    # logs -f is a streamed GET: a stream of the h2 connection.
    assert eventually_protocols(system, "since") == {"h2"}

    port = free_port()
    proc = system.kubectl_popen("port-forward", "pod/demo", f"{port}:8080")
    try:
        assert read_lines(proc, 1, timeout=20)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"e2e-h2-pf")
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(100)
    finally:
        stop(proc)
    # The upgrade to SPDY/WebSocket: HTTP/1.1, as client-go does for upgrades.
    assert eventually_protocols(system, "portforward") == {"h1"}
