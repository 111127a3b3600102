"""The agent side: dial out to the hub and keep a session up, for as long as the agent runs.

* The hub is verified against the configured CA only: the caller's SSL context factory is
  pinned (``certs.tls.client_context``), and we insist on TLS 1.3 and our ALPN.
* Reconnects wait an exponential delay with full jitter, reset after a stable session.
* GOAWAY from the hub (it is shutting down or shedding load): a new session is dialled for new
  streams while the old one finishes its in-flight streams.
* Certificate rotation: when the context factory hands out a new context (files changed on
  disk), a new session is opened with it and the old one is drained.
* ``drain(deadline)`` (SIGTERM): DRAIN to the hub, in-flight streams finish up to the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable

from tunnel.backoff import Backoff
from tunnel.connection import ALPN, OpenRequest, SessionConfig, StreamProtocol, TunnelSession

log = logging.getLogger("hubproxy.tunnel")

OnOpen = Callable[[OpenRequest], StreamProtocol | None]
WATCH_INTERVAL = 0.5
OLD_SESSION_DEADLINE = 300.0  # how long a replaced session may keep its in-flight streams


class AgentDialer:
    def __init__(
        self,
        hub_host: str,
        hub_port: int,
        ssl_context_factory: Callable[[], ssl.SSLContext],
        on_open: OnOpen,
        config: SessionConfig | None = None,
        server_hostname: str | None = None,
        *,
        backoff: Backoff | None = None,
        handshake_timeout: float = 10.0,
    ) -> None:
        self.hub_host = hub_host
        self.hub_port = hub_port
        self.ssl_context_factory = ssl_context_factory
        self.on_open = on_open
        self.config = config or SessionConfig()
        self.server_hostname = server_hostname or hub_host
        self.backoff = backoff or Backoff()
        self.handshake_timeout = handshake_timeout
        self.session: TunnelSession | None = None
        self.retiring: set[TunnelSession] = set()
        self.connects = 0
        self._stopping = asyncio.Event()
        self._caching_factory = False

    @property
    def connected(self) -> bool:
        return self.session is not None and not self.session.closed and not self.session.draining

    async def run(self) -> None:
        """Keep one usable session to the hub until ``drain`` is called."""
        while not self._stopping.is_set():
            context = self.ssl_context_factory()
            # A factory that hands out the same context until its files change (ReloadingContext)
            # tells us about rotation by handing out a new one; one that builds anew every call
            # cannot, and must not look like a rotation every half second.
            self._caching_factory = self.ssl_context_factory() is context
            session = await self._connect(context)
            if session is None:
                await self._sleep(self.backoff.next_delay())
                continue
            self.session = session
            self.backoff.connected(time.monotonic())
            reason = await self._watch(session, context)
            self.session = None
            self.backoff.disconnected(time.monotonic())
            if reason == "closed":
                log.warning("hub session ended: %s", session.close_reason or "closed")
                await self._sleep(self.backoff.next_delay())
            else:  # goaway or rotation: dial again at once, let the old one finish
                log.info("replacing the hub session (%s)", reason)
                self._retire(session)

    async def _connect(self, context: ssl.SSLContext) -> TunnelSession | None:
        loop = asyncio.get_running_loop()
        try:
            transport, session = await loop.create_connection(
                lambda: TunnelSession(config=self.config, on_open=self.on_open, name="hub"),
                self.hub_host,
                self.hub_port,
                ssl=context,
                server_hostname=self.server_hostname,
                ssl_handshake_timeout=self.handshake_timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.warning(
                "cannot connect to the hub %s:%d: %s",
                self.hub_host,
                self.hub_port,
                getattr(exc, "reason", None)
                or getattr(exc, "strerror", None)
                or type(exc).__name__,
            )
            return None
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.version() != "TLSv1.3" or (
            ssl_object.selected_alpn_protocol() != ALPN
        ):
            log.warning("hub %s:%d did not negotiate TLS 1.3 with ALPN %s; disconnecting",
                        self.hub_host, self.hub_port, ALPN)
            session.close("hub protocol mismatch")
            return None
        self.connects += 1
        log.info("connected to the hub %s:%d", self.hub_host, self.hub_port)
        return session

    async def _watch(self, session: TunnelSession, context: ssl.SSLContext) -> str:
        """Why this session stops being the one for new streams."""
        while True:
            if session.closed:
                return "closed"
            if self._stopping.is_set():
                return "stopping"
            if session.draining:
                return "hub sent GOAWAY"
            if self._caching_factory and self.ssl_context_factory() is not context:
                return "certificate rotated"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), WATCH_INTERVAL)

    def _retire(self, session: TunnelSession) -> None:
        if session.closed:
            return
        self.retiring.add(session)

        async def finish() -> None:
            try:
                await session.drain(OLD_SESSION_DEADLINE)
            finally:
                self.retiring.discard(session)

        asyncio.get_running_loop().create_task(finish())

    async def _sleep(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay)

    async def drain(self, deadline: float) -> None:
        """Stop reconnecting; DRAIN every session and wait up to ``deadline`` for its streams."""
        self._stopping.set()
        sessions = [s for s in (self.session, *self.retiring) if s is not None and not s.closed]
        await asyncio.gather(*(s.drain(deadline) for s in sessions), return_exceptions=True)
