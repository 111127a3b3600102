"""gateway.wire.h2server: the front door's sans-IO HTTP/2 server core, byte by byte.

In the spirit of h2spec's server-side cases (RFC 9113 §3.4, §4.1-4.3, §5.1-5.5, §6.1-6.10,
§8.1): every test feeds hostile or ordinary client bytes (built with ``hyperframe`` or, where
the frame is malformed on purpose, with ``struct``), then checks the exact outcome read back
from :meth:`ServerConnection.data_to_send` (parsed with ``hyperframe``): the GOAWAY code and
:class:`H2ConnectionError.code` of a connection error, the RST_STREAM code and
:class:`StreamReset` of a stream error, or the events. No sockets: the front door's own tests
(tests/gateway/hub/test_frontdoor_h2*.py) go through real TLS.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from gateway.wire.h2server import (
    ANSWERED_BURST,
    CHEAP_BURST,
    MAX_CONTINUATIONS,
    MAX_SETTINGS_ENTRIES,
    PREFACE,
    RECENT_RESETS,
    RESET_BURST,
    ConnectionTerminated,
    DataReceived,
    Event,
    FrameBudget,
    H2ConnectionError,
    RequestReceived,
    ServerConnection,
    StreamClosedError,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)

# Frame types, flags, error codes and settings, spelled out here rather than imported: the test
# states the wire values the RFC gives, independently of the module under test.
T_DATA, T_HEADERS, T_PRIORITY, T_RST, T_SETTINGS, T_PUSH, T_PING, T_GOAWAY = range(8)
T_WINDOW_UPDATE, T_CONTINUATION = 8, 9
F_END_STREAM = F_ACK = 0x1
F_END_HEADERS, F_PADDED, F_PRIORITY = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 5, 6, 7, 8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 9, 11
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 1, 2, 3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 4, 5, 6

MAX_STREAMS = 8
HEADER_LIST_LIMIT = 8192
REQUEST = [(b":method", b"POST"), (b":scheme", b"https"), (b":path", b"/api/v1/pods"),
           (b":authority", b"gw")]
RESPONSE = [(b":status", b"200"), (b"content-type", b"application/json")]
PING_PAYLOAD = b"\x01\x02\x03\x04\x05\x06\x07\x08"


# --- helpers ----------------------------------------------------------------------------------

def raw(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """A frame as struct lays it out: no validation, for malformed frames."""
    n = len(payload)
    return struct.pack(">BHBBL", n >> 16, n & 0xFFFF, ftype, flags, stream_id) + payload


def setting(key: int, value: int) -> bytes:
    return struct.pack(">HL", key, value)


def parse(data: bytes) -> list[Frame]:
    """The frames in ``data``, parsed (and so validated) by hyperframe."""
    frames: list[Frame] = []
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= 9, "a truncated frame header"
        parsed, length = Frame.parse_frame_header(view[pos:pos + 9])
        assert pos + 9 + length <= len(data), "a truncated frame"
        parsed.parse_body(view[pos + 9:pos + 9 + length])
        frames.append(parsed)
        pos += 9 + length
    return frames


def ping(data: bytes = PING_PAYLOAD, ack: bool = False) -> bytes:
    return PingFrame(0, opaque_data=data, flags=["ACK"] if ack else []).serialize()


def data_frame(stream_id: int, data: bytes, end_stream: bool = False) -> bytes:
    return DataFrame(stream_id, data=data, flags=["END_STREAM"] if end_stream else []).serialize()


def window_update(stream_id: int, increment: int) -> bytes:
    return raw(T_WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))


def rst(stream_id: int, code: int) -> bytes:
    return RstStreamFrame(stream_id, error_code=code).serialize()


def settings(*pairs: tuple[int, int]) -> bytes:
    return raw(T_SETTINGS, 0, 0, b"".join(setting(k, v) for k, v in pairs))


def priority(stream_id: int, depends_on: int) -> bytes:
    return PriorityFrame(stream_id, depends_on=depends_on, stream_weight=15).serialize()


def summary(events: Iterable[Event]) -> list[tuple[object, ...]]:
    """Events as comparable tuples (the classes have slots, no __eq__)."""
    out: list[tuple[object, ...]] = []
    for e in events:
        name = type(e).__name__
        if isinstance(e, RequestReceived):
            out.append((name, e.stream_id, tuple(e.headers), e.stream_ended))
        elif isinstance(e, DataReceived):
            out.append((name, e.stream_id, e.data, e.flow_controlled_length))
        elif isinstance(e, StreamReset):
            out.append((name, e.stream_id, e.error_code, e.remote_reset))
        elif isinstance(e, WindowUpdated):
            out.append((name, e.stream_id, e.delta))
        elif isinstance(e, ConnectionTerminated):
            out.append((name, e.error_code, e.last_stream_id))
        elif isinstance(e, StreamEnded):  # TrailersReceived too (the name tells them apart)
            out.append((name, e.stream_id))
        else:
            out.append((name,))
    return out


class Client:
    """A client's side, by hand: its own HPACK encoder (with a dynamic table, as real clients
    use) and a server connection past the preface and SETTINGS exchange."""

    def __init__(self, *, max_concurrent_streams: int = MAX_STREAMS,
                 max_header_list_size: int = HEADER_LIST_LIMIT,
                 client_settings: bytes = b"", **kwargs: Any) -> None:
        self.encoder = hpack.Encoder()
        self.server = ServerConnection(max_concurrent_streams=max_concurrent_streams,
                                       max_header_list_size=max_header_list_size, **kwargs)
        self.server.initiate()
        self.server_settings = parse(self.server.data_to_send())
        events = self.server.receive_data(PREFACE + raw(T_SETTINGS, 0, 0, client_settings))
        assert summary(events) == [("SettingsChanged",)]
        ack = parse(self.server.data_to_send())
        assert len(ack) == 1 and isinstance(ack[0], SettingsFrame) and "ACK" in ack[0].flags

    def block(self, fields: Iterable[tuple[bytes, bytes]] = REQUEST) -> bytes:
        return self.encoder.encode(list(fields))

    def headers(self, stream_id: int, fields: Iterable[tuple[bytes, bytes]] = REQUEST, *,
                end_stream: bool = True) -> bytes:
        flags = F_END_HEADERS | (F_END_STREAM if end_stream else 0)
        return raw(T_HEADERS, flags, stream_id, self.block(fields))

    def send(self, data: bytes) -> list[tuple[object, ...]]:
        return summary(self.server.receive_data(data))

    def out(self) -> list[Frame]:
        return parse(self.server.data_to_send())

    def open(self, stream_id: int, *, end_stream: bool = False) -> None:
        assert self.send(self.headers(stream_id, end_stream=end_stream)) == [
            ("RequestReceived", stream_id, tuple(REQUEST), end_stream)]
        assert self.out() == []

    def connection_error(self, data: bytes, code: int) -> H2ConnectionError:
        """``data`` breaks a connection rule: GOAWAY ``code`` (last stream: the highest opened),
        and nothing is accepted after."""
        with pytest.raises(H2ConnectionError) as info:
            self.server.receive_data(data)
        assert info.value.code == code
        frames = self.out()
        assert isinstance(frames[-1], GoAwayFrame), frames
        assert frames[-1].error_code == code
        assert frames[-1].last_stream_id == self.server.highest_inbound_stream_id
        assert not any(isinstance(f, GoAwayFrame) for f in frames[:-1])
        assert self.server.receive_data(ping()) == []
        assert self.server.receive_data(self.headers(101)) == []
        assert self.server.data_to_send() == b""
        return info.value

    def stream_error(self, data: bytes, stream_id: int, code: int) -> None:
        """``data`` breaks a rule of ``stream_id`` only: RST_STREAM ``code`` and a StreamReset
        we initiated; the connection goes on (a PING is answered)."""
        assert self.send(data) == [("StreamReset", stream_id, code, False)]
        frames = self.out()
        assert len(frames) == 1 and isinstance(frames[0], RstStreamFrame), frames
        assert (frames[0].stream_id, frames[0].error_code) == (stream_id, code)
        assert stream_id not in self.server.streams
        self.assert_alive()

    def assert_alive(self) -> None:
        assert self.send(ping()) == [("PingReceived",)]
        frames = self.out()
        assert len(frames) == 1 and isinstance(frames[0], PingFrame)
        assert "ACK" in frames[0].flags and frames[0].opaque_data == PING_PAYLOAD


def fresh(**kwargs: int) -> ServerConnection:
    server = ServerConnection(max_concurrent_streams=MAX_STREAMS,
                              max_header_list_size=HEADER_LIST_LIMIT, **kwargs)
    server.initiate()
    server.data_to_send()
    return server


# --- §3.4: the connection preface -------------------------------------------------------------

def test_our_settings_announce_limits_windows_and_no_push() -> None:
    client = Client(initial_window_size=1000, connection_window=100_000)
    first, update = client.server_settings
    assert isinstance(first, SettingsFrame) and not first.flags
    assert first.settings == {S_MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                              S_MAX_HEADER_LIST_SIZE: HEADER_LIST_LIMIT,
                              S_INITIAL_WINDOW_SIZE: 1000, S_ENABLE_PUSH: 0}
    assert isinstance(update, WindowUpdateFrame)
    assert (update.stream_id, update.window_increment) == (0, 100_000 - 65535)


def test_default_connection_window_needs_no_window_update() -> None:
    assert [type(f) for f in Client().server_settings] == [SettingsFrame]


def test_has_data_to_send_says_whether_frames_are_queued() -> None:
    """The front door schedules a write only when frames are queued: a request's HEADERS
    queue nothing, a PING queues its ACK until taken."""
    client = Client()
    assert not client.server.has_data_to_send
    client.open(1, end_stream=True)
    assert not client.server.has_data_to_send
    client.send(ping())
    assert client.server.has_data_to_send
    assert client.out() and not client.server.has_data_to_send


def test_preface_and_settings_split_at_every_byte() -> None:
    wire = PREFACE + settings((S_MAX_FRAME_SIZE, 20000)) + ping()
    for cut in range(1, len(wire)):
        server = fresh()
        events = summary(server.receive_data(wire[:cut])) + summary(
            server.receive_data(wire[cut:]))
        assert events == [("SettingsChanged",), ("PingReceived",)], cut
        acks = parse(server.data_to_send())
        assert [type(f) for f in acks] == [SettingsFrame, PingFrame], cut
    server = fresh()  # and one byte per call
    events = []
    for i in range(len(wire)):
        events += summary(server.receive_data(wire[i:i + 1]))
    assert events == [("SettingsChanged",), ("PingReceived",)]
    assert server.max_outbound_frame_size == 20000


@pytest.mark.parametrize("index", range(len(PREFACE)))
def test_wrong_preface_byte_is_protocol_error_as_soon_as_it_arrives(index: int) -> None:
    wrong = bytearray(PREFACE)
    wrong[index] ^= 0x20
    server = fresh()
    with pytest.raises(H2ConnectionError) as info:
        server.receive_data(bytes(wrong[:index + 1]))  # the bad byte is the last one seen
    assert info.value.code == PROTOCOL_ERROR
    [goaway] = parse(server.data_to_send())
    assert isinstance(goaway, GoAwayFrame)
    assert (goaway.error_code, goaway.last_stream_id) == (PROTOCOL_ERROR, 0)
    assert server.receive_data(PREFACE + settings()) == []
    assert server.data_to_send() == b""


def test_http1_request_instead_of_preface_is_protocol_error() -> None:
    server = fresh()
    with pytest.raises(H2ConnectionError) as info:
        server.receive_data(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert info.value.code == PROTOCOL_ERROR


@pytest.mark.parametrize("first", [
    ping(),
    raw(T_SETTINGS, F_ACK, 0),
    raw(T_HEADERS, F_END_HEADERS | F_END_STREAM, 1, hpack.Encoder().encode(REQUEST)),
    window_update(0, 100),
    raw(0xFA, 0, 0, b"unknown"),
], ids=["ping", "settings-ack", "headers", "window-update", "unknown-type"])
def test_first_frame_not_settings_is_protocol_error(first: bytes) -> None:
    server = fresh()
    with pytest.raises(H2ConnectionError) as info:
        server.receive_data(PREFACE + first)
    assert info.value.code == PROTOCOL_ERROR
    [goaway] = parse(server.data_to_send())
    assert isinstance(goaway, GoAwayFrame) and goaway.error_code == PROTOCOL_ERROR
    assert server.streams == {}


# --- §4.1: frame format -----------------------------------------------------------------------

def test_unknown_frame_type_is_ignored() -> None:
    client = Client()
    assert client.send(raw(0xFA, 0xFF, 0, b"x" * 100) + raw(0x20, 0, 7, b"")) == [
        ("FrameIgnored",), ("FrameIgnored",)]
    assert client.out() == []
    client.assert_alive()


def test_undefined_flags_and_reserved_bit_are_ignored() -> None:
    client = Client()
    assert client.send(raw(T_PING, 0xFE, 0x80000000, PING_PAYLOAD)) == [("PingReceived",)]
    [pong] = client.out()
    assert isinstance(pong, PingFrame) and pong.flags == {"ACK"}
    block = client.block()
    assert client.send(raw(T_HEADERS, F_END_HEADERS | F_END_STREAM | 0x40, 0x80000001,
                           block)) == [("RequestReceived", 1, tuple(REQUEST), True)]


# --- §4.2: frame size -------------------------------------------------------------------------

def test_data_of_16384_bytes_is_accepted() -> None:
    client = Client()
    client.open(1)
    assert client.send(data_frame(1, b"a" * 16384, end_stream=True)) == [
        ("DataReceived", 1, b"a" * 16384, 16384), ("StreamEnded", 1)]


@pytest.mark.parametrize("ftype", [T_DATA, T_HEADERS, T_PING, 0xFA])
def test_frame_larger_than_16384_is_frame_size_error(ftype: int) -> None:
    client = Client()
    client.open(1)
    # The header alone decides: the payload need not have arrived.
    head = struct.pack(">BHBBL", 0, 16385, ftype, 0, 1 if ftype != T_PING else 0)
    client.connection_error(head, FRAME_SIZE_ERROR)


@pytest.mark.parametrize("wire", [
    raw(T_PING, 0, 0, b"\0" * 7), raw(T_PING, 0, 0, b"\0" * 9),
    raw(T_PING, F_ACK, 0, b"\0" * 7),
    raw(T_WINDOW_UPDATE, 0, 0, b"\0\0\1"), raw(T_WINDOW_UPDATE, 0, 0, b"\0\0\0\0\1"),
    raw(T_WINDOW_UPDATE, 0, 1, b"\0\0\1"), raw(T_WINDOW_UPDATE, 0, 1, b"\0\0\0\0\1"),
    raw(T_RST, 0, 1, b"\0\0\0"), raw(T_RST, 0, 1, b"\0\0\0\0\0"),
    raw(T_SETTINGS, 0, 0, b"\0" * 5), raw(T_SETTINGS, 0, 0, b"\0" * 7),
    raw(T_SETTINGS, F_ACK, 0, b"\0" * 6),
    raw(T_GOAWAY, 0, 0, b"\0" * 7),
    raw(T_HEADERS, F_PRIORITY | F_END_HEADERS, 3, b"\0\0\0"),
    raw(T_HEADERS, F_PADDED | F_PRIORITY | F_END_HEADERS, 3, b"\0" * 5),
], ids=["ping-7", "ping-9", "ping-ack-7", "wu0-3", "wu0-5", "wu1-3", "wu1-5", "rst-3", "rst-5",
        "settings-5", "settings-7", "settings-ack-6", "goaway-7", "headers-priority-3",
        "headers-padded-priority-5"])
def test_fixed_size_frame_with_wrong_length_is_frame_size_error(wire: bytes) -> None:
    client = Client()
    client.open(1)
    client.connection_error(wire, FRAME_SIZE_ERROR)


@pytest.mark.parametrize("length", [4, 6])
def test_priority_with_wrong_length_is_stream_frame_size_error(length: int) -> None:
    client = Client()
    client.open(1)
    client.stream_error(raw(T_PRIORITY, 0, 1, b"\0" * length), 1, FRAME_SIZE_ERROR)


# --- §4.3 and HPACK ---------------------------------------------------------------------------

@pytest.mark.parametrize("block", [b"\x80", b"\x3f\xff\xff\xff\xff\xff", b"\x00\x85abc"],
                         ids=["index-0", "table-size-overflow", "truncated-literal"])
def test_undecodable_header_block_is_compression_error(block: bytes) -> None:
    client = Client()
    client.connection_error(raw(T_HEADERS, F_END_HEADERS | F_END_STREAM, 1, block),
                            COMPRESSION_ERROR)


def test_header_list_over_the_limit_is_enhance_your_calm() -> None:
    client = Client(max_header_list_size=1000)
    fields = [*REQUEST, (b"x-big", b"v" * 1000)]
    client.connection_error(client.headers(1, fields), ENHANCE_YOUR_CALM)
    assert client.server.streams == {}


def test_hpack_bomb_of_indexed_references_is_enhance_your_calm() -> None:
    # One 3,000-byte field enters the client's table; the next block names it three times in
    # three bytes each: a few bytes on the wire, 9,000 decoded.
    client = Client(max_header_list_size=4096)
    fields = [*REQUEST, (b"x-big", b"v" * 3000)]
    assert client.send(client.headers(1, fields))[0][0] == "RequestReceived"
    bomb = client.block([*REQUEST, *[(b"x-big", b"v" * 3000)] * 3])
    assert len(bomb) < 20
    client.connection_error(raw(T_HEADERS, F_END_HEADERS | F_END_STREAM, 3, bomb),
                            ENHANCE_YOUR_CALM)


def test_hpack_table_stays_in_step_when_a_stream_is_refused() -> None:
    client = Client()
    client.open(1)
    client.server.close_connection(NO_ERROR)
    [goaway] = client.out()
    assert isinstance(goaway, GoAwayFrame) and goaway.last_stream_id == 1
    # Stream 3 is refused, but its block added x-token to both tables.
    fields = [*REQUEST, (b"x-token", b"first-value")]
    assert client.send(client.headers(3, fields)) == [("StreamReset", 3, REFUSED_STREAM, False)]
    [refusal] = client.out()
    assert isinstance(refusal, RstStreamFrame) and refusal.error_code == REFUSED_STREAM
    # Stream 1's trailers name the oldest entry of the client's table (stream 1's :path), by
    # an index that exists only if stream 3's block entered the server's table too.
    entries = len(client.encoder.header_table.dynamic_entries)
    assert entries == 3  # :path and :authority of stream 1, x-token of stream 3
    trailers = bytes((0x80 | (61 + entries),))
    assert client.send(raw(T_HEADERS, F_END_HEADERS | F_END_STREAM, 1, trailers)) == [
        ("TrailersReceived", 1), ("StreamEnded", 1)]


def test_hpack_table_stays_in_step_for_a_self_dependent_stream_and_later_requests() -> None:
    client = Client()
    fields = [*REQUEST, (b"x-audit", b"abc")]
    block = client.block(fields)
    prio = struct.pack(">LB", 1, 15)
    assert client.send(raw(T_HEADERS, F_PRIORITY | F_END_HEADERS | F_END_STREAM, 1,
                           prio + block)) == [("StreamReset", 1, PROTOCOL_ERROR, False)]
    client.out()
    again = client.block(fields)
    assert len(again) < len(block)  # indexed now: decodable only with the refused block's entry
    assert client.send(raw(T_HEADERS, F_END_HEADERS | F_END_STREAM, 3, again)) == [
        ("RequestReceived", 3, tuple(fields), True)]


# --- §5.1: stream states ----------------------------------------------------------------------

@pytest.mark.parametrize("wire", [
    data_frame(1, b"test", end_stream=True),
    rst(1, CANCEL),
    window_update(1, 100),
    raw(T_CONTINUATION, F_END_HEADERS, 1, hpack.Encoder().encode(REQUEST)),
], ids=["data", "rst-stream", "window-update", "continuation"])
def test_frame_on_an_idle_stream_is_protocol_error(wire: bytes) -> None:
    Client().connection_error(wire, PROTOCOL_ERROR)


@pytest.mark.parametrize("wire", [data_frame(5, b"x"), window_update(5, 1), rst(5, CANCEL),
                                  data_frame(2, b"x"), window_update(2, 1), rst(2, CANCEL)],
                         ids=["data-5", "wu-5", "rst-5", "data-2", "wu-2", "rst-2"])
def test_frame_on_an_idle_stream_above_open_ones_is_protocol_error(wire: bytes) -> None:
    client = Client()
    client.open(1)
    client.open(3)
    client.connection_error(wire, PROTOCOL_ERROR)


def test_data_after_end_stream_is_stream_closed() -> None:  # half-closed (remote)
    client = Client()
    client.open(1, end_stream=True)
    client.server.send_headers(1, RESPONSE)
    client.out()
    client.stream_error(data_frame(1, b"test", end_stream=True), 1, STREAM_CLOSED)
    with pytest.raises(StreamClosedError):  # the stream is gone for us too
        client.server.send_data(1, b"late")


def test_data_after_end_stream_on_data_is_stream_closed() -> None:
    client = Client()
    client.open(1)
    assert client.send(data_frame(1, b"body", end_stream=True)) == [
        ("DataReceived", 1, b"body", 4), ("StreamEnded", 1)]
    client.stream_error(data_frame(1, b"more"), 1, STREAM_CLOSED)


def test_second_headers_after_end_stream_is_stream_closed() -> None:
    client = Client()
    client.open(1, end_stream=True)
    client.stream_error(client.headers(1), 1, STREAM_CLOSED)


def test_continuation_on_half_closed_stream_is_protocol_error() -> None:
    client = Client()
    client.open(1, end_stream=True)
    client.connection_error(raw(T_CONTINUATION, F_END_HEADERS, 1, client.block()),
                            PROTOCOL_ERROR)


def test_frames_after_the_clients_rst_stream_are_stream_closed_once() -> None:
    # §5.1 closed: "An endpoint that receives any frame other than PRIORITY after receiving a
    # RST_STREAM MUST treat that as a stream error of type STREAM_CLOSED." Our RST_STREAM makes
    # it a stream we reset: what follows is ignored (§5.4.2), not answered again.
    client = Client()
    client.open(1)
    assert client.send(rst(1, CANCEL)) == [("StreamReset", 1, CANCEL, True)]
    assert client.out() == []
    assert client.send(priority(1, 0)) == [("FrameIgnored",)]
    client.stream_error(data_frame(1, b"test", end_stream=True), 1, STREAM_CLOSED)
    assert client.send(data_frame(1, b"again")) == [("FrameIgnored",)]
    assert client.out() == []


def test_window_update_and_rst_stream_after_the_clients_rst_stream_are_ignored() -> None:
    client = Client()
    client.open(1)
    assert client.send(rst(1, CANCEL)) == [("StreamReset", 1, CANCEL, True)]
    assert client.send(window_update(1, 10) + rst(1, CANCEL)) == [
        ("FrameIgnored",), ("FrameIgnored",)]
    assert client.out() == []
    client.assert_alive()


def test_headers_after_the_clients_rst_stream_is_stream_closed() -> None:
    client = Client()
    client.open(1)
    client.send(rst(1, CANCEL))
    client.connection_error(client.headers(1), STREAM_CLOSED)


def test_data_on_a_closed_stream_is_stream_closed() -> None:
    client = Client()
    client.open(1, end_stream=True)
    client.server.send_headers(1, RESPONSE, end_stream=True)
    client.out()
    assert 1 not in client.server.streams
    client.stream_error(data_frame(1, b"test", end_stream=True), 1, STREAM_CLOSED)


def test_headers_on_a_closed_stream_is_connection_stream_closed() -> None:
    client = Client()
    client.open(1, end_stream=True)
    client.server.send_headers(1, RESPONSE, end_stream=True)
    client.out()
    client.connection_error(client.headers(1), STREAM_CLOSED)


def test_continuation_on_a_closed_stream_is_protocol_error() -> None:
    client = Client()
    client.open(1, end_stream=True)
    client.server.send_headers(1, RESPONSE, end_stream=True)
    client.out()
    client.connection_error(raw(T_CONTINUATION, F_END_HEADERS, 1, client.block()),
                            PROTOCOL_ERROR)


def test_window_update_on_a_closed_stream_is_ignored() -> None:
    client = Client()
    client.open(1, end_stream=True)
    client.server.send_headers(1, RESPONSE, end_stream=True)
    client.out()
    assert client.send(window_update(1, 100)) == [("FrameIgnored",)]
    assert client.out() == []


# --- §5.1.1: stream identifiers ---------------------------------------------------------------

def test_headers_on_an_even_stream_is_protocol_error() -> None:
    client = Client()
    client.connection_error(client.headers(2), PROTOCOL_ERROR)


def test_headers_on_stream_0_is_protocol_error() -> None:
    client = Client()
    client.connection_error(client.headers(0), PROTOCOL_ERROR)


def test_headers_on_a_lower_id_than_one_opened_is_a_connection_error() -> None:
    # §5.1.1 says PROTOCOL_ERROR ("unexpected stream identifier"); stream 3 is also closed
    # (implicitly, §5.1.1), and we keep no record of which lower ids were used, so it is the
    # closed-stream code (as the h2 library answered). Either way the connection ends.
    client = Client()
    client.open(5, end_stream=True)
    client.connection_error(client.headers(3), STREAM_CLOSED)
    assert client.server.highest_inbound_stream_id == 5


def test_skipped_ids_are_allowed() -> None:
    client = Client()
    client.open(1)
    client.open(7)
    client.open(101)
    assert sorted(client.server.streams) == [1, 7, 101]


# --- §5.1.2: concurrency ----------------------------------------------------------------------

def test_a_stream_past_max_concurrent_streams_is_refused_alone() -> None:
    """Before the client acknowledged our SETTINGS it may not know the limit: REFUSED_STREAM
    (it may retry); after, PROTOCOL_ERROR. Never opened, and the connection goes on."""
    client = Client(max_concurrent_streams=2)
    client.open(1, end_stream=True)  # half-closed (remote): still counts
    client.open(3)
    client.stream_error(client.headers(5), 5, REFUSED_STREAM)
    assert client.send(raw(T_SETTINGS, F_ACK, 0)) == [("FrameIgnored",)]
    client.stream_error(client.headers(7), 7, PROTOCOL_ERROR)
    assert sorted(client.server.streams) == [1, 3]
    client.server.reset_stream(3, CANCEL)
    client.out()
    client.open(9)  # a place came free: the next stream opens


def test_a_closed_stream_frees_its_place() -> None:
    client = Client(max_concurrent_streams=2)
    client.open(1, end_stream=True)
    client.open(3)
    client.server.send_headers(1, RESPONSE, end_stream=True)  # stream 1 is closed now
    client.server.reset_stream(3, CANCEL)
    assert [f.stream_id for f in client.out()] == [1, 3]
    client.open(5)
    client.open(7)
    assert sorted(client.server.streams) == [5, 7]


def test_a_stream_the_client_reset_frees_its_place() -> None:
    client = Client(max_concurrent_streams=1)
    client.open(1)
    assert client.send(rst(1, CANCEL)) == [("StreamReset", 1, CANCEL, True)]
    client.open(3)


# --- §5.3.1: dependencies ---------------------------------------------------------------------

def test_headers_depending_on_itself_is_stream_protocol_error() -> None:
    client = Client()
    prio = struct.pack(">LB", 0x80000001, 15)  # exclusive bit set: still stream 1
    client.stream_error(raw(T_HEADERS, F_PRIORITY | F_END_HEADERS | F_END_STREAM, 1,
                            prio + client.block()), 1, PROTOCOL_ERROR)


def test_priority_depending_on_itself_is_stream_protocol_error() -> None:
    client = Client()
    client.open(1)
    client.stream_error(priority(1, 1), 1, PROTOCOL_ERROR)


def test_priority_is_parsed_and_ignored_on_any_stream() -> None:
    client = Client()
    client.open(1)
    assert client.send(priority(1, 0) + priority(9, 1) + priority(2, 0)) == [
        ("FrameIgnored",)] * 3
    assert client.out() == []
    assert client.server.highest_inbound_stream_id == 1  # PRIORITY opens nothing
    client.open(3)


def test_priority_on_stream_0_is_protocol_error() -> None:
    client = Client()
    client.connection_error(raw(T_PRIORITY, 0, 0, struct.pack(">LB", 1, 15)), PROTOCOL_ERROR)


def test_headers_with_priority_flag_is_accepted() -> None:
    client = Client()
    prio = struct.pack(">LB", 0, 200)
    assert client.send(raw(T_HEADERS, F_PRIORITY | F_END_HEADERS, 1, prio + client.block())) \
        == [("RequestReceived", 1, tuple(REQUEST), False)]


# --- §5.4: error handling ---------------------------------------------------------------------

def test_nothing_is_accepted_after_a_connection_error_even_in_the_same_buffer() -> None:
    client = Client()
    client.open(1)
    wire = data_frame(1, b"before") + raw(T_PING, 0, 1, PING_PAYLOAD) + ping() \
        + data_frame(1, b"after")
    with pytest.raises(H2ConnectionError):
        client.server.receive_data(wire)
    frames = client.out()
    assert [type(f) for f in frames] == [GoAwayFrame]  # no PING ACK
    assert frames[0].last_stream_id == 1
    for later in (ping(), settings(), client.headers(3), data_frame(1, b"x"), b"junk"):
        assert client.server.receive_data(later) == []
    assert client.server.data_to_send() == b""


def test_a_stream_error_leaves_other_streams_working() -> None:
    client = Client()
    client.open(1)
    client.open(3)
    client.stream_error(priority(3, 3), 3, PROTOCOL_ERROR)
    assert client.send(data_frame(1, b"ok", end_stream=True)) == [
        ("DataReceived", 1, b"ok", 2), ("StreamEnded", 1)]
    client.server.send_headers(1, RESPONSE, end_stream=True)
    assert [type(f) for f in client.out()] == [HeadersFrame]


# --- §5.5: extensions -------------------------------------------------------------------------

def test_unknown_frame_inside_a_header_block_is_protocol_error() -> None:
    client = Client()
    block = client.block()
    client.connection_error(raw(T_HEADERS, F_END_STREAM, 1, block[:2])
                            + raw(0xFA, 0, 0, b"x")
                            + raw(T_CONTINUATION, F_END_HEADERS, 1, block[2:]), PROTOCOL_ERROR)


def test_unknown_settings_are_ignored() -> None:
    client = Client()
    assert client.send(settings((0x99, 12345), (0xFFFF, 2**32 - 1))) == [("SettingsChanged",)]
    [ack] = client.out()
    assert isinstance(ack, SettingsFrame) and ack.flags == {"ACK"} and not ack.settings


# --- §6.1: DATA ---------------------------------------------------------------------------------

def test_data_on_stream_0_is_protocol_error() -> None:
    client = Client()
    client.connection_error(raw(T_DATA, F_END_STREAM, 0, b"test"), PROTOCOL_ERROR)


@pytest.mark.parametrize(("pad", "body"), [(0, b"body"), (10, b"body"), (255, b"body"),
                                           (3, b"")])
def test_padded_data_yields_the_data_and_counts_the_padding(pad: int, body: bytes) -> None:
    client = Client()
    client.open(1)
    payload = bytes((pad,)) + body + b"\0" * pad
    assert client.send(raw(T_DATA, F_PADDED | F_END_STREAM, 1, payload)) == [
        ("DataReceived", 1, body, len(payload)), ("StreamEnded", 1)]


@pytest.mark.parametrize("payload", [b"", b"\x01", b"\x04abc", b"\x05abc", b"\xff" + b"a" * 200],
                         ids=["empty", "pad1-len1", "pad4-len4", "pad5-len4", "pad255-len201"])
def test_data_padding_as_long_as_the_payload_is_protocol_error(payload: bytes) -> None:
    client = Client()
    client.open(1)
    client.connection_error(raw(T_DATA, F_PADDED, 1, payload), PROTOCOL_ERROR)


# --- §6.2: HEADERS ----------------------------------------------------------------------------

@pytest.mark.parametrize("with_priority", [False, True])
@pytest.mark.parametrize("pad", [0, 7, 255])
def test_padded_headers_are_accepted(pad: int, with_priority: bool) -> None:
    client = Client()
    prio = struct.pack(">LB", 0, 15) if with_priority else b""
    payload = bytes((pad,)) + prio + client.block() + b"\0" * pad
    flags = F_PADDED | F_END_HEADERS | (F_PRIORITY if with_priority else 0)
    assert client.send(raw(T_HEADERS, flags, 1, payload)) == [
        ("RequestReceived", 1, tuple(REQUEST), False)]


def test_padded_headers_may_have_an_empty_fragment_completed_by_continuation() -> None:
    client = Client()
    prio = struct.pack(">LB", 0, 15)
    payload = b"\x04" + prio + b"\0" * 4  # the padding takes all the room after the priority
    wire = raw(T_HEADERS, F_PADDED | F_PRIORITY | F_END_STREAM, 1, payload) \
        + raw(T_CONTINUATION, F_END_HEADERS, 1, client.block())
    assert client.send(wire) == [("RequestReceived", 1, tuple(REQUEST), True)]


@pytest.mark.parametrize("with_priority", [False, True])
def test_headers_padding_longer_than_the_fragment_is_protocol_error(
        with_priority: bool) -> None:
    # §6.2: "Padding that exceeds the size remaining for the header block fragment MUST be
    # treated as a PROTOCOL_ERROR" (h2spec 6.2/4 sends one byte too many).
    client = Client()
    block = client.block()
    prio = struct.pack(">LB", 0, 15) if with_priority else b""
    payload = bytes((len(block) + 1,)) + prio + block
    flags = F_PADDED | F_END_HEADERS | (F_PRIORITY if with_priority else 0)
    client.connection_error(raw(T_HEADERS, flags, 1, payload), PROTOCOL_ERROR)


@pytest.mark.parametrize("pad", [2, 5, 6])
def test_headers_padding_eating_into_the_priority_fields_is_protocol_error(pad: int) -> None:
    client = Client()
    payload = bytes((pad,)) + struct.pack(">LB", 0, 15) + b"\x82"  # 7 bytes
    client.connection_error(raw(T_HEADERS, F_PADDED | F_PRIORITY | F_END_HEADERS, 1, payload),
                            PROTOCOL_ERROR)


def test_headers_padded_flag_without_payload_is_protocol_error() -> None:
    Client().connection_error(raw(T_HEADERS, F_PADDED | F_END_HEADERS, 1), PROTOCOL_ERROR)


# --- §8.1: trailers ---------------------------------------------------------------------------

def test_trailers_end_the_stream() -> None:
    client = Client()
    client.open(1)
    assert client.send(data_frame(1, b"body")) == [("DataReceived", 1, b"body", 4)]
    trailers = client.headers(1, [(b"x-checksum", b"abc")])
    assert client.send(trailers) == [("TrailersReceived", 1), ("StreamEnded", 1)]
    assert client.server.streams[1].remote_open is False
    client.server.send_headers(1, RESPONSE, end_stream=True)
    assert 1 not in client.server.streams


def test_trailers_after_the_response_ended_close_the_stream() -> None:
    client = Client()
    client.open(1)
    client.server.send_headers(1, RESPONSE, end_stream=True)
    client.out()
    assert client.send(client.headers(1, [(b"x-t", b"1")])) == [
        ("TrailersReceived", 1), ("StreamEnded", 1)]
    assert 1 not in client.server.streams


def test_trailers_without_end_stream_are_stream_protocol_error() -> None:
    client = Client()
    client.open(1)
    client.send(data_frame(1, b"body"))
    client.stream_error(client.headers(1, [(b"x-t", b"1")], end_stream=False), 1,
                        PROTOCOL_ERROR)


def test_trailers_in_continuation_frames() -> None:
    client = Client()
    client.open(1)
    block = client.block([(b"x-a", b"1"), (b"x-b", b"2")])
    wire = raw(T_HEADERS, F_END_STREAM, 1, block[:3]) \
        + raw(T_CONTINUATION, F_END_HEADERS, 1, block[3:])
    assert client.send(wire) == [("TrailersReceived", 1), ("StreamEnded", 1)]


# --- §8.1.1: content-length against the DATA ---------------------------------------------------

def with_length(n: bytes) -> list[tuple[bytes, bytes]]:
    return [*REQUEST, (b"content-length", n)]


def test_headers_ending_the_stream_with_a_content_length_are_malformed() -> None:
    """HEADERS with END_STREAM and ``content-length: 5``: refused before the application hears
    of the request (it reached the managed apiserver as a POST with no body, issue 24)."""
    client = Client()
    client.stream_error(client.headers(1, with_length(b"5")), 1, PROTOCOL_ERROR)
    assert client.send(client.headers(3, with_length(b"0"))) == [
        ("RequestReceived", 3, tuple(with_length(b"0")), True)]


def test_data_past_the_content_length_is_malformed_and_not_handed_on() -> None:
    client = Client()
    assert client.send(client.headers(1, with_length(b"5"), end_stream=False))[0][0] == \
        "RequestReceived"
    assert client.send(data_frame(1, b"abc")) == [("DataReceived", 1, b"abc", 3)]
    client.stream_error(data_frame(1, b"def"), 1, PROTOCOL_ERROR)  # 6 > 5: no DataReceived
    # Its bytes went back to the connection window: a later stream may use all of it.
    client.server.acknowledge_received_data(3, 1)
    assert client.server._recv_window + client.server._recv_unacked == 65535


@pytest.mark.parametrize("ending", ["data", "empty-data", "trailers"])
def test_a_body_ending_short_of_its_content_length_is_malformed(ending: str) -> None:
    client = Client()
    client.send(client.headers(1, with_length(b"5"), end_stream=False))
    if ending == "data":  # the last DATA is not handed on either
        client.stream_error(data_frame(1, b"abcd", end_stream=True), 1, PROTOCOL_ERROR)
        return
    assert client.send(data_frame(1, b"abcd")) == [("DataReceived", 1, b"abcd", 4)]
    last = (data_frame(1, b"", end_stream=True) if ending == "empty-data"
            else client.headers(1, [(b"x-checksum", b"1")]))
    client.stream_error(last, 1, PROTOCOL_ERROR)


@pytest.mark.parametrize("ending", ["data", "trailers"])
def test_a_body_of_exactly_its_content_length_ends_the_stream(ending: str) -> None:
    client = Client()
    client.send(client.headers(1, with_length(b"5"), end_stream=False))
    padded = raw(T_DATA, F_PADDED, 1, b"\x03abc" + b"\0" * 3)  # padding is not body
    assert client.send(padded) == [("DataReceived", 1, b"abc", 7)]
    if ending == "data":
        assert client.send(data_frame(1, b"de", end_stream=True)) == [
            ("DataReceived", 1, b"de", 2), ("StreamEnded", 1)]
    else:
        assert client.send(data_frame(1, b"de")) == [("DataReceived", 1, b"de", 2)]
        assert client.send(client.headers(1, [(b"x-t", b"1")])) == [
            ("TrailersReceived", 1), ("StreamEnded", 1)]


def test_an_unparsable_content_length_is_left_to_the_request_rules() -> None:
    """Not a number the connection can hold the body against: the request goes on to
    :func:`gateway.wire.http2.request_head_from_h2`, which refuses it whole (400)."""
    client = Client()
    fields = with_length(b"5x")
    assert client.send(client.headers(1, fields)) == [
        ("RequestReceived", 1, tuple(fields), True)]


# --- §6.10: CONTINUATION ----------------------------------------------------------------------

def test_header_block_over_continuation_frames() -> None:
    client = Client()
    fields = [*REQUEST, *[(b"x-%d" % i, b"v" * 50) for i in range(20)]]
    block = client.block(fields)
    pieces = [block[i:i + 100] for i in range(0, len(block), 100)]
    wire = raw(T_HEADERS, 0, 1, pieces[0]) + b"".join(
        raw(T_CONTINUATION, 0, 1, p) for p in pieces[1:-1]) \
        + raw(T_CONTINUATION, F_END_HEADERS, 1, pieces[-1])
    assert client.send(wire) == [("RequestReceived", 1, tuple(fields), False)]


def test_empty_continuation_frames_up_to_the_limit_are_accepted() -> None:
    client = Client()
    wire = raw(T_HEADERS, F_END_STREAM, 1, client.block()) \
        + raw(T_CONTINUATION, 0, 1) * (MAX_CONTINUATIONS - 1) \
        + raw(T_CONTINUATION, F_END_HEADERS, 1)
    assert client.send(wire) == [("RequestReceived", 1, tuple(REQUEST), True)]


def test_continuation_flood_is_enhance_your_calm() -> None:
    # CVE-2024-27316: endless CONTINUATION frames, never END_HEADERS. Refused at the frame past
    # the limit, before any decoding.
    client = Client()
    wire = raw(T_HEADERS, 0, 1, client.block()) + raw(T_CONTINUATION, 0, 1) * MAX_CONTINUATIONS
    assert client.send(wire) == []
    client.connection_error(raw(T_CONTINUATION, 0, 1), ENHANCE_YOUR_CALM)


def test_oversize_header_block_is_enhance_your_calm_before_decoding() -> None:
    client = Client(max_header_list_size=1000)
    # Junk that would not decode: the size alone ends the connection, at the first byte past
    # the header-list limit plus one frame.
    wire = raw(T_HEADERS, 0, 1, b"\x82") + raw(T_CONTINUATION, 0, 1, b"\xff" * 16384) \
        + raw(T_CONTINUATION, 0, 1, b"\xff" * 999)
    assert client.send(wire) == []  # 17,384 bytes: not yet
    client.connection_error(raw(T_CONTINUATION, 0, 1, b"\xff"), ENHANCE_YOUR_CALM)


@pytest.mark.parametrize("between", [
    data_frame(1, b"x"), ping(), priority(1, 0), raw(T_HEADERS, F_END_HEADERS, 3, b"\x82"),
    raw(T_CONTINUATION, F_END_HEADERS, 3, b"\x82"), raw(T_CONTINUATION, F_END_HEADERS, 0, b""),
    settings(),
], ids=["data", "ping", "priority", "headers-other-stream", "continuation-other-stream",
        "continuation-stream-0", "settings"])
def test_header_block_interrupted_is_protocol_error(between: bytes) -> None:
    client = Client()
    block = client.block()
    client.connection_error(raw(T_HEADERS, F_END_STREAM, 1, block[:2]) + between,
                            PROTOCOL_ERROR)


def test_continuation_without_headers_is_protocol_error() -> None:
    client = Client()
    client.open(1)
    client.connection_error(raw(T_CONTINUATION, F_END_HEADERS, 1, client.block()),
                            PROTOCOL_ERROR)


def test_continuation_after_end_headers_is_protocol_error() -> None:
    client = Client()
    block = client.block()
    client.connection_error(raw(T_HEADERS, F_END_STREAM, 1, block)
                            + raw(T_CONTINUATION, F_END_HEADERS, 1, b"")
                            + raw(T_CONTINUATION, F_END_HEADERS, 1, b""), PROTOCOL_ERROR)


def test_push_promise_from_a_client_is_protocol_error() -> None:
    client = Client()
    client.open(1)
    client.connection_error(raw(T_PUSH, F_END_HEADERS, 1, struct.pack(">L", 2) + b"\x82"),
                            PROTOCOL_ERROR)


# --- §6.4: RST_STREAM -------------------------------------------------------------------------

def test_rst_stream_on_stream_0_is_protocol_error() -> None:
    Client().connection_error(raw(T_RST, 0, 0, struct.pack(">L", CANCEL)), PROTOCOL_ERROR)


def test_rst_stream_from_the_client_resets_the_stream() -> None:
    client = Client()
    client.open(1)
    assert client.send(rst(1, 0xDEAD)) == [("StreamReset", 1, 0xDEAD, True)]
    assert client.out() == []
    with pytest.raises(StreamClosedError):
        client.server.send_headers(1, RESPONSE)


# --- §6.5: SETTINGS ---------------------------------------------------------------------------

def test_settings_ack_with_payload_is_frame_size_error() -> None:
    Client().connection_error(raw(T_SETTINGS, F_ACK, 0, setting(S_ENABLE_PUSH, 0)),
                              FRAME_SIZE_ERROR)


def test_settings_ack_is_ignored() -> None:
    client = Client()
    assert client.send(raw(T_SETTINGS, F_ACK, 0)) == [("FrameIgnored",)]
    assert client.out() == []


def test_settings_on_a_stream_is_protocol_error() -> None:
    client = Client()
    client.open(1)
    client.connection_error(raw(T_SETTINGS, 0, 1, setting(S_ENABLE_PUSH, 0)), PROTOCOL_ERROR)


@pytest.mark.parametrize(("key", "value", "code"), [
    (S_ENABLE_PUSH, 2, PROTOCOL_ERROR),
    (S_ENABLE_PUSH, 2**32 - 1, PROTOCOL_ERROR),
    (S_MAX_FRAME_SIZE, 16383, PROTOCOL_ERROR),
    (S_MAX_FRAME_SIZE, 0, PROTOCOL_ERROR),
    (S_MAX_FRAME_SIZE, 2**24, PROTOCOL_ERROR),
    (S_INITIAL_WINDOW_SIZE, 2**31, FLOW_CONTROL_ERROR),
    (S_INITIAL_WINDOW_SIZE, 2**32 - 1, FLOW_CONTROL_ERROR),
])
def test_invalid_setting_is_a_connection_error(key: int, value: int, code: int) -> None:
    client = Client()
    client.connection_error(settings((key, value)), code)


@pytest.mark.parametrize(("key", "value"), [
    (S_ENABLE_PUSH, 0), (S_ENABLE_PUSH, 1), (S_MAX_FRAME_SIZE, 16384),
    (S_MAX_FRAME_SIZE, 2**24 - 1), (S_INITIAL_WINDOW_SIZE, 2**31 - 1),
    (S_INITIAL_WINDOW_SIZE, 0), (S_HEADER_TABLE_SIZE, 0), (S_MAX_CONCURRENT_STREAMS, 0),
    (S_MAX_HEADER_LIST_SIZE, 1),
])
def test_valid_setting_is_acknowledged(key: int, value: int) -> None:
    client = Client()
    assert client.send(settings((key, value))) == [("SettingsChanged",)]
    [ack] = client.out()
    assert isinstance(ack, SettingsFrame) and ack.flags == {"ACK"} and ack.settings == {}
    if key == S_MAX_FRAME_SIZE:
        assert client.server.max_outbound_frame_size == value


def test_each_settings_frame_gets_its_own_ack() -> None:
    client = Client()
    assert client.send(settings() + settings((S_ENABLE_PUSH, 0)) + settings()) == [
        ("SettingsChanged",)] * 3
    assert [(type(f), f.flags) for f in client.out()] == [(SettingsFrame, {"ACK"})] * 3


# --- §6.9.2: INITIAL_WINDOW_SIZE moves the open streams' send windows -------------------------

def test_initial_window_size_change_moves_open_streams_windows() -> None:
    client = Client()
    client.open(1)
    client.open(3, end_stream=True)
    client.server.send_data(1, b"x" * 1000)
    assert client.server.local_flow_control_window(1) == 64535
    assert client.send(settings((S_INITIAL_WINDOW_SIZE, 100_000))) == [("SettingsChanged",)]
    assert client.server.local_flow_control_window(3) == 64535  # the connection's is lower
    assert client.server.streams[1].send_window == 100_000 - 1000
    assert client.server.streams[3].send_window == 100_000
    client.out()
    client.send(settings((S_INITIAL_WINDOW_SIZE, 500)))
    client.out()
    assert client.server.local_flow_control_window(1) == -500  # negative, tracked (§6.9.2)
    assert client.server.local_flow_control_window(3) == 500
    client.open(5)  # a new stream starts at the new value
    assert client.server.local_flow_control_window(5) == 500


def test_negative_window_is_tracked_and_blocks_data_but_not_end_stream() -> None:
    # h2spec 6.9.2/2: window 3, 3 bytes sent, window set to 2 (so -1), WINDOW_UPDATE 2: one
    # byte may go.
    client = Client(client_settings=setting(S_INITIAL_WINDOW_SIZE, 3))
    client.open(1, end_stream=True)
    client.server.send_headers(1, RESPONSE)
    client.server.send_data(1, b"abc")
    client.out()
    client.send(settings((S_INITIAL_WINDOW_SIZE, 2)))
    client.out()
    assert client.server.local_flow_control_window(1) == -1
    with pytest.raises(ValueError):
        client.server.send_data(1, b"d")
    assert client.send(window_update(1, 2)) == [("WindowUpdated", 1, 2)]
    assert client.server.local_flow_control_window(1) == 1
    client.server.send_data(1, b"d")
    with pytest.raises(ValueError):
        client.server.send_data(1, b"e")
    client.send(settings((S_INITIAL_WINDOW_SIZE, 0)))  # window -3 now
    client.out()
    client.server.end_stream(1)  # an empty DATA frame takes no window (§6.9.1)
    [end] = client.out()
    assert isinstance(end, DataFrame) and end.data == b"" and end.flags == {"END_STREAM"}
    assert 1 not in client.server.streams


def test_initial_window_size_change_overflowing_a_stream_window_is_flow_control_error() -> None:
    client = Client()
    client.open(1)
    assert client.send(window_update(1, 2**31 - 1 - 65535)) == [
        ("WindowUpdated", 1, 2**31 - 1 - 65535)]
    assert client.server.local_flow_control_window(1) == 65535  # the connection's
    assert client.server.streams[1].send_window == 2**31 - 1
    client.connection_error(settings((S_INITIAL_WINDOW_SIZE, 65536)), FLOW_CONTROL_ERROR)


class CountingStreams(dict[int, Any]):
    """The connection's stream table, counting the walks over every open stream."""

    walks = 0

    def values(self) -> Any:
        self.walks += 1
        return super().values()


