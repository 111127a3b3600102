"""The client side of one HTTP/2 connection (RFC 9113), sans-IO: bytes in, events out; calls
in, bytes out. The agent's connections to its kube-apiserver (:mod:`gateway.agent.h2pool`) are
its only user.

Why not the ``h2`` library: with its validation off and our HPACK encoder, ``h2`` still cost
the agent about 1.8 times the CPU of a pooled HTTP/1.1 request per short request, and every
watch event a pure-Python frame object, flag set, two state machines and an event with a dozen
attributes. A client of kube-apiserver needs a small part of that machinery (no push, no
priorities, no server role); this module is that part, built like the front door's
:mod:`gateway.wire.h2server` (whose frame constants, budgets and frame writer it shares).
HPACK: :mod:`gateway.wire.hpackdecode` decodes, :class:`FieldEncoder` encodes.

What it does, and the rules it enforces on what the server sends (a *connection error* queues
GOAWAY with the code and raises :class:`ServerProtocolError`, after which nothing more is
accepted; a *stream error* queues RST_STREAM and reports a :class:`StreamReset` with
``remote_reset`` False):

* :meth:`ClientConnection.initiate` queues the preface and our SETTINGS: ENABLE_PUSH 0 (push
  is refused: a PUSH_PROMISE is PROTOCOL_ERROR), MAX_HEADER_LIST_SIZE, the streams' receive
  window; and the connection window beyond the default. The server's first frame must be
  SETTINGS (§3.4); frames up to 16,384 bytes, the SETTINGS_MAX_FRAME_SIZE we keep (§4.2,
  FRAME_SIZE_ERROR); fixed-size frames are checked (PING 8, WINDOW_UPDATE and RST_STREAM 4,
  PRIORITY 5, SETTINGS a multiple of 6, GOAWAY at least 8).
* Streams are ours only, odd ids in order (§5.1.1); a frame on an even id or on an odd one we
  never opened is PROTOCOL_ERROR; DATA or HEADERS on a stream whose response ended is
  STREAM_CLOSED (a stream error while ours is still sending, a connection error once closed);
  frames on a stream we reset are ignored (§5.4.2) for the last ``RECENT_RESETS`` of them,
  their header blocks still decoded (the HPACK table must stay in step) and their DATA still
  counted against the connection window. WINDOW_UPDATE and RST_STREAM on closed streams are
  ignored (§6.9, §5.1).
* Responses (§8.1): interim heads (1xx) before the final one, never ending the stream, never
  101 (§8.6); DATA only after the final head; a second header block after it is trailers and
  must end the stream; a response's ``content-length`` is held against its DATA (§8.1.1: more
  DATA, or the end short of it, is PROTOCOL_ERROR; a response to HEAD, a 204 or a 304 carries
  none). Each of these is a stream error: the other streams go on. The fields themselves are
  not checked here (``gateway.wire.h2upstream.response_head`` does, for the relay). Events
  say when a response's body is complete (``body_complete``): at END_STREAM, or at its
  content-length's last byte (the one count of it), or with its head when it has no content.
* Header blocks: HEADERS and its CONTINUATION frames must follow each other with nothing in
  between (§6.10); a block longer than the header-list limit or spread over more than
  ``MAX_CONTINUATIONS`` frames is ENHANCE_YOUR_CALM (as the front door), before it is decoded. A
  decoded list over ``max_header_list_size`` is ENHANCE_YOUR_CALM (the decoder stops at the
  first field past it, so its table is out of step and the connection cannot go on), any other
  decoding failure COMPRESSION_ERROR.
* Padding (§6.1, §6.2) is removed and checked; priorities are parsed and ignored (§5.3.2), a
  stream depending on itself is a stream error PROTOCOL_ERROR.
* SETTINGS (§6.5): at most ``MAX_SETTINGS_ENTRIES`` entries and no id twice in one frame
  (PROTOCOL_ERROR); ENABLE_PUSH other than 0 from a server is PROTOCOL_ERROR, MAX_FRAME_SIZE
  outside 16,384..2^24-1 PROTOCOL_ERROR, INITIAL_WINDOW_SIZE over 2^31-1 FLOW_CONTROL_ERROR.
  Every SETTINGS is acknowledged. INITIAL_WINDOW_SIZE moves the send window of every open
  stream by the difference, which may make it negative (§6.9.2): nothing is sent on it until
  WINDOW_UPDATEs bring it back above zero. MAX_CONCURRENT_STREAMS bounds the streams we open
  (:attr:`ClientConnection.can_open`).
* Flow control (§6.9) both ways. Received DATA counts against the connection's and the
  stream's windows (more is FLOW_CONTROL_ERROR, a connection error for the connection window,
  a stream error for the stream's). The connection window is given back on receipt (once per
  run of DATA frames in one read, when it is past half); a stream's
  only through :meth:`ClientConnection.acknowledge_received_data`, once the application took the
  bytes (a stream whose reader is slow holds its window, no more), in WINDOW_UPDATEs sent when
  half a window is used. A stream's window starts at ``initial_window_size`` and auto-tunes:
  when half of it was taken within ``GROW_WITHIN`` of the last update (the window, not the
  reader, is the limit: a large list or log), it doubles, up to ``max_stream_window``, while the
  :class:`WindowBudget` shared by the connections allows; a stream taken slowly again (over
  ``SHRINK_AFTER`` between updates: a watch after its burst) goes back to the initial window,
  and a stream that ends gives its growth back. DATA is sent only within the server's windows
  (:meth:`ClientConnection.local_flow_control_window`); a window over 2^31-1 after a
  WINDOW_UPDATE is FLOW_CONTROL_ERROR, an increment of 0 PROTOCOL_ERROR.
* GOAWAY (§6.8): no stream is opened after it; the streams above its last stream id were not
  processed (the server says so): they are closed here and reported in
  :class:`ConnectionTerminated` ``refused``, safe to send again on another connection (§8.7),
  as are streams the server resets with REFUSED_STREAM. A later GOAWAY may lower the last
  stream id, never raise it. With NO_ERROR the streams up to it still finish.

Floods are bounded as the front door bounds them, frame by frame, with the same three token
buckets (:class:`gateway.wire.h2server.FrameBudget`): our stream errors for the server's broken
stream rules; frames that cost us an answer (PING, SETTINGS), spent before the answer is
queued; frames that cost only parsing (WINDOW_UPDATE, PRIORITY, unknown types, ACKs, empty DATA
that ends nothing, frames for closed or reset streams, each SETTINGS entry). Past a budget:
connection error ENHANCE_YOUR_CALM.

For the relay's sake, consecutive DATA frames of one stream within one :meth:`receive_data`
call come out as one :class:`DataReceived` (their payloads in ``pieces``): a read holding a
hundred small watch events costs the application one call, not a hundred.

Such a run of small frames is parsed from ``bytes``, even when the input is a view of a read
buffer: compiled, indexing ``bytes`` is a C array access, while a view's bytes, ``struct``'s
tuples and their ints are Python objects. Copying the rest of the read once (a watch's read is
a hundred events of a few hundred bytes) made a frame about three times cheaper to take, and
slicing a small payload out of ``bytes`` cheaper than a view of it. A read is copied from its
first small DATA frame on, so a read of large frames (a large list or body: 16 KiB frames) is
not copied; a payload of ``COPIED_BELOW`` bytes or more is handed on as a view, of the input or
of the read's copy, never sliced into bytes of its own.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final

from mypy_extensions import mypyc_attr

from gateway.wire.h2server import (
    ACK,
    ANSWERED_BURST,
    ANSWERED_RATE,
    CHEAP_BURST,
    CHEAP_RATE,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_LIMIT,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_CONTINUATIONS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    MAX_SETTINGS_ENTRIES,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    RECENT_RESETS,
    RESET_BURST,
    RESET_RATE,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    Fields,
    FrameBudget,
    frame,
    header_block_frames,
)
from gateway.wire.hpackdecode import Decoder, HeaderListTooLarge, HPACKDecodeError
from gateway.wire.hpackfields import FieldEncoder

MAX_STREAM_ID = 2**31 - 1
# Receive-window auto-tuning (see the module docstring). Half a window taken this soon after
# the last update means the window limits the transfer (loopback or in-cluster round trips are
# well under it; a watch trickling events never gets there); this long means it does not.
GROW_WITHIN = 0.05
SHRINK_AFTER = 1.0
_DIGITS = b"0123456789"

_FRAME_HEAD = struct.Struct(">BHBBL")  # length (24 bits, as 8 + 16), type, flags, stream id
_SETTING = struct.Struct(">HL")
_unpack_head = _FRAME_HEAD.unpack_from
# A frame payload shorter than this is parsed and handed on from a copy (see the module
# docstring): a watch event's frame; a large body's 16 KiB frames are not.
COPIED_BELOW: Final = 4096
_pack_head = _FRAME_HEAD.pack
_SELF_DEPENDENT = 0x100  # not a wire flag: HEADERS whose priority names its own stream


# --- events -----------------------------------------------------------------------------------

class Event:
    __slots__ = ()


class ResponseReceived(Event):
    """A stream's final response head (``stream_ended``: no body follows, the stream's
    response side is over). ``content_length``: its first ``content-length`` as the core
    parsed it to hold the DATA against (§8.1.1), -1 when there is none or it does not parse;
    given so that a relay need not parse it again. ``body_complete``: the response is whole
    with its head: the stream ended, or the response has no content (a HEAD request's, a 204
    or 304, a ``content-length: 0``), whether or not END_STREAM came yet."""

    __slots__ = ("body_complete", "content_length", "headers", "stream_ended", "stream_id")

    def __init__(self, stream_id: int, headers: Fields, stream_ended: bool,
                 content_length: int, body_complete: bool) -> None:
        self.stream_id, self.headers, self.stream_ended = stream_id, headers, stream_ended
        self.content_length = content_length
        self.body_complete = body_complete


class InformationalResponse(Event):
    """An interim (1xx) response head; the final one follows."""

    __slots__ = ("headers", "stream_id")

    def __init__(self, stream_id: int, headers: Fields) -> None:
        self.stream_id, self.headers = stream_id, headers


class DataReceived(Event):
    """Body bytes of one stream: the payloads of one or more consecutive DATA frames of one
    :meth:`ClientConnection.receive_data` call, in ``pieces`` (those of ``COPIED_BELOW`` bytes
    or more may be views of its input: read or copy them before the event is dropped, never
    keep them). ``flow_controlled_length`` (padding included) is what to acknowledge;
    ``stream_ended``: the last frame ended the stream; ``body_complete``: the response's body
    is whole with these bytes (the stream ended, or its content-length is reached: the
    server's END_STREAM may come later, in a frame of its own, as Go's does)."""

    __slots__ = ("body_complete", "flow_controlled_length", "pieces", "stream_ended",
                 "stream_id")

    def __init__(self, stream_id: int, piece: bytes | memoryview, flow_controlled_length: int,
                 stream_ended: bool, body_complete: bool) -> None:
        self.stream_id = stream_id
        self.pieces: list[bytes | memoryview] = [piece] if piece else []
        self.flow_controlled_length = flow_controlled_length
        self.stream_ended = stream_ended
        self.body_complete = body_complete

    @property
    def data(self) -> bytes:
        """The payload as one bytes object (a copy)."""
        return b"".join(self.pieces)


class TrailersReceived(Event):
    """Trailers ended the stream's response (they are not kept)."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class StreamReset(Event):
    """The stream is gone: the server reset it (``remote_reset``) or broke a stream rule and we
    did (``remote_reset`` False). ``error_code`` REFUSED_STREAM from the server: it did not
    process the request."""

    __slots__ = ("error_code", "remote_reset", "stream_id")

    def __init__(self, stream_id: int, error_code: int, remote_reset: bool) -> None:
        self.stream_id, self.error_code, self.remote_reset = stream_id, error_code, remote_reset


