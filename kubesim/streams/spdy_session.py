"""A SPDY/3.1 server session over any byte pipe, for kubelet-style streaming.

The peer (client-go through moby/spdystream) opens every stream itself with SYN_STREAM; we
answer each with SYN_REPLY, echo its PINGs, and ignore flow control: spdystream never enforces
windows and never sends WINDOW_UPDATE expecting an answer. Bytes come in through `feed()` (the
caller reads the transport) and go out through the `send` callable given at construction, so the
same session runs over a raw upgraded TLS connection and over WebSocket binary messages.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from kubesim.streams import spdy

log = logging.getLogger(__name__)

MAX_DATA_FRAME = 32 * 1024


class SpdyStream:
    """One stream opened by the peer. `read()` returns b"" once the peer finished sending."""

    def __init__(self, session: SpdySession, frame: spdy.SynStream) -> None:
        self.session = session
        self.stream_id = frame.stream_id
        self.headers = frame.headers
        self._chunks: deque[bytes] = deque()
        self._readable = asyncio.Event()
        self.remote_done = frame.fin
        self.local_done = False
        self.reset = False
        if frame.fin:
            self._readable.set()

    def header(self, name: str) -> str | None:
        return spdy.header_value(self.headers, name)

    def _push(self, data: bytes, fin: bool) -> None:
        if self.remote_done:
            return  # data after FIN: ignore, as spdystream does
        if data:
            self._chunks.append(data)
        if fin:
            self.remote_done = True
            if self.local_done:
                self.session._forget(self)
        self._readable.set()

    def _abort(self) -> None:
        self.remote_done = self.local_done = True
        self._readable.set()

    async def read(self) -> bytes:
        while not self._chunks:
            if self.remote_done:
                return b""
            self._readable.clear()
            await self._readable.wait()
        return self._chunks.popleft()

    def reply(self) -> None:
        self.session.send_frame(spdy.SynReply(self.stream_id))

    def write(self, data: bytes) -> None:
        if self.local_done or not data:
            return
        for start in range(0, len(data), MAX_DATA_FRAME):
            self.session.send_frame(
                spdy.Data(self.stream_id, bytes(data[start : start + MAX_DATA_FRAME]))
            )

    def close(self) -> None:
        """Half-close our direction (empty DATA frame with FIN)."""
        if not self.local_done:
            self.local_done = True
            self.session.send_frame(spdy.Data(self.stream_id, b"", fin=True))
            if self.remote_done:
                self.session._forget(self)

    async def drain(self) -> None:
        await self.session.drain()


class SpdySession:
    """Server side of one SPDY connection. New streams are handed to `on_stream`."""

    def __init__(
        self,
        on_stream: Callable[[SpdyStream], None],
        send: Callable[[bytes], None] | None = None,
        drain: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._send = send
        self._drain = drain
        self._on_stream = on_stream
        self._decoder = spdy.FrameDecoder()
        self._encoder = spdy.FrameEncoder()
        self._streams: dict[int, SpdyStream] = {}
        self._last_stream_id = 0
        self.closed = asyncio.Event()
        self.went_away = False

    def bind(
        self, send: Callable[[bytes], None], drain: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Attach the output pipe once it exists (after the 101 went out)."""
        self._send = send
        self._drain = drain

    @property
    def open_streams(self) -> int:
        """Streams not yet finished in both directions (closed ones are forgotten)."""
        return len(self._streams)

    def _forget(self, stream: SpdyStream) -> None:
        # A long port-forward session opens two streams per connection: drop finished ones.
        self._streams.pop(stream.stream_id, None)

    # -- output ---------------------------------------------------------------------------------
    def send_frame(self, frame: spdy.Frame) -> None:
        if self.closed.is_set() or self._send is None:
            return
        self._send(self._encoder.encode(frame))

    async def drain(self) -> None:
        if self._drain is not None:
            await self._drain()

    def goaway(self, status: int = 0) -> None:
        self.send_frame(spdy.GoAway(self._last_stream_id, status))

    # -- input ----------------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self.closed.is_set():
            return
        try:
            frames = self._decoder.feed(data)
        except spdy.SpdyError as exc:
            log.info("SPDY peer broke framing: %s", exc)
            self.goaway(1)
            self.connection_lost()
            return
        for frame in frames:
            self._handle(frame)

    def connection_lost(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for stream in self._streams.values():
            stream._abort()

    def _handle(self, frame: spdy.Frame) -> None:
        match frame:
            case spdy.Data(stream_id, data, fin):
                stream = self._streams.get(stream_id)
                if stream is not None:
                    stream._push(data, fin)
            case spdy.SynStream():
                # Client streams are odd and strictly increasing (SPDY/3 section 2.3.2).
                if frame.stream_id % 2 == 0 or frame.stream_id <= self._last_stream_id:
                    self.send_frame(spdy.RstStream(frame.stream_id, spdy.RstStatus.PROTOCOL_ERROR))
                    return
                self._last_stream_id = frame.stream_id
                stream = SpdyStream(self, frame)
                self._streams[frame.stream_id] = stream
                self._on_stream(stream)
            case spdy.RstStream(stream_id, _):
                stream = self._streams.pop(stream_id, None)
                if stream is not None:
                    stream.reset = True
                    stream._abort()
            case spdy.Ping(ping_id):
                if ping_id % 2 == 1:  # theirs: echo; even ids would be answers to ours
                    self.send_frame(frame)
            case spdy.GoAway():
                self.went_away = True
            case _:
                pass  # SETTINGS, WINDOW_UPDATE, HEADERS, SYN_REPLY: nothing to do for us


async def stop_task(task: asyncio.Future[object]) -> None:
    """Cancel `task` and wait for it to finish, without swallowing a cancellation of our own
    (awaiting a cancelled task directly would raise CancelledError, indistinguishable from ours)."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        log.debug("task ended with %r", task.exception())


class OutboundQueue:
    """Serialises sends for pipes whose write is a coroutine (WebSocket): sync `put`, one task.

    `drain()` waits while more than `high_water` bytes are queued, so a producer that awaits it
    (an echo loop) cannot outrun a slow client without bound."""

    def __init__(
        self, write: Callable[[bytes], Awaitable[None]], high_water: int = 256 * 1024
    ) -> None:
        self._write = write
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._queued = 0
        self._high_water = high_water
        self._below_high_water = asyncio.Event()
        self._below_high_water.set()
        self._task = asyncio.ensure_future(self._run())

    def put(self, data: bytes) -> None:
        self._queued += len(data)
        if self._queued > self._high_water:
            self._below_high_water.clear()
        self._queue.put_nowait(data)

    async def drain(self) -> None:
        if not self._task.done():
            await self._below_high_water.wait()

    async def _run(self) -> None:
        try:
            while (data := await self._queue.get()) is not None:
                try:
                    await self._write(data)
                except (ConnectionError, RuntimeError) as exc:
                    log.debug("pipe closed while sending: %s", exc)
                    break
                self._queued -= len(data)
                if self._queued <= self._high_water:
                    self._below_high_water.set()
        finally:
            self._below_high_water.set()  # never leave a producer waiting on a dead pipe

    async def flush_and_stop(self, timeout: float = 5.0) -> None:
        self._queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            await stop_task(self._task)