def test_initial_window_size_moves_the_streams_once_per_frame() -> None:
    """Issue 24: an INITIAL_WINDOW_SIZE change costs one step per open stream per SETTINGS
    frame, not per entry (a frame of 2,730 entries with 250 streams open cost 680,000 steps)."""
    client = Client(max_concurrent_streams=200)
    client.server.streams = CountingStreams()
    for sid in range(1, 401, 2):
        client.send(client.headers(sid, end_stream=False))
    filler = [(0x100 + i, i) for i in range(MAX_SETTINGS_ENTRIES - 1)]
    for value in (70_000, 80_000, 80_000):  # the last one changes nothing
        assert client.send(settings((S_INITIAL_WINDOW_SIZE, value), *filler)) == [
            ("SettingsChanged",)]
    assert client.server.streams.walks == 2
    assert {s.send_window for s in client.server.streams.values()} == {80_000}


@pytest.mark.parametrize("pairs", [
    [(S_INITIAL_WINDOW_SIZE, 100), (S_INITIAL_WINDOW_SIZE, 1)],
    [(S_ENABLE_PUSH, 0), (S_MAX_FRAME_SIZE, 20_000), (S_ENABLE_PUSH, 0)],
    [(0x99, 1), (0x99, 1)],  # even an unknown id
], ids=["initial-window", "enable-push", "unknown"])
def test_a_repeated_setting_id_is_protocol_error(pairs: list[tuple[int, int]]) -> None:
    """Issue 24, as Go's server: an id twice in one frame is refused (RFC 9113 would apply
    both in order; only a flood needs that), and none of the frame is applied."""
    client = Client()
    client.open(1)
    client.connection_error(settings(*pairs), PROTOCOL_ERROR)
    assert client.server.streams[1].send_window == 65535
    assert client.server.max_outbound_frame_size == 16384


