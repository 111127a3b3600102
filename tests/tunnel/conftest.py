"""Fixtures: two TunnelSessions joined by a real TLS 1.3 connection on 127.0.0.1 (trustme)."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import Callable

import pytest
import trustme

from tunnel.connection import ALPN, TunnelSession, TunnelStream
from tunnel.errors import StreamError
from tunnel.session_state import SessionConfig


@pytest.fixture(scope="session")
def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.minimum_version = ssl.TLSVersion.TLSv1_3
    ca.issue_cert("hub.test").configure_cert(server)
    ca.configure_trust(server)
    server.verify_mode = ssl.CERT_REQUIRED
    server.set_alpn_protocols([ALPN])
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    client.minimum_version = ssl.TLSVersion.TLSv1_3
    ca.configure_trust(client)
    ca.issue_cert("agent.test").configure_cert(client)
    client.set_alpn_protocols([ALPN])
    return server, client


async def session_pair(tls_contexts, hub_config: SessionConfig | None = None,
                       agent_config: SessionConfig | None = None,
                       on_open: Callable | None = None) -> tuple[TunnelSession, TunnelSession,
                                                                  asyncio.Server]:
    """Hub (server side, opens streams) and agent (client side, on_open) over real TLS."""
    server_ctx, client_ctx = tls_contexts
    loop = asyncio.get_running_loop()
    hub_ready: asyncio.Future[TunnelSession] = loop.create_future()

    def make_hub() -> TunnelSession:
        s = TunnelSession(config=hub_config or SessionConfig(), on_open=None, name="hub")
        if not hub_ready.done():
            hub_ready.set_result(s)
        return s

    server = await loop.create_server(make_hub, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    _, agent = await loop.create_connection(
        lambda: TunnelSession(config=agent_config or SessionConfig(),
                              on_open=on_open or (lambda req: None), name="agent"),
        "127.0.0.1", port, ssl=client_ctx, server_hostname="hub.test")
    hub = await asyncio.wait_for(hub_ready, 5)
    return hub, agent, server


class Collector:
    """A StreamProtocol that hashes what it receives and records every callback."""

    def __init__(self, keep: bool = False) -> None:
        self.stream: TunnelStream | None = None
        self.sha = hashlib.sha256()
        self.count = 0
        self.keep = keep
        self.data = bytearray()
        self.eof = False
        self.lost: asyncio.Future[StreamError | None] = asyncio.get_running_loop().create_future()
        self.paused = 0
        self.resumed = 0
        self.eof_event = asyncio.Event()

    def connection_made(self, stream: TunnelStream) -> None:
        self.stream = stream

    def data_received(self, data) -> None:
        self.sha.update(data)
        self.count += len(data)
        if self.keep:
            self.data += data

    def eof_received(self) -> None:
        self.eof = True
        self.eof_event.set()

    def connection_lost(self, exc) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)

    def pause_writing(self) -> None:
        self.paused += 1

    def resume_writing(self) -> None:
        self.resumed += 1
