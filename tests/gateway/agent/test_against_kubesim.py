"""The agent's exchange against kubesim: real impersonation, RBAC, watch, and what kubesim saw."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.agent.agent import Agent
from gateway.agent.kubeapi import from_kubeconfig
from gateway.fixtures import managed_rbac
from kubesim.testing import RunningKubeSim, run_kubesim
from tests.gateway.agent.conftest import FakeStream
from tests.gateway.agent.test_exchange import FakePolicy, get, identity_metadata
from tunnel.connection import OpenRequest
from tunnel.targets import KubeAPITarget

AGENT_TOKEN = "agent-static-token-0123"
HUB_TOKEN = "eyJhbGciOiJIUzI1NiJ9.hub-token.sig"
USER = "cluster:hub:system:serviceaccount:demo:demo"


@pytest.fixture
async def sim(tmp_path: Path) -> Any:
    async with run_kubesim(tmp_path, name="cluster1",
                           users=[(AGENT_TOKEN, "hubproxy-agent", "agent-uid")]) as sim:
        sim.apply(managed_rbac(USER))
        yield sim


@pytest.fixture
def agent(sim: RunningKubeSim, tmp_path: Path) -> Agent:
    kc = sim.write_kubeconfig(tmp_path / "agent-kc", token=AGENT_TOKEN)
    access = from_kubeconfig(str(kc))
    return Agent(cluster="cluster1", policy=FakePolicy((sim.host, sim.port), {}), kube=access)


def exchange(agent: Agent, request: bytes, metadata: bytes | None = None) -> FakeStream:
    target = KubeAPITarget()
    meta = identity_metadata() if metadata is None else metadata
    stream = FakeStream(agent.on_open(OpenRequest(3, target, meta)), target, meta)
    stream.send(request)
    return stream


async def test_whoami_is_the_impersonated_hub_identity(agent: Agent,
                                                       sim: RunningKubeSim) -> None:
    body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    request = (
        "POST /apis/authentication.k8s.io/v1/selfsubjectreviews HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {HUB_TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    stream = exchange(agent, request)
    stream.send_eof()
    await stream.wait_done()
    status, _, payload = stream.response()
    assert status == 201, payload
    info = json.loads(payload)["status"]["userInfo"]
    assert info["username"] == USER
    assert "cluster:hub:system:serviceaccounts" in info["groups"]
    seen = sim.requests_to("/apis/authentication.k8s.io/v1/selfsubjectreviews")
    assert seen and seen[-1].user == "hubproxy-agent" and seen[-1].acting_as == USER
    assert all(HUB_TOKEN not in v for r in sim.received for _, v in r.headers)


async def test_rbac_of_the_impersonated_identity_applies(agent: Agent) -> None:
    # managed_rbac (the demo's) grants configmaps but not secrets to the hub identity.
    stream = exchange(agent, get("/api/v1/namespaces/default/secrets"))
    stream.send_eof()
    await stream.wait_done()
    assert stream.response()[0] == 403
    stream = exchange(agent, get("/api/v1/namespaces/default/configmaps"))
    stream.send_eof()
    await stream.wait_done()
    assert stream.response()[0] == 200


async def test_watch_streams_events_then_cancel_closes_upstream(agent: Agent,
                                                                sim: RunningKubeSim) -> None:
    stream = exchange(agent, get("/api/v1/namespaces/default/configmaps?watch=1"))
    stream.send_eof()
    await stream.wait(lambda: b"\r\n\r\n" in stream.received)
    assert stream.response()[0] == 200
    sim.apply({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "cm1", "namespace": "default"}, "data": {"a": "b"}})
    await stream.wait(lambda: b'"cm1"' in stream.received)
    assert not stream.eof
    assert agent.pool.in_use == 1
    stream.client_reset()
    await asyncio.sleep(0.05)
    assert agent.pool.in_use == 0


async def test_kubesim_speaks_http1_so_the_agent_falls_back_and_stays(
        agent: Agent, sim: RunningKubeSim) -> None:
    """kubesim (aiohttp) negotiates no h2: the default ``auto`` agent probes once, then uses
    HTTP/1.1 connections, reused, for every request after."""
    assert agent.apiserver_protocol == "auto"
    for _ in range(3):
        stream = exchange(agent, get("/api/v1/namespaces/default/configmaps"))
        stream.send_eof()
        await stream.wait_done()
        assert stream.response()[0] == 200
    assert agent.pool.protocol_dials == {"h1": 1}
    assert not agent.pool.h2_connections()
    agent.pool.close()


async def test_over_a_real_tunnel_session(agent: Agent, sim: RunningKubeSim) -> None:
    """The agent's on_open behind a real TunnelSession pair (socketpair, no TLS)."""
    import socket

    from gateway.wire.identity import Identity
    from tests.gateway.agent.conftest import Collect
    from tunnel.connection import TunnelSession
    from tunnel.errors import OpenErrorCode, OpenRefused

    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    _, hub = await loop.create_connection(lambda: TunnelSession(name="hub"), sock=a)
    _, _agent_session = await loop.create_connection(
        lambda: TunnelSession(on_open=agent.on_open, name="agent"), sock=b)
    try:
        metadata = Identity(USER, ("cluster:hub:system:serviceaccounts",), "u").to_metadata()
        for _ in range(3):  # keep-alive: one upstream connection serves them all
            got = Collect()
            hub.open_stream(KubeAPITarget(), metadata, got, initial_data=get("/version"))
            got.stream.write_eof()
            assert await asyncio.wait_for(got.done, 10) is None
            assert got.data.startswith(b"HTTP/1.1 200") and b"cluster1" in got.data
        assert agent.pool.dials == 1

        refused = Collect()
        hub.open_stream(KubeAPITarget(), b"", refused, initial_data=get("/version"))
        exc = await asyncio.wait_for(refused.done, 10)
        assert isinstance(exc, OpenRefused) and exc.code == OpenErrorCode.NO_IDENTITY

        before = sim.watcher_count
        watch = Collect()
        hub.open_stream(KubeAPITarget(), metadata, watch,
                        initial_data=get("/api/v1/namespaces/default/configmaps?watch=1"))
        watch.stream.write_eof()
        async with asyncio.timeout(10):
            while sim.watcher_count <= before:
                await asyncio.sleep(0.02)
        watch.stream.reset()  # the client went away
        async with asyncio.timeout(10):
            while sim.watcher_count > before:
                await asyncio.sleep(0.02)
    finally:
        hub.close()
        _agent_session.close()
