"""The server side of one HTTP/2 connection (RFC 9113), sans-IO: bytes in, events out; calls
in, bytes out. The front door (:mod:`gateway.hub.frontdoor_h2`) is its only user.

Why not the ``h2`` library (the agent's client side has its own core too,
:mod:`gateway.wire.h2client`, which shares this module's frame constants and budgets): with its
validation off, its logging muted and our encoder, ``h2`` still cost about 48 µs to receive
one small request and send its response: frame objects, flag sets, two state machines per
stream, events with a dozen attributes, all pure Python. That is half of what the gateway
spends on a whole HTTP/1.1 request, and it is what kept 16 streams on one HTTP/2 connection
slower than 16 HTTP/1.1 connections. A server that only answers (no push, no priorities, no
client role) needs a small part of that machinery; this module is that part, and it costs a
few microseconds per request. HPACK decoding is :mod:`gateway.wire.hpackdecode`'s (hpack's
decoder took 8-16 µs per request block, ours 1-3), encoding :class:`FieldEncoder`'s.

What it does, and the RFC 9113 rules it enforces (a *connection error* queues GOAWAY with the
code and raises :class:`H2ConnectionError`; a *stream error* queues RST_STREAM and reports a
:class:`StreamReset` with ``remote_reset`` False):

* The client preface, then SETTINGS first (§3.4); frames up to 16,384 bytes, the default
  SETTINGS_MAX_FRAME_SIZE we keep (§4.2, FRAME_SIZE_ERROR); fixed-size frames checked
  (PING 8, WINDOW_UPDATE and RST_STREAM 4, PRIORITY 5, SETTINGS a multiple of 6).
* Streams are opened by the client only, on odd, increasing ids (§5.1.1); a HEADERS frame on a
  stream that is closed is STREAM_CLOSED, on an even id PROTOCOL_ERROR; frames other than
  HEADERS and PRIORITY on an idle stream are PROTOCOL_ERROR. A stream past
  ``max_concurrent_streams`` is refused alone (§5.1.2), as Go's server does: REFUSED_STREAM
  (safe to retry) while our SETTINGS are not acknowledged, so the client may not know the
  limit yet, PROTOCOL_ERROR after; either costs the client a reset from the front door's
  budget. PUSH_PROMISE from a client is PROTOCOL_ERROR.
* Header blocks: HEADERS and its CONTINUATION frames must follow each other with nothing in
  between (§6.10); a block longer than the header-list limit or spread over more than
  ``MAX_CONTINUATIONS`` frames is ENHANCE_YOUR_CALM (CVE-2024-27316), before it is decoded. A
  decoded list over ``max_header_list_size`` (an HPACK bomb) is ENHANCE_YOUR_CALM, any other
  decoding failure COMPRESSION_ERROR. A second HEADERS on a stream is trailers and must end it.
* Padding (§6.1, §6.2) is removed and checked; priorities are parsed and ignored (§5.3.2), a
  stream depending on itself is a stream error.
* A request's ``content-length`` is held against its DATA (§8.1.1): HEADERS with END_STREAM
  that declare a body, DATA past the declared length, and END_STREAM (on DATA or trailers)
  short of it are stream errors PROTOCOL_ERROR, found before the request or the offending
  DATA is handed on, so a malformed request is never forwarded. (The value's syntax, and
  every other message rule, is :func:`gateway.wire.http2.request_head_from_h2`'s.)
* SETTINGS: at most ``MAX_SETTINGS_ENTRIES`` (100) entries and no id twice in one frame, else
  PROTOCOL_ERROR, as Go's server does; so an INITIAL_WINDOW_SIZE change moves each open
  stream's window once per frame, never once per entry.
* Flow control (§6.9) both ways: received DATA counts against the connection's and the
  stream's windows (more is FLOW_CONTROL_ERROR); they are given back by
  :meth:`ServerConnection.acknowledge_received_data` once the application took the bytes, in
  WINDOW_UPDATEs sent when half a window is used. DATA is sent only within the client's
  windows (:meth:`ServerConnection.local_flow_control_window`); its INITIAL_WINDOW_SIZE changes
  move every open stream's window; a window over 2^31-1 is FLOW_CONTROL_ERROR.
* Frames for streams we reset are ignored (§5.4.2) for the last ``RECENT_RESETS`` of them;
  their DATA still goes back to the connection window.
* After our GOAWAY, new streams are refused with RST_STREAM REFUSED_STREAM (the client may
  retry them elsewhere) while the streams in flight finish.

Floods are bounded here too, frame by frame, by three token buckets (:class:`FrameBudget`):
stream resets, the client's or ours for its broken stream rules (rapid reset,
CVE-2023-44487); frames that cost us an answer (PING, SETTINGS), spent before the answer is
queued; frames that cost only parsing (WINDOW_UPDATE, PRIORITY, unknown types, ACKs, frames
for closed streams) and each entry of a SETTINGS frame. Past a budget: connection error
ENHANCE_YOUR_CALM. Checking them here, not on the events afterwards, means a read holding a
hundred PINGs past the budget queues no hundred PONGs first.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final

from mypy_extensions import mypyc_attr

from gateway.wire.hpackdecode import Decoder, HeaderListTooLarge, HPACKDecodeError
from gateway.wire.hpackfields import FieldEncoder
from gateway.wire.http1 import plain_content_length

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 §6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
# Flags
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# Error codes (§7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 5, 6, 7, 8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 9, 11
# Settings (§6.5.2)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 1, 2, 3, 4
MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 5, 6

DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1
FRAME_LIMIT: Final = 16384  # our SETTINGS_MAX_FRAME_SIZE: the default, so never announced
MAX_CONTINUATIONS = 64  # CONTINUATION frames per header block (as the h2 library allowed)
RECENT_RESETS = 1024  # streams we reset whose late frames are still ignored, not errors
RESET_BURST, RESET_RATE = 200, 50.0  # stream resets: burst, then per second
ANSWERED_BURST, ANSWERED_RATE = 200, 20.0  # PING and SETTINGS (each costs us an ACK)
CHEAP_BURST, CHEAP_RATE = 5000, 1000.0  # WINDOW_UPDATE, PRIORITY, unknown and ignored frames
MAX_SETTINGS_ENTRIES = 100  # per SETTINGS frame, as Go's server allows (each costs CHEAP)

_FRAME_HEAD = struct.Struct(">BHBBL")  # length (24 bits, as 8 + 16), type, flags, stream id
_SETTING = struct.Struct(">HL")
_pack_head = _FRAME_HEAD.pack

Fields = list[tuple[bytes, bytes]]


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame's bytes."""
    n = len(payload)
    return _pack_head(n >> 16, n & 0xFFFF, ftype, flags, stream_id) + payload


