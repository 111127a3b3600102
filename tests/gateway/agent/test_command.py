"""`hubproxy agent` as a process: dials a real tunnel listener, serves streams, probes, drains.

The hub side here is the tunnel package itself (listener + registry), so these tests need no
gateway: they play the hub and open streams the way the gateway does.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from certs import layout
from gateway.fixtures import agent_args, agent_kubeconfig, managed_rbac, write_private
from gateway.wire.identity import Identity
from kubesim.testing import RunningKubeSim, run_kubesim
from tests.gateway.agent.conftest import Collect
from tests.support import ProcessGroup, free_port

AGENT_TOKEN = "agent-cmd-token-42"
USER = "cluster:hub:system:serviceaccount:demo:demo"


@pytest.fixture
async def hub(tmp_path: Path) -> Any:
    from certs.tls import TLS1_3, server_context
    from gateway.agent.command import tunnel_alpn
    from tunnel.connection import SessionConfig
    from tunnel.listener import start_tunnel_listener
    from tunnel.registry import SessionRegistry

    pki = tmp_path / "pki"
    layout.init(pki, layout.InitOptions(clusters=["cluster1", "cluster2"]))
    registry = SessionRegistry()
    server = pki / "tunnel-server"
    ctx = server_context(server / "tls.crt", server / "tls.key", pki / "tunnel-ca" / "ca.crt",
                         min_version=TLS1_3,
                         alpn_protocols=tunnel_alpn())
    port = free_port()
    listener = await start_tunnel_listener("127.0.0.1", port, ctx, registry, SessionConfig())
    try:
        yield pki, port, registry
    finally:
        listener.close()
        await listener.wait_closed()


@pytest.fixture
async def sim(tmp_path: Path) -> Any:
    async with run_kubesim(tmp_path, name="cluster1",
                           users=[(AGENT_TOKEN, "hubproxy-agent", "agent-uid")],
                           rbac=managed_rbac(USER)) as sim:
        yield sim


def start_agent(processes: ProcessGroup, pki: Path, port: int, sim: RunningKubeSim,
                tmp_path: Path, health: int, cluster: str = "cluster1", *extra: str) -> Any:
    token = write_private(tmp_path / "agent-token", AGENT_TOKEN)
    kc = write_private(tmp_path / "agent-kc", __import__("yaml").safe_dump(
        agent_kubeconfig(sim.url, sim.ca_file, str(token))))
    return processes.hubproxy(*agent_args(pki, cluster, hub=f"127.0.0.1:{port}",
                                          kubeconfig=kc, health_listen=f"127.0.0.1:{health}"),
                              "--allow-loopback-targets", *extra)


async def wait_session(registry: Any, cluster: str, timeout: float = 20) -> Any:
    async with asyncio.timeout(timeout):
        while registry.pick(cluster) is None:
            await asyncio.sleep(0.05)
    return registry.pick(cluster)


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.slow
async def test_agent_serves_streams_probes_and_drains_on_sigterm(
    processes: ProcessGroup, hub: Any, sim: RunningKubeSim, tmp_path: Path
) -> None:
    from tunnel.targets import KubeAPITarget

    pki, port, registry = hub
    health = free_port()
    agent = start_agent(processes, pki, port, sim, tmp_path, health)
    session = await wait_session(registry, "cluster1")

    metadata = Identity(USER, ("cluster:hub:system:serviceaccounts",), "uid-1",
                        request_id="r-1").to_metadata()
    collect = Collect()
    session.open_stream(KubeAPITarget(), metadata, collect, initial_data=(
        b"GET /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: gw\r\n\r\n"))
    collect.stream.write_eof()
    try:
        await asyncio.wait_for(collect.done, 10)
    except TimeoutError:
        raise AssertionError("no answer; agent output:\n" + agent.output[-3000:]) from None
    assert collect.data.startswith(b"HTTP/1.1 200"), bytes(collect.data[:300])
    seen = sim.requests_to("/api/v1/namespaces/default/configmaps")[-1]
    assert seen.user == "hubproxy-agent" and seen.acting_as == USER

    assert await asyncio.to_thread(http_get, f"http://127.0.0.1:{health}/healthz") == (200, "ok\n")
    deadline = time.monotonic() + 15
    while True:  # readiness needs one successful apiserver probe
        code, _ = await asyncio.to_thread(http_get, f"http://127.0.0.1:{health}/readyz")
        if code == 200 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert code == 200

    # A long request in flight, then SIGTERM: the agent drains and exits 0.
    follow = Collect()
    session.open_stream(KubeAPITarget(), metadata, follow, initial_data=(
        b"GET /api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1 HTTP/1.1\r\n"
        b"Host: gw\r\n\r\n"))
    follow.stream.write_eof()
    await asyncio.sleep(0.2)
    agent.popen.send_signal(signal.SIGTERM)
    rc = await asyncio.to_thread(agent.popen.wait, 15)
    assert rc == 0, agent.output[-2000:]
    assert follow.data.startswith(b"HTTP/1.1 200")
    assert AGENT_TOKEN not in agent.final_output()


@pytest.mark.slow
async def test_upstream_connection_limit_is_a_typed_overload(
    processes: ProcessGroup, hub: Any, sim: RunningKubeSim, tmp_path: Path
) -> None:
    from tunnel.errors import OpenErrorCode, OpenRefused
    from tunnel.targets import KubeAPITarget

    pki, port, registry = hub
    agent = start_agent(processes, pki, port, sim, tmp_path, free_port(), "cluster1",
                        "--max-upstream-connections", "1")
    session = await wait_session(registry, "cluster1")
    metadata = Identity(USER, (), "uid-1", request_id="r1").to_metadata()

    def send(head: bytes) -> Collect:
        collect = Collect()
        session.open_stream(KubeAPITarget(), metadata, collect, initial_data=head)
        collect.stream.write_eof()
        return collect

    watch = send(b"GET /api/v1/namespaces/default/configmaps?watch=1 HTTP/1.1\r\nHost: gw\r\n\r\n")
    async with asyncio.timeout(10):
        while not watch.data.startswith(b"HTTP/1.1 200"):  # the one connection is now held
            await asyncio.sleep(0.02)
    second = send(b"GET /api/v1/namespaces HTTP/1.1\r\nHost: gw\r\n\r\n")
    refused = await asyncio.wait_for(second.done, 10)
    assert isinstance(refused, OpenRefused) and refused.code == OpenErrorCode.OVERLOAD, (
        refused, agent.output[-2000:])
    watch.stream.reset()  # the client goes away: its connection is freed for the next request
    async with asyncio.timeout(10):
        while True:
            third = send(b"GET /api/v1/namespaces HTTP/1.1\r\nHost: gw\r\n\r\n")
            if await asyncio.wait_for(third.done, 10) is None:
                break
            await asyncio.sleep(0.05)
    assert third.data.startswith(b"HTTP/1.1 200")


def test_agent_help_and_refusals(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "gateway.cli", "agent"]
    got = subprocess.run([*cli, "--help"], capture_output=True, text=True, timeout=30)
    assert got.returncode == 0 and "--allow-service" in got.stdout
    pki = tmp_path / "pki"
    layout.init(pki, layout.InitOptions(clusters=["cluster1", "cluster2"]))
    kc = tmp_path / "kc"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    base = [*cli, "--hub", "127.0.0.1:1", "--health-listen", "off", "--kubeconfig", str(kc)]
    # the certificate names another cluster
    got = subprocess.run([*base, "--cluster", "cluster1", "--tls-dir",
                          str(pki / "agents" / "cluster2")], capture_output=True, text=True,
                         timeout=30)
    assert got.returncode == 2 and "cluster2" in got.stderr
    # an apiserver it cannot verify
    got = subprocess.run([*base, "--cluster", "cluster1", "--tls-dir",
                          str(pki / "agents" / "cluster1")], capture_output=True, text=True,
                         timeout=30)
    assert got.returncode == 2 and "insecure-skip-tls-verify" in got.stderr
