"""Gateway front door -> real tunnel session pair -> the real agent (gateway.agent) -> kubesim,
driven by kubectl and curl. Checks the gateway/agent stream contract end to end without the
tunnel listener: what kubesim received, impersonation, watch, exec over WebSocket."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.agent.agent import Agent
from gateway.agent.kubeapi import from_kubeconfig
from gateway.fixtures import managed_rbac, sample_pod
from kubesim.testing import run_kubesim
from tests.gateway.agent.test_exchange import FakePolicy
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    USERS,
    Harness,
    running,
    tls,  # noqa: F401
)
from tunnel.connection import TunnelSession

pytestmark = pytest.mark.timeout(60)

AGENT_TOKEN = "agent-token-" + os.urandom(6).hex()
USER = "cluster:hub:" + USERS[HUB_TOKEN]["username"]


@pytest.fixture
async def system(tls, tmp_path: Path) -> AsyncIterator[tuple[Harness, Any, Path]]:  # noqa: F811
    async with run_kubesim(tmp_path, name="cluster1",
                           users=[(AGENT_TOKEN, "hubproxy-agent", "agent-uid")]) as sim:
        sim.apply(managed_rbac(USER))
        sim.apply(sample_pod())
        kc = sim.write_kubeconfig(tmp_path / "agent-kc", token=AGENT_TOKEN)
        agent = Agent(cluster="cluster1", policy=FakePolicy((sim.host, sim.port), {}),
                      kube=from_kubeconfig(str(kc)))
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        _, hub = await loop.create_connection(lambda: TunnelSession(name="hub"), sock=a)
        _, agent_session = await loop.create_connection(
            lambda: TunnelSession(on_open=agent.on_open, name="agent"), sock=b)
        async with running(tls) as h:
            h.registry.add("cluster1", hub)
            user_kc = tmp_path / "user-kc"
            user_kc.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "c1",
                "clusters": [{"name": "c1", "cluster": {
                    "server": f"https://localhost:{h.port}/cluster1",
                    "certificate-authority": h.tls.ca_file}}],
                "users": [{"name": "u", "user": {"token": HUB_TOKEN}}],
                "contexts": [{"name": "c1", "context": {"cluster": "c1", "user": "u"}}],
            }))
            try:
                yield h, sim, user_kc
            finally:
                hub.close()
                agent_session.close()


async def kubectl(kc: Path, *args: str, timeout: float = 30) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(kc), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_kubectl_get_apply_whoami_through_gateway_and_agent(system) -> None:
    _h, sim, kc = system
    code, out, err = await kubectl(kc, "get", "pods", "-o", "name")
    assert code == 0, err
    assert "pod/demo" in out
    code, out, err = await kubectl(kc, "create", "configmap", "cm1", "--from-literal=a=b")
    assert code == 0, err
    code, out, err = await kubectl(kc, "auth", "whoami", "-o", "json")
    assert code == 0, err
    info = json.loads(out)["status"]["userInfo"]
    assert info["username"] == USER
    assert "cluster:hub:system:serviceaccounts" in info["groups"]
    # The managed cluster never saw the hub token.
    assert sim.received
    for request in sim.received:
        assert HUB_TOKEN not in json.dumps(request.__dict__, default=str)


async def test_kubectl_exec_over_websocket(system) -> None:
    _h, _sim, kc = system
    code, out, err = await kubectl(kc, "exec", "demo", "--", "echo", "hello-through-tunnel")
    assert code == 0, err
    assert "hello-through-tunnel" in out


async def test_watch_streams_and_client_disconnect_cancels_upstream(system) -> None:
    _h, sim, kc = system
    before = sim.watcher_count
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(kc), "get", "configmaps", "-w", "-o", "name",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(20):
            while sim.watcher_count <= before:
                await asyncio.sleep(0.05)
        code, _, err = await kubectl(kc, "create", "configmap", "watched", "--from-literal=x=y")
        assert code == 0, err
        async with asyncio.timeout(20):
            while True:
                line = await proc.stdout.readline()
                assert line, "watch ended"
                if b"watched" in line:
                    break
    finally:
        proc.kill()
        await proc.wait()
    async with asyncio.timeout(20):
        while sim.watcher_count > before:  # the reset reached the apiserver
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("websockets", ["true", "false"])  # WebSocket-tunnelled SPDY / SPDY
async def test_kubectl_port_forward(system, websockets: str) -> None:
    from tests.support import free_port

    _, _, kc = system
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(kc), "port-forward", "pod/demo", f"{port}:8080",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECTL_PORT_FORWARD_WEBSOCKETS": websockets})
    try:
        async with asyncio.timeout(20):
            while b"Forwarding from" not in (await proc.stdout.readline()):
                pass
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"ping-through-the-tunnel")
            got = b""
            while len(got) < 23:
                chunk = await reader.read(100)
                assert chunk, "connection closed"
                got += chunk
            assert got == b"ping-through-the-tunnel"
            writer.close()
    finally:
        proc.kill()
        await proc.wait()


async def test_slow_reader_on_a_watch_gets_every_event(system) -> None:
    import time

    h, sim, _ = system
    sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bulk"}})
    blob = "x" * 100_000
    sim.apply([{"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"big-{i:02d}", "namespace": "bulk"}, "data": {"blob": blob}}
               for i in range(40)])
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.setblocking(False)
    await asyncio.get_running_loop().sock_connect(raw, ("127.0.0.1", h.port))
    reader, writer = await asyncio.open_connection(sock=raw, ssl=h.tls.client,
                                                   server_hostname="localhost")
    writer.write(f"GET /cluster1/api/v1/namespaces/bulk/configmaps?watch=1 HTTP/1.1\r\n"
                 f"Host: x\r\nAuthorization: Bearer {HUB_TOKEN}\r\n\r\n".encode())
    await asyncio.sleep(1.0)
    received = bytearray()
    started = time.monotonic()
    def dechunk(received: bytearray) -> bytearray:
        body = bytes(received).partition(b"\r\n\r\n")[2]
        data, pos = bytearray(), 0
        while (end := body.find(b"\r\n", pos)) > 0:
            size = int(body[pos:end].split(b";")[0], 16)
            if size == 0 or end + 2 + size + 2 > len(body):
                break
            data += body[end + 2:end + 2 + size]
            pos = end + 2 + size + 2
        return data

    async with asyncio.timeout(30):
        # Count blobs in large steps (re-scanning 4 MB per small read would be quadratic).
        while True:
            chunk = await reader.read(1 << 20)
            assert chunk, "connection closed early"
            received += chunk
            if len(received) > 4_000_000 and dechunk(received).count(blob.encode()) == 40:
                break
    assert time.monotonic() - started < 10
    data = dechunk(received)  # 40 intact events, byte for byte
    assert all(f'"big-{i:02d}"'.encode() in data for i in range(40))
    writer.close()