def header_block_frames(stream_id: int, block: bytes, max_frame_size: int,
                        end_stream: bool) -> list[bytes]:
    """A header block as HEADERS, then CONTINUATION frames past ``max_frame_size`` (both
    ends send their heads this way)."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame_size:
        return [frame(HEADERS, flags | END_HEADERS, stream_id, block)]
    pieces = [block[i:i + max_frame_size] for i in range(0, len(block), max_frame_size)]
    return ([frame(HEADERS, flags, stream_id, pieces[0])]
            + [frame(CONTINUATION, 0, stream_id, piece) for piece in pieces[1:-1]]
            + [frame(CONTINUATION, END_HEADERS, stream_id, pieces[-1])])


class FrameBudget:
    """A token bucket: ``spend()`` is False once the peer went past ``burst`` + ``rate``/s."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, burst: float, rate: float) -> None:
        self.burst = self.tokens = burst
        self.rate = rate
        self.stamp = time.monotonic()

    def spend(self, cost: int = 1) -> bool:
        """Take ``cost`` tokens; False (and nothing taken) when fewer are left."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < cost:
            return False
        self.tokens -= cost
        return True


# --- events -----------------------------------------------------------------------------------

class Event:
    __slots__ = ()


class RequestReceived(Event):
    """A stream's request head (``stream_ended``: it has no body)."""

    __slots__ = ("headers", "stream_ended", "stream_id")

    def __init__(self, stream_id: int, headers: Fields, stream_ended: bool) -> None:
        self.stream_id, self.headers, self.stream_ended = stream_id, headers, stream_ended


class DataReceived(Event):
    """Body bytes; ``flow_controlled_length`` (padding included) is what to acknowledge."""

    __slots__ = ("data", "flow_controlled_length", "stream_id")

    def __init__(self, stream_id: int, data: bytes, flow_controlled_length: int) -> None:
        self.stream_id, self.data = stream_id, data
        self.flow_controlled_length = flow_controlled_length


