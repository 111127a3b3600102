"""Streams under stress: slow readers, vanishing clients, a dying agent."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time

import pytest

from tests.e2e.conftest import CURL, System, split_status
from tests.support import eventually_blocking


def watchers(system: System, cluster: str) -> int:
    return system.clusters[cluster].watcher_count


def test_slow_reader_on_one_watch_does_not_stall_others(system: System) -> None:
    sim = system.clusters["cluster2"]
    sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bulk"}})
    blob = "x" * 100_000
    sim.apply([{"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"big-{i:02d}", "namespace": "bulk"}, "data": {"blob": blob}}
               for i in range(40)])
    raw = socket.create_connection(("127.0.0.1", system.front_port), timeout=30)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # far below the 4 MB pending
    slow = system.ssl_context().wrap_socket(raw, server_hostname="localhost")
    try:
        slow.sendall(
            b"GET /cluster2/api/v1/namespaces/bulk/configmaps?watch=1 HTTP/1.1\r\n"
            b"Host: localhost\r\nAuthorization: Bearer " + system.token.encode() + b"\r\n\r\n")
        time.sleep(1.0)  # ~4 MB of events pile up behind a reader that reads nothing
        started = time.monotonic()
        for _ in range(20):
            code, _ = split_status(system.curl("/cluster2/api/v1/namespaces/default/pods",
                                               timeout=10))
            assert code == 200
        assert time.monotonic() - started < 10, "other requests stalled behind the slow reader"
        got = system.kubectl("get", "pod", "demo", "-o", "name", context="cluster2")
        assert got.returncode == 0 and "pod/demo" in got.stdout
        # The slow reader now reads: every event arrives, intact.
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        received = bytearray()
        deadline = time.monotonic() + 30
        names = [f'"big-{i:02d}"'.encode() for i in range(40)]
        while received.count(blob.encode()) < 40 and time.monotonic() < deadline:
            chunk = slow.recv(1 << 20)
            if not chunk:
                break
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        missing = [n for n in names if n not in received]
        assert not missing, (len(received), missing[:3])
        assert received.count(blob.encode()) >= 40
    finally:
        slow.close()


def test_client_disconnect_mid_watch_cancels_upstream(system: System) -> None:
    before = watchers(system, "cluster1")
    proc = system.kubectl_popen("get", "configmaps", "-w", "-n", "kube-public")
    try:
        eventually_blocking(lambda: watchers(system, "cluster1") > before, 20, "a new watcher",
                            interval=0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    # kubesim sees the watch connection close: its watcher goes away.
    eventually_blocking(lambda: watchers(system, "cluster1") <= before, 10, "the watch ended",
                        interval=0.05)


def test_agent_killed_mid_request_fails_promptly_then_recovers(system: System) -> None:
    follow = subprocess.Popen(
        [CURL, "-sSN", "--cacert", str(system.ca_file), "-H",
         f"Authorization: Bearer {system.token}",
         f"{system.front}/cluster2/api/v1/namespaces/default/pods/demo/log?follow=true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()
        assert first.startswith(b"line "), first
        agent = system.agents["cluster2"]
        agent.popen.send_signal(signal.SIGKILL)
        agent.popen.wait(5)
        killed = time.monotonic()
        follow.wait(10)  # the client's stream ends promptly, not at some far timeout
        assert time.monotonic() - killed < 10
        started = time.monotonic()
        code, body = split_status(system.curl("/cluster2/version", timeout=15))
        assert code in (502, 503), body
        assert time.monotonic() - started < 5
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(5)
        if system.agents["cluster2"].popen.poll() is not None:
            system.start_agent("cluster2")
    system.wait_cluster("cluster2", timeout=30)
    got = system.kubectl("get", "pods", "-o", "name", context="cluster2")
    assert got.returncode == 0 and "pod/demo" in got.stdout


@pytest.mark.slow
async def test_many_concurrent_requests_share_the_agents(system: System) -> None:
    import aiohttp

    headers = {"Authorization": f"Bearer {system.token}"}
    connector = aiohttp.TCPConnector(ssl=system.ssl_context(), limit=50)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def one(i: int) -> int:
            cluster = "cluster1" if i % 2 else "cluster2"
            async with session.get(f"{system.front}/{cluster}/api/v1/namespaces/default/pods",
                                   timeout=aiohttp.ClientTimeout(total=30)) as resp:
                await resp.read()
                return resp.status

        statuses = await asyncio.gather(*(one(i) for i in range(200)))
    assert statuses == [200] * 200
