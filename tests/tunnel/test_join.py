"""The tunnel port's join door (tunnel.join + listener): real TLS 1.3 on 127.0.0.1.

With a join handler the listener asks for a client certificate without requiring it; these
tests check that this opens exactly one door: a join-ALPN connection gets one request to the
handler (with the verified certificate if one was sent), and a tunnel-ALPN connection without
a certificate is still refused before any frame (``no_certificate``).
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from certs.tls import TLS1_3, client_context, server_context
from tests.tunnel.pki import PKI, make_pki
from tunnel.connection import ALPN, SessionConfig, TunnelSession
from tunnel.join import (
    JOIN_ALPN,
    JoinAnswer,
    JoinProtocolError,
    JoinRequest,
    parse_request,
    request,
)
from tunnel.listener import start_tunnel_listener
from tunnel.registry import SessionRegistry


@pytest.fixture()
def pki(tmp_path: Path) -> PKI:
    return make_pki(tmp_path)


def join_server_context(pki: PKI) -> ssl.SSLContext:
    d = pki.root / "tunnel-server"
    return server_context(d / "tls.crt", d / "tls.key", pki.root / "tunnel-ca.crt",
                          min_version=TLS1_3, alpn_protocols=[ALPN, JOIN_ALPN],
                          client_cert_optional=True)


def join_client_context(pki: PKI, cluster: str | None = None) -> ssl.SSLContext:
    if cluster is None:
        return client_context(pki.root / "tunnel-ca.crt", min_version=TLS1_3,
                              alpn_protocols=[JOIN_ALPN])
    d = pki.agent_dir(cluster)
    return client_context(d / "ca.crt", d / "tls.crt", d / "tls.key", min_version=TLS1_3,
                          alpn_protocols=[JOIN_ALPN])


def test_parse_request_accepts_one_bounded_post() -> None:
    head = b"POST /v1/join HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n"
    assert parse_request(head + b"{") is None
    assert parse_request(head + b"{}") == ("/v1/join", b"{}")
    for bad, status in ((head + b"{}x", 400),
                        (head.replace(b"POST", b"GET"), 405),
                        (head.replace(b"/v1/join", b"/api"), 404),
                        (head.replace(b"Content-Length: 2", b"Transfer-Encoding: chunked"), 400),
                        (head.replace(b"Content-Length: 2", b"Content-Length: 99999"), 413),
                        (head.replace(b"Content-Length: 2\r\n", b""), 411),
                        (b"POST /v1/join HTTP/1.1\r\n" + b"X: y\r\n" * 1000, 400)):
        with pytest.raises(JoinProtocolError) as info:
            parse_request(bad)
        assert info.value.status == status


async def test_join_door_serves_one_request_with_or_without_a_certificate(pki: PKI) -> None:
    seen: list[JoinRequest] = []

    async def handler(req: JoinRequest) -> JoinAnswer:
        seen.append(req)
        return JoinAnswer(200, b'{"ok": true}')

    listener = await start_tunnel_listener("127.0.0.1", 0, join_server_context(pki),
                                           SessionRegistry(), SessionConfig(), join=handler)
    try:
        answer = await request("127.0.0.1", listener.port, join_client_context(pki),
                               "/v1/join", b'{"token": "t"}', server_hostname="localhost")
        assert answer == JoinAnswer(200, b'{"ok": true}')
        assert seen[0].path == "/v1/join" and seen[0].body == b'{"token": "t"}'
        assert seen[0].peer_certificate is None
        answer = await request("127.0.0.1", listener.port, join_client_context(pki, "c1"),
                               "/v1/renew", b"{}", server_hostname="localhost")
        assert answer.status == 200
        assert seen[1].peer_certificate is not None  # the verified agent certificate
        # A certificate from another CA is refused by TLS even on the join door.
        d = pki.agent_dir("c2", ca=pki.other_ca, name="foreign")
        foreign = client_context(pki.root / "tunnel-ca.crt", d / "tls.crt", d / "tls.key",
                                 min_version=TLS1_3, alpn_protocols=[JOIN_ALPN])
        with pytest.raises((ssl.SSLError, ValueError, ConnectionError)):
            await request("127.0.0.1", listener.port, foreign, "/v1/renew", b"{}",
                          server_hostname="localhost")
        assert len(seen) == 2
        assert listener.handshake_failures["unknown_ca"] == 1
    finally:
        listener.close()
        await listener.wait_closed()


async def test_tunnel_alpn_without_a_certificate_is_still_refused(pki: PKI) -> None:
    async def handler(req: JoinRequest) -> JoinAnswer:
        raise AssertionError("not a join")

    registry = SessionRegistry()
    listener = await start_tunnel_listener("127.0.0.1", 0, join_server_context(pki),
                                           registry, SessionConfig(), join=handler)
    try:
        loop = asyncio.get_running_loop()
        _, session = await loop.create_connection(
            lambda: TunnelSession(config=SessionConfig(), on_open=lambda r: None, name="x"),
            "127.0.0.1", listener.port, ssl=pki.bare_client_context(),
            server_hostname="localhost")
        await asyncio.wait_for(session.wait_closed(), 5)
        assert listener.handshake_failures["no_certificate"] == 1
        assert registry.clusters() == [] or not list(registry.clusters())
        # With a certificate the same door is the tunnel, as always.
        _, agent = await loop.create_connection(
            lambda: TunnelSession(config=SessionConfig(), on_open=lambda r: None, name="a"),
            "127.0.0.1", listener.port, ssl=pki.agent_context("c1"),
            server_hostname="localhost")
        await asyncio.wait_for(agent.wait_peer_settings(5), 6)
        assert "c1" in registry.clusters()
        agent.close()
    finally:
        listener.close()
        await listener.wait_closed()


async def test_join_needs_a_join_handler_and_an_optional_context(pki: PKI) -> None:
    with pytest.raises(ValueError):  # fail closed: an optional context without joining
        await start_tunnel_listener("127.0.0.1", 0, join_server_context(pki), SessionRegistry())
    with pytest.raises(ValueError):
        async def handler(req: JoinRequest) -> JoinAnswer:
            return JoinAnswer(200, b"")
        await start_tunnel_listener("127.0.0.1", 0, pki.hub_context(), SessionRegistry(),
                                    join=handler)
