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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)


class PoolError(Exception):
    """The pool could not hand out a connection."""


class PoolExhausted(PoolError):
    pass


class UpstreamTimeout(PoolError):
    pass


class UpstreamUnreachable(PoolError):
    pass


@dataclass(frozen=True)
class UpstreamKey:
    host: str
    port: int
    server_hostname: str | None  # TLS name to verify; None for plain TCP
    tls: bool


class UpstreamUser(Protocol):
    """Whoever currently owns a connection (one exchange at a time).

    ``upstream_data`` gets a view of the pool's shared read buffer: valid only during the call
    (copy what must outlive it; the tunnel stream's ``write`` copies).
    """

    def upstream_data(self, data: memoryview) -> None: ...
    def upstream_eof(self) -> None: ...
    def upstream_lost(self, exc: Exception | None) -> None: ...
    def upstream_pause_writing(self) -> None: ...
    def upstream_resume_writing(self) -> None: ...


READ_BUFFER_SIZE = 256 * 1024


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


class UpstreamPool:
    def __init__(
        self,
        *,
        max_connections: int = 2048,
        max_idle_per_key: int = 32,
        idle_timeout: float = 30.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self.max_connections = max_connections
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
        return len(self._all) - sum(len(q) for q in self._idle.values())

    @property
    def idle(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def acquire_idle(self, key: UpstreamKey, user: UpstreamUser) -> UpstreamConnection | None:
        """An idle keep-alive connection for ``key`` now, or None (then :meth:`acquire`)."""
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
    ) -> UpstreamConnection:
        if not fresh:
            idle = self.acquire_idle(key, user)
            if idle is not None:
                return idle
        if len(self._all) + self._dialling >= self.max_connections:
            raise PoolExhausted(f"{self.max_connections} upstream connections in use")
        self._dialling += 1
        try:
            conn = await self._dial(key, ssl_context)
        finally:
            self._dialling -= 1
        conn.user = user
        return conn

    async def _dial(
        self, key: UpstreamKey, ssl_context: ssl.SSLContext | None
    ) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        conn = UpstreamConnection(self, key)
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
        self.dials += 1
        self._all.add(conn)
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        """Hand back a connection whose last exchange ended cleanly with keep-alive."""
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

    def discard(self, conn: UpstreamConnection) -> None:
        conn.close()
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
        if remaining:
            self._schedule_reaper()

    def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
