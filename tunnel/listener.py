"""The hub side: accept agents over mTLS, name them from their certificate, register them.

Contract (DESIGN §4, §6): the SSL context must require a client certificate verified against
the agent CA (the gateway builds it with ``certs.tls.server_context``). Before any frame is
read, the session checks that TLS 1.3 and our ALPN were negotiated and takes the cluster name
from the verified certificate (under the listener's :class:`tunnel.identity.AgentNaming`);
anything else is aborted. Agents never open streams toward the hub (the hub's sessions have no
``on_open``).

Certificate trouble is visible (issue 12): the listener accepts sockets itself and awaits each
TLS handshake (``loop.connect_accepted_socket``), so a failed handshake is seen with its peer
address and OpenSSL's reason instead of vanishing inside the event loop (asyncio and uvloop
report server-side handshake errors only in debug mode). Failures are counted by reason
(``handshake_failures``, :mod:`tunnel.handshake`); certificate failures are logged at WARNING,
at most once a minute per reason and peer host.

The agent learns why too. With TLS 1.3 its own handshake has succeeded by the time the hub
checks its certificate, so the reason must travel after it: OpenSSL writes the matching TLS alert
(certificate_expired, unknown_ca, ...), which the event loop's SSL layer drops when the
handshake fails; :class:`_AlertKeepingSSLObject` keeps those bytes and the listener sends them
before closing. A certificate that verifies but names no cluster gets a GOAWAY (UNAUTHORIZED)
saying why instead of SETTINGS.

Joining (``tunnel.join``, issue 12): given a ``join`` handler, the listener also offers the ALPN
``hubproxy-join/1`` and its context asks for a client certificate without requiring one
(``CERT_OPTIONAL``: a certificate that is sent must still verify, or the handshake fails as
before). The check moves here, fail closed: a connection on the tunnel ALPN without a
certificate is refused (``no_certificate``) before any frame; only a join-ALPN connection may
go without, and it is handed to :class:`tunnel.join.JoinExchange`, which serves one request.

Revocation: ``refuse(cluster, certificate)`` (the gateway's list of removed clusters) is asked
for every new session; a reason refuses it (``revoked``), and :meth:`TunnelListener.close_where`
ends the sessions that are open.

Storms (issue 22): at most ``max_handshakes`` TLS handshakes run at once; further connections
wait in the listen queue (``backlog``), and one that waited so long that its agent is about to
give up, or that its agent already closed, is refused before any TLS work (the rules and why
are in :mod:`tunnel.admission`). ``refused_early`` counts those by reason. The tunnel context
sends no session tickets: agents never resume (a restarted hub could not read its old tickets,
and Python's asyncio does not offer resumption), and two tickets were a quarter of the hub's
handshake CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

from cryptography import x509
from mypy_extensions import mypyc_attr

from tunnel import frames
from tunnel.admission import (
    BUSY_ALERT,
    DEFAULT_BACKLOG,
    DEFAULT_MAX_HANDSHAKES,
    EARLY_REASONS,
    GONE,
    SLOT_HOLD,
    HandshakeSlots,
    classify_waiting,
    parse_listen_queue,
    parse_tcp_info,
    somaxconn,
    tcp_info,
)
from tunnel.connection import ALPN, SessionConfig, TunnelSession
from tunnel.errors import GoAwayCode
from tunnel.handshake import (
    AGENT_HANDSHAKE_TIMEOUT,
    NO_CERTIFICATE,
    PROTOCOL,
    REVOKED,
    HandshakeFailure,
    LogThrottle,
    classify_hub_failure,
    wrong_name,
)
from tunnel.identity import URI_NAMING, AgentIdentityError, AgentNaming, cluster_from_certificate
from tunnel.join import JOIN_ALPN, JoinExchange, JoinHandler
from tunnel.registry import SessionRegistry
from tunnel.session_state import HUB_PING_AFTER

log = logging.getLogger("hubproxy.tunnel")

HANDSHAKE_TIMEOUT = 10.0
# A connection that waited this long in the listen queue is refused rather than handshaken: its
# agent gives the whole dial AGENT_HANDSHAKE_TIMEOUT, and the handshake itself needs the rest
# (about max_handshakes / handshake rate, under a second, plus margin). Refusing earlier sends
# agents that would have been served into seconds of backoff: a model of 10,000 agents
# redialling (issue 22 report) took 2-5x longer to converge with half the timeout than with
# this, and wasted no more handshakes.
STALE_AFTER = AGENT_HANDSHAKE_TIMEOUT - 2.5
REFUSAL_LOG_INTERVAL = 60.0  # one WARNING per reason and peer host per interval
ACCEPT_ERROR_PAUSE = 0.1  # after accept() fails (EMFILE...): do not spin


class AgentSession(TunnelSession):
    """The hub's end of one agent connection."""

    __slots__ = ("_join", "_join_buffer", "_listener", "certificate", "certificate_not_after",
                 "cluster", "peer")

    def __init__(self, listener: TunnelListener, peer: tuple[str, int] | None = None) -> None:
        super().__init__(config=listener.config, name="agent")
        self._listener = listener
        self.peer = peer
        self.cluster: str | None = None
        self.certificate_not_after = 0.0  # POSIX time the agent certificate expires
        self.certificate: x509.Certificate | None = None
        # A join-ALPN connection: its bytes go to this exchange, never to the frame parser.
        # (Delegated here rather than by transport.set_protocol, which uvloop's SSL transport
        # does not carry over from a BufferedProtocol to a plain one.)
        self._join: JoinExchange | None = None
        self._join_buffer: bytearray | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._listener.join is not None and _alpn(transport) == JOIN_ALPN:
            self.closed = True  # not a tunnel session: never processes a frame
            self._join_buffer = bytearray(4096)
            self._join = self._listener.start_join(cast(asyncio.Transport, transport),
                                                   self.peer)
            return
        try:
            self.cluster, self.certificate_not_after = self._identify(transport)
        except AgentIdentityError as exc:
            self._listener.refused += 1
            self.closed = True  # never processes a frame
            if exc.about_protocol:
                self._listener.failed(self.peer, HandshakeFailure(PROTOCOL, str(exc)))
                cast(asyncio.Transport, transport).abort()
                return
            self._listener.failed(self.peer, exc.failure if isinstance(
                exc, _Refused) else wrong_name(str(exc)))
            # Tell the agent why: one GOAWAY instead of its SETTINGS, then close.
            # (cast: uvloop's SSL transport is not an asyncio.Transport subclass)
            tls = cast(asyncio.Transport, transport)
            tls.write(frames.encode_goaway(0, GoAwayCode.UNAUTHORIZED, str(exc)))
            tls.close()
            asyncio.get_running_loop().call_later(2.0, tls.abort)  # a peer not reading
            return
        self.name = f"agent:{self.cluster}"
        super().connection_made(transport)
        self._listener.adopt(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._join_buffer is not None:
            return memoryview(self._join_buffer)
        return super().get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self._join is not None and self._join_buffer is not None:
            self._join.data_received(bytes(self._join_buffer[:nbytes]))
            return
        if self.cluster is None:  # refused in connection_made; the transport is aborting
            return
        super().buffer_updated(nbytes)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._join is not None:
            self._join.connection_lost(exc)
            return
        super().connection_lost(exc)

    def _identify(self, transport: asyncio.BaseTransport) -> tuple[str, float]:
        """(cluster, certificate expiry as POSIX time), or AgentIdentityError."""
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None:
            raise AgentIdentityError("not a TLS connection", about_protocol=True)
        if ssl_object.version() != "TLSv1.3":
            raise AgentIdentityError(f"TLS 1.3 required, got {ssl_object.version()}",
                                     about_protocol=True)
        if ssl_object.selected_alpn_protocol() != ALPN:
            raise AgentIdentityError(f"ALPN {ALPN!r} required", about_protocol=True)
        der = ssl_object.getpeercert(binary_form=True)
        if not der:  # only possible with CERT_OPTIONAL, i.e. when joining is enabled
            raise _Refused(HandshakeFailure(NO_CERTIFICATE, "the peer sent no client certificate"))
        cluster = cluster_from_certificate(der, self._listener.naming)
        # Kept for the session's life (revocation asks about it): a fresh copy, without the
        # ~2.4 KB of parsed extensions the name check cached on its own.
        self.certificate = x509.load_der_x509_certificate(der)
        refuse = self._listener.refuse
        why = refuse(cluster, self.certificate) if refuse is not None else None
        if why is not None:
            raise _Refused(HandshakeFailure(REVOKED, f"cluster {cluster}: {why}"))
        return cluster, self.certificate.not_valid_after_utc.timestamp()


@mypyc_attr(native_class=False)
class _Refused(AgentIdentityError):
    """A verified certificate the hub still refuses (none sent, or its cluster removed)."""

    def __init__(self, failure: HandshakeFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


RefuseHook = Callable[[str, x509.Certificate], str | None]


class TunnelListener:
    def __init__(self, registry: SessionRegistry, config: SessionConfig,
                 naming: AgentNaming = URI_NAMING,
                 ssl_context: ssl.SSLContext | None = None,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 log_interval: float = REFUSAL_LOG_INTERVAL,
                 join: JoinHandler | None = None, refuse: RefuseHook | None = None,
                 max_handshakes: int = DEFAULT_MAX_HANDSHAKES,
                 stale_after: float = STALE_AFTER) -> None:
        self.registry = registry
        self.join = join
        self.refuse = refuse
        self.joins: set[JoinExchange] = set()
        self.config = config
        self.naming = naming
        self.ssl_context = ssl_context
        self.handshake_timeout = handshake_timeout
        self.sockets: list[socket.socket] = []
        self.sessions: set[AgentSession] = set()
        self.refused = 0
        self.handshake_failures: Counter[str] = Counter()  # by tunnel.handshake reason
        # Refused before any TLS work (tunnel.admission), by reason; handshakes begun.
        self.refused_early: Counter[str] = Counter(dict.fromkeys(EARLY_REASONS, 0))
        self.handshakes_started = 0
        self.slots = HandshakeSlots(max_handshakes)
        self.stale_after = stale_after
        self.slot_hold = SLOT_HOLD
        self._throttle = LogThrottle(log_interval)
        self._accepting: list[asyncio.Task[None]] = []
        self._handshakes: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self.sockets
        return int(self.sockets[0].getsockname()[1])

    def listen(self, socks: list[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        self.sockets = socks
        self._accepting = [loop.create_task(self._accept_forever(s)) for s in socks]

    async def _accept_forever(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        slots = self.slots
        while True:
            # All handshakes busy: accept nothing, the rest wait in the listen queue for free.
            await slots.wait()
            try:
                conn, address = await loop.sock_accept(sock)
            except OSError as exc:  # out of file descriptors, aborted connection...
                log.warning("tunnel listener: accept failed: %s", exc.strerror or exc)
                await asyncio.sleep(ACCEPT_ERROR_PAUSE)
                continue
            raw = tcp_info(conn)
            verdict = classify_waiting(parse_tcp_info(raw), self.stale_after) if raw else None
            if verdict is not None:
                self._refuse_early(conn, verdict)
                continue
            slots.take()
            self.handshakes_started += 1
            task = loop.create_task(self._handshake(conn, _peer(address)))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    def _refuse_early(self, conn: socket.socket, reason: str) -> None:
        """No handshake for this one: tell a waiting agent the hub is busy, then close."""
        self.refused_early[reason] += 1
        if reason != GONE:
            with contextlib.suppress(OSError):
                conn.setblocking(False)
                # Read the ClientHello first, so that closing sends FIN (not a reset that
                # could discard the alert before the agent reads it).
                with contextlib.suppress(BlockingIOError):
                    conn.recv(65536)
                conn.send(BUSY_ALERT)
        conn.close()

    async def _handshake(self, conn: socket.socket, peer: tuple[str, int] | None) -> None:
        loop = asyncio.get_running_loop()
        # The slot goes back when the handshake ends, or after slot_hold if it has not by then
        # (a peer that never finishes must not hold admission for everyone).
        holding = True

        def give_back() -> None:
            nonlocal holding
            if holding:
                holding = False
                self.slots.give_back()

        hold = loop.call_later(self.slot_hold, give_back)
        # A failed handshake's alert goes out on this socket (tunnel.listener._Alert).
        _pending_alert.set(_Alert(conn))  # this task's context only
        try:
            await loop.connect_accepted_socket(
                lambda: AgentSession(self, peer), conn, ssl=self.ssl_context,
                ssl_handshake_timeout=self.handshake_timeout)
        except Exception as exc:  # every handshake failure: classify, count, maybe log
            conn.close()
            self.failed(peer, classify_hub_failure(exc))
        finally:
            hold.cancel()
            give_back()

    def admission(self) -> dict[str, int]:
        """The listener's admission figures now (gateway metrics): handshakes in flight and
        begun, connections waiting in the listen queues, and the early refusals by reason."""
        waiting = 0
        for sock in self.sockets:
            raw = tcp_info(sock)  # (None once the socket is closed)
            if raw is not None:
                waiting += parse_listen_queue(raw)[0]
        return {"handshakes_in_flight": self.slots.in_flight,
                "handshakes_started": self.handshakes_started, "accept_queue": waiting,
                **{f"refused_{reason}": count for reason, count in self.refused_early.items()}}

    def failed(self, peer: tuple[str, int] | None, failure: HandshakeFailure) -> None:
        """Count one refused connection; log certificate trouble (throttled), the rest at DEBUG."""
        self.handshake_failures[failure.reason] += 1
        where = f"{peer[0]}:{peer[1]}" if peer else "an unknown address"
        if not failure.about_certificate:
            log.debug("tunnel handshake from %s failed (%s): %s", where, failure.reason,
                      failure.message)
            return
        allowed, suppressed = self._throttle.allow((failure.reason, peer[0] if peer else None))
        if allowed:
            log.warning("agent connection from %s refused (%s): %s%s", where, failure.reason,
                        failure.message,
                        f" [and {suppressed} more from this host since the last such line]"
                        if suppressed else "")

    def start_join(self, transport: asyncio.Transport,
                   peer: tuple[str, int] | None) -> JoinExchange:
        """A :class:`JoinExchange` for a join-ALPN connection (one request, then close)."""
        assert self.join is not None
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        exchange = JoinExchange(self.join, der or None, peer,
                                on_done=lambda: self.joins.discard(exchange))
        self.joins.add(exchange)
        exchange.connection_made(transport)
        return exchange

    def close_where(self, refuse: RefuseHook) -> int:
        """Close every session ``refuse`` now has a reason against; how many were closed."""
        closed = 0
        for session in list(self.sessions):
            if session.cluster is None or session.certificate is None or session.closed:
                continue
            why = refuse(session.cluster, session.certificate)
            if why is not None:
                log.warning("closing the session of cluster %s from %s: %s", session.cluster,
                            f"{session.peer[0]}:{session.peer[1]}" if session.peer else "?", why)
                session.close(why)
                closed += 1
        return closed

    def _stop_accepting(self) -> None:
        for task in [*self._accepting, *self._handshakes]:
            task.cancel()
        for sock in self.sockets:
            sock.close()

    def adopt(self, session: AgentSession) -> None:
        cluster = session.cluster
        assert cluster is not None
        self.sessions.add(session)
        self.registry.add(cluster, session)

        def gone(closed: TunnelSession) -> None:
            self.sessions.discard(session)
            self.registry.remove(cluster, session)

        session.on_closed.append(gone)

    def announce_hub_peers(self, peers: tuple[int, ...]) -> None:
        """The live hub instances changed: new sessions announce ``peers`` in their first
        SETTINGS, established ones get a SETTINGS with them now (PROTOCOL.md §5, HUB_PEER)."""
        self.config.hub_peers = peers
        self.config.hub_instances = max(1, min(len(peers), frames.MAX_HUB_INSTANCES))
        for session in list(self.sessions):
            session.announce_hub_peers(peers)

    def close(self) -> None:
        """Stop accepting and abort every session (their streams see SessionClosed)."""
        self._stop_accepting()
        for session in list(self.sessions):
            session.close("hub closing")
        for exchange in list(self.joins):
            if exchange.transport is not None:
                exchange.transport.abort()

    async def wait_closed(self) -> None:
        for session in list(self.sessions):
            with contextlib.suppress(Exception):
                await session.wait_closed()
        for task in self._accepting:
            with contextlib.suppress(BaseException):
                await task

    async def drain(self, deadline: float) -> None:
        """Graceful hub shutdown: GOAWAY to every agent, in-flight streams finish (<= deadline)."""
        self._stop_accepting()
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
    join: JoinHandler | None = None,
    refuse: RefuseHook | None = None,
    max_handshakes: int = DEFAULT_MAX_HANDSHAKES,
    backlog: int = DEFAULT_BACKLOG,
) -> TunnelListener:
    # Fail closed: without joining, the TLS layer itself requires the certificate; with it,
    # the context must at least ask for one, and AgentSession requires it on the tunnel ALPN.
    wanted = ssl.CERT_OPTIONAL if join is not None else ssl.CERT_REQUIRED
    if ssl_context.verify_mode != wanted:
        raise ValueError("the tunnel listener needs an SSL context that requires client certs"
                         if join is None else
                         "a tunnel listener that serves joins needs a CERT_OPTIONAL context")
    # The listener keeps failed handshakes' alerts (see the module docstring); this context is
    # the listener's own (the gateway builds one for it).
    ssl_context.sslobject_class = _AlertKeepingSSLObject
    ssl_context.num_tickets = 0  # no resumption (see the module docstring)
    cap = somaxconn()
    if cap is not None and cap < backlog:
        log.warning("tunnel listener: a backlog of %d was asked for, but the kernel caps it at "
                    "net.core.somaxconn = %d; raise that sysctl for the queue to hold %d",
                    backlog, cap, backlog)
    listener = TunnelListener(registry, config or SessionConfig(ping_after=HUB_PING_AFTER),
                              naming, ssl_context,
                              handshake_timeout, join=join, refuse=refuse,
                              max_handshakes=max_handshakes)
    listener.listen(_listening_sockets(host, port, reuse_port=reuse_port, backlog=backlog))
    return listener


def _listening_sockets(host: str, port: int, *, reuse_port: bool,
                       backlog: int = DEFAULT_BACKLOG) -> list[socket.socket]:
    """What ``loop.create_server`` binds: one non-blocking socket per address of ``host``.

    With port 0, every address gets the port the first one was given (asyncio would give each
    its own), so an agent reaches the listener on whichever address it resolves.
    """
    infos = dict.fromkeys(
        (family, kind, proto, address) for family, kind, proto, _, address in
        socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                           flags=socket.AI_PASSIVE))
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, address in infos:
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:  # several hub processes on one port (gateway workers)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if socks[1:] and address[1] == 0:  # port 0: the same port on every address
                address = (address[0], socks[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


class _Alert:
    """The connection a listener task is handshaking: a failed handshake's TLS alert is sent
    on it at once (the event loop's SSL layer would drop it and close the descriptor)."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.sock.send(data)  # a few dozen bytes: they fit the socket buffer


_pending_alert: contextvars.ContextVar[_Alert | None] = contextvars.ContextVar(
    "hubproxy_tunnel_pending_alert", default=None)


class _AlertKeepingSSLObject(ssl.SSLObject):
    """An ``SSLObject`` that, when the server handshake fails, sends the alert OpenSSL wrote.

    The SSL layer wraps the socket in the context of the listener task that awaits the
    handshake, so ``_pending_alert`` there names the connection (outside a listener task it is
    None and this behaves exactly like ``ssl.SSLObject``). The alert is written to the socket
    at once, while the descriptor is still open (no spare descriptor per handshake).
    """

    _alert: _Alert | None = None
    _outgoing: ssl.MemoryBIO | None = None

    @classmethod
    def _create(cls, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, *args: Any,
                **kwargs: Any) -> _AlertKeepingSSLObject:
        obj = super()._create(incoming, outgoing, *args, **kwargs)  # type: ignore[misc]
        obj._alert = _pending_alert.get()
        obj._outgoing = outgoing
        return obj  # type: ignore[no-any-return]

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError:
            if self._alert is not None and self._outgoing is not None:
                self._alert.send(self._outgoing.read())
            raise
        self._alert = self._outgoing = None  # done: hold nothing for the session's life


def _alpn(transport: asyncio.BaseTransport) -> str | None:
    ssl_object = transport.get_extra_info("ssl_object")
    return ssl_object.selected_alpn_protocol() if ssl_object is not None else None


def _peer(address: object) -> tuple[str, int] | None:
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return None