class WindowUpdated(Event):
    """The server gave send credit on a stream (``stream_id``) or on every stream (0: the
    connection window, or an INITIAL_WINDOW_SIZE increase)."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class SettingsChanged(Event):
    """The server's SETTINGS, applied and acknowledged (ACK queued). The first one ends the
    connection preface: streams may be opened."""

    __slots__ = ()


class PingReceived(Event):
    """A PING, answered (ACK queued)."""

    __slots__ = ()


class ConnectionTerminated(Event):
    """The server sent GOAWAY. ``refused``: our streams above ``last_stream_id``, closed here
    (the server never processed them)."""

    __slots__ = ("error_code", "last_stream_id", "refused")

    def __init__(self, error_code: int, last_stream_id: int, refused: list[int]) -> None:
        self.error_code, self.last_stream_id, self.refused = error_code, last_stream_id, refused


class FrameIgnored(Event):
    """A frame that cost only parsing (PRIORITY, unknown types, ACKs, frames for closed or
    reset streams)."""

    __slots__ = ()


_IGNORED = FrameIgnored()
_PINGED = PingReceived()
_SETTINGS_CHANGED = SettingsChanged()


# --- errors -----------------------------------------------------------------------------------

@mypyc_attr(native_class=False)
class ServerProtocolError(Exception):
    """The server broke a connection rule; GOAWAY with ``code`` is queued. The connection is
    over: write what :meth:`ClientConnection.data_to_send` returns, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@mypyc_attr(native_class=False)
