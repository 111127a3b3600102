"""Keep-alive connections from the agent to its upstreams (kube-apiserver, allow-listed Services).

One TLS handshake per connection, not per request: a finished exchange whose request and
response were both complete and keep-alive hands its connection back with :meth:`release`;
anything else (upgrade, close-delimited response, truncated message, reset stream) closes it.

Contracts:

* :meth:`UpstreamPool.acquire` returns an idle connection for the same key if one is still
  open, else dials a new one within ``connect_timeout``. It raises :class:`PoolExhausted` when
  ``max_connections`` (in use + idle + dialling) are taken, :class:`UpstreamTimeout` when the dial
  or handshake is too slow, :class:`UpstreamUnreachable` for any other dial or TLS failure.
* Idle connections are bounded per key and closed after ``idle_timeout`` (shorter than the
  apiserver's own idle timeout, so we seldom pick one the server is closing).
* Events of a connection (bytes, EOF, loss, write back-pressure) go to its current
  :class:`UpstreamUser`; an idle connection that receives bytes is broken and closed.
* HTTP/2 (``protocol="auto"`` or ``"h2"``, with a TLS context offering ``h2``): the exchange
  gets a stream of a shared :class:`gateway.agent.h2pool.H2Upstream` instead of a connection
  of its own. Streams are packed onto the first connection with room (at most
  ``h2_max_streams`` and the server's ``SETTINGS_MAX_CONCURRENT_STREAMS``); another connection
  is dialled when all are full, one dial at a time per key (concurrent requests wait for it).
  A key whose server chose ``http/1.1`` is remembered and served over HTTP/1.1 from then on
  (``auto``), or refused as unreachable (``h2``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import Counter, deque
from typing import NamedTuple, Protocol

from mypy_extensions import mypyc_attr

from gateway.agent.config import AgentConfig
from gateway.agent.h2pool import READ_BUFFER_SIZE, WINDOW_BUDGET, H2Stream, H2Upstream
from gateway.agent.h2pool import UpstreamUser as H2StreamUser
from gateway.wire.h2client import WindowBudget
from gateway.wire.http1 import RequestHead, serialize_request_head

log = logging.getLogger(__name__)


@mypyc_attr(native_class=False)
class PoolError(Exception):
    """The pool could not hand out a connection."""


@mypyc_attr(native_class=False)
class PoolExhausted(PoolError):
    pass


@mypyc_attr(native_class=False)
class UpstreamTimeout(PoolError):
    pass


@mypyc_attr(native_class=False)
class UpstreamUnreachable(PoolError):
    pass


class UpstreamKey(NamedTuple):
    """Which upstream: connections are pooled per key. A named tuple, not a frozen dataclass:
    one is made per request and looked up in the pool's dicts twice, and a tuple's
    constructor and hash are C (a frozen dataclass's are Python, ~2 µs a request)."""

    host: str
    port: int
    server_hostname: str | None  # TLS name to verify; None for plain TCP
    tls: bool


class UpstreamUser(H2StreamUser, Protocol):
    """Whoever currently owns a connection (one exchange at a time), or an HTTP/2 stream (what
    a stream calls: :class:`gateway.agent.h2pool.UpstreamUser`).

    ``upstream_data`` gets a view of the pool's shared read buffer: valid only during the call
    (copy what must outlive it; the tunnel stream's ``write`` copies).
    """

    def upstream_data(self, data: memoryview) -> None: ...
    def upstream_eof(self) -> None: ...


class UpstreamConnection(asyncio.BufferedProtocol):
    """One connection to an upstream.

    A buffered protocol reading into the pool's one shared buffer: TLS records are decrypted
    straight into it and handed on as a view, instead of a new 256 KiB bytes object per record
    that is then joined into another (uvloop's path for plain protocols). Sharing is safe because
    every read is delivered synchronously before the next one starts, and it keeps an idle
    connection from owning a read buffer of its own.
    """

    def __init__(self, pool: UpstreamPool, key: UpstreamKey) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.user: UpstreamUser | None = None
        self.lost = False
        self.requests = 0  # exchanges served so far (a reused connection may be stale)
        self.idle_since = 0.0
        self._reading_paused = False

    # --- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses; no isinstance check)
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.pool.read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self.user is not None:
            with self.pool.read_buffer()[:nbytes] as data:
                self.user.upstream_data(data)
        else:
            # An idle HTTP/1.1 connection must stay silent; bytes here mean it is out of sync.
            self.close()

    def eof_received(self) -> bool | None:
        if self.user is not None:
            self.user.upstream_eof()
        return False  # close our side too (TLS cannot half-close anyway)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool._forget(self)
        user, self.user = self.user, None
        if user is not None:
            user.upstream_lost(exc)

    def pause_writing(self) -> None:
        if self.user is not None:
            self.user.upstream_pause_writing()

    def resume_writing(self) -> None:
        if self.user is not None:
            self.user.upstream_resume_writing()

    # --- used by the exchange ---------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def send_head(self, head: RequestHead) -> None:
        """The request head, checked (``gateway.agent.exchange.rewrite_request``), serialised
        here: an HTTP/2 stream sends its fields and never needs these bytes."""
        self.write(serialize_request_head(head.method, head.target, head.headers, head.version))

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.usable:
            assert self.transport is not None
            self.transport.write(data)

    def write_eof(self) -> None:
        """Half-close if the transport can (plain TCP); TLS in asyncio cannot, so it is a no-op."""
        if self.usable:
            assert self.transport is not None
            if self.transport.can_write_eof():
                self.transport.write_eof()

    def pause_reading(self) -> None:
        if self.usable and not self._reading_paused:
            assert self.transport is not None
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.usable and self._reading_paused:
            assert self.transport is not None
            self._reading_paused = False
            self.transport.resume_reading()

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.usable and self.transport else 0

    def close(self) -> None:
        """Abort: used to cancel an in-flight request (watch, logs -f) or drop a broken one."""
        self.user = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


Upstream = UpstreamConnection | H2Stream  # what an exchange holds: a connection or a stream
PROTOCOLS = ("auto", "h1", "h2")
H2_MAX_STREAMS = AgentConfig.apiserver_h2_streams  # the flag's default


class UpstreamPool:
    def __init__(
        self,
        *,
        max_connections: int = AgentConfig.max_upstream_connections,
        max_idle_per_key: int = 32,
        idle_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        h2_max_streams: int = H2_MAX_STREAMS,
    ) -> None:
        self.max_connections = max_connections
        self.h2_max_streams = h2_max_streams
        self._h2: dict[UpstreamKey, list[H2Upstream]] = {}
        self._h2_dials: dict[UpstreamKey, asyncio.Future[None]] = {}
        self._h1_only: set[UpstreamKey] = set()  # servers that chose http/1.1
        # What the HTTP/2 connections' grown stream windows may hold, all together.
        self.h2_window_budget = WindowBudget(WINDOW_BUDGET)
        self.protocol_dials: Counter[str] = Counter()  # new connections by protocol
        self.max_idle_per_key = max_idle_per_key
        self.idle_timeout = idle_timeout
        self.connect_timeout = connect_timeout
        self._idle: dict[UpstreamKey, deque[UpstreamConnection]] = {}
        self._all: set[UpstreamConnection] = set()
        self._dialling = 0
        self._reaper: asyncio.TimerHandle | None = None
        self._read_view: memoryview | None = None
        self.dials = 0  # new connections made (observability, tests: reuse means few dials)

    def read_buffer(self) -> memoryview:
        """The buffer every connection of this pool reads into (see UpstreamConnection)."""
        if self._read_view is None:
            self._read_view = memoryview(bytearray(READ_BUFFER_SIZE))
        return self._read_view

    @property
    def in_use(self) -> int:
        h2_busy = sum(1 for c in self.h2_connections() if c.handles)
        return len(self._all) - sum(len(q) for q in self._idle.values()) + h2_busy

    @property
    def idle(self) -> int:
        h2_idle = sum(1 for c in self.h2_connections() if not c.handles)
        return sum(len(q) for q in self._idle.values()) + h2_idle

    def h2_connections(self) -> list[H2Upstream]:
        return [c for conns in self._h2.values() for c in conns]

    def _connections(self) -> int:
        return len(self._all) + sum(len(conns) for conns in self._h2.values())

    def acquire_idle(self, key: UpstreamKey, user: UpstreamUser,
                     protocol: str = "h1") -> Upstream | None:
        """An idle keep-alive connection (or a free HTTP/2 stream) for ``key`` now, or None
        (then :meth:`acquire`)."""
        if protocol != "h1" and key not in self._h1_only:
            return self._h2_stream(key, user)
        queue = self._idle.get(key)
        while queue:
            conn = queue.pop()  # most recently used first: least likely to be timed out
            if conn.usable:
                conn.user = user
                conn.resume_reading()
                return conn
            self._all.discard(conn)
        return None

    async def acquire(
        self,
        key: UpstreamKey,
        ssl_context: ssl.SSLContext | None,
        user: UpstreamUser,
        *,
        fresh: bool = False,
        protocol: str = "h1",
        h2_context: ssl.SSLContext | None = None,
    ) -> Upstream:
        """A connection (or, over HTTP/2, a stream) for ``user``.

        ``protocol`` ``auto``/``h2`` with ``h2_context`` (a TLS context offering ``h2``) asks
        for HTTP/2; ``fresh`` skips idle HTTP/1.1 connections (a retry after a stale one).
        """
        if protocol != "h1" and h2_context is not None and key not in self._h1_only:
            stream = await self._acquire_h2(key, h2_context, user, required=protocol == "h2")
            if stream is not None:
                return stream
        if not fresh:
            idle = self.acquire_idle(key, user)
            if idle is not None:
                return idle
        if self._connections() + self._dialling >= self.max_connections:
            raise PoolExhausted(f"{self.max_connections} upstream connections in use")
        self._dialling += 1
        try:
            conn = await self._dial(key, ssl_context)
        finally:
            self._dialling -= 1
        conn.user = user
        return conn

    def _h2_stream(self, key: UpstreamKey, user: UpstreamUser) -> H2Stream | None:
        for conn in self._h2.get(key, ()):
            if conn.has_room:
                return conn.open_stream(user)
        return None

    async def _acquire_h2(self, key: UpstreamKey, context: ssl.SSLContext, user: UpstreamUser,
                          *, required: bool) -> H2Stream | None:
        """A stream on an HTTP/2 connection, or None when the server speaks only HTTP/1.1."""
        while True:
            stream = self._h2_stream(key, user)
            if stream is not None:
                return stream
            if key in self._h1_only:
                break
            pending = self._h2_dials.get(key)
            if pending is not None:  # one dial per key at a time: wait for it, then look again
                await asyncio.shield(pending)
                continue
            if self._connections() + self._dialling >= self.max_connections:
                raise PoolExhausted(f"{self.max_connections} upstream connections in use")
            done = asyncio.get_running_loop().create_future()
            self._h2_dials[key] = done
            self._dialling += 1
            try:
                conn = await self._dial_h2(key, context)
            finally:
                self._dialling -= 1
                del self._h2_dials[key]
                done.set_result(None)
            if conn is None:
                self._h1_only.add(key)
                log.info("%s:%d chose HTTP/1.1: its requests use HTTP/1.1 connections",
                         key.host, key.port)
                break
            self._h2.setdefault(key, []).append(conn)
        if required:
            raise UpstreamUnreachable(f"{key.host}:{key.port} does not speak HTTP/2 "
                                      "(--apiserver-protocol h2)")
        return None

    async def _dial_h2(self, key: UpstreamKey, context: ssl.SSLContext) -> H2Upstream | None:
        """A ready HTTP/2 connection (the server's SETTINGS arrived), or None if the server
        chose another protocol in ALPN (that connection is closed)."""
        conn = H2Upstream(self.h2_max_streams, self._h2_changed, self.h2_window_budget,
                          self.read_buffer)
        await self._connect(key, context, conn)
        if conn.alpn != "h2":
            conn.abort(None)
            return None
        try:
            async with asyncio.timeout(self.connect_timeout):
                await conn.ready
        except TimeoutError:
            conn.abort(None)
            raise UpstreamTimeout(f"no HTTP/2 SETTINGS from {key.host}:{key.port} within "
                                  f"{self.connect_timeout:g}s") from None
        except ConnectionError as exc:
            raise UpstreamUnreachable(f"{key.host}:{key.port}: {exc}") from None
        self.dials += 1
        if not self.protocol_dials["h2"]:
            log.info("%s:%d speaks HTTP/2: requests and watches share its connections "
                     "(up to %d streams each)", key.host, key.port, conn.stream_limit)
        self.protocol_dials["h2"] += 1
        return conn

    def _h2_changed(self, conn: H2Upstream) -> None:
        """An HTTP/2 connection became idle (reap it later) or was lost/drained (forget it)."""
        if conn.lost or conn.draining:
            for key, conns in list(self._h2.items()):
                if conn in conns:
                    conns.remove(conn)
                    if not conns:
                        del self._h2[key]
            return
        if not conn.handles:
            self._schedule_reaper()

    async def _dial(
        self, key: UpstreamKey, ssl_context: ssl.SSLContext | None
    ) -> UpstreamConnection:
        conn = UpstreamConnection(self, key)
        await self._connect(key, ssl_context, conn)
        self.dials += 1
        self.protocol_dials["h1"] += 1
        self._all.add(conn)
        return conn

    async def _connect(self, key: UpstreamKey, ssl_context: ssl.SSLContext | None,
                       conn: asyncio.BaseProtocol) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                await loop.create_connection(
                    lambda: conn,
                    key.host,
                    key.port,
                    ssl=ssl_context if key.tls else None,
                    server_hostname=key.server_hostname if key.tls else None,
                    ssl_handshake_timeout=self.connect_timeout if key.tls else None,
                )
        except TimeoutError:
            raise UpstreamTimeout(
                f"connecting to {key.host}:{key.port} took over {self.connect_timeout:g}s"
            ) from None
        except ssl.SSLError as exc:
            raise UpstreamUnreachable(
                f"TLS with {key.host}:{key.port} failed: {exc.reason}"
            ) from None
        except OSError as exc:
            raise UpstreamUnreachable(
                f"cannot connect to {key.host}:{key.port}: {exc.strerror or exc}"
            ) from None

    def release(self, conn: Upstream) -> None:
        """Hand back a connection whose last exchange ended cleanly with keep-alive."""
        if isinstance(conn, H2Stream):
            conn.finish()
            return
        conn.user = None
        conn.requests += 1
        if not conn.usable:
            self._all.discard(conn)
            return
        queue = self._idle.setdefault(conn.key, deque())
        if len(queue) >= self.max_idle_per_key:
            conn.close()
            return
        conn.resume_reading()  # so a server-side close is noticed while idle
        conn.idle_since = time.monotonic()
        queue.append(conn)
        self._schedule_reaper()

    def discard(self, conn: Upstream) -> None:
        conn.close()
        if isinstance(conn, UpstreamConnection):
            self._forget(conn)

    def _forget(self, conn: UpstreamConnection) -> None:
        self._all.discard(conn)
        queue = self._idle.get(conn.key)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(conn)

    def _schedule_reaper(self) -> None:
        if self._reaper is None:
            loop = asyncio.get_running_loop()
            self._reaper = loop.call_later(max(1.0, self.idle_timeout / 2), self._reap)

    def _reap(self) -> None:
        self._reaper = None
        cutoff = time.monotonic() - self.idle_timeout
        remaining = 0
        for queue in self._idle.values():
            for conn in [c for c in queue if c.idle_since <= cutoff]:
                queue.remove(conn)
                self._all.discard(conn)
                conn.close()
            remaining += len(queue)
        for h2conn in self.h2_connections():
            if not h2conn.handles:
                if h2conn.idle_since <= cutoff:
                    h2conn.close()  # GOAWAY; forgotten when the connection is lost
                else:
                    remaining += 1
        if remaining:
            self._schedule_reaper()

    def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for conn in list(self._all):
            conn.close()
        for h2conn in self.h2_connections():
            h2conn.close()
        self._all.clear()
        self._idle.clear()
        self._h2.clear()
