"""The front door's listener behind a load balancer that speaks the PROXY protocol (opt-in).

With ``--proxy-protocol-from CIDR...`` the front door accepts plain TCP itself, reads the
PROXY header (v1 or v2, :mod:`gateway.wire.proxyprotocol`) from connections that come from
those addresses, and only then starts TLS on the socket (``loop.connect_accepted_socket``),
with the header's source address as the connection's client. The header is read from the
socket without consuming a byte past it (peek, then take exactly the header), so the TLS
ClientHello behind it stays in the socket for the TLS layer.

Refused, before TLS (the connection is closed, and
``hubproxy_proxy_protocol_refused_total{reason}`` counts it):

* ``missing``, ``malformed``, ``oversized``: a connection from a trusted address that does not
  start with a valid header (a client that reached the gateway around the balancer from inside
  its network, or a balancer not told to send one);
* ``untrusted``: a connection from any other address that starts like a header: nobody but the
  named balancers may say where a connection comes from;
* ``timeout``: no complete header (or, from elsewhere, no first byte) within the header
  timeout; ``closed``: the peer closed first; ``busy``: ``max_pending`` connections are
  being read already.

Connections from other addresses that start with TLS are served as without this option, with
their own address as the client. While headers are being read at most ``max_pending``
connections wait (the front door's connection limit); more are closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable

from gateway.hub.admission.forwarded import Network, trusts
from gateway.wire.proxyprotocol import (
    MAX_HEADER_BYTES,
    REASONS,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyProtocolError,
    could_be_header,
    parse_header,
)

log = logging.getLogger("hubproxy.gateway")

UNTRUSTED = "untrusted"
TIMEOUT = "timeout"
CLOSED = "closed"
BUSY = "busy"
# Every reason a connection is refused before TLS (the metric's label values).
REFUSAL_REASONS = (*REASONS, UNTRUSTED, TIMEOUT, CLOSED, BUSY)


class PeerClosed(Exception):
    """The peer closed the connection before its first bytes were read."""


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    waiter = loop.create_future()
    fd = sock.fileno()

    def ready() -> None:
        if not waiter.done():
            waiter.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await waiter
    finally:
        loop.remove_reader(fd)


async def read_header(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> ProxyHeader:
    """Read exactly one PROXY header from a non-blocking socket; raises
    :class:`ProxyProtocolError` or :class:`PeerClosed`. Bytes of a header that arrives in
    pieces are consumed as they come (they all belong to it); the last piece is peeked first
    and only the header's bytes taken."""
    taken = b""
    while True:
        await _readable(loop, sock)
        try:
            peeked = sock.recv(MAX_HEADER_BYTES - len(taken), socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            continue
        if not peeked:
            raise PeerClosed
        header = parse_header(taken + peeked)
        if header is None:
            taken += sock.recv(len(peeked))
            continue
        rest = header.length - len(taken)
        if len(sock.recv(rest)) != rest:  # peeked, so in the socket: cannot be short
            raise ProxyProtocolError("PROXY header shrank between peek and read")
        return header


async def refuse_header(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Wait for the first bytes of a connection that may not send a PROXY header; raise
    :class:`ProxyProtocolError` (``untrusted``) if they start like one. Nothing is consumed."""
    while True:
        await _readable(loop, sock)
        try:
            peeked = sock.recv(len(V2_SIGNATURE), socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            continue
        if not peeked:
            raise PeerClosed
        if could_be_header(peeked):
            raise ProxyProtocolError("a PROXY protocol header from an address not in "
                                     "--proxy-protocol-from", UNTRUSTED)
        return


def _client(header: ProxyHeader, peer: str) -> str:
    if header.source is None:
        return peer
    address = ipaddress.ip_address(header.source[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


class ProxyProtocolListener:
    """The front door's listening socket when ``--proxy-protocol-from`` is set: the
    ``close``/``wait_closed`` of an ``asyncio.Server`` and the bound ``port``."""

    def __init__(self, protocol_factory: Callable[[str], asyncio.Protocol], *,
                 trusted: tuple[Network, ...], ssl_context: ssl.SSLContext | None,
                 header_timeout: float, max_pending: int,
                 refused: Callable[[str], None] = lambda reason: None) -> None:
        self.protocol_factory = protocol_factory
        self.trusted = trusted
        self.ssl_context = ssl_context
        self.header_timeout = header_timeout
        self.max_pending = max_pending
        self.refused = refused
        self.port = 0
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, *, reuse_port: bool = False,
                    backlog: int = 1024) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._accepting = asyncio.ensure_future(self._accept(sock))

    @property
    def sockets(self) -> list[socket.socket]:
        return [self._sock] if self._sock is not None else []

    async def _accept(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    conn, address = await loop.sock_accept(listening)
                except OSError as exc:  # out of file descriptors, ...: do not spin
                    log.warning("front door cannot accept: %s", exc)
                    await asyncio.sleep(0.1)
                    continue
                if len(self._pending) >= self.max_pending:
                    self.refused(BUSY)
                    conn.close()
                    continue
                task = asyncio.ensure_future(self._admit(conn, str(address[0])))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
        finally:
            # Here, once the accept is no longer waiting on it (never under a waiting reader).
            listening.close()

    async def _admit(self, conn: socket.socket, peer: str) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        try:
            async with asyncio.timeout(self.header_timeout):
                if trusts(self.trusted, peer):
                    client = _client(await read_header(loop, conn), peer)
                else:
                    await refuse_header(loop, conn)
                    client = peer
        except ProxyProtocolError as exc:
            self._refuse(conn, peer, exc.reason, str(exc))
            return
        except TimeoutError:
            self._refuse(conn, peer, TIMEOUT, "no PROXY header in time")
            return
        except (PeerClosed, OSError):
            self._refuse(conn, peer, CLOSED, "closed before its first bytes")
            return
        except asyncio.CancelledError:
            conn.close()
            raise
        try:
            if self.ssl_context is None:
                await loop.connect_accepted_socket(lambda: self.protocol_factory(client), conn)
            else:
                await loop.connect_accepted_socket(
                    lambda: self.protocol_factory(client), conn, ssl=self.ssl_context,
                    ssl_handshake_timeout=self.header_timeout)
        except asyncio.CancelledError:
            conn.close()
            raise
        except Exception as exc:  # a failed TLS handshake: as create_server, just close
            log.debug("front door: TLS with %s failed: %s", client, type(exc).__name__)
            conn.close()

    def _refuse(self, conn: socket.socket, peer: str, reason: str, why: str) -> None:
        log.info("front door: connection from %s refused: %s", peer, why)
        self.refused(reason)
        conn.close()

    def close(self) -> None:
        """Stop accepting; connections still reading their header are closed."""
        if self._accepting is not None:
            self._accepting.cancel()
        elif self._sock is not None:
            self._sock.close()
        for task in list(self._pending):
            task.cancel()

    async def wait_closed(self) -> None:
        tasks = [t for t in (self._accepting, *self._pending) if t is not None]
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