def test_settings_with_more_than_100_entries_is_protocol_error() -> None:
    client = Client()
    most = [(0x100 + i, 0) for i in range(MAX_SETTINGS_ENTRIES)]
    assert client.send(settings(*most)) == [("SettingsChanged",)]
    [ack] = client.out()
    assert ack.flags == {"ACK"}
    client.connection_error(settings(*most, (S_INITIAL_WINDOW_SIZE, 1)), PROTOCOL_ERROR)
    assert MAX_SETTINGS_ENTRIES == 100


def test_settings_entries_are_spent_from_the_parsing_budget() -> None:
    """Each entry costs what a frame that is only parsed costs: a client cannot make entries
    free by packing them into few frames."""
    client = Client(cheap=FrameBudget(250, 0.0))
    hundred = settings(*[(0x100 + i, 0) for i in range(100)])
    assert client.send(hundred + hundred) == [("SettingsChanged",)] * 2
    assert len(client.out()) == 2
    client.connection_error(hundred, ENHANCE_YOUR_CALM)


# --- §6.7: PING -------------------------------------------------------------------------------

def test_ping_is_answered_with_the_same_payload() -> None:
    client = Client()
    for payload in (b"\0" * 8, b"\xff" * 8, PING_PAYLOAD):
        assert client.send(ping(payload)) == [("PingReceived",)]
        [pong] = client.out()
        assert isinstance(pong, PingFrame) and pong.flags == {"ACK"} and pong.stream_id == 0
        assert pong.opaque_data == payload