class StreamEnded(Event):
    """The client's side of the stream ended after its body (or trailers)."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class TrailersReceived(StreamEnded):
    """Trailers ended the stream (a :class:`StreamEnded` follows); they are not kept."""

    __slots__ = ()


class StreamReset(Event):
    """The stream is gone: the client reset it (``remote_reset``) or broke a stream rule and
    we did (``remote_reset`` False). Either way the client caused it."""

    __slots__ = ("error_code", "remote_reset", "stream_id")

    def __init__(self, stream_id: int, error_code: int, remote_reset: bool) -> None:
        self.stream_id, self.error_code, self.remote_reset = stream_id, error_code, remote_reset


class WindowUpdated(Event):
    """The client gave send credit on a stream (``stream_id``) or the connection (0)."""

    __slots__ = ("delta", "stream_id")

    def __init__(self, stream_id: int, delta: int) -> None:
        self.stream_id, self.delta = stream_id, delta


class PingReceived(Event):
    """A PING, answered (ACK queued)."""

    __slots__ = ()


class SettingsChanged(Event):
    """The client's SETTINGS, applied and acknowledged (ACK queued)."""

    __slots__ = ()


class ConnectionTerminated(Event):
    """The client sent GOAWAY."""

    __slots__ = ("error_code", "last_stream_id")

    def __init__(self, error_code: int, last_stream_id: int) -> None:
        self.error_code, self.last_stream_id = error_code, last_stream_id


class FrameIgnored(Event):
    """A frame that cost only parsing: PRIORITY, unknown types, PING and SETTINGS ACKs,
    WINDOW_UPDATE or RST_STREAM for a closed stream, frames for a stream we reset."""

    __slots__ = ()


_IGNORED = FrameIgnored()
_PINGED = PingReceived()
_SETTINGS_CHANGED = SettingsChanged()


# --- errors -----------------------------------------------------------------------------------

