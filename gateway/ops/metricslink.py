"""Worker metrics to worker 0: one AF_UNIX datagram socket pair, made before the fork.

With ``--workers N`` only worker 0 serves ``/metrics`` and ``/clusters``, but every worker
counts its own requests and holds its own agent sessions. Each other worker keeps worker 0 up
to date with its *part* (``gateway.ops.metrics``: bounded scalars, and per-cluster sections:
requests by status class, detailed latency, and the fleet's sessions) by sending **what
changed**, every second:

* the scalars that differ from what it last sent;
* of the per-cluster values, those of clusters marked changed since (a request ended there, a
  session came or went), plus a rolling sweep that compares a slice of the clusters each
  second, so every value (an idle session's RTT and byte counts) is at most
  :data:`SWEEP_PERIOD` seconds old at worker 0.

At 10,000 clusters an idle worker thus sends a few hundred values a second instead of its whole
part (3.5 MB of JSON, which no longer fit a datagram); a busy one, the clusters it served.
Values go in datagrams of at most :data:`BATCH` values, zlib-compressed (level 1), with a turn
of the event loop between two; a removed value is sent as ``null``.

Datagrams on an AF_UNIX socket pair are never lost: one is delivered whole or ``send`` fails
(the receiver is behind: its clusters are sent again next second). Worker 0 applies each
datagram to its copy of that worker's part. A datagram that starts with ``{`` is read as plain
JSON; one that does not decode is dropped and said in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import socket
import zlib
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("hubproxy.gateway")

INTERVAL = 1.0
SWEEP_PERIOD = 30.0  # seconds within which every per-cluster value is compared again
BATCH = 256  # values per datagram, and per step between two turns of the event loop
SCALARS = "scalars"
_ABSENT = object()

Part = dict[str, Any]  # {"scalars": {...}, section: {cluster: value}}


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


def apply_changes(part: Part, changes: list[list[Any]]) -> None:
    """Apply one datagram's ``[section, key, value]`` triples to a worker's part."""
    for section, key, value in changes:
        values = part.setdefault(str(section), {})
        if value is None:
            values.pop(str(key), None)
        else:
            values[str(key)] = value


class PeerSnapshots:
    """Every other worker's part, kept current as datagrams arrive."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._parts: dict[int, Part] = {}
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
                worker, changes = int(message["worker"]), message["changes"]
                if not isinstance(changes, list):
                    raise TypeError("changes")
                apply_changes(self._parts.setdefault(worker, {SCALARS: {}}), changes)
            except (ValueError, KeyError, TypeError, zlib.error):
                log.warning("metrics link: dropped a malformed snapshot")

    def snapshots(self) -> list[Part]:
        """The other workers' parts (live: they change as datagrams arrive)."""
        return list(self._parts.values())

    def by_worker(self) -> dict[int, dict[str, Any]]:
        """The scalars of each other worker that has sent them, by worker index."""
        return {worker: part.get(SCALARS, {}) for worker, part in self._parts.items()}

    def stop(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock.fileno())
            self._loop = None
        self._sock.close()


class SnapshotSender:
    """Sends this worker's changes every ``interval`` seconds, never blocking the loop."""

    def __init__(self, sock: socket.socket, worker_index: int) -> None:
        self._sock = sock
        self._worker = worker_index
        self._task: asyncio.Task[None] | None = None
        self._part: Callable[[], Part] = dict
        self._changed: Callable[[], set[str]] = set
        self._interval = INTERVAL
        self._sent: dict[str, dict[str, Any]] = {}  # what worker 0 holds, as we sent it
        self._again: set[str] = set()  # clusters whose datagram could not be sent
        self._sweep: list[str] = []
        self._cursor = 0
        self._first = True
        self._warned = False
        self.datagrams = 0
        self.bytes_sent = 0

    def start(self, part: Callable[[], Part], changed: Callable[[], set[str]] = set,
              interval: float = INTERVAL) -> None:
        """``part()``: this worker's figures (see ``GatewayMetrics.part``); ``changed()``: the
        clusters whose values changed since it was last called."""
        self._sock.setblocking(False)
        self._part = part
        self._changed = changed
        self._interval = interval
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.send_changes()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the link take the worker down
                log.exception("metrics link: sending changes failed")
            await asyncio.sleep(self._interval)

    def _sweep_slice(self, sections: Mapping[str, Mapping[str, Any]]) -> list[str]:
        if self._cursor >= len(self._sweep):
            names: set[str] = set()
            for name, values in sections.items():
                names.update(values)
                names.update(self._sent.get(name, ()))
            self._sweep, self._cursor = sorted(names), 0
        size = math.ceil(len(self._sweep) * self._interval / SWEEP_PERIOD)
        taken = self._sweep[self._cursor:self._cursor + size]
        self._cursor += size
        return taken

    async def send_changes(self) -> int:
        """Send what changed; the number of values sent."""
        part = self._part()
        scalars = part.get(SCALARS) or {}
        sections = {name: values for name, values in part.items() if name != SCALARS}
        changes: list[list[Any]] = []
        sent_scalars = self._sent.setdefault(SCALARS, {})
        for key, value in scalars.items():
            if sent_scalars.get(key, _ABSENT) != value:
                changes.append([SCALARS, key, value])
        if self._first:
            keys: set[str] = set()
            for values in sections.values():
                keys.update(values)
            self._first = False
        else:
            keys = self._changed() | self._again | set(self._sweep_slice(sections))
        self._again = set()
        ordered = list(keys)
        count = 0
        for start in range(0, max(len(ordered), 1), BATCH):
            for key in ordered[start:start + BATCH]:
                for name, values in sections.items():
                    sent = self._sent.setdefault(name, {})
                    value = values.get(key)
                    before = sent.get(key, _ABSENT)
                    if value is None:
                        if before is not _ABSENT:
                            changes.append([name, key, None])
                    elif before != value:
                        changes.append([name, key, value])
            while len(changes) >= BATCH:
                count += self._send(changes[:BATCH])
                changes = changes[BATCH:]
            await asyncio.sleep(0)
        if changes:
            count += self._send(changes)
        return count

    def _send(self, changes: list[list[Any]]) -> int:
        data = zlib.compress(json.dumps({"worker": self._worker, "changes": changes},
                                        separators=(",", ":")).encode(), 1)
        try:
            self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            # Worker 0 is behind: these clusters go again with the next round.
            self._again.update(key for name, key, _ in changes if name != SCALARS)
            return 0
        except OSError as exc:  # EMSGSIZE (one huge value), or worker 0 gone
            if len(changes) > 1:
                half = len(changes) // 2
                return self._send(changes[:half]) + self._send(changes[half:])
            if not self._warned:
                self._warned = True
                log.warning("metrics link: worker %d cannot send a value (%d bytes): %s",
                            self._worker, len(data), exc)
            # Counted as sent, so it is not encoded again every second; it goes when it changes.
            name, key, value = changes[0]
            self._sent.setdefault(name, {})[key] = value
            return 0
        self.datagrams += 1
        self.bytes_sent += len(data)
        for name, key, value in changes:
            sent = self._sent.setdefault(name, {})
            if value is None:
                sent.pop(key, None)
            else:
                sent[key] = value
        return len(changes)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._sock.close()
