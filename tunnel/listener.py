"""The hub side: accept agents over mTLS, name them from their certificate, register them.

Contract (DESIGN §4, §6): the SSL context must require a client certificate verified against
the agent CA (the gateway builds it with ``certs.tls.server_context``). Before any frame is
read, the session checks that TLS 1.3 and our ALPN were negotiated and takes the cluster name
from the verified certificate (under the listener's :class:`tunnel.identity.AgentNaming`);
anything else is aborted. Agents never open streams toward the hub (the hub's sessions have no
``on_open``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import cast

from tunnel.connection import ALPN, SessionConfig, TunnelSession
from tunnel.identity import URI_NAMING, AgentIdentityError, AgentNaming, cluster_from_certificate
from tunnel.registry import SessionRegistry

log = logging.getLogger("hubproxy.tunnel")

HANDSHAKE_TIMEOUT = 10.0


class AgentSession(TunnelSession):
    """The hub's end of one agent connection."""

    def __init__(self, listener: TunnelListener) -> None:
        super().__init__(config=listener.config, name="agent")
        self._listener = listener
        self.cluster: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        try:
            self.cluster = self._identify(transport)
        except AgentIdentityError as exc:
            peer = transport.get_extra_info("peername")
            log.warning("agent connection from %s refused: %s", peer, exc)
            self._listener.refused += 1
            self.closed = True  # never processes a frame
            cast(asyncio.Transport, transport).abort()
            return
        self.name = f"agent:{self.cluster}"
        super().connection_made(transport)
        self._listener.adopt(self)

    def buffer_updated(self, nbytes: int) -> None:
        if self.cluster is None:  # refused in connection_made; the transport is aborting
            return
        super().buffer_updated(nbytes)

    def _identify(self, transport: asyncio.BaseTransport) -> str:
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None:
            raise AgentIdentityError("not a TLS connection")
        if ssl_object.version() != "TLSv1.3":
            raise AgentIdentityError(f"TLS 1.3 required, got {ssl_object.version()}")
        if ssl_object.selected_alpn_protocol() != ALPN:
            raise AgentIdentityError(f"ALPN {ALPN!r} required")
        return cluster_from_certificate(ssl_object.getpeercert(binary_form=True),
                                        self._listener.naming)


class TunnelListener:
    def __init__(self, registry: SessionRegistry, config: SessionConfig,
                 naming: AgentNaming = URI_NAMING) -> None:
        self.registry = registry
        self.config = config
        self.naming = naming
        self.server: asyncio.Server | None = None
        self.sessions: set[AgentSession] = set()
        self.refused = 0

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def adopt(self, session: AgentSession) -> None:
        cluster = session.cluster
        assert cluster is not None
        self.sessions.add(session)
        self.registry.add(cluster, session)

        def gone(closed: TunnelSession) -> None:
            self.sessions.discard(session)
            self.registry.remove(cluster, session)

        session.on_closed.append(gone)

    def close(self) -> None:
        """Stop accepting and abort every session (their streams see SessionClosed)."""
        if self.server is not None:
            self.server.close()
        for session in list(self.sessions):
            session.close("hub closing")

    async def wait_closed(self) -> None:
        for session in list(self.sessions):
            with contextlib.suppress(Exception):
                await session.wait_closed()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5.0)

    async def drain(self, deadline: float) -> None:
        """Graceful hub shutdown: GOAWAY to every agent, in-flight streams finish (<= deadline)."""
        if self.server is not None:
            self.server.close()
        await asyncio.gather(
            *(session.drain(deadline) for session in list(self.sessions)), return_exceptions=True
        )


async def start_tunnel_listener(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext,
    registry: SessionRegistry,
    config: SessionConfig | None = None,
    *,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    reuse_port: bool = False,
    naming: AgentNaming = URI_NAMING,
) -> TunnelListener:
    if ssl_context.verify_mode != ssl.CERT_REQUIRED:
        raise ValueError("the tunnel listener needs an SSL context that requires client certs")
    listener = TunnelListener(registry, config or SessionConfig(), naming)
    loop = asyncio.get_running_loop()
    listener.server = await loop.create_server(
        lambda: AgentSession(listener),
        host,
        port,
        ssl=ssl_context,
        ssl_handshake_timeout=handshake_timeout,
        backlog=1024,
        reuse_port=reuse_port or None,  # several hub processes on one port (gateway workers)
    )
    return listener
