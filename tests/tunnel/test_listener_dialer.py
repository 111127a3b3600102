"""Listener and dialer over real mTLS on 127.0.0.1, with certificates from our own certs package.

DESIGN §4 / §6 rule 4: an agent's cluster comes only from its verified certificate; a wrong CA,
no certificate, or an old TLS version is refused before any frame; the agent trusts only its
configured hub CA. Plus: reconnect after a hub restart, GOAWAY drain with in-flight streams
finishing, and certificate rotation replacing the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from certs.files import cert_pem, write_pair
from certs.issue import issue_agent
from certs.tls import TLS1_2, TLS1_3, ReloadingContext, client_context
from tests.support import eventually, free_port
from tests.tunnel.conftest import Collector
from tests.tunnel.pki import PKI, make_pki
from tunnel.backoff import Backoff
from tunnel.connection import ALPN, SessionConfig
from tunnel.dialer import AgentDialer
from tunnel.listener import TunnelListener, start_tunnel_listener
from tunnel.registry import SessionRegistry
from tunnel.targets import KubeAPITarget


class Echo:
    """Agent-side stream: accept at once, echo everything, half-close when the hub does."""

    def connection_made(self, stream) -> None:
        self.stream = stream
        stream.accept()

    def data_received(self, data) -> None:
        self.stream.write(bytes(data))

    def eof_received(self) -> None:
        self.stream.write_eof()

    def connection_lost(self, exc) -> None:
        pass

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


def echo_on_open(request):
    return Echo()


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    return make_pki(tmp_path)


@contextlib.asynccontextmanager
async def hub(pki: PKI, port: int = 0, **kw) -> AsyncIterator[TunnelListener]:
    registry = SessionRegistry()
    listener = await start_tunnel_listener("127.0.0.1", port, pki.hub_context(**kw), registry)
    try:
        yield listener
    finally:
        listener.close()
        await listener.wait_closed()


@contextlib.asynccontextmanager
async def dialer(port: int, factory, **kw) -> AsyncIterator[AgentDialer]:
    agent = AgentDialer("127.0.0.1", port, factory, echo_on_open, SessionConfig(),
                        server_hostname="localhost", backoff=Backoff(base=0.05, cap=0.2), **kw)
    task = asyncio.create_task(agent.run())
    try:
        yield agent
    finally:
        await agent.drain(1.0)
        await asyncio.wait_for(task, 5)


async def echo_through(listener: TunnelListener, cluster: str, payload: bytes) -> bytes:
    session = listener.registry.pick(cluster)
    assert session is not None
    collector = Collector(keep=True)
    stream = session.open_stream(KubeAPITarget(), b"{}", collector, initial_data=payload)
    stream.write_eof()
    await asyncio.wait_for(collector.lost, 5)
    return bytes(collector.data)


async def test_rule4_agent_registers_under_its_certificate_cluster(pki: PKI) -> None:
    async with hub(pki) as listener, dialer(listener.port, lambda: pki.agent_context("c1")):
        await eventually(lambda: listener.registry.clusters() == {"c1"})
        assert await echo_through(listener, "c1", b"hello") == b"hello"
        assert listener.registry.pick("c2") is None


@pytest.mark.parametrize("case", ["wrong-ca", "no-cert", "tls12", "no-alpn"])
async def test_rule4_unverifiable_agents_are_refused_before_any_frame(pki: PKI, case: str) -> None:
    if case == "wrong-ca":
        context = pki.agent_context("c1", ca=pki.other_ca, name="forged")
    elif case == "no-cert":
        context = pki.bare_client_context()
    elif case == "tls12":
        context = pki.agent_context("c1", max_tls12=True)
    else:
        context = pki.agent_context("c1", alpn=False)
    # The hub context allows TLS 1.2 here so that the listener's own checks are what refuses.
    async with hub(pki, min_version=TLS1_2) as listener, dialer(
        listener.port, lambda: context
    ) as agent:
        await asyncio.sleep(0.6)
        assert listener.registry.clusters() == frozenset()
        assert not listener.sessions
        assert agent.session is None or agent.session.closed


async def test_agent_refuses_a_hub_with_an_untrusted_certificate(pki: PKI, tmp_path: Path) -> None:
    pinned_elsewhere = tmp_path / "other-ca.crt"
    pinned_elsewhere.write_bytes(cert_pem(pki.other_ca.cert))
    d = pki.agent_dir("c1")
    context = client_context(pinned_elsewhere, d / "tls.crt", d / "tls.key", min_version=TLS1_3,
                             alpn_protocols=[ALPN])
    async with hub(pki) as listener, dialer(listener.port, lambda: context) as agent:
        await asyncio.sleep(0.6)
        assert agent.connects == 0
        assert listener.registry.clusters() == frozenset()


async def test_agent_reconnects_after_the_hub_restarts(pki: PKI) -> None:
    port = free_port()
    async with dialer(port, lambda: pki.agent_context("c1")) as agent:
        async with hub(pki, port) as first:
            await eventually(lambda: first.registry.clusters() == {"c1"})
        await eventually(lambda: not agent.connected)
        async with hub(pki, port) as second:
            await eventually(lambda: second.registry.clusters() == {"c1"})
            assert await echo_through(second, "c1", b"again") == b"again"
        assert agent.connects >= 2


class ClosingRegistry(SessionRegistry):
    """A hub that accepts each session (its SETTINGS go out first) and closes it at once, as a
    hub shutting down just after registering an agent does."""

    def add(self, cluster, session) -> None:
        super().add(cluster, session)
        asyncio.get_running_loop().call_soon(session.close, "hub closing")


async def test_a_session_the_hub_accepted_then_closed_is_a_connect_not_a_refusal(
    pki: PKI, caplog: pytest.LogCaptureFixture,
) -> None:
    # The hub's SETTINGS say it accepted us (a refusal is a TLS alert or a GOAWAY *instead of*
    # SETTINGS), so an end that follows them is the session ending, not the hub refusing us:
    # it counts as a connect and sets no refusal (which the agent's /readyz would show).
    registry = ClosingRegistry()
    listener = await start_tunnel_listener("127.0.0.1", 0, pki.hub_context(), registry)
    try:
        async with dialer(listener.port, lambda: pki.agent_context("c1")) as agent:
            await eventually(lambda: agent.connects >= 3 or agent.last_refusal is not None)
            assert agent.last_refusal is None
    finally:
        listener.close()
        await listener.wait_closed()
    assert "refused this agent" not in caplog.text


async def test_goaway_drain_lets_in_flight_streams_finish(pki: PKI) -> None:
    async with hub(pki) as listener, dialer(listener.port, lambda: pki.agent_context("c1")):
        await eventually(lambda: bool(listener.registry.clusters()))
        session = listener.registry.pick("c1")
        collector = Collector(keep=True)
        stream = session.open_stream(KubeAPITarget(), b"{}", collector, initial_data=b"part1-")
        drain = asyncio.create_task(listener.drain(5.0))
        await asyncio.sleep(0.1)
        stream.write(b"part2")
        stream.write_eof()
        assert await asyncio.wait_for(collector.lost, 5) is None
        assert bytes(collector.data) == b"part1-part2"
        await asyncio.wait_for(drain, 5)
        assert listener.registry.clusters() == frozenset()


async def test_certificate_rotation_opens_a_new_session_and_drains_the_old(pki: PKI) -> None:
    d = pki.agent_dir("c1")
    reloading = ReloadingContext(
        lambda: client_context(d / "ca.crt", d / "tls.crt", d / "tls.key", min_version=TLS1_3,
                               alpn_protocols=[ALPN]),
        [d / "tls.crt", d / "tls.key", d / "ca.crt"], check_interval=0.05)
    async with hub(pki) as listener, dialer(listener.port, reloading.current) as agent:
        await eventually(lambda: len(listener.registry.sessions("c1")) == 1)
        old = listener.registry.sessions("c1")[0]
        serial_before = old.get_extra_info("ssl_object").getpeercert(binary_form=True)
        write_pair(d, issue_agent(pki.tunnel_ca, "c1", days=1), pki.tunnel_ca.cert, force=True)
        await eventually(lambda: any(
            s is not old and not s.closed for s in listener.registry.sessions("c1")))
        await eventually(lambda: old.closed)
        new = listener.registry.pick("c1")
        assert new.get_extra_info("ssl_object").getpeercert(binary_form=True) != serial_before
        # The agent counts a session once the hub's SETTINGS accept it, a moment after the hub
        # registered it.
        await eventually(lambda: agent.connects == 2)
        assert await echo_through(listener, "c1", b"rotated") == b"rotated"
        assert agent.connects == 2


def test_listener_refuses_a_context_without_client_certificates(pki: PKI) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with pytest.raises(ValueError, match="client certs"):
        asyncio.run(start_tunnel_listener("127.0.0.1", 0, context, SessionRegistry()))