@mypyc_attr(native_class=False)
class H2ConnectionError(Exception):
    """The client broke a connection rule; GOAWAY with ``code`` is queued. The connection is
    over: write what :meth:`ServerConnection.data_to_send` returns, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@mypyc_attr(native_class=False)
class StreamClosedError(Exception):
    """Sending on a stream that is closed (or never was)."""


@mypyc_attr(native_class=False)
class _StreamError(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


# --- the connection ---------------------------------------------------------------------------

class _Stream:
    __slots__ = ("body_left", "local_open", "recv_unacked", "recv_window", "remote_open",
                 "send_window")

    def __init__(self, send_window: int, recv_window: int, remote_open: bool,
                 body_left: int) -> None:
        self.send_window = send_window  # what we may still send on it
        self.recv_window = recv_window  # what the client may still send on it
        self.recv_unacked = 0  # acknowledged by the application, not yet given back
        self.remote_open = remote_open
        self.local_open = True
        self.body_left = body_left  # content-length minus the DATA received; -1: none declared


def _declared_length(headers: Fields) -> int:
    """The request's ``content-length``, -1 when it declares none that parses (such a request
    is refused whole by :func:`gateway.wire.http2.request_head_from_h2`, before admission)."""
    for name, value in headers:
        if name == b"content-length":
            length = plain_content_length(value)
            return -1 if length is None else length
    return -1


class ServerConnection:
    """One HTTP/2 connection, server side. See the module docstring.

    ``max_concurrent_streams`` and ``max_header_list_size`` are announced in our SETTINGS and
    enforced from the first frame; ``initial_window_size`` is each stream's receive window and
    ``connection_window`` the connection's. The budgets default to the front door's."""

    def __init__(self, *, max_concurrent_streams: int, max_header_list_size: int,
                 initial_window_size: int = DEFAULT_WINDOW,
                 connection_window: int = DEFAULT_WINDOW,
                 encoder: FieldEncoder | None = None,
                 resets: FrameBudget | None = None,
                 answered: FrameBudget | None = None,
                 cheap: FrameBudget | None = None) -> None:
        self._resets = resets if resets is not None else FrameBudget(RESET_BURST, RESET_RATE)
        self._answered = (answered if answered is not None
                          else FrameBudget(ANSWERED_BURST, ANSWERED_RATE))
        self._cheap = cheap if cheap is not None else FrameBudget(CHEAP_BURST, CHEAP_RATE)
        self.max_concurrent_streams = max_concurrent_streams
        self.max_header_list_size = max_header_list_size
        self.streams: dict[int, _Stream] = {}
        self.highest_inbound_stream_id = 0
        self.max_outbound_frame_size = FRAME_LIMIT
        self.encoder = encoder if encoder is not None else FieldEncoder()
        self.decoder = Decoder(max_header_list_size)
        self._initial_window = initial_window_size
        self._connection_window = connection_window
        self._recv_window = DEFAULT_WINDOW  # until initiate() announces connection_window
        self._recv_unacked = 0
        self._send_window = DEFAULT_WINDOW
        self._peer_initial_window = DEFAULT_WINDOW
        self._out: list[bytes] = []
        self._pending = b""  # bytes of an incomplete frame (or preface)
        self._preface = True  # the client's preface has not arrived yet
        self._settings_first = True  # nor its first SETTINGS
        self._block: bytearray | None = None  # a header block waiting for CONTINUATION
        self._block_stream = 0
        self._block_flags = 0
        self._block_frames = 0
        self._goaway_last: int | None = None  # last stream id of our GOAWAY
        self._settings_acked = False  # the client acknowledged our SETTINGS (knows our limits)
        self._broken = False
        self._reset_order: deque[int] = deque()
        self._reset: set[int] = set()
        self._handlers: tuple[Callable[[int, int, bytes, list[Event]], None], ...] = (
            self._on_data, self._on_headers, self._on_priority, self._on_rst_stream,
            self._on_settings, self._on_push_promise, self._on_ping, self._on_goaway,
            self._on_window_update, self._on_continuation)

    # --- input ---------------------------------------------------------------------------------

    def initiate(self) -> None:
        """Queue our SETTINGS and the connection window beyond the default."""
        settings = b"".join(_SETTING.pack(k, v) for k, v in (
            (MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
            (MAX_HEADER_LIST_SIZE, self.max_header_list_size),
            (INITIAL_WINDOW_SIZE, self._initial_window),
            (ENABLE_PUSH, 0)))
        self._out.append(frame(SETTINGS, 0, 0, settings))
        extra = self._connection_window - DEFAULT_WINDOW
        if extra > 0:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, extra.to_bytes(4, "big")))
            self._recv_window += extra

    def receive_data(self, data: bytes) -> list[Event]:
        """The events in ``data``. Raises :class:`H2ConnectionError` (GOAWAY queued) when the
        client broke a connection rule; nothing is accepted after that."""
        if self._broken:
            return []
        if self._pending:
            data = self._pending + data
            self._pending = b""
        events: list[Event] = []
        pos = 0
        try:
            if self._preface:
                if len(data) < 24:
                    if not PREFACE.startswith(data):
                        raise H2ConnectionError(PROTOCOL_ERROR, "not the HTTP/2 preface")
                    self._pending = data
                    return events
                if not data.startswith(PREFACE):
                    raise H2ConnectionError(PROTOCOL_ERROR, "not the HTTP/2 preface")
                self._preface = False
                pos = 24
            end = len(data)
            handlers = self._handlers
            while end - pos >= 9:
                high, low, ftype, flags, stream_id = _FRAME_HEAD.unpack_from(data, pos)
                length = high << 16 | low
                if length > FRAME_LIMIT:
                    raise H2ConnectionError(FRAME_SIZE_ERROR, "frame larger than 16384 bytes")
                stop = pos + 9 + length
                if stop > end:
                    break
                payload = data[pos + 9:stop]
                pos = stop
                stream_id &= 0x7FFFFFFF
                if self._block is not None and ftype != CONTINUATION:
                    raise H2ConnectionError(PROTOCOL_ERROR, "header block interrupted")
                if self._settings_first:
                    if ftype != SETTINGS or flags & ACK:
                        raise H2ConnectionError(PROTOCOL_ERROR, "the preface lacks SETTINGS")
                    self._settings_first = False
                if ftype < 10:
                    handlers[ftype](flags, stream_id, payload, events)
                else:
                    self._ignored(events)  # unknown frame types are ignored (§5.5)
        except H2ConnectionError as exc:
            self._broken = True
            self._pending = b""
            self._send_goaway(exc.code)
            raise
        if pos < end:
            self._pending = data[pos:]
        return events

    def _idle(self, stream_id: int) -> bool:
        return stream_id > self.highest_inbound_stream_id or not stream_id & 1

    def _ignored(self, events: list[Event]) -> None:
        if not self._cheap.spend():
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "flood of frames that cost only parsing")
        events.append(_IGNORED)

    def _spend_reset(self) -> None:
        if not self._resets.spend():
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "rapid reset")

    def _stream_error(self, stream_id: int, code: int, events: list[Event]) -> None:
        self._spend_reset()
        self._out.append(frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))
        self.streams.pop(stream_id, None)
        self._remember_reset(stream_id)
        events.append(StreamReset(stream_id, code, False))

    def _remember_reset(self, stream_id: int) -> None:
        if stream_id in self._reset:
            return
        self._reset.add(stream_id)
        self._reset_order.append(stream_id)
        if len(self._reset_order) > RECENT_RESETS:
            self._reset.discard(self._reset_order.popleft())

    @staticmethod
    def _unpad(payload: bytes, fixed: int = 0) -> bytes:
        """``payload`` without its pad length and padding. ``fixed``: the bytes after the pad
        length that padding may not take (HEADERS' priority fields, §6.2)."""
        if fixed and len(payload) <= fixed:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "frame too short for its fields")
        if not payload or payload[0] >= len(payload) - fixed:
            raise H2ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1:len(payload) - payload[0]]

    def _on_data(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if stream_id == 0:
            raise H2ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        flow = len(payload)
        if flow > self._recv_window:
            raise H2ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_window -= flow
        if flags & PADDED:
            payload = self._unpad(payload)
        stream = self.streams.get(stream_id)
        if stream is None or not stream.remote_open:
            self._give_back(flow)  # nobody will acknowledge these
            if stream is None and self._idle(stream_id):
                raise H2ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            if stream is None and stream_id in self._reset:
                self._ignored(events)
            else:
                self._stream_error(stream_id, STREAM_CLOSED, events)
            return
        if flow > stream.recv_window:
            self._give_back(flow)
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, events)
            return
        if stream.body_left >= 0:
            # §8.1.1: DATA past the content-length, or END_STREAM short of it, is malformed;
            # this frame's bytes are not handed on (nothing of it may be forwarded).
            left = stream.body_left - len(payload)
            if left < 0 or (left and flags & END_STREAM):
                self._give_back(flow)
                self._stream_error(stream_id, PROTOCOL_ERROR, events)
                return
            stream.body_left = left
        stream.recv_window -= flow
        events.append(DataReceived(stream_id, payload, flow))
        if flags & END_STREAM:
            stream.remote_open = False
            events.append(StreamEnded(stream_id))
            if not stream.local_open:
                del self.streams[stream_id]

    def _on_headers(self, flags: int, stream_id: int, payload: bytes,
                    events: list[Event]) -> None:
        if stream_id == 0 or not stream_id & 1:
            raise H2ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0 or an even stream")
        if flags & PADDED:
            payload = self._unpad(payload, 5 if flags & PRIORITY_FLAG else 0)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream_id:
                flags |= 0x100  # depends on itself: a stream error once the block is decoded
            payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, flags, payload, events)
        else:
            self._block = bytearray(payload)
            self._block_stream, self._block_flags, self._block_frames = stream_id, flags, 0

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes,
                         events: list[Event]) -> None:
        block = self._block
        if block is None or stream_id != self._block_stream:
            raise H2ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block += payload
        self._block_frames += 1
        if self._block_frames > MAX_CONTINUATIONS \
                or len(block) > self.max_header_list_size + FRAME_LIMIT:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "header block too long")
        if flags & END_HEADERS:
            self._block = None
            self._header_block(stream_id, self._block_flags, bytes(block), events)

    def _header_block(self, stream_id: int, flags: int, block: bytes,
                      events: list[Event]) -> None:
        try:  # always decoded, even when refused: the HPACK table must stay in step
            headers: Fields = self.decoder.decode(block)
        except HeaderListTooLarge:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "header list too large") from None
        except HPACKDecodeError:
            raise H2ConnectionError(COMPRESSION_ERROR, "undecodable header block") from None
        end_stream = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # a second header block on a stream: trailers
            if not stream.remote_open:
                self._stream_error(stream_id, STREAM_CLOSED, events)
            elif not end_stream or stream.body_left > 0:  # trailers end it short: malformed
                self._stream_error(stream_id, PROTOCOL_ERROR, events)
            else:
                stream.remote_open = False
                events.append(TrailersReceived(stream_id))
                events.append(StreamEnded(stream_id))
                if not stream.local_open:
                    del self.streams[stream_id]
            return
        if stream_id <= self.highest_inbound_stream_id:
            if stream_id in self._reset:
                self._ignored(events)
                return
            raise H2ConnectionError(STREAM_CLOSED, "HEADERS on a closed stream")
        self.highest_inbound_stream_id = stream_id
        if self._goaway_last is not None or flags & 0x100:
            self._stream_error(stream_id, REFUSED_STREAM if self._goaway_last is not None
                               else PROTOCOL_ERROR, events)
            return
        body_left = _declared_length(headers)
        if end_stream and body_left > 0:
            # §8.1.1: a content-length with no body to match it is malformed. Refused here,
            # before the application sees the request, so that none of it is forwarded.
            self._stream_error(stream_id, PROTOCOL_ERROR, events)
            return
        if len(self.streams) >= self.max_concurrent_streams:
            self._stream_error(stream_id, PROTOCOL_ERROR if self._settings_acked
                               else REFUSED_STREAM, events)
            return
        self.streams[stream_id] = _Stream(self._peer_initial_window, self._initial_window,
                                          not end_stream, body_left)
        events.append(RequestReceived(stream_id, headers, end_stream))

    def _on_priority(self, flags: int, stream_id: int, payload: bytes,
                     events: list[Event]) -> None:
        if stream_id == 0:
            raise H2ConnectionError(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            self._stream_error(stream_id, FRAME_SIZE_ERROR, events)
        elif int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream_id:
            self._stream_error(stream_id, PROTOCOL_ERROR, events)
        else:
            self._ignored(events)

    def _on_rst_stream(self, flags: int, stream_id: int, payload: bytes,
                       events: list[Event]) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM is not 4 bytes")
        if stream_id == 0 or self._idle(stream_id):
            raise H2ConnectionError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        if self.streams.pop(stream_id, None) is None:
            self._ignored(events)
            return
        # Not remembered as one we reset: what the client sends on it after its own RST_STREAM
        # is a stream error STREAM_CLOSED (§5.1), answered once (then it is one we reset).
        self._spend_reset()
        events.append(StreamReset(stream_id, int.from_bytes(payload, "big"), True))

    def _on_settings(self, flags: int, stream_id: int, payload: bytes,
                     events: list[Event]) -> None:
        if stream_id:
            raise H2ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            self._settings_acked = True
            self._ignored(events)
            return
        if len(payload) % 6:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        entries = _SETTING.iter_unpack(payload)
        count = len(payload) // 6
        if count > MAX_SETTINGS_ENTRIES:
            # A handful of settings are defined; a long frame is only work for us.
            raise H2ConnectionError(PROTOCOL_ERROR, f"SETTINGS with more than "
                                                    f"{MAX_SETTINGS_ENTRIES} entries")
        if not self._answered.spend():
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "PING or SETTINGS flood")
        if count and not self._cheap.spend(count):
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "flood of SETTINGS entries")
        settings = dict(entries)
        if len(settings) != count:
            raise H2ConnectionError(PROTOCOL_ERROR, "SETTINGS with a repeated id")
        for key, value in settings.items():
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2ConnectionError(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                # Ids are not repeated: every open stream's window moves once per frame.
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                if delta:
                    for stream in self.streams.values():
                        stream.send_window += delta
                        if stream.send_window > MAX_WINDOW:
                            raise H2ConnectionError(FLOW_CONTROL_ERROR,
                                                    "a window went past 2^31-1")
            elif key == MAX_FRAME_SIZE:
                if not FRAME_LIMIT <= value <= 2**24 - 1:
                    raise H2ConnectionError(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self.max_outbound_frame_size = value
            elif key == ENABLE_PUSH and value > 1:
                raise H2ConnectionError(PROTOCOL_ERROR, "ENABLE_PUSH neither 0 nor 1")
            elif key == HEADER_TABLE_SIZE:
                self.encoder.header_table_size = value  # our encoder keeps no table anyway
            # MAX_CONCURRENT_STREAMS (we push nothing), MAX_HEADER_LIST_SIZE (advisory),
            # unknown settings (§6.5.2): nothing to do.
        self._out.append(frame(SETTINGS, ACK, 0))
        events.append(_SETTINGS_CHANGED)

    def _on_push_promise(self, flags: int, stream_id: int, payload: bytes,
                         events: list[Event]) -> None:
        raise H2ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def _on_ping(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if stream_id:
            raise H2ConnectionError(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "PING is not 8 bytes")
        if flags & ACK:
            self._ignored(events)
            return
        if not self._answered.spend():
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "PING or SETTINGS flood")
        self._out.append(frame(PING, ACK, 0, payload))
        events.append(_PINGED)

    def _on_goaway(self, flags: int, stream_id: int, payload: bytes,
                   events: list[Event]) -> None:
        if stream_id:
            raise H2ConnectionError(PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
        last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        events.append(ConnectionTerminated(int.from_bytes(payload[4:8], "big"), last))

    def _on_window_update(self, flags: int, stream_id: int, payload: bytes,
                          events: list[Event]) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE is not 4 bytes")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if not self._cheap.spend():
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "WINDOW_UPDATE flood")
        if stream_id == 0:
            if increment == 0:
                raise H2ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise H2ConnectionError(FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            events.append(WindowUpdated(0, increment))
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if self._idle(stream_id):
                raise H2ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            events.append(_IGNORED)  # a closed stream: allowed for a while (§6.9)
            return
        if increment == 0:
            self._stream_error(stream_id, PROTOCOL_ERROR, events)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, events)
            return
        events.append(WindowUpdated(stream_id, increment))

    # --- flow control of what we receive -------------------------------------------------------

    def acknowledge_received_data(self, n: int, stream_id: int) -> None:
        """The application took ``n`` flow-controlled bytes of ``stream_id``: give them back,
        in a WINDOW_UPDATE once half a window is used (not one per DATA frame)."""
        if n <= 0:
            return
        self._give_back(n)
        stream = self.streams.get(stream_id)
        if stream is None or not stream.remote_open:
            return  # nothing more will come on it: only the connection needs its bytes
        stream.recv_unacked += n
        if stream.recv_window <= self._initial_window // 2:
            increment, stream.recv_unacked = stream.recv_unacked, 0
            stream.recv_window += increment
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big")))

    def _give_back(self, n: int) -> None:
        self._recv_unacked += n
        if self._recv_window <= self._connection_window // 2:
            increment, self._recv_unacked = self._recv_unacked, 0
            self._recv_window += increment
            self._out.append(frame(WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big")))

    # --- output --------------------------------------------------------------------------------

    def _sending(self, stream_id: int) -> _Stream:
        stream = self.streams.get(stream_id)
        if stream is None or not stream.local_open:
            raise StreamClosedError(stream_id)
        return stream

    def _sent_end(self, stream_id: int, stream: _Stream) -> None:
        stream.local_open = False
        if not stream.remote_open:
            del self.streams[stream_id]

    def send_headers(self, stream_id: int, fields: Iterable[tuple[bytes, bytes]],
                     end_stream: bool = False) -> None:
        """Queue a header block (split into CONTINUATION frames past the client's frame size)."""
        stream = self._sending(stream_id)
        self._out.extend(header_block_frames(stream_id, self.encoder.encode(fields),
                                             self.max_outbound_frame_size, end_stream))
        if end_stream:
            self._sent_end(stream_id, stream)

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
            raise ValueError(f"{n} bytes do not fit the client's windows or frame size")
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

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        if self.streams.pop(stream_id, None) is None:
            raise StreamClosedError(stream_id)
        self._out.append(frame(RST_STREAM, 0, stream_id, error_code.to_bytes(4, "big")))
        self._remember_reset(stream_id)

    def local_flow_control_window(self, stream_id: int) -> int:
        """How many bytes of DATA the client's windows take now on ``stream_id``."""
        stream = self._sending(stream_id)
        return min(self._send_window, stream.send_window)

    def close_connection(self, error_code: int = NO_ERROR) -> None:
        """Queue GOAWAY (last stream: the highest the client opened). With NO_ERROR the streams
        in flight may still finish; new ones are refused."""
        self._send_goaway(error_code)

    def _send_goaway(self, error_code: int) -> None:
        last = self.highest_inbound_stream_id
        self._goaway_last = last
        self._out.append(frame(GOAWAY, 0, 0, last.to_bytes(4, "big")
                               + error_code.to_bytes(4, "big")))

    @property
    def has_data_to_send(self) -> bool:
        """Frames are queued (what :meth:`data_to_send` would return is not empty)."""
        return bool(self._out)

    def data_to_send(self) -> bytes:
        out = self._out
        if not out:
            return b""
        data = b"".join(out)
        out.clear()
        return data