def test_ping_ack_is_ignored_and_not_answered() -> None:
    client = Client()
    assert client.send(ping(b"unasked!", ack=True) + ping()) == [
        ("FrameIgnored",), ("PingReceived",)]
    [pong] = client.out()
    assert pong.opaque_data == PING_PAYLOAD


def test_ping_on_a_stream_is_protocol_error() -> None:
    client = Client()
    client.open(1)
    client.connection_error(raw(T_PING, 0, 1, PING_PAYLOAD), PROTOCOL_ERROR)


# --- §6.8: GOAWAY -----------------------------------------------------------------------------

def test_goaway_from_the_client_is_connection_terminated() -> None:
    client = Client()
    client.open(1)
    wire = GoAwayFrame(0, last_stream_id=0, error_code=ENHANCE_YOUR_CALM,
                       additional_data=b"debug").serialize()
    assert client.send(wire) == [("ConnectionTerminated", ENHANCE_YOUR_CALM, 0)]
    assert client.out() == []


def test_goaway_on_a_stream_is_protocol_error() -> None:
    client = Client()
    client.open(1)
    client.connection_error(raw(T_GOAWAY, 0, 1, b"\0" * 8), PROTOCOL_ERROR)


def test_our_goaway_refuses_new_streams_and_lets_open_ones_finish() -> None:
    client = Client()
    client.open(1)
    client.open(3, end_stream=True)
    client.server.close_connection()
    [goaway] = client.out()
    assert isinstance(goaway, GoAwayFrame)
    assert (goaway.last_stream_id, goaway.error_code) == (3, NO_ERROR)
    assert client.send(client.headers(5) + client.headers(7)) == [
        ("StreamReset", 5, REFUSED_STREAM, False), ("StreamReset", 7, REFUSED_STREAM, False)]
    assert [(type(f), f.stream_id, f.error_code) for f in client.out()] == [
        (RstStreamFrame, 5, REFUSED_STREAM), (RstStreamFrame, 7, REFUSED_STREAM)]
    assert sorted(client.server.streams) == [1, 3]
    # The streams in flight go on both ways.
    assert client.send(data_frame(1, b"body", end_stream=True)) == [
        ("DataReceived", 1, b"body", 4), ("StreamEnded", 1)]
    client.server.send_headers(3, RESPONSE)
    client.server.send_data(3, b"answer", end_stream=True)
    client.server.send_headers(1, RESPONSE, end_stream=True)
    assert [(type(f), f.stream_id) for f in client.out()] == [
        (HeadersFrame, 3), (DataFrame, 3), (HeadersFrame, 1)]
    assert client.server.streams == {}
    # Late frames of the refused streams are ignored (we reset them).
    assert client.send(data_frame(5, b"x")) == [("FrameIgnored",)]


