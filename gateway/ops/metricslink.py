"""Worker metrics to worker 0: one AF_UNIX datagram socket pair, made before the fork.

With ``--workers N`` only worker 0 serves ``/metrics``, but every worker counts its own
requests. Each other worker sends worker 0 a JSON snapshot of its figures every second (one
datagram, so several senders never interleave); worker 0 keeps the latest per worker and adds
them to its own when scraped. A scrape is thus at most about a second behind for the others.
No files, no shared memory to lock; a snapshot that does not fit in one datagram is dropped
and said once in the log. Snapshots are zlib-compressed (level 1: about a millisecond a second
for a thousand clusters): with per-cluster histograms and the fleet's sessions, a thousand
clusters are ~600 KB of JSON, beyond a datagram (~200 KB), and ~50 KB compressed. A datagram
that starts with ``{`` is read as plain JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import zlib
from collections.abc import Callable
from typing import Any

log = logging.getLogger("hubproxy.gateway")

INTERVAL = 1.0


class MetricsLink:
    """Made by the parent before forking; each worker then takes the end it needs."""

    def __init__(self) -> None:
        self._receive, self._send = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)

    def receiver(self) -> PeerSnapshots:
        """Worker 0's end."""
        self._send.close()
        return PeerSnapshots(self._receive)

    def sender(self, worker_index: int) -> SnapshotSender:
        """Every other worker's end."""
        self._receive.close()
        return SnapshotSender(self._send, worker_index)

    def close(self) -> None:
        """The parent's copies, once every worker is forked."""
        self._receive.close()
        self._send.close()


class PeerSnapshots:
    """The latest snapshot of every other worker, read as datagrams arrive."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._latest: dict[int, dict[str, Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._read)

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.stop()
                return
            try:
                if data[:1] != b"{":
                    data = zlib.decompress(data)
                message = json.loads(data)
                self._latest[int(message["worker"])] = message["metrics"]
            except (ValueError, KeyError, TypeError, zlib.error):
                log.warning("metrics link: dropped a malformed snapshot")

    def snapshots(self) -> list[dict[str, Any]]:
        return list(self._latest.values())

    def by_worker(self) -> dict[int, dict[str, Any]]:
        """The latest snapshot of each other worker that has sent one, by worker index."""
        return dict(self._latest)

    def stop(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock.fileno())
            self._loop = None
        self._sock.close()


class SnapshotSender:
    """Sends this worker's snapshot every ``interval`` seconds, never blocking the loop."""

    def __init__(self, sock: socket.socket, worker_index: int) -> None:
        self._sock = sock
        self._worker = worker_index
        self._timer: asyncio.TimerHandle | None = None
        self._snapshot: Callable[[], dict[str, Any]] = dict
        self._interval = INTERVAL
        self._warned = False

    def start(self, snapshot: Callable[[], dict[str, Any]],
              interval: float = INTERVAL) -> None:
        self._sock.setblocking(False)
        self._snapshot = snapshot
        self._interval = interval
        self.send_now()

    def send_now(self) -> None:
        data = zlib.compress(json.dumps({"worker": self._worker, "metrics": self._snapshot()},
                                        separators=(",", ":")).encode(), 1)
        try:
            self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            pass  # worker 0 is behind: the next snapshot replaces this one anyway
        except OSError as exc:  # EMSGSIZE, or worker 0 gone (the parent stops us then)
            if not self._warned:
                self._warned = True
                log.warning("metrics link: worker %d cannot send its snapshot (%d bytes): %s",
                            self._worker, len(data), exc)
        self._timer = asyncio.get_running_loop().call_later(self._interval, self.send_now)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._sock.close()
