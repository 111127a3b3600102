"""HTTP/2 connections from the agent to its kube-apiserver, each carrying many exchanges.

A tunnel stream carries one HTTP/1.1 exchange; when the apiserver negotiated ``h2`` the
exchange rides as one stream of an :class:`H2Upstream` instead of holding a TLS connection of
its own (a watch then costs a few hundred bytes of state here, not a connection). The pool
(``gateway.agent.pool``) picks the connection; this module is the asyncio adapter around our
sans-IO client core (:class:`gateway.wire.h2client.ClientConnection`) and the pure translations
of ``gateway.wire.h2upstream``.

:class:`H2Stream` looks to :class:`gateway.agent.exchange.HttpExchange` like an
``UpstreamConnection``: the exchange gives it the request's header fields already encoded
(``send_request``: ``gateway.agent.exchange.rewrite_request_block``, one pass from the parsed
head) or the rewritten head (``send_head``), and then writes the body bytes as framed by the
client; the stream sends HEADERS and DATA. The response comes back to the
exchange as HTTP/1.1 bytes (a synthesised head, the body chunked when it has no length), so the
exchange's checks and its relay to the tunnel are the same for both protocols. The DATA of one
stream that one read brought (a hundred watch events, say) is one delivery: one chunk, one
write to the tunnel stream.

Contracts:

* A connection carries at most ``min(max_streams, the server's SETTINGS_MAX_CONCURRENT_STREAMS)``
  exchanges (the pool opens another connection when all are full). Streams are only handed out
  once the server's SETTINGS arrived.
* Flow control is per exchange: DATA is acknowledged (WINDOW_UPDATE) only while the exchange's
  tunnel stream takes bytes; while it is paused (a slow reader at the hub) the stream's window
  closes and the server stops sending on that stream only: it holds its window, no more. A
  stream's window is 64 KiB, grown (up to ``MAX_STREAM_WINDOW``, within ``WINDOW_BUDGET`` for
  the whole agent) only while the stream's reader keeps up with a transfer the window limits,
  shrunk back when it is taken slowly again. The connection window is large, so a paused
  stream never holds up the others. Request bodies are sent as the server's windows allow;
  until then the tunnel stream is paused.
* ``close()`` of a stream that has not ended sends RST_STREAM (CANCEL): the client went away,
  and the apiserver ends the watch or ``logs -f``.
* GOAWAY: no new streams on that connection; streams the server says it never processed
  (above ``last_stream_id``, or reset with REFUSED_STREAM) fail at once with
  :class:`StreamRefused` (the exchange sends a body-less request again on another connection,
  else answers 503 with Retry-After); the others finish, then the connection is closed.
* PINGs from the server are answered by the core; a connection error (the server broke a rule
  of RFC 9113, see ``gateway.wire.h2client``) closes the connection after its GOAWAY and fails
  every stream on it. A malformed response (a HEADERS block ``relayed_response`` refuses, or a
  stream rule the core enforces, e.g. DATA past the content-length) fails its stream only,
  with a 502 if nothing of the response was relayed yet.
* What the core queues is written once per event-loop turn (every ``MAX_BATCHED_HEADS`` new
  streams in a burst), not per frame; request fields are HPACK-encoded by
  :mod:`gateway.wire.hpackfields` (no dynamic table; credentials and ``impersonate-*`` never
  indexed; nothing of a client's fields retained after its request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from mypy_extensions import mypyc_attr

from gateway.wire.h2client import (
    ClientConnection,
    ConnectionTerminated,
    DataReceived,
    Event,
    NoNewStreams,
    ResponseReceived,
    ServerProtocolError,
    SettingsChanged,
    StreamClosedError,
    StreamReset,
    TrailersReceived,
    WindowBudget,
    WindowUpdated,
)
from gateway.wire.h2server import CANCEL, NO_ERROR, REFUSED_STREAM
from gateway.wire.h2upstream import RequestBody, relayed_response, request_body, request_fields
from gateway.wire.http1 import HTTPError, RequestHead, ResponseHead
from gateway.wire.http2 import LAST_CHUNK

log = logging.getLogger(__name__)


@mypyc_attr(native_class=False)
class StreamRefused(ConnectionResetError):
    """The server did not process the request (a stream above a GOAWAY's ``last_stream_id``,
    or reset with REFUSED_STREAM): sending it again is safe (RFC 9113 §8.7)."""


class UpstreamUser(Protocol):
    """The exchange a stream serves: what a stream calls (declared here because the pool
    imports this module, not the reverse). The response comes as its HTTP/1.1 head, bytes and
    parsed (``upstream_head``), the body framed for the tunnel (``upstream_body``: one call per
    read, whatever the number of DATA frames) and its last bytes with its end
    (``upstream_last``, one call: a small response is a head, then its whole body and end). The
    head's bytes may be empty: then they are the first bytes of the next ``upstream_body`` or
    ``upstream_last`` (a head and body that one read brought leave in one write)."""

    def upstream_head(self, head_bytes: bytes, response: ResponseHead) -> None: ...
    def upstream_body(self, data: bytes | memoryview) -> None: ...
    def upstream_last(self, data: bytes | memoryview) -> None: ...
    def upstream_lost(self, exc: Exception | None) -> None: ...
    def upstream_pause_writing(self) -> None: ...
    def upstream_resume_writing(self) -> None: ...

# The connection window only has to stop one paused stream from blocking the others: every
# stream's own window bounds what the server may send it unread. That window starts at the
# default, 64 KiB (an idle or slow watch holds no more), and grows while a stream's reader
# keeps up with a transfer the window limits (a large list or log: at 64 KiB a round trip, the
# agent moved half the bytes per second it does over HTTP/1.1), up to what Go's HTTP/2 client
# gives every stream, within one budget for the whole agent (gateway.wire.h2client).
CONNECTION_WINDOW = 1 << 30
MAX_STREAM_WINDOW = 4 << 20
WINDOW_BUDGET = 64 << 20
MAX_RESPONSE_HEADER_LIST = 256 * 1024  # as the HTTP/1.1 response head limit (exchange.py)
# A burst of new streams (a client opening thousands of watches at once) is written every this
# many HEADERS instead of as one write at the end of the loop turn: measured with 2,000 watches
# opened together, one large write left the agent's RSS ~0.9 KB per watch higher for good.
MAX_BATCHED_HEADS = 16
READ_BUFFER_SIZE = 256 * 1024  # what one read may bring (uvloop reads TLS up to 256 KiB)
_CRLF = b"\r\n"
_LAST_CHUNK_AFTER_DATA = _CRLF + LAST_CHUNK  # ends a chunk and the body in one piece


class H2Stream:
    """One exchange on an :class:`H2Upstream`: the exchange's view of an upstream connection."""

    __slots__ = ("_body", "_chunked", "_end_pending", "_held_head", "_method", "_out",
                 "_paused", "_unacked", "_write_paused", "conn", "ended", "request_ended",
                 "requests", "response_ended", "stream_id", "user")

    def __init__(self, conn: H2Upstream, user: UpstreamUser, requests: int) -> None:
        self.conn = conn
        self.user: UpstreamUser | None = user
        self.requests = requests  # streams the connection carried before: >0 may be stale
        self.stream_id = 0  # assigned when HEADERS go out (ids must be used in order)
        self.ended = False  # finished, reset or failed: no more events to the user
        self.request_ended = False
        self.response_ended = False  # the server's END_STREAM arrived
        self._method = b"GET"
        self._body: RequestBody | None = None
        self._out = bytearray()  # payload waiting for the server's flow-control window
        self._end_pending = False
        self._chunked = False
        # The response head, held for the body bytes the same read brought (see response()).
        self._held_head = b""
        self._paused = False
        self._unacked = 0
        self._write_paused = False

    # --- what the exchange uses (as of an UpstreamConnection) ------------------------------
    @property
    def usable(self) -> bool:
        return not self.ended and self.conn.usable

    def send_head(self, head: RequestHead) -> None:
        """The request head, parsed and checked (``gateway.agent.exchange.rewrite_request``)."""
        if not self.ended and self._body is None:
            self._send_head(head)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.ended or self._body is None:
            return  # the head comes first, by send_head
        if self.request_ended or self._end_pending:
            return  # the exchange refuses bytes past the body; nothing more goes up
        for piece in self._body.feed(data):
            self._out += piece
        if self._body.complete:
            self._end_pending = True
        self._flush_out()
        self.conn.flush()

    def write_eof(self) -> None:
        """Only upgrades half-close, and they never use HTTP/2."""

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = False
        if self._unacked and not self.ended:
            unacked, self._unacked = self._unacked, 0
            self.conn.acknowledge(self.stream_id, unacked)
            self.conn.flush()

    def get_write_buffer_size(self) -> int:
        return len(self._out)

    def finish(self) -> None:
        """The exchange is done with a complete response (the pool's ``release``). The body's
        own length may end it before the server's END_STREAM is read: that stream is not
        reset (unless the request side is still open), its last frame is simply dropped."""
        if self.ended:
            self.user = None
            return
        self.ended = True
        self.user = None
        self.conn.stream_closed(self, reset=not self.request_ended)

    def close(self) -> None:
        """The exchange is done; a stream still open is reset (the pool's ``discard``)."""
        if self.ended:
            self.user = None
            return
        self.ended = True
        self.user = None
        self.conn.stream_closed(self, reset=not (self.request_ended and self.response_ended))

    # --- from the connection -----------------------------------------------------------------
    def send_request(self, head: RequestHead, fields: bytes, *, at_once: bool = False) -> None:
        """The request: its header fields already HPACK-encoded
        (``gateway.agent.exchange.rewrite_request_block``, the fields :func:`request_fields`
        would make of ``rewrite_request``'s head), its method and body framing from ``head``.
        ``at_once``: the caller knows no other request joins this turn's write (see
        :meth:`H2Upstream.send_headers`)."""
        if not self.ended and self._body is None:
            self._send_head(head, fields, at_once)

    def _send_head(self, head: RequestHead, block: bytes | None = None,
                   at_once: bool = False) -> None:
        try:
            fields = request_fields(head) if block is None else None
            self._body = request_body(head)
        except (HTTPError, ValueError) as exc:
            self.fail(exc)
            return
        self._method = head.method
        end = self._body.complete
        try:
            self.stream_id = self.conn.send_headers(self, fields, block, end,
                                                    head.method == b"HEAD", at_once)
        except NoNewStreams as exc:  # a GOAWAY came since the pool handed this stream out
            self.fail(StreamRefused(f"the connection takes no new stream ({exc})"))
            return
        self.request_ended = end

    def _flush_out(self) -> None:
        if self.ended or not self.stream_id:
            return
        core = self.conn.h2
        sid = self.stream_id
        try:
            while self._out:
                window = min(core.local_flow_control_window(sid), core.max_outbound_frame_size)
                if window <= 0:
                    break
                piece = bytes(self._out[:window])
                del self._out[:window]
                core.send_data(sid, piece)
            if not self._out and self._end_pending:
                self._end_pending = False
                core.end_stream(sid)
                self.request_ended = True
        except StreamClosedError as exc:  # the server reset it meanwhile
            self.fail(ConnectionResetError(f"stream {exc} closed"))
            return
        user = self.user
        if user is None:
            return
        if self._out and not self._write_paused:
            self._write_paused = True
            user.upstream_pause_writing()
        elif not self._out and self._write_paused:
            self._write_paused = False
            user.upstream_resume_writing()

    def window_opened(self) -> None:
        if self._out or self._end_pending:
            self._flush_out()

    def response(self, event: ResponseReceived, *, body_follows: bool = False) -> None:
        """The response head. ``body_follows``: the same read brought DATA of this stream right
        after it (a small response, whole): the head is held and goes to the exchange with
        those bytes, one write to the tunnel stream instead of two (``data`` delivers it, with
        the body or alone)."""
        try:
            head_bytes, head = relayed_response(event.headers, self._method,
                                               event.content_length)
        except HTTPError as exc:
            self.fail(exc)
            return
        user = self.user
        if user is None:
            return
        self._chunked = head.chunked
        if body_follows and not event.stream_ended:
            self._held_head = head_bytes
            head_bytes = b""
        user.upstream_head(head_bytes, head)
        # A body of known length (none at all without content) ends with its last byte, as
        # the core counts them: the server's END_STREAM may come later (Go's does that).
        if event.body_complete:
            self._end(LAST_CHUNK if head.chunked else b"")

    def data(self, event: DataReceived) -> None:
        """The payload of the DATA frames of one read: one delivery (one chunk), with the
        response's end if they bring it."""
        pieces = event.pieces
        ended = event.body_complete  # the stream's end, or the content-length's last byte
        body: bytes | memoryview = b""
        if self._chunked:
            if pieces:
                n = sum(map(len, pieces)) if len(pieces) > 1 else len(pieces[0])
                body = b"".join((b"%x\r\n" % n, *pieces,
                                 _LAST_CHUNK_AFTER_DATA if ended else _CRLF))
            elif ended:
                body = LAST_CHUNK
        elif pieces:
            body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if body or ended or self._held_head:
            # (A held head with nothing of the body: an empty DATA frame; it goes alone.)
            self._deliver(body, ended)
        flow = event.flow_controlled_length
        if not flow:
            return
        if self._paused and not self.ended:
            self._unacked += flow  # acknowledged when the tunnel takes bytes again
        else:
            self.conn.acknowledge(self.stream_id, flow)

    def trailers(self) -> None:
        self._end(LAST_CHUNK if self._chunked else b"")

    def _deliver(self, data: bytes | memoryview, end: bool) -> None:
        """Body bytes to the exchange, after the head if it is held (``response``); ``end``:
        they are the last (the response is complete)."""
        held = self._held_head
        if held:
            self._held_head = b""
            data = held + data
        if end:
            self.response_ended = True
        user = self.user
        if user is None:
            return
        if end:
            user.upstream_last(data)
        elif data:
            user.upstream_body(data)

    def _end(self, last: bytes) -> None:
        """The response is complete (``last``: its final bytes, the last chunk)."""
        self._deliver(last, True)

    def fail(self, exc: Exception | None) -> None:
        """The stream cannot go on (reset by the server, connection lost, a protocol error)."""
        if self.ended:
            return
        self.ended = True
        user, self.user = self.user, None
        self.conn.stream_closed(self, reset=True)
        if user is not None:
            self.conn.loop.call_soon(user.upstream_lost, exc)