# --- §6.9: WINDOW_UPDATE ----------------------------------------------------------------------

def test_window_update_of_0_on_the_connection_is_protocol_error() -> None:
    Client().connection_error(window_update(0, 0), PROTOCOL_ERROR)


def test_window_update_of_0_on_a_stream_is_stream_protocol_error() -> None:
    client = Client()
    client.open(1)
    client.stream_error(window_update(1, 0), 1, PROTOCOL_ERROR)


def test_window_update_reserved_bit_is_ignored() -> None:
    client = Client()
    assert client.send(window_update(0, 0x80000000 | 10)) == [("WindowUpdated", 0, 10)]


def test_connection_window_past_2_31_minus_1_is_flow_control_error() -> None:
    client = Client()
    assert client.send(window_update(0, 2**31 - 1 - 65535)) == [
        ("WindowUpdated", 0, 2**31 - 1 - 65535)]
    client.connection_error(window_update(0, 1), FLOW_CONTROL_ERROR)


def test_stream_window_past_2_31_minus_1_is_stream_flow_control_error() -> None:
    client = Client()
    client.open(1)
    client.open(3)
    assert client.send(window_update(1, 2**31 - 1 - 65535)) == [
        ("WindowUpdated", 1, 2**31 - 1 - 65535)]
    client.stream_error(window_update(1, 1), 1, FLOW_CONTROL_ERROR)
    assert client.server.local_flow_control_window(3) == 65535