class StreamClosedError(Exception):
    """Sending on a stream that is closed (or never was)."""


@mypyc_attr(native_class=False)
class NoNewStreams(Exception):
    """No stream can be opened: the server's limit is reached, a GOAWAY was sent or received,
    the stream ids are used up, or the server's SETTINGS have not arrived."""


# --- the connection ---------------------------------------------------------------------------

# A stream's response, as far as it got.
_AWAITING_HEAD, _BODY = 0, 1


class WindowBudget:
    """Bytes that grown receive windows (beyond the initial window) may add up to, shared by
    the connections that hold it: what readers that stop could leave buffered at most."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reserve(self, n: int) -> int:
        """Up to ``n`` bytes of growth (what is left of the budget)."""
        n = max(0, min(n, self.limit - self.used))
        self.used += n
        return n

    def release(self, n: int) -> None:
        self.used = max(0, self.used - n)


class _Stream:
    __slots__ = ("body_left", "last_update", "local_open", "no_content", "phase",
                 "recv_target", "recv_unacked", "recv_window", "remote_open", "send_window")

    def __init__(self, send_window: int, recv_window: int, local_open: bool,
                 no_content: bool, now: float) -> None:
        self.send_window = send_window  # what we may still send on it (may go negative)
        self.recv_window = recv_window  # what the server may still send on it
        self.recv_target = recv_window  # the window's size now (auto-tuned)
        self.last_update = now  # when credit last went back (or the stream opened)
        self.recv_unacked = 0  # acknowledged by the application, not yet given back
        self.local_open = local_open
        self.remote_open = True
        self.phase = _AWAITING_HEAD
        self.no_content = no_content  # a HEAD request: its response has no content
        self.body_left = -1  # content-length minus the DATA received; -1: none declared


def _declared_length(headers: Fields) -> int:
    """The response's ``content-length`` (plain digits), -1 when it declares none that parses
    (the relay refuses such a response: ``gateway.wire.h2upstream.response_head``)."""
    for name, value in headers:
        if name == b"content-length":
            value = value.strip(b" \t")
            if not value or value.translate(None, _DIGITS) or len(value) > 18:
                return -1
            return int(value)
    return -1


class ClientConnection:
    """One HTTP/2 connection, client side. See the module docstring.

    ``max_header_list_size`` is announced in our SETTINGS and enforced on every response header
    block; ``initial_window_size`` is each stream's receive window, ``connection_window`` the
    connection's; streams' windows grow up to ``max_stream_window`` within ``window_budget``
    (none by default: no growth). The flood budgets default to the front door's; ``clock``
    (seconds) times the window updates."""

    def __init__(self, *, max_header_list_size: int,
                 initial_window_size: int = DEFAULT_WINDOW,
                 connection_window: int = DEFAULT_WINDOW,
                 max_stream_window: int = 0,
                 window_budget: WindowBudget | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 encoder: FieldEncoder | None = None,
                 resets: FrameBudget | None = None,
                 answered: FrameBudget | None = None,
                 cheap: FrameBudget | None = None) -> None:
        self._resets = resets if resets is not None else FrameBudget(RESET_BURST, RESET_RATE)
        self._answered = (answered if answered is not None
                          else FrameBudget(ANSWERED_BURST, ANSWERED_RATE))
        self._cheap = cheap if cheap is not None else FrameBudget(CHEAP_BURST, CHEAP_RATE)
        self.max_header_list_size = max_header_list_size
        self.streams: dict[int, _Stream] = {}  # open or half-closed: they count as concurrent
        self.next_stream_id = 1
        # Requests carry header values a client chose: encoded, never retained (FieldEncoder).
        self.encoder = encoder if encoder is not None else FieldEncoder(retain=False)
        self.decoder = Decoder(max_header_list_size)
        # The server's settings (RFC 9113 §6.5.2 initial values until its SETTINGS arrive).
        self.peer_max_concurrent_streams = MAX_STREAM_ID
        self.max_outbound_frame_size = FRAME_LIMIT
        self.settings_received = False  # the server's first SETTINGS arrived
        self.goaway_received: int | None = None  # its last stream id
        self.goaway_error = NO_ERROR
        self._goaway_sent = False
        self._initial_window = initial_window_size
        self._connection_window = connection_window
        self._max_stream_window = max(max_stream_window, initial_window_size)
        self._window_budget = window_budget
        self._clock = clock
        self._recv_window = DEFAULT_WINDOW  # until initiate() announces connection_window
        self._recv_unacked = 0
        self._send_window = DEFAULT_WINDOW
        self._peer_initial_window = DEFAULT_WINDOW
        self._out: list[bytes] = []
        self._pending = b""  # bytes of an incomplete frame
        self._block: bytearray | None = None  # a header block waiting for CONTINUATION
        self._block_stream = 0
        self._block_flags = 0
        self._block_frames = 0
        self._unusual = True  # _block is set or settings_received is not (one check a frame)
        self._broken = False
        self._reset_order: deque[int] = deque()
        self._reset: set[int] = set()
        self._handlers: tuple[Callable[[int, int, memoryview, list[Event]], None], ...] = (
            self._on_data, self._on_headers, self._on_priority, self._on_rst_stream,
            self._on_settings, self._on_push_promise, self._on_ping, self._on_goaway,
            self._on_window_update, self._on_continuation)

    # --- opening ---------------------------------------------------------------------------

    def initiate(self) -> None:
        """Queue the preface, our SETTINGS and the connection window beyond the default."""
        settings = [(ENABLE_PUSH, 0), (MAX_HEADER_LIST_SIZE, self.max_header_list_size)]
        if self._initial_window != DEFAULT_WINDOW:
            settings.append((INITIAL_WINDOW_SIZE, self._initial_window))
        self._out.append(PREFACE)
        self._out.append(frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v)
                                                         for k, v in settings)))
        extra = self._connection_window - DEFAULT_WINDOW
        if extra > 0:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, extra.to_bytes(4, "big")))
            self._recv_window += extra

    @property
    def can_open(self) -> bool:
        """A stream may be opened now (:meth:`send_headers` would not raise NoNewStreams)."""
        return (self.settings_received and self.goaway_received is None
                and not self._goaway_sent and not self._broken
                and self.next_stream_id <= MAX_STREAM_ID
                and len(self.streams) < self.peer_max_concurrent_streams)

    # --- input -----------------------------------------------------------------------------

    def receive_data(self, data: bytes | memoryview) -> list[Event]:
        """The events in ``data``. Raises :class:`ServerProtocolError` (GOAWAY queued) when
        the server broke a connection rule; nothing is accepted after that.

        ``data`` may be a view of a read buffer that is used again after the call: nothing of
        it is kept (a frame cut at its end is copied), and the events hold no view of it but
        :class:`DataReceived`'s pieces, which must be read or copied before the next read."""
        if self._broken:
            return []
        events: list[Event] = []
        try:
            pos = 0
            pending = self._pending
            if pending:
                # Complete the frame a read left cut, from the head of this one: only its bytes
                # are copied, not the whole read (a large body's reads almost all end mid-frame).
                if len(pending) < 9:
                    pending += data[:9 - len(pending)]
                    if len(pending) < 9:
                        self._pending = pending
                        return events
                    pos = 9 - len(self._pending)
                size = 9 + (pending[0] << 16 | pending[1] << 8 | pending[2])
                take = min(size - len(pending), len(data) - pos)
                if size > 9 + FRAME_LIMIT:
                    take = 0  # _frames refuses it from its header
                pending += data[pos:pos + take]
                pos += take
                if len(pending) < size and size <= 9 + FRAME_LIMIT:
                    self._pending = pending
                    return events
                self._pending = b""
                self._frames(pending, 0, events)
            stop = self._frames(data, pos, events)
        except ServerProtocolError as exc:
            self._broken = True
            self._pending = b""
            self._send_goaway(exc.code)
            raise
        if stop < len(data):
            self._pending = bytes(data[stop:])
        return events

    def _frames(self, data: bytes | memoryview, pos: int, events: list[Event]) -> int:
        """The whole frames in ``data`` from ``pos`` on, into ``events``; returns where the
        first incomplete frame (or the end) is."""
        view = memoryview(data)
        end = len(data)
        handlers = self._handlers
        while end - pos >= 9:
            # Declared, so that the compiled loop keeps them as C integers.
            high: int
            low: int
            ftype: int
            flags: int
            stream_id: int
            high, low, ftype, flags, stream_id = _unpack_head(data, pos)
            length = high << 16 | low
            if length > FRAME_LIMIT:
                raise ServerProtocolError(FRAME_SIZE_ERROR, "frame larger than 16384 bytes")
            stop = pos + 9 + length
            if stop > end:
                break
            if ftype == DATA and not flags and length and not self._unusual:
                if isinstance(data, bytes):
                    taken = self._plain_data(data, view, pos, end, stream_id & 0x7FFFFFFF,
                                             events)
                    if taken != pos:
                        pos = taken
                        continue
                elif length < COPIED_BELOW:
                    return pos + self._frames(bytes(view[pos:end]), 0, events)
            payload = view[pos + 9:stop]
            pos = stop
            if self._unusual:  # a header block in progress, or no SETTINGS from the server yet
                if self._block is not None and ftype != CONTINUATION:
                    raise ServerProtocolError(PROTOCOL_ERROR, "header block interrupted")
                if not self.settings_received and (ftype != SETTINGS or flags & ACK):
                    raise ServerProtocolError(PROTOCOL_ERROR,
                                              "the server's preface is not SETTINGS")
            if ftype < 10:
                handlers[ftype](flags, stream_id & 0x7FFFFFFF, payload, events)
            else:
                self._ignored(events)  # unknown frame types are ignored (§5.5)
        return pos

    def _idle(self, stream_id: int) -> bool:
        """Never opened by us: an even id (a server may open none) or one not reached yet."""
        return stream_id >= self.next_stream_id or not stream_id & 1

    def _ignored(self, events: list[Event]) -> None:
        if not self._cheap.spend():
            raise ServerProtocolError(ENHANCE_YOUR_CALM, "flood of frames that cost only parsing")
        events.append(_IGNORED)

    def _stream_error(self, stream_id: int, code: int, events: list[Event]) -> None:
        if not self._resets.spend():
            raise ServerProtocolError(ENHANCE_YOUR_CALM, "too many broken stream rules")
        self._out.append(frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))
        self._drop(stream_id)
        self._remember_reset(stream_id)
        events.append(StreamReset(stream_id, code, False))

    def _drop(self, stream_id: int) -> _Stream | None:
        """Forget a stream (closed or reset); its grown window goes back to the budget."""
        stream = self.streams.pop(stream_id, None)
        if stream is not None and self._window_budget is not None \
                and stream.recv_target > self._initial_window:
            self._window_budget.release(stream.recv_target - self._initial_window)
        return stream

    def _remember_reset(self, stream_id: int) -> None:
        if stream_id in self._reset:
            return
        self._reset.add(stream_id)
        self._reset_order.append(stream_id)
        if len(self._reset_order) > RECENT_RESETS:
            self._reset.discard(self._reset_order.popleft())

    def _closed_stream_frame(self, stream_id: int, what: str, events: list[Event]) -> None:
        """DATA or HEADERS for a stream not in ``streams``: ignored if we reset it lately, else
        a connection error (a stream closed both ways, or one never opened)."""
        if self._idle(stream_id):
            raise ServerProtocolError(PROTOCOL_ERROR, f"{what} on a stream we did not open")
        if stream_id in self._reset:
            self._ignored(events)
            return
        raise ServerProtocolError(STREAM_CLOSED, f"{what} on a closed stream")

    @staticmethod
    def _unpad(payload: memoryview, fixed: int = 0) -> memoryview:
        """``payload`` without its pad length and padding. ``fixed``: the bytes after the pad
        length that padding may not take (HEADERS' priority fields, §6.2)."""
        if fixed and len(payload) <= fixed:
            raise ServerProtocolError(FRAME_SIZE_ERROR, "frame too short for its fields")
        if not payload or payload[0] >= len(payload) - fixed:
            raise ServerProtocolError(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1:len(payload) - payload[0]]

    def _on_data(self, flags: int, stream_id: int, payload: memoryview,
                 events: list[Event]) -> None:
        flow = len(payload)
        if flow:
            window = self._recv_window - flow
            if window < 0:
                raise ServerProtocolError(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
            # The connection window is given back on receipt: the streams' windows bound
            # what a slow reader holds (see the module docstring).
            self._recv_unacked += flow
            if window <= self._connection_window >> 1:
                increment, self._recv_unacked = self._recv_unacked, 0
                window += increment
                self._out.append(frame(WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big")))
            self._recv_window = window
        if flags & PADDED:
            payload = self._unpad(payload)
        stream = self.streams.get(stream_id)
        if stream is None or not stream.remote_open or stream.phase != _BODY \
                or flow > stream.recv_window:
            self._unexpected_data(stream_id, stream, events)
            return
        n = len(payload)
        ended = flags & END_STREAM
        left = stream.body_left
        if left >= 0:
            # §8.1.1: DATA past the content-length, or the end short of it, is malformed; the
            # offending frame is not handed on.
            left -= n
            if left < 0 or (left and ended):
                self._stream_error(stream_id, PROTOCOL_ERROR, events)
                return
            stream.body_left = left
        if not n and not ended and not self._cheap.spend():
            raise ServerProtocolError(ENHANCE_YOUR_CALM, "flood of empty DATA frames")
        stream.recv_window -= flow
        complete = bool(ended) or not left  # left: 0 once the content-length is reached
        if events:
            last = events[-1]
            if type(last) is DataReceived and last.stream_id == stream_id:
                if n:
                    last.pieces.append(payload)
                last.flow_controlled_length += flow
                if complete:
                    last.body_complete = True
                if ended:
                    last.stream_ended = True
                    self._remote_ended(stream_id, stream)
                return
        events.append(DataReceived(stream_id, payload, flow, bool(ended), complete))
        if ended:
            self._remote_ended(stream_id, stream)

    def _plain_data(self, data: bytes, view: memoryview, pos: int, end: int,
                    stream_id: int, events: list[Event]) -> int:
        """The run of plain DATA frames of ``stream_id`` (whole, not empty, no flags: no
        padding, not the end) that starts at ``pos``, taken as :meth:`_on_data` takes them one
        by one, in one call: a watch's read is a hundred such frames, an event each. Returns
        where the first frame it did not take starts (``pos``: none); a frame that is not
        plain or breaks a rule (a window, the content-length) is left to :meth:`_on_data`.

        The windows and the content-length are checked against the run's running total, not
        frame by frame: the frames of one read all had to fit in the windows the server knew
        before it (a WINDOW_UPDATE queued while parsing it has not gone out yet), so one
        limit, the smallest of the three, holds for the whole run."""
        stream = self.streams.get(stream_id)
        if stream is None or not stream.remote_open or stream.phase != _BODY:
            return pos
        window, stream_window, left = self._recv_window, stream.recv_window, stream.body_left
        limit = min(window, stream_window, left) if left >= 0 else min(window, stream_window)
        taken = 0  # payload bytes of the run so far
        pieces: list[bytes | memoryview] = []
        start = pos
        while end - pos >= 9:
            length = data[pos] << 16 | data[pos + 1] << 8 | data[pos + 2]
            stop = pos + 9 + length
            if data[pos + 3] or data[pos + 4] or stop > end or not 0 < length <= FRAME_LIMIT \
                    or taken + length > limit:
                break  # not DATA (type 0) with no flags, cut, too long or beyond a window
            if (data[pos + 5] << 24 | data[pos + 6] << 16 | data[pos + 7] << 8
                    | data[pos + 8]) != stream_id:
                break  # another stream's (a reserved bit set fails the comparison too)
            taken += length
            pieces.append(data[pos + 9:stop] if length < COPIED_BELOW else view[pos + 9:stop])
            pos = stop
        if pos == start:
            return pos
        # As _on_data: the connection window is given back on receipt.
        window -= taken
        unacked = self._recv_unacked + taken
        if window <= self._connection_window >> 1:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, unacked.to_bytes(4, "big")))
            window += unacked
            unacked = 0
        self._recv_window, self._recv_unacked = window, unacked
        stream.recv_window = stream_window - taken
        complete = False
        if left > 0:
            stream.body_left = left - taken
            complete = left == taken
        if events:
            last = events[-1]
            if type(last) is DataReceived and last.stream_id == stream_id:
                last.pieces += pieces
                last.flow_controlled_length += taken
                if complete:
                    last.body_complete = True
                return pos
        event = DataReceived(stream_id, pieces[0], taken, False, complete)
        event.pieces = pieces
        events.append(event)
        return pos

    def _unexpected_data(self, stream_id: int, stream: _Stream | None,
                         events: list[Event]) -> None:
        """DATA that breaks a rule: on stream 0, on a stream we never opened, closed or reset,
        whose response ended or has not begun, or beyond the stream's window."""
        if stream_id == 0:
            raise ServerProtocolError(PROTOCOL_ERROR, "DATA on stream 0")
        if stream is None:
            self._closed_stream_frame(stream_id, "DATA", events)
        elif not stream.remote_open:
            self._stream_error(stream_id, STREAM_CLOSED, events)
        elif stream.phase != _BODY:
            self._stream_error(stream_id, PROTOCOL_ERROR, events)  # DATA before the head
        else:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, events)

    def _on_headers(self, flags: int, stream_id: int, payload: memoryview,
                    events: list[Event]) -> None:
        if stream_id == 0:
            raise ServerProtocolError(PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & PADDED:
            payload = self._unpad(payload, 5 if flags & PRIORITY_FLAG else 0)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise ServerProtocolError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream_id:
                flags |= _SELF_DEPENDENT  # a stream error once the block is decoded
            payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, flags, bytes(payload), events)
        else:
            if len(payload) > self.max_header_list_size:
                raise ServerProtocolError(ENHANCE_YOUR_CALM, "header block too long")
            self._block = bytearray(payload)
            self._block_stream, self._block_flags, self._block_frames = stream_id, flags, 0
            self._unusual = True

    def _on_continuation(self, flags: int, stream_id: int, payload: memoryview,
                         events: list[Event]) -> None:
        block = self._block
        if block is None or stream_id != self._block_stream:
            raise ServerProtocolError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block += payload
        self._block_frames += 1
        if self._block_frames > MAX_CONTINUATIONS \
                or len(block) > self.max_header_list_size + FRAME_LIMIT:
            raise ServerProtocolError(ENHANCE_YOUR_CALM, "header block too long")
        if flags & END_HEADERS:
            self._block = None
            self._unusual = not self.settings_received
            self._header_block(stream_id, self._block_flags, bytes(block), events)

    def _header_block(self, stream_id: int, flags: int, block: bytes,
                      events: list[Event]) -> None:
        try:  # always decoded, even when dropped: the HPACK table must stay in step
            headers: Fields = self.decoder.decode(block)
        except HeaderListTooLarge:
            raise ServerProtocolError(ENHANCE_YOUR_CALM, "header list too large") from None
        except HPACKDecodeError:
            raise ServerProtocolError(COMPRESSION_ERROR, "undecodable header block") from None
        stream = self.streams.get(stream_id)
        if stream is None:
            self._closed_stream_frame(stream_id, "HEADERS", events)
            return
        if not stream.remote_open:
            self._stream_error(stream_id, STREAM_CLOSED, events)
            return
        if flags & _SELF_DEPENDENT:
            self._stream_error(stream_id, PROTOCOL_ERROR, events)
            return
        ended = bool(flags & END_STREAM)
        if stream.phase == _BODY:  # a second header block: trailers, which end the stream
            if not ended or stream.body_left > 0:
                self._stream_error(stream_id, PROTOCOL_ERROR, events)
                return
            self._remote_ended(stream_id, stream)
            events.append(TrailersReceived(stream_id))
            return
        status = headers[0][1] if headers and headers[0][0] == b":status" else b""
        if status[:1] == b"1" and len(status) == 3:
            if ended or status == b"101":  # §8.1: an interim head never ends; §8.6: no 101
                self._stream_error(stream_id, PROTOCOL_ERROR, events)
                return
            events.append(InformationalResponse(stream_id, headers))
            return
        stream.phase = _BODY
        declared = _declared_length(headers)
        if stream.no_content or status == b"204" or status == b"304":
            stream.body_left = 0  # whatever its content-length says (§8.1.1)
        else:
            stream.body_left = declared
            if ended and declared > 0:
                self._stream_error(stream_id, PROTOCOL_ERROR, events)
                return
        if ended:
            self._remote_ended(stream_id, stream)
        events.append(ResponseReceived(stream_id, headers, ended, declared,
                                       ended or not stream.body_left))

    def _remote_ended(self, stream_id: int, stream: _Stream) -> None:
        stream.remote_open = False
        if not stream.local_open:
            self._drop(stream_id)

    def _on_priority(self, flags: int, stream_id: int, payload: memoryview,
                     events: list[Event]) -> None:
        if stream_id == 0:
            raise ServerProtocolError(PROTOCOL_ERROR, "PRIORITY on stream 0")
        # A malformed PRIORITY is a stream error (§6.3, §5.3.1), but no RST_STREAM may name a
        # stream we never opened (§6.4): there it is the connection's.
        if len(payload) != 5:
            if self._idle(stream_id):
                raise ServerProtocolError(FRAME_SIZE_ERROR, "PRIORITY is not 5 bytes")
            self._stream_error(stream_id, FRAME_SIZE_ERROR, events)
        elif int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream_id:
            if self._idle(stream_id):
                raise ServerProtocolError(PROTOCOL_ERROR, "PRIORITY on itself")
            self._stream_error(stream_id, PROTOCOL_ERROR, events)
        else:
            self._ignored(events)

    def _on_rst_stream(self, flags: int, stream_id: int, payload: memoryview,
                       events: list[Event]) -> None:
        if len(payload) != 4:
            raise ServerProtocolError(FRAME_SIZE_ERROR, "RST_STREAM is not 4 bytes")
        if stream_id == 0 or self._idle(stream_id):
            raise ServerProtocolError(PROTOCOL_ERROR, "RST_STREAM on a stream we did not open")
        if self._drop(stream_id) is None:
            self._ignored(events)  # closed already (§5.1): the reset crossed our end
            return
        events.append(StreamReset(stream_id, int.from_bytes(payload, "big"), True))

    def _on_settings(self, flags: int, stream_id: int, payload: memoryview,
                     events: list[Event]) -> None:
        if stream_id:
            raise ServerProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ServerProtocolError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            self._ignored(events)
            return
        if len(payload) % 6:
            raise ServerProtocolError(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        count = len(payload) // 6
        if count > MAX_SETTINGS_ENTRIES:
            raise ServerProtocolError(PROTOCOL_ERROR,
                                      f"SETTINGS with more than {MAX_SETTINGS_ENTRIES} entries")
        if not self._answered.spend():
            raise ServerProtocolError(ENHANCE_YOUR_CALM, "PING or SETTINGS flood")
        for _ in range(count):  # each entry costs parsing
            if not self._cheap.spend():
                raise ServerProtocolError(ENHANCE_YOUR_CALM, "flood of SETTINGS entries")
        settings = dict(_SETTING.iter_unpack(payload))
        if len(settings) != count:
            raise ServerProtocolError(PROTOCOL_ERROR, "SETTINGS with a repeated id")
        opened = False
        for key, value in settings.items():
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ServerProtocolError(FLOW_CONTROL_ERROR,
                                              "INITIAL_WINDOW_SIZE over 2^31-1")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                if delta:  # every open stream's window moves, below zero if need be (§6.9.2)
                    for stream in self.streams.values():
                        stream.send_window += delta
                        if stream.send_window > MAX_WINDOW:
                            raise ServerProtocolError(FLOW_CONTROL_ERROR,
                                                      "a stream window went past 2^31-1")
                    opened = delta > 0
            elif key == MAX_FRAME_SIZE:
                if not FRAME_LIMIT <= value <= 2**24 - 1:
                    raise ServerProtocolError(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self.max_outbound_frame_size = value
            elif key == ENABLE_PUSH:
                if value != 0:  # §6.5.2: a server never enables push
                    raise ServerProtocolError(PROTOCOL_ERROR, "ENABLE_PUSH from a server")
            elif key == MAX_CONCURRENT_STREAMS:
                self.peer_max_concurrent_streams = value
            elif key == HEADER_TABLE_SIZE:
                self.encoder.header_table_size = value  # our encoder keeps no table anyway
            # MAX_HEADER_LIST_SIZE (advisory; our request heads are bounded before they get
            # here) and unknown settings (§6.5.2): nothing to do.
        self.settings_received = True
        self._unusual = self._block is not None
        self._out.append(frame(SETTINGS, ACK, 0))
        events.append(_SETTINGS_CHANGED)
        if opened:
            events.append(WindowUpdated(0))

    def _on_push_promise(self, flags: int, stream_id: int, payload: memoryview,
                         events: list[Event]) -> None:
        raise ServerProtocolError(PROTOCOL_ERROR, "PUSH_PROMISE, though we disabled push")

    def _on_ping(self, flags: int, stream_id: int, payload: memoryview,
                 events: list[Event]) -> None:
        if stream_id:
            raise ServerProtocolError(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ServerProtocolError(FRAME_SIZE_ERROR, "PING is not 8 bytes")
        if flags & ACK:
            self._ignored(events)  # we send no PING: an ACK answers nothing
            return
        if not self._answered.spend():
            raise ServerProtocolError(ENHANCE_YOUR_CALM, "PING or SETTINGS flood")
        self._out.append(frame(PING, ACK, 0, bytes(payload)))
        events.append(_PINGED)

    def _on_goaway(self, flags: int, stream_id: int, payload: memoryview,
                   events: list[Event]) -> None:
        if stream_id:
            raise ServerProtocolError(PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ServerProtocolError(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
        last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        code = int.from_bytes(payload[4:8], "big")
        if self.goaway_received is not None:
            last = min(last, self.goaway_received)  # §6.8: it may only go down
        self.goaway_received = last
        self.goaway_error = code
        refused = sorted(sid for sid in self.streams if sid > last)
        for sid in refused:  # never processed: closed, and anything late for them ignored
            self._drop(sid)
            self._remember_reset(sid)
        events.append(ConnectionTerminated(code, last, refused))

    def _on_window_update(self, flags: int, stream_id: int, payload: memoryview,
                          events: list[Event]) -> None:
        if len(payload) != 4:
            raise ServerProtocolError(FRAME_SIZE_ERROR, "WINDOW_UPDATE is not 4 bytes")
        if not self._cheap.spend():
            raise ServerProtocolError(ENHANCE_YOUR_CALM, "WINDOW_UPDATE flood")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ServerProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ServerProtocolError(FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            events.append(WindowUpdated(0))
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if self._idle(stream_id):
                raise ServerProtocolError(PROTOCOL_ERROR,
                                          "WINDOW_UPDATE on a stream we did not open")
            events.append(_IGNORED)  # a closed stream: allowed for a while (§6.9)
            return
        if increment == 0:
            self._stream_error(stream_id, PROTOCOL_ERROR, events)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, events)
            return
        events.append(WindowUpdated(stream_id))

    # --- flow control of what we receive -------------------------------------------------------

    def acknowledge_received_data(self, n: int, stream_id: int) -> None:
        """The application took ``n`` flow-controlled bytes of ``stream_id``: give them back
        to the stream's window, in a WINDOW_UPDATE once half of it is used (not one per DATA
        frame), growing or shrinking the window as the module docstring says. The connection
        window needs nothing: it was given back on receipt."""
        stream = self.streams.get(stream_id)
        if n <= 0 or stream is None or not stream.remote_open:
            return  # nothing more will come on it
        stream.recv_unacked += n
        target = stream.recv_target
        if stream.recv_window > target >> 1:
            return
        increment, stream.recv_unacked = stream.recv_unacked, 0
        now = self._clock()
        since = now - stream.last_update
        stream.last_update = now
        budget = self._window_budget
        if budget is not None:
            initial = self._initial_window
            if since < GROW_WITHIN and target < self._max_stream_window:
                grow = budget.reserve(min(target, self._max_stream_window - target))
                stream.recv_target += grow
                increment += grow
            elif since > SHRINK_AFTER and target > initial:
                # Credit taken back from what the application returned: the bytes it still
                # holds (unacknowledged) stay counted, so the server never goes negative.
                shrink = min(increment, target - initial)
                stream.recv_target -= shrink
                budget.release(shrink)
                increment -= shrink
        if increment:
            stream.recv_window += increment
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big")))

    # --- output --------------------------------------------------------------------------------

    def _sending(self, stream_id: int) -> _Stream:
        stream = self.streams.get(stream_id)
        if stream is None or not stream.local_open:
            raise StreamClosedError(stream_id)
        return stream

    def _sent_end(self, stream_id: int, stream: _Stream) -> None:
        stream.local_open = False
        if not stream.remote_open:
            self._drop(stream_id)

    def send_headers(self, fields: Iterable[tuple[bytes, bytes]], end_stream: bool = False,
                     *, head_request: bool = False) -> int:
        """Open a stream with a request's header block (split into CONTINUATION frames past
        the server's frame size); returns its id. ``head_request``: a HEAD, whose response has
        no content whatever its content-length says. Raises :class:`NoNewStreams` unless
        :attr:`can_open`."""
        if not self.can_open:
            raise NoNewStreams("no new stream on this connection")
        return self._open(self.encoder.encode(fields), end_stream, head_request)

    def send_header_block(self, fields: bytes, end_stream: bool = False,
                          *, head_request: bool = False) -> int:
        """:meth:`send_headers` of fields already HPACK-encoded by
        :func:`gateway.wire.hpackfields.encode_fields` (no dynamic table: the encoder adds the
        table size update the first block carries)."""
        if not self.can_open:
            raise NoNewStreams("no new stream on this connection")
        return self._open(self.encoder.block(fields), end_stream, head_request)

    def _open(self, block: bytes, end_stream: bool, head_request: bool) -> int:
        stream_id = self.next_stream_id
        self.next_stream_id += 2
        self._out.extend(header_block_frames(stream_id, block, self.max_outbound_frame_size,
                                             end_stream))
        self.streams[stream_id] = _Stream(self._peer_initial_window, self._initial_window,
                                          not end_stream, head_request, self._clock())
        return stream_id

    def send_data(self, stream_id: int, data: bytes | bytearray | memoryview,
                  end_stream: bool = False) -> None:
        """Queue one DATA frame; ``data`` must fit :meth:`local_flow_control_window` and
        ``max_outbound_frame_size``."""
        stream = self._sending(stream_id)
        n = len(data)
        # An empty frame (END_STREAM alone) takes no window: it goes even when a SETTINGS
        # change made the stream's window negative (§6.9.2).
        if n and (n > self._send_window or n > stream.send_window
                  or n > self.max_outbound_frame_size):
            raise ValueError(f"{n} bytes do not fit the server's windows or frame size")
        self._send_window -= n
        stream.send_window -= n
        self._out.append(_pack_head(n >> 16, n & 0xFFFF, DATA, END_STREAM if end_stream else 0,
                                    stream_id))
        if n:
            self._out.append(bytes(data))
        if end_stream:
            self._sent_end(stream_id, stream)

    def end_stream(self, stream_id: int) -> None:
        self.send_data(stream_id, b"", end_stream=True)

    def reset_stream(self, stream_id: int, error_code: int) -> bool:
        """Queue RST_STREAM for a stream still open (False, nothing sent: it is closed)."""
        if self._broken or self._drop(stream_id) is None:
            return False
        self._out.append(frame(RST_STREAM, 0, stream_id, error_code.to_bytes(4, "big")))
        self._remember_reset(stream_id)
        return True

    def connection_lost(self) -> None:
        """The transport is gone: nothing more is accepted, and every stream is forgotten, its
        grown window back to the :class:`WindowBudget` the agent's other connections share
        (else each connection lost with a large transfer under way would keep its growth
        from them for good)."""
        self._broken = True
        self._pending = b""
        for stream_id in list(self.streams):
            self._drop(stream_id)

    def local_flow_control_window(self, stream_id: int) -> int:
        """How many bytes of DATA the server's windows take now on ``stream_id`` (0 or less:
        none)."""
        stream = self._sending(stream_id)
        return min(self._send_window, stream.send_window)

    def close_connection(self, error_code: int = NO_ERROR) -> None:
        """Queue GOAWAY (last stream 0: a server opens none). No stream is opened after it;
        the server may still finish the ones in flight."""
        if not self._goaway_sent and not self._broken:
            self._send_goaway(error_code)

    def _send_goaway(self, error_code: int) -> None:
        self._goaway_sent = True
        self._out.append(frame(GOAWAY, 0, 0, b"\0\0\0\0" + error_code.to_bytes(4, "big")))

    @property
    def has_data_to_send(self) -> bool:
        return bool(self._out)

    def data_to_send(self) -> bytes:
        out = self._out
        if not out:
            return b""
        data = b"".join(out)
        out.clear()
        return data