class H2Upstream(asyncio.BufferedProtocol):
    """One HTTP/2 connection to the apiserver and the exchanges it carries.

    A buffered protocol, reading into ``read_buffer()`` (the pool's one buffer, shared with its
    HTTP/1.1 connections): TLS records are decrypted straight into it and parsed in place,
    instead of into a new bytes object per read (up to 256 KiB of a large body, allocated and
    freed each time) that the body relay then copies again. Sharing is safe because every
    read is handled synchronously before the next one starts: the core keeps no view of it,
    and the body the streams relay is copied into the tunnel stream's queue (its ``write``
    copies a view, a chunk's framing is a join)."""

    def __init__(self, max_streams: int, on_change: Callable[[H2Upstream], None],
                 window_budget: WindowBudget | None = None,
                 read_buffer: Callable[[], memoryview] | None = None) -> None:
        self.max_streams = max_streams
        self._read_buffer = read_buffer or _OwnBuffer()
        self.on_change = on_change  # the pool: the connection became idle or was lost
        self.h2 = ClientConnection(max_header_list_size=MAX_RESPONSE_HEADER_LIST,
                                   connection_window=CONNECTION_WINDOW,
                                   max_stream_window=MAX_STREAM_WINDOW,
                                   window_budget=window_budget)
        self.transport: asyncio.Transport | None = None
        self.alpn: str | None = None
        # Kept: asyncio.get_running_loop() costs a getpid() system call each time.
        self.loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.handles: set[H2Stream] = set()  # streams handed out, sent or not yet
        self.by_id: dict[int, H2Stream] = {}
        self.draining = False  # GOAWAY received (or sent): no new streams
        self.lost = False
        self.opened = 0  # streams ever opened (observability; staleness of a stream)
        self.idle_since = time.monotonic()
        self._flush_handle: asyncio.Handle | None = None
        self._unflushed_heads = 0  # HEADERS queued since the last write

    # --- capacity ------------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    @property
    def stream_limit(self) -> int:
        return min(self.max_streams, self.h2.peer_max_concurrent_streams)

    @property
    def has_room(self) -> bool:
        if not self.ready.done() or self.draining or not self.usable:
            return False
        if len(self.handles) >= self.stream_limit:
            return False
        # The server also counts streams we are done with whose END_STREAM has not arrived
        # yet (the core keeps them), and ids run out after 2^30 streams.
        unsent = len(self.handles) - len(self.by_id)
        core = self.h2
        return (len(core.streams) + unsent < core.peer_max_concurrent_streams
                and core.next_stream_id + 2 * unsent < 2**31)

    def open_stream(self, user: UpstreamUser) -> H2Stream:
        stream = H2Stream(self, user, self.opened)
        self.opened += 1
        self.handles.add(stream)
        return stream

    # --- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        ssl_object = transport.get_extra_info("ssl_object")
        self.alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        if self.alpn != "h2":
            return  # the pool closes it and speaks HTTP/1.1 instead
        self.h2.initiate()
        self.flush()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        with self._read_buffer()[:nbytes] as data:
            self.data_received(data)

    def data_received(self, data: bytes | memoryview) -> None:
        """``data``: a view valid only during the call (see the class docstring)."""
        try:
            events = self.h2.receive_data(data)
        except ServerProtocolError as exc:
            log.warning("HTTP/2 protocol error from the apiserver, closing: %s", exc)
            self.abort(exc)  # after writing the GOAWAY the core queued
            return
        by_id = self.by_id
        for i, event in enumerate(events, 1):  # i: the index of the event after this one
            if type(event) is DataReceived:
                stream = by_id.get(event.stream_id)
                if stream is not None:
                    stream.data(event)
                else:  # a stream the exchange is done with: its window goes back at once
                    self.acknowledge(event.stream_id, event.flow_controlled_length)
            elif type(event) is ResponseReceived:
                if (stream := by_id.get(event.stream_id)) is not None:
                    following = events[i] if i < len(events) else None
                    stream.response(event, body_follows=isinstance(following, DataReceived)
                                    and following.stream_id == event.stream_id)
            else:
                self._event(event)
        self.flush()

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.draining = True
        self.h2.connection_lost()
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("the apiserver closed the connection"))
            self.ready.exception()  # retrieved: the pool may not be waiting any more
        for stream in list(self.handles):
            stream.fail(exc)
        self.on_change(self)

    # --- events --------------------------------------------------------------------------------
    def _event(self, event: Event) -> None:
        if isinstance(event, TrailersReceived):
            if (stream := self.by_id.get(event.stream_id)) is not None:
                stream.trailers()
        elif isinstance(event, StreamReset):
            if (stream := self.by_id.get(event.stream_id)) is not None:
                refused = event.remote_reset and event.error_code == REFUSED_STREAM
                reason = "reset the stream" if event.remote_reset else "broke a stream rule"
                stream.fail((StreamRefused if refused else ConnectionResetError)(
                    f"the apiserver {reason} (error code {event.error_code})"))
        elif isinstance(event, WindowUpdated):
            if event.stream_id == 0:
                for stream in list(self.by_id.values()):
                    stream.window_opened()
            elif (stream := self.by_id.get(event.stream_id)) is not None:
                stream.window_opened()
        elif isinstance(event, SettingsChanged):
            if not self.ready.done():
                self.ready.set_result(None)
        elif isinstance(event, ConnectionTerminated):
            self._goaway(event)
        # PINGs are answered by the core; interim (1xx) heads, ACKs and ignored frames need
        # nothing here.

    def _goaway(self, event: ConnectionTerminated) -> None:
        self.draining = True
        log.info("apiserver sent GOAWAY (error code %d, last stream %d): new requests use "
                 "another connection", event.error_code, event.last_stream_id)
        last = event.last_stream_id
        for stream in list(self.handles):
            if stream.stream_id > last or not stream.stream_id:
                stream.fail(StreamRefused("the apiserver refused the stream (GOAWAY)"))
        if event.error_code != NO_ERROR or not self.handles:
            self.abort(None)
        self.on_change(self)

    # --- used by streams -----------------------------------------------------------------------
    def send_headers(self, stream: H2Stream, fields: list[tuple[bytes, bytes]] | None,
                     block: bytes | None, end: bool, head_request: bool,
                     at_once: bool = False) -> int:
        """Open ``stream`` with ``fields``, or with their encoding ``block`` if they are None.

        A complete request (``end``) that the caller knows nothing else joins (``at_once``:
        its tunnel stream is its session's only one) on a connection with no other stream is
        written now, not at the end of the loop turn: on the c=1 latency path, and it saves no
        write to wait when nothing can share it."""
        if self.draining or not self.usable:
            raise NoNewStreams("the connection is closing")
        if fields is not None:
            stream_id = self.h2.send_headers(fields, end, head_request=head_request)
        else:
            assert block is not None
            stream_id = self.h2.send_header_block(block, end, head_request=head_request)
        self.by_id[stream_id] = stream
        self._unflushed_heads += 1
        if self._unflushed_heads >= MAX_BATCHED_HEADS or (
                at_once and end and len(self.handles) == 1):
            self._write_now()
        else:
            self.flush()
        return stream_id

    def acknowledge(self, stream_id: int, size: int) -> None:
        if size and stream_id and not self.lost:
            self.h2.acknowledge_received_data(size, stream_id)

    def stream_closed(self, stream: H2Stream, *, reset: bool) -> None:
        self.handles.discard(stream)
        sid = stream.stream_id
        if sid:
            self.by_id.pop(sid, None)
            if stream._unacked:
                self.acknowledge(sid, stream._unacked)
                stream._unacked = 0
            if reset and not self.lost:
                self.h2.reset_stream(sid, CANCEL)
        self.flush()
        if not self.handles:
            self.idle_since = time.monotonic()
            if self.draining:
                self.abort(None)
            else:
                self.on_change(self)

    def flush(self) -> None:
        """Write what the core queued at the end of this event-loop turn: the frames of every
        stream in the turn (HEADERS, DATA, WINDOW_UPDATE, RST_STREAM of many exchanges) go out
        as one TLS write, not one each (at most ``MAX_BATCHED_HEADS`` new streams per write).
        Nothing queued (most reads of a watch: its WINDOW_UPDATEs are batched), nothing to do."""
        if self._flush_handle is None and not self.lost and self.h2.has_data_to_send:
            self._flush_handle = self.loop.call_soon(self._write_now)

    def _write_now(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._unflushed_heads = 0
        data = self.h2.data_to_send()
        if data and self.usable:
            assert self.transport is not None
            self.transport.write(data)

    def close(self) -> None:
        """Graceful: GOAWAY, then close (streams still open fail)."""
        if self.usable and self.alpn == "h2":
            self.h2.close_connection()
        self.abort(None)

    def abort(self, exc: Exception | None) -> None:
        """Close after writing what is queued (a GOAWAY, the last frames)."""
        self.draining = True
        self._write_now()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class _OwnBuffer:
    """A connection's own read buffer, made at its first read (a connection without a pool's:
    tests, benchmarks)."""

    __slots__ = ("_view",)

    def __init__(self) -> None:
        self._view: memoryview | None = None

    def __call__(self) -> memoryview:
        if self._view is None:
            self._view = memoryview(bytearray(READ_BUFFER_SIZE))
        return self._view