def test_window_updates_raise_what_may_be_sent() -> None:
    client = Client()
    client.open(1)
    client.server.send_data(1, b"x" * 16384)
    client.server.send_data(1, b"x" * 16384)
    client.server.send_data(1, b"x" * 16384)
    client.server.send_data(1, b"x" * 16383)
    assert client.server.local_flow_control_window(1) == 0
    client.out()
    assert client.send(window_update(0, 100)) == [("WindowUpdated", 0, 100)]
    assert client.server.local_flow_control_window(1) == 0  # the stream's window is 0
    assert client.send(window_update(1, 40)) == [("WindowUpdated", 1, 40)]
    assert client.server.local_flow_control_window(1) == 40


# --- flow control of what we receive (§6.9, §6.9.1) ------------------------------------------

def test_data_past_the_connection_window_is_flow_control_error() -> None:
    client = Client(initial_window_size=100_000)  # streams may take more than the connection
    client.open(1)
    chunk = b"d" * 16384
    assert len(client.send(data_frame(1, chunk) * 3 + data_frame(1, chunk[:16383]))) == 4
    assert client.send(raw(T_DATA, 0, 1, b"")) == [("DataReceived", 1, b"", 0)]  # 0 still fits
    client.connection_error(data_frame(1, b"x"), FLOW_CONTROL_ERROR)


def test_padding_counts_against_the_connection_window() -> None:
    client = Client(initial_window_size=100_000)
    client.open(1)
    padded = raw(T_DATA, F_PADDED, 1, b"\xff" + b"\0" * 255)  # 256 flow-controlled, no data
    assert client.send(padded * 255) == [("DataReceived", 1, b"", 256)] * 255
    client.connection_error(padded, FLOW_CONTROL_ERROR)  # 256 more than the 255 left


