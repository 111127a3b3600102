"""Which accepted agent connections the hub spends a TLS handshake on (issue 22).

When every agent dials at once (a gateway restart, a network heal), handshakes are the hub's
cost: a few milliseconds of CPU each, wasted on a connection whose agent gives up before it
completes. So the listener (:mod:`tunnel.listener`):

* runs at most ``max_handshakes`` at once (:class:`HandshakeSlots`); while they are all taken it
  accepts nothing, and further connections wait in the kernel's listen queue
  (``backlog``, capped by ``net.core.somaxconn``), where waiting costs the hub nothing;
* looks at each connection it accepts before any TLS work (:func:`classify_waiting`, from the
  kernel's ``TCP_INFO``): one whose agent already closed it is dropped (``gone``); one that
  has waited ``stale_after`` or longer (``tunnel.listener.STALE_AFTER``), so that its agent
  would likely give up before the handshake ends, is refused with a plaintext TLS alert
  ``user_canceled`` (:data:`BUSY_ALERT`, ``stale``): the agent reads it as "hub busy" and
  backs off with jitter (PROTOCOL.md section 1);
* a handshake that has held its slot for ``SLOT_HOLD`` without finishing (a slow or stalled
  peer) gives the slot back and goes on outside the bound until its own timeout, so peers
  that never finish cannot stall admission for everyone.

The pure parts (``TCP_INFO`` decoding, the verdict, the alert bytes) are byte-level testable;
:class:`HandshakeSlots` is the thin asyncio part.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import deque
from dataclasses import dataclass

# Reasons a connection was refused before any handshake (the hub's listener counters).
STALE = "stale"  # waited too long in the listen queue: the agent is about to give up
GONE = "gone"  # the agent had already closed (or reset) the connection
EARLY_REASONS = (STALE, GONE)

DEFAULT_MAX_HANDSHAKES = 64
DEFAULT_BACKLOG = 4096
SLOT_HOLD = 2.0  # seconds a handshake may hold a slot before it runs outside the bound

# A TLS record of type alert (21), legacy version TLS 1.2, 2 bytes: level fatal (2),
# description user_canceled (90): "canceling the handshake for some reason unrelated to a
# protocol failure" (RFC 8446 section 6.1). Sent in plaintext, before any handshake message.
BUSY_ALERT = bytes((21, 3, 3, 0, 2, 2, 90))

# struct tcp_info (linux/tcp.h): tcpi_state is the first byte; tcpi_last_data_recv the u32 at
# offset 52 (milliseconds since the connection last received data, or since it was
# established if it never did).
TCP_INFO_SIZE = 104
_STATE = struct.Struct("B")
_LAST_DATA_RECV = struct.Struct("=I")
_LAST_DATA_RECV_OFFSET = 52
TCP_ESTABLISHED = 1
# For a listening socket, tcpi_unacked is the accept queue's length now and tcpi_sacked its
# limit (the backlog after the somaxconn cap).
_QUEUE = struct.Struct("=II")
_QUEUE_OFFSET = 24


@dataclass(frozen=True)
class Waiting:
    """What the kernel says about an accepted connection that has not been handshaken."""

    state: int  # TCP state (1: established; 8: close-wait, the peer closed; 7: closed)
    waited: float  # seconds since it last received data (its ClientHello) or was established


def parse_tcp_info(raw: bytes) -> Waiting:
    """The fields of ``getsockopt(TCP_INFO)`` that :func:`classify_waiting` reads."""
    if len(raw) < _LAST_DATA_RECV_OFFSET + 4:
        raise ValueError(f"TCP_INFO of {len(raw)} bytes is too short")
    (state,) = _STATE.unpack_from(raw, 0)
    (last_recv_ms,) = _LAST_DATA_RECV.unpack_from(raw, _LAST_DATA_RECV_OFFSET)
    return Waiting(state, last_recv_ms / 1000)


def classify_waiting(waiting: Waiting, stale_after: float) -> str | None:
    """Why this connection gets no handshake (:data:`GONE`, :data:`STALE`), or None."""
    if waiting.state != TCP_ESTABLISHED:
        return GONE
    if waiting.waited >= stale_after:
        return STALE
    return None


def parse_listen_queue(raw: bytes) -> tuple[int, int]:
    """(connections waiting to be accepted, the queue's limit) from a listening socket's
    ``TCP_INFO``."""
    if len(raw) < _QUEUE_OFFSET + _QUEUE.size:
        raise ValueError(f"TCP_INFO of {len(raw)} bytes is too short")
    waiting, limit = _QUEUE.unpack_from(raw, _QUEUE_OFFSET)
    return int(waiting), int(limit)


def tcp_info(sock: socket.socket) -> bytes | None:
    """The socket's ``TCP_INFO`` (None where the platform has none)."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, option, TCP_INFO_SIZE)
    except OSError:
        return None


def somaxconn() -> int | None:
    """The kernel's cap on listen backlogs (None if it cannot be read)."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


class HandshakeSlots:
    """At most ``limit`` handshakes in flight; :meth:`wait` until one may start."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("at least one handshake must be allowed")
        self.limit = limit
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def full(self) -> bool:
        return self.in_flight >= self.limit

    async def wait(self) -> None:
        """Until a slot is free (it is not taken: call :meth:`take` when starting)."""
        while self.full:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def take(self) -> None:
        self.in_flight += 1

    def give_back(self) -> None:
        self.in_flight -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