def test_data_past_a_stream_window_is_stream_flow_control_error_and_returns_connection_window(
        ) -> None:
    client = Client(initial_window_size=40_000)
    client.open(1)
    client.open(3)
    chunk = b"a" * 16384
    assert len(client.send(data_frame(1, chunk) * 2 + data_frame(1, chunk[:40_000 - 32768]))) \
        == 3
    assert client.send(data_frame(1, b"b")) == [("StreamReset", 1, FLOW_CONTROL_ERROR, False)]
    # The refused byte goes back to the connection at once (the connection is past half used):
    # nobody will acknowledge it.
    assert [(type(f), f.stream_id) for f in client.out()] == [
        (WindowUpdateFrame, 0), (RstStreamFrame, 1)]
    # The 40,000 the application takes come back too; stream 1 is gone: connection only.
    client.server.acknowledge_received_data(40_000, 1)
    [update] = client.out()
    assert (update.stream_id, update.window_increment) == (0, 40_000)
    assert client.send(data_frame(3, b"c" * 1000)) == [("DataReceived", 3, b"c" * 1000, 1000)]


def test_window_updates_after_acknowledge_once_half_a_window_is_used() -> None:
    client = Client()
    client.open(1)
    chunk = b"d" * 16384
    assert client.send(data_frame(1, chunk)) == [("DataReceived", 1, chunk, 16384)]
    client.server.acknowledge_received_data(16384, 1)
    assert client.out() == []  # 49,151 left of 65,535: more than half
    client.send(data_frame(1, chunk))
    assert client.out() == []  # nothing given back before the application acknowledges
    client.server.acknowledge_received_data(16384, 1)  # 32,767 left: half used
    updates = client.out()
    assert [(type(f), f.stream_id, f.window_increment) for f in updates] == [
        (WindowUpdateFrame, 0, 32768), (WindowUpdateFrame, 1, 32768)]
    # Windows are full again: 65,535 more bytes fit, one more does not.
    assert len(client.send(data_frame(1, chunk) * 3 + data_frame(1, chunk[:16383]))) == 4
    client.connection_error(data_frame(1, b"x"), FLOW_CONTROL_ERROR)


def test_acknowledge_with_a_large_connection_window() -> None:
    client = Client(initial_window_size=65535, connection_window=4 * 65535)
    client.open(1)
    client.open(3)
    chunk = b"d" * 16384
    client.send(data_frame(1, chunk) * 3 + data_frame(3, chunk) * 3)
    client.server.acknowledge_received_data(3 * 16384, 1)
    # Stream 1 is past half (16,383 left) and gets its bytes back; the connection (4 windows:
    # 163,842 left of 262,140) is not past half and keeps them.
    assert [(f.stream_id, f.window_increment) for f in client.out()] == [(1, 3 * 16384)]
    client.send(data_frame(1, chunk) * 3)  # 114,684 left of the connection's: past half
    client.server.acknowledge_received_data(16384, 3)
    # The connection gives back all the application took (stream 1's too), stream 3 its own.
    assert [(f.stream_id, f.window_increment) for f in client.out()] == [
        (0, 4 * 16384), (3, 16384)]


def test_acknowledge_after_the_stream_ended_returns_only_connection_window() -> None:
    client = Client()
    client.open(1)
    chunk = b"d" * 16384
    client.send(data_frame(1, chunk) + data_frame(1, chunk, end_stream=True))
    client.server.acknowledge_received_data(2 * 16384, 1)
    assert [(f.stream_id, f.window_increment) for f in client.out()] == [(0, 32768)]


def test_frames_for_a_stream_we_reset_are_ignored_and_data_returns_connection_window() -> None:
    client = Client()
    client.open(1)
    client.server.reset_stream(1, CANCEL)
    [reset] = client.out()
    assert (type(reset), reset.stream_id, reset.error_code) == (RstStreamFrame, 1, CANCEL)
    chunk = b"d" * 16384
    # Frames the client sent before it saw our RST_STREAM: no error, no answer...
    assert client.send(data_frame(1, chunk) + window_update(1, 5) + rst(1, CANCEL)
                       + priority(1, 0) + client.headers(1, [(b"x-t", b"1")])) == [
        ("FrameIgnored",)] * 5
    assert client.out() == []
    # ...but the DATA counted against the connection window, and comes back by itself.
    assert client.send(data_frame(1, chunk)) == [("FrameIgnored",)]
    assert [(type(f), f.stream_id, f.window_increment) for f in client.out()] == [
        (WindowUpdateFrame, 0, 32768)]
    with pytest.raises(StreamClosedError):
        client.server.send_data(1, b"late")
    with pytest.raises(StreamClosedError):
        client.server.reset_stream(1, CANCEL)


def test_only_the_most_recent_resets_are_remembered() -> None:
    client = Client(max_concurrent_streams=RECENT_RESETS + 1)
    for i in range(RECENT_RESETS + 1):
        sid = 2 * i + 1
        client.send(client.headers(sid, end_stream=False))
        client.server.reset_stream(sid, CANCEL)
    client.out()
    assert client.send(data_frame(3, b"x")) == [("FrameIgnored",)]
    # The oldest fell out: its late DATA is a frame on a closed stream now.
    client.stream_error(data_frame(1, b"x"), 1, STREAM_CLOSED)


# --- output -----------------------------------------------------------------------------------

def test_send_data_is_refused_past_the_stream_window() -> None:
    client = Client(client_settings=setting(S_INITIAL_WINDOW_SIZE, 100))
    client.open(1, end_stream=True)
    assert client.server.local_flow_control_window(1) == 100
    with pytest.raises(ValueError):
        client.server.send_data(1, b"x" * 101)
    client.server.send_data(1, b"x" * 100)
    [sent] = client.out()
    assert isinstance(sent, DataFrame) and sent.data == b"x" * 100 and not sent.flags


def test_send_data_is_refused_past_the_connection_window() -> None:
    client = Client(client_settings=setting(S_INITIAL_WINDOW_SIZE, 100_000))
    client.open(1, end_stream=True)
    client.open(3, end_stream=True)
    for _ in range(3):
        client.server.send_data(1, b"x" * 16384)
    client.server.send_data(3, b"x" * 16383)
    assert client.server.local_flow_control_window(1) == 0
    assert client.server.local_flow_control_window(3) == 0
    with pytest.raises(ValueError):
        client.server.send_data(3, b"x")
    client.server.send_data(3, b"", end_stream=True)  # empty: takes no window


def test_send_data_is_refused_past_the_frame_size() -> None:
    client = Client(client_settings=setting(S_INITIAL_WINDOW_SIZE, 100_000))
    client.send(window_update(0, 100_000))
    client.open(1, end_stream=True)
    with pytest.raises(ValueError):
        client.server.send_data(1, b"x" * 16385)
    client.send(settings((S_MAX_FRAME_SIZE, 20000)))
    client.out()
    client.server.send_data(1, b"x" * 20000)
    [sent] = client.out()
    assert len(sent.data) == 20000


@pytest.mark.parametrize("frame_size", [16384, 20000])
def test_send_headers_splits_into_continuation_past_the_frame_size(frame_size: int) -> None:
    client = Client(client_settings=setting(S_MAX_FRAME_SIZE, frame_size))
    client.open(1, end_stream=True)
    fields = [(b":status", b"200"), *[(b"x-h%d" % i, b"v" * 1000) for i in range(45)]]
    client.server.send_headers(1, fields, end_stream=True)
    frames = client.out()
    assert [type(f) for f in frames] == [HeadersFrame] + [ContinuationFrame] * (
        len(frames) - 1)
    assert len(frames) >= 3
    assert frames[0].flags == {"END_STREAM"}
    assert all(not f.flags for f in frames[1:-1])
    assert frames[-1].flags == {"END_HEADERS"}
    assert all(f.stream_id == 1 for f in frames)
    assert all(len(f.data) == frame_size for f in frames[:-1])
    block = b"".join(f.data for f in frames)
    assert hpack.Decoder(max_header_list_size=10**6).decode(block, raw=True) == fields
    assert 1 not in client.server.streams


def test_send_headers_fits_one_frame_when_it_can() -> None:
    client = Client()
    client.open(1, end_stream=True)
    client.server.send_headers(1, RESPONSE)
    [headers] = client.out()
    assert isinstance(headers, HeadersFrame) and headers.flags == {"END_HEADERS"}
    assert hpack.Decoder().decode(headers.data, raw=True) == RESPONSE


def test_end_stream_closes_our_side() -> None:
    client = Client()
    client.open(1)
    client.server.send_headers(1, RESPONSE)
    client.server.send_data(1, b"done", end_stream=True)
    frames = client.out()
    assert [(type(f), f.flags) for f in frames] == [(HeadersFrame, {"END_HEADERS"}),
                                                    (DataFrame, {"END_STREAM"})]
    assert client.server.streams[1].local_open is False  # the client may still send
    for send in (lambda: client.server.send_data(1, b"x"),
                 lambda: client.server.send_headers(1, RESPONSE),
                 lambda: client.server.end_stream(1),
                 lambda: client.server.local_flow_control_window(1)):
        with pytest.raises(StreamClosedError):
            send()
    assert client.send(data_frame(1, b"body", end_stream=True)) == [
        ("DataReceived", 1, b"body", 4), ("StreamEnded", 1)]
    assert client.server.streams == {}


def test_sending_on_a_stream_never_opened_is_refused() -> None:
    client = Client()
    with pytest.raises(StreamClosedError):
        client.server.send_headers(1, RESPONSE)
    with pytest.raises(StreamClosedError):
        client.server.reset_stream(1, CANCEL)


# --- the byte stream --------------------------------------------------------------------------

def test_a_frame_split_at_every_byte_gives_the_same_events() -> None:
    encoder = hpack.Encoder()
    block = encoder.encode([*REQUEST, (b"x-long", b"l" * 300)])
    wire = (PREFACE + settings((S_INITIAL_WINDOW_SIZE, 1000))
            + raw(T_HEADERS, F_PRIORITY | F_PADDED, 1,
                  b"\x03" + struct.pack(">LB", 0, 15) + block[:100] + b"\0\0\0")
            + raw(T_CONTINUATION, F_END_HEADERS, 1, block[100:])
            + raw(T_DATA, F_PADDED, 1, b"\x02" + b"b" * 500 + b"\0\0")
            + window_update(1, 77) + ping() + raw(0xFA, 0, 0, b"?")
            + data_frame(1, b"e" * 10, end_stream=True))
    expected = summary(fresh().receive_data(wire))
    assert [e[0] for e in expected] == [
        "SettingsChanged", "RequestReceived", "DataReceived", "WindowUpdated", "PingReceived",
        "FrameIgnored", "DataReceived", "StreamEnded"]
    reference = fresh()
    reference.receive_data(wire)
    output = reference.data_to_send()
    for cut in range(1, len(wire)):
        server = fresh()
        events = summary(server.receive_data(wire[:cut])) + summary(
            server.receive_data(wire[cut:]))
        assert events == expected, cut
        assert server.data_to_send() == output, cut
    server = fresh()
    events = []
    for i in range(len(wire)):
        events += summary(server.receive_data(wire[i:i + 1]))
    assert events == expected
    assert server.data_to_send() == output


def test_several_frames_in_one_call() -> None:
    client = Client()
    wire = b"".join(client.headers(sid, end_stream=False) for sid in (1, 3, 5)) \
        + data_frame(3, b"three", end_stream=True)
    assert client.send(wire) == [
        ("RequestReceived", 1, tuple(REQUEST), False),
        ("RequestReceived", 3, tuple(REQUEST), False),
        ("RequestReceived", 5, tuple(REQUEST), False),
        ("DataReceived", 3, b"three", 5), ("StreamEnded", 3)]


# --- interoperation with a real client: python-hyper h2 -------------------------------------

class _App:
    """A server application on ServerConnection: echo-ish responses, flow control honoured."""

    def __init__(self, server: ServerConnection, response_size: int) -> None:
        self.server = server
        self.response_size = response_size
        self.bodies: dict[int, bytearray] = {}
        self.paths: dict[int, bytes] = {}
        self.pending: dict[int, bytes] = {}

    def handle(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, RequestReceived):
                self.bodies[event.stream_id] = bytearray()
                self.paths[event.stream_id] = dict(event.headers)[b":path"]
                if event.stream_ended:
                    self.respond(event.stream_id)
            elif isinstance(event, DataReceived):
                self.bodies[event.stream_id] += event.data
                self.server.acknowledge_received_data(event.flow_controlled_length,
                                                      event.stream_id)
            elif isinstance(event, TrailersReceived):
                pass
            elif isinstance(event, StreamEnded):
                self.respond(event.stream_id)
            elif isinstance(event, (StreamReset, ConnectionTerminated)):
                raise AssertionError(summary([event]))
        self.send_pending()

    def respond(self, sid: int) -> None:
        body = self.paths[sid] + b":" + bytes(self.bodies[sid])
        body = (body * (self.response_size // len(body) + 1))[:self.response_size]
        self.server.send_headers(sid, [(b":status", b"200"),
                                       (b"content-length", b"%d" % len(body))])
        self.pending[sid] = body

    def send_pending(self) -> None:
        for sid, rest in list(self.pending.items()):
            while rest:
                room = min(self.server.local_flow_control_window(sid),
                           self.server.max_outbound_frame_size, len(rest))
                if room <= 0:
                    break
                self.server.send_data(sid, rest[:room], end_stream=room == len(rest))
                rest = rest[room:]
            if rest:
                self.pending[sid] = rest
            else:
                del self.pending[sid]


@pytest.mark.parametrize(("server_window", "client_window", "response_size"), [
    (65535, 65535, 100_000), (1024, 777, 20_000), (16384, 1, 1000)])
def test_interop_with_h2_client(server_window: int, client_window: int,
                                response_size: int) -> None:
    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    client = h2.connection.H2Connection(config)
    client.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: client_window})
    server = ServerConnection(max_concurrent_streams=16, max_header_list_size=8192,
                              initial_window_size=server_window,
                              connection_window=server_window * 4)
    server.initiate()
    # SETTINGS both ways first: our smaller windows apply from our SETTINGS on (a client that
    # sends before it saw them could overrun them; the front door keeps the default 65,535).
    assert summary(server.receive_data(client.data_to_send())) == [("SettingsChanged",)] * 2
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    app = _App(server, response_size)
    bodies = {1: b"a" * 5000, 3: b"", 5: b"c" * 70_000, 7: b"d" * 300}
    to_send = dict(bodies)
    for sid in bodies:
        client.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"https"),
                                  (b":path", b"/p%d" % sid), (b":authority", b"gw")],
                            end_stream=not bodies[sid])
    responses: dict[int, bytearray] = {sid: bytearray() for sid in bodies}
    statuses: dict[int, bytes] = {}
    ended: set[int] = set()
    client_waits = server_waits = 0  # rounds where a window held bytes back
    for _ in range(10_000):  # bounded: each round moves bytes or the test fails
        for sid, rest in list(to_send.items()):
            while rest:
                room = min(client.local_flow_control_window(sid),
                           client.max_outbound_frame_size, len(rest))
                if room <= 0:
                    client_waits += 1
                    break
                client.send_data(sid, rest[:room], end_stream=room == len(rest))
                rest = rest[room:]
            if rest:
                to_send[sid] = rest
            else:
                del to_send[sid]
        wire = client.data_to_send()
        if wire:
            app.handle(server.receive_data(wire))
        server_waits += bool(app.pending)
        back = server.data_to_send()
        if back:
            for event in client.receive_data(back):
                assert not isinstance(event, (h2.events.StreamReset,
                                              h2.events.ConnectionTerminated)), event
                if isinstance(event, h2.events.ResponseReceived):
                    statuses[event.stream_id] = dict(event.headers)[b":status"]
                elif isinstance(event, h2.events.DataReceived):
                    responses[event.stream_id] += event.data
                    client.acknowledge_received_data(event.flow_controlled_length,
                                                     event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    ended.add(event.stream_id)
        if len(ended) == len(bodies) and not wire and not back:
            break
    assert ended == set(bodies)
    assert client_waits > 0 and server_waits > 0  # both sides waited for WINDOW_UPDATEs
    assert statuses == dict.fromkeys(bodies, b"200")
    for sid, body in bodies.items():
        assert bytes(app.bodies[sid]) == body
        expected = b"/p%d:" % sid + body
        assert bytes(responses[sid]) == (expected * (response_size // len(expected) + 1))[
            :response_size]
    assert server.streams == {}
    # And it ends cleanly: our GOAWAY is a ConnectionTerminated(NO_ERROR) for h2.
    server.close_connection()
    [terminated] = client.receive_data(server.data_to_send())
    assert isinstance(terminated, h2.events.ConnectionTerminated)
    assert (terminated.error_code, terminated.last_stream_id) == (NO_ERROR, 7)



# --- floods: the frame budgets, spent frame by frame -------------------------------------------

def test_a_ping_flood_in_one_read_gets_no_answer_past_the_budget() -> None:
    """Three times the budget of PINGs in one read: the ACKs stop at the budget (each is spent
    before its ACK is queued), then GOAWAY ENHANCE_YOUR_CALM."""
    client = Client()  # the client's SETTINGS spent one answer already
    with pytest.raises(H2ConnectionError) as info:
        client.server.receive_data(ping() * (3 * ANSWERED_BURST))
    assert info.value.code == ENHANCE_YOUR_CALM
    frames = client.out()
    acks = [f for f in frames if isinstance(f, PingFrame) and "ACK" in f.flags]
    assert ANSWERED_BURST - 2 <= len(acks) <= ANSWERED_BURST
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == ENHANCE_YOUR_CALM


def test_a_settings_flood_in_one_read_gets_no_answer_past_the_budget() -> None:
    client = Client()
    with pytest.raises(H2ConnectionError) as info:
        client.server.receive_data(raw(T_SETTINGS, 0, 0) * (3 * ANSWERED_BURST))
    assert info.value.code == ENHANCE_YOUR_CALM
    acks = [f for f in client.out() if isinstance(f, SettingsFrame) and "ACK" in f.flags]
    assert ANSWERED_BURST - 2 <= len(acks) <= ANSWERED_BURST


def test_rapid_reset_in_one_read_is_calmed_at_the_budget() -> None:
    """HEADERS + RST_STREAM pairs: each reset spends; past the budget the connection ends, and
    the requests that reached the application stay within the budget."""
    client = Client(max_concurrent_streams=10)
    batch = b"".join(client.headers(1 + 2 * i) + rst(1 + 2 * i, CANCEL)
                     for i in range(2 * RESET_BURST))
    with pytest.raises(H2ConnectionError) as info:
        client.server.receive_data(batch)
    assert info.value.code == ENHANCE_YOUR_CALM
    assert str(info.value) == "rapid reset"


def test_stream_errors_we_answer_spend_the_reset_budget() -> None:
    """Streams the client breaks (here: past the concurrency limit) cost a reset each: a
    client cannot make us send RST_STREAMs without end."""
    client = Client(max_concurrent_streams=1, resets=FrameBudget(5, 0.0))
    client.open(1)
    for sid in range(3, 13, 2):
        client.stream_error(client.headers(sid), sid, REFUSED_STREAM)
    client.connection_error(client.headers(13), ENHANCE_YOUR_CALM)


def test_a_flood_of_frames_that_cost_only_parsing_is_calmed() -> None:
    client = Client(cheap=FrameBudget(CHEAP_BURST, 0.0))
    unknown = raw(0xFA, 0, 0, b"x")
    with pytest.raises(H2ConnectionError) as info:
        client.server.receive_data(unknown * (CHEAP_BURST + 1))
    assert info.value.code == ENHANCE_YOUR_CALM


def test_a_window_update_flood_is_calmed() -> None:
    client = Client(cheap=FrameBudget(10, 0.0))
    update = WindowUpdateFrame(0, window_increment=1).serialize()
    assert client.send(update * 10) == [("WindowUpdated", 0, 1)] * 10
    client.connection_error(update, ENHANCE_YOUR_CALM)
