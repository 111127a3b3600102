"""gateway.wire.h2client: the agent's sans-IO HTTP/2 client core, byte by byte.

The client-side counterpart of test_h2server.py (h2spec's cases turned around: RFC 9113 §3.4,
§4.1-4.3, §5.1-5.5, §6.1-6.10, §8.1): every test feeds hostile or ordinary *server* bytes
(built with ``hyperframe`` and ``hpack`` or, where the frame is malformed on purpose, with
``struct``), then checks the exact outcome read back from
:meth:`ClientConnection.data_to_send` (parsed with ``hyperframe``): the GOAWAY code and
:class:`ServerProtocolError.code` of a connection error, the RST_STREAM code and
:class:`StreamReset` of a stream error, or the events. The last tests run the core against
``h2``'s server role, in memory; tests/gateway/agent/test_h2pool.py runs the agent's adapter
against it over real TLS, and tests/realkube/test_agent_h2*.py against kube-apiserver.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import h2.config
import h2.connection
import h2.errors
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
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from gateway.wire.h2client import (
    COPIED_BELOW,
    MAX_SETTINGS_ENTRIES,
    ClientConnection,
    ConnectionTerminated,
    DataReceived,
    Event,
    InformationalResponse,
    NoNewStreams,
    ResponseReceived,
    ServerProtocolError,
    StreamClosedError,
    StreamReset,
    TrailersReceived,
    WindowBudget,
    WindowUpdated,
)
from gateway.wire.h2server import (
    ANSWERED_BURST,
    CHEAP_BURST,
    MAX_CONTINUATIONS,
    RECENT_RESETS,
    RESET_BURST,
    FrameBudget,
)

# Wire values as the RFC gives them, spelled out here rather than imported.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
T_DATA, T_HEADERS, T_PRIORITY, T_RST, T_SETTINGS, T_PUSH, T_PING, T_GOAWAY = range(8)
T_WINDOW_UPDATE, T_CONTINUATION = 8, 9
F_END_STREAM = F_ACK = 0x1
F_END_HEADERS, F_PADDED, F_PRIORITY = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 5, 6, 7, 8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 9, 11
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 1, 2, 3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 4, 5, 6

HEADER_LIST_LIMIT = 8192
REQUEST = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"kube"),
           (b":path", b"/api/v1/pods"), (b"authorization", b"Bearer agent-token")]
OK = [(b":status", b"200"), (b"content-type", b"application/json")]
PING_PAYLOAD = b"\x01\x02\x03\x04\x05\x06\x07\x08"


# --- helpers ----------------------------------------------------------------------------------

def raw(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """A frame as struct lays it out: no validation, for malformed frames."""
    n = len(payload)
    return struct.pack(">BHBBL", n >> 16, n & 0xFFFF, ftype, flags, stream_id) + payload


def setting(key: int, value: int) -> bytes:
    return struct.pack(">HL", key, value)


def settings(*pairs: tuple[int, int]) -> bytes:
    return raw(T_SETTINGS, 0, 0, b"".join(setting(k, v) for k, v in pairs))


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
    return raw(T_RST, 0, stream_id, struct.pack(">L", code))


def goaway(last_stream_id: int, code: int = NO_ERROR, debug: bytes = b"") -> bytes:
    return GoAwayFrame(0, last_stream_id=last_stream_id, error_code=code,
                       additional_data=debug).serialize()


def summary(events: Iterable[Event]) -> list[tuple[object, ...]]:
    """Events as comparable tuples (the classes have slots, no __eq__)."""
    out: list[tuple[object, ...]] = []
    for e in events:
        name = type(e).__name__
        if isinstance(e, ResponseReceived):
            out.append((name, e.stream_id, tuple(e.headers), e.stream_ended))
        elif isinstance(e, InformationalResponse):
            out.append((name, e.stream_id, tuple(e.headers)))
        elif isinstance(e, DataReceived):
            out.append((name, e.stream_id, e.data, e.flow_controlled_length, e.stream_ended))
        elif isinstance(e, StreamReset):
            out.append((name, e.stream_id, e.error_code, e.remote_reset))
        elif isinstance(e, (WindowUpdated, TrailersReceived)):
            out.append((name, e.stream_id))
        elif isinstance(e, ConnectionTerminated):
            out.append((name, e.error_code, e.last_stream_id, tuple(e.refused)))
        else:
            out.append((name,))
    return out


class Server:
    """A server's side, by hand: its own HPACK encoder (with a dynamic table, as Go's server
    uses) and a client connection past the preface and SETTINGS exchange."""

    def __init__(self, server_settings: bytes | None = None, **kwargs: Any) -> None:
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        kwargs.setdefault("max_header_list_size", HEADER_LIST_LIMIT)
        self.client = ClientConnection(**kwargs)
        self.client.initiate()
        sent = self.client.data_to_send()
        assert sent.startswith(PREFACE)
        self.client_preface = parse(sent[len(PREFACE):])
        events = self.client.receive_data(
            settings((S_MAX_CONCURRENT_STREAMS, 100)) if server_settings is None
            else server_settings)
        assert summary(events) == [("SettingsChanged",)]
        ack = self.out()
        assert len(ack) == 1 and isinstance(ack[0], SettingsFrame) and "ACK" in ack[0].flags

    def block(self, fields: Iterable[tuple[bytes, bytes]] = OK) -> bytes:
        return self.encoder.encode(list(fields))

    def headers(self, stream_id: int, fields: Iterable[tuple[bytes, bytes]] = OK, *,
                end_stream: bool = False) -> bytes:
        flags = F_END_HEADERS | (F_END_STREAM if end_stream else 0)
        return raw(T_HEADERS, flags, stream_id, self.block(fields))

    def send(self, data: bytes) -> list[tuple[object, ...]]:
        return summary(self.client.receive_data(data))

    def out(self) -> list[Frame]:
        return parse(self.client.data_to_send())

    def request(self, fields: list[tuple[bytes, bytes]] = REQUEST, *, end_stream: bool = True,
                head_request: bool = False) -> int:
        """Open a stream; the HEADERS went out (checked) and the server decoded them."""
        sid = self.client.send_headers(fields, end_stream, head_request=head_request)
        frames = self.out()
        assert isinstance(frames[0], HeadersFrame) and frames[0].stream_id == sid
        block = b"".join(bytes(f.data) for f in frames)
        assert self.decoder.decode(block, raw=True) == fields
        return sid

    def respond(self, sid: int, fields: list[tuple[bytes, bytes]] = OK) -> None:
        assert self.send(self.headers(sid, fields)) == [
            ("ResponseReceived", sid, tuple(fields), False)]
        assert self.out() == []

    def connection_error(self, data: bytes, code: int) -> ServerProtocolError:
        """``data`` breaks a connection rule: GOAWAY ``code`` (last stream 0: a server opens
        none), and nothing is accepted after."""
        with pytest.raises(ServerProtocolError) as info:
            self.client.receive_data(data)
        assert info.value.code == code
        frames = self.out()
        assert isinstance(frames[-1], GoAwayFrame), frames
        assert (frames[-1].error_code, frames[-1].last_stream_id) == (code, 0)
        assert not any(isinstance(f, GoAwayFrame) for f in frames[:-1])
        assert self.client.receive_data(ping()) == []
        assert self.client.data_to_send() == b""
        assert not self.client.can_open
        return info.value

    def stream_error(self, data: bytes, stream_id: int, code: int,
                     before: list[tuple[object, ...]] | None = None) -> None:
        """``data`` breaks a rule of ``stream_id`` only: RST_STREAM ``code`` and a StreamReset
        we initiated (after the events in ``before``); the connection goes on."""
        assert self.send(data) == [*(before or []), ("StreamReset", stream_id, code, False)]
        frames = self.out()
        assert len(frames) == 1 and isinstance(frames[0], RstStreamFrame), frames
        assert (frames[0].stream_id, frames[0].error_code) == (stream_id, code)
        assert stream_id not in self.client.streams
        self.assert_alive()

    def assert_alive(self) -> None:
        assert self.send(ping()) == [("PingReceived",)]
        frames = self.out()
        assert len(frames) == 1 and isinstance(frames[0], PingFrame)
        assert "ACK" in frames[0].flags and frames[0].opaque_data == PING_PAYLOAD


def fresh(**kwargs: Any) -> ClientConnection:
    kwargs.setdefault("max_header_list_size", HEADER_LIST_LIMIT)
    client = ClientConnection(**kwargs)
    client.initiate()
    client.data_to_send()
    return client


# --- §3.4: the connection preface -------------------------------------------------------------

def test_the_preface_refuses_push_and_announces_limits_and_windows() -> None:
    server = Server(initial_window_size=1000, connection_window=100_000)
    first, update = server.client_preface
    assert isinstance(first, SettingsFrame) and not first.flags
    assert first.settings == {S_ENABLE_PUSH: 0, S_MAX_HEADER_LIST_SIZE: HEADER_LIST_LIMIT,
                              S_INITIAL_WINDOW_SIZE: 1000}
    assert isinstance(update, WindowUpdateFrame)
    assert (update.stream_id, update.window_increment) == (0, 100_000 - 65535)


def test_default_windows_need_no_setting_and_no_window_update() -> None:
    (first,) = Server().client_preface
    assert isinstance(first, SettingsFrame)
    assert first.settings == {S_ENABLE_PUSH: 0, S_MAX_HEADER_LIST_SIZE: HEADER_LIST_LIMIT}


@pytest.mark.parametrize("first", [ping(), settings() [:3] + b"\x04\x01" + settings()[5:],
                                   window_update(0, 10)], ids=["ping", "settings-ack", "wu"])
def test_the_servers_first_frame_must_be_settings(first: bytes) -> None:
    client = fresh()
    with pytest.raises(ServerProtocolError) as info:
        client.receive_data(first)
    assert info.value.code == PROTOCOL_ERROR
    (goaway_frame,) = parse(client.data_to_send())
    assert isinstance(goaway_frame, GoAwayFrame) and goaway_frame.error_code == PROTOCOL_ERROR


def test_no_stream_opens_before_the_servers_settings() -> None:
    client = fresh()
    assert not client.can_open
    with pytest.raises(NoNewStreams):
        client.send_headers(REQUEST, True)
    assert summary(client.receive_data(settings())) == [("SettingsChanged",)]
    assert client.can_open and client.send_headers(REQUEST, True) == 1


def test_settings_and_frames_split_at_every_byte() -> None:
    wire = settings((S_MAX_FRAME_SIZE, 20000)) + ping()
    for cut in range(1, len(wire)):
        client = fresh()
        events = summary(client.receive_data(wire[:cut])) + summary(
            client.receive_data(wire[cut:]))
        assert events == [("SettingsChanged",), ("PingReceived",)], cut
        assert [type(f) for f in parse(client.data_to_send())] == [SettingsFrame, PingFrame]
    client = fresh()  # and one byte per call
    events = []
    for i in range(len(wire)):
        events += summary(client.receive_data(wire[i:i + 1]))
    assert events == [("SettingsChanged",), ("PingReceived",)]
    assert client.max_outbound_frame_size == 20000


def test_a_response_split_at_every_byte_gives_the_same_events() -> None:
    def run(cuts: list[int]) -> tuple[list[tuple[object, ...]], bytes, int]:
        server = Server()
        sid = server.request()
        wire = (server.headers(sid, length(3 * 700)) + data_frame(sid, b"a" * 700)
                + raw(T_DATA, F_PADDED, sid, b"\x05" + b"b" * 700 + bytes(5))
                + data_frame(sid, b"c" * 700, True) + ping())
        events: list[tuple[object, ...]] = []
        body = b""
        for start, stop in zip([0, *cuts], [*cuts, len(wire)], strict=True):
            for event in server.client.receive_data(wire[start:stop]):
                if isinstance(event, DataReceived):
                    body += event.data
                    events.append(("DataReceived", event.stream_id, event.stream_ended))
                else:
                    events += summary([event])
        return events, body, len(wire)

    whole_events, whole_body, size = run([])
    assert whole_body == b"a" * 700 + b"b" * 700 + b"c" * 700
    for cut in range(1, size):
        events, body, _ = run([cut])
        assert body == whole_body, cut
        # the same events, the DATA perhaps cut in two where the read was
        assert [e for e in events if e[0] != "DataReceived"] == [
            e for e in whole_events if e[0] != "DataReceived"], cut
        assert events[-2][2] is True or events[-1][0] == "PingReceived"
    events, body, _ = run(list(range(1, size)))  # one byte per read
    assert body == whole_body


def test_reads_from_one_reused_buffer_give_the_same_events() -> None:
    # The agent reads every connection into one shared buffer (gateway.agent.h2pool): the core
    # may keep nothing of a read, so a frame cut at its end is copied, not a view of a buffer
    # the next read overwrites (here with garbage first, then the next read's bytes).
    server = Server()
    sid = server.request()
    wire = (server.headers(sid, length(3 * 700)) + data_frame(sid, b"a" * 700)
            + data_frame(sid, b"b" * 700) + data_frame(sid, b"c" * 700, True) + ping())
    for cut in range(1, len(wire)):
        server = Server()
        assert server.request() == sid
        buffer = bytearray(len(wire))
        body, names = b"", []
        for start, stop in ((0, cut), (cut, len(wire))):
            n = stop - start
            buffer[:] = b"\xff" * len(buffer)
            buffer[:n] = wire[start:stop]
            with memoryview(buffer)[:n] as view:
                for event in server.client.receive_data(view):
                    names.append(type(event).__name__)
                    if isinstance(event, DataReceived):
                        body += event.data  # read during the call, as the agent does
        assert body == b"a" * 700 + b"b" * 700 + b"c" * 700, cut
        assert names[0] == "ResponseReceived" and names[-1] == "PingReceived", cut


# --- requests and responses (§8.1) ------------------------------------------------------------

def test_a_request_and_its_response() -> None:
    server = Server()
    sid = server.request()
    assert sid == 1
    fields = [(b":status", b"200"), (b"content-length", b"5")]
    assert server.send(server.headers(sid, fields) + data_frame(sid, b"hello", True)) == [
        ("ResponseReceived", 1, tuple(fields), False), ("DataReceived", 1, b"hello", 5, True)]
    assert server.client.streams == {} and server.out() == []


def test_stream_ids_are_odd_and_increasing() -> None:
    server = Server()
    assert [server.request() for _ in range(3)] == [1, 3, 5]


def test_a_response_without_a_body_ends_with_its_head() -> None:
    server = Server()
    sid = server.request()
    fields = [(b":status", b"204")]
    assert server.send(server.headers(sid, fields, end_stream=True)) == [
        ("ResponseReceived", 1, tuple(fields), True)]
    assert server.client.streams == {}


def test_a_request_body_then_the_response() -> None:
    server = Server()
    sid = server.request(end_stream=False)
    server.client.send_data(sid, b"{}")
    server.client.end_stream(sid)
    frames = server.out()
    assert [(type(f), bytes(f.data), f.flags) for f in frames] == [
        (DataFrame, b"{}", set()), (DataFrame, b"", {"END_STREAM"})]
    with pytest.raises(StreamClosedError):
        server.client.send_data(sid, b"more")
    server.respond(sid)
    assert server.send(data_frame(sid, b"", True)) == [("DataReceived", 1, b"", 0, True)]
    assert server.client.streams == {}


def test_consecutive_data_of_one_stream_in_one_read_is_one_event() -> None:
    server = Server()
    one, two = server.request(), server.request()
    server.respond(one)
    server.respond(two)
    wire = (data_frame(one, b"a") + data_frame(one, b"bb") + data_frame(two, b"x")
            + data_frame(one, b"c") + data_frame(one, b"d", True))
    events = server.client.receive_data(wire)
    assert summary(events) == [("DataReceived", 1, b"abb", 3, False),
                               ("DataReceived", 3, b"x", 1, False),
                               ("DataReceived", 1, b"cd", 2, True)]
    first = events[0]
    assert isinstance(first, DataReceived)
    assert first.pieces == [b"a", b"bb"]


def watch_read(sid: int, sizes: list[int]) -> tuple[bytearray, list[bytes]]:
    """A read as the agent's adapter hands it over: DATA frames of ``sizes`` bytes in a
    reused read buffer, and their payloads."""
    payloads = [bytes([65 + i % 26]) * n for i, n in enumerate(sizes)]
    return bytearray(b"".join(data_frame(sid, p) for p in payloads)), payloads


def test_small_payloads_are_copied_out_of_a_read_buffer_and_large_ones_are_views_of_it() -> None:
    server = Server(connection_window=1 << 30, initial_window_size=1 << 20)
    sid = server.request()
    server.respond(sid)
    buffer, payloads = watch_read(sid, [COPIED_BELOW, COPIED_BELOW + 1, 16384])
    [event] = server.client.receive_data(memoryview(buffer))
    assert isinstance(event, DataReceived)
    assert [bytes(p) for p in event.pieces] == payloads
    assert all(isinstance(p, memoryview) and p.obj is buffer for p in event.pieces)

    buffer, payloads = watch_read(sid, [542] * 100 + [COPIED_BELOW - 1, COPIED_BELOW])
    [event] = server.client.receive_data(memoryview(buffer))
    assert isinstance(event, DataReceived)
    buffer[:] = bytes(len(buffer))  # the next read lands in the same buffer
    small = [p for p in event.pieces if len(p) < COPIED_BELOW]
    assert small == payloads[:-1] and all(type(p) is bytes for p in small)
    assert isinstance(event.pieces[-1], memoryview) and len(event.pieces[-1]) == COPIED_BELOW
    assert event.flow_controlled_length == sum(map(len, payloads))


def test_a_read_buffer_of_small_frames_cut_anywhere_gives_the_same_events_as_bytes() -> None:
    whole = Server()
    sid = whole.request()
    whole.respond(sid)
    wire, payloads = watch_read(sid, [542] * 6)
    wire += whole.headers(sid, [(b"grpc-status", b"0")], end_stream=True)
    assert whole.send(bytes(wire)) == [
        ("DataReceived", sid, b"".join(payloads), 542 * 6, False), ("TrailersReceived", sid)]
    for cut in (5, 9, 551, 552, 1000, 551 * 3 + 4, len(wire) - 3):
        server = Server()
        sid = server.request()
        server.respond(sid)
        got: list[Event] = []
        buffer = bytearray(len(wire))
        for piece in (wire[:cut], wire[cut:]):
            buffer[:len(piece)] = piece
            for event in server.client.receive_data(memoryview(buffer)[:len(piece)]):
                if isinstance(event, DataReceived):
                    event = DataReceived(event.stream_id, event.data,
                                         event.flow_controlled_length, event.stream_ended,
                                         event.body_complete)  # read before the next read
                got.append(event)
        assert b"".join(e.data for e in got if isinstance(e, DataReceived)) == b"".join(payloads)
        assert summary(got)[-1] == ("TrailersReceived", sid), cut
        assert server.client.streams == {}


def test_interim_responses_come_before_the_final_one() -> None:
    server = Server()
    sid = server.request()
    interim = [(b":status", b"100")]
    assert server.send(server.headers(sid, interim)) == [
        ("InformationalResponse", 1, tuple(interim))]
    early = [(b":status", b"103"), (b"link", b"</a>")]
    assert server.send(server.headers(sid, early)) == [("InformationalResponse", 1, tuple(early))]
    server.respond(sid)
    assert server.send(data_frame(sid, b"x", True)) == [("DataReceived", 1, b"x", 1, True)]


@pytest.mark.parametrize("status,end", [(b"100", True), (b"101", False)])
def test_an_interim_head_that_ends_the_stream_or_a_101_is_a_stream_error(status: bytes,
                                                                         end: bool) -> None:
    server = Server()
    sid = server.request()
    server.stream_error(server.headers(sid, [(b":status", status)], end_stream=end), sid,
                        PROTOCOL_ERROR)


def test_data_before_the_response_head_is_a_stream_error() -> None:
    server = Server()
    sid = server.request()
    server.stream_error(data_frame(sid, b"early"), sid, PROTOCOL_ERROR)
    server.stream_error(data_frame(server.request(), b"", True), 3, PROTOCOL_ERROR)


def test_trailers_end_the_response() -> None:
    server = Server()
    sid = server.request()
    server.respond(sid)
    assert server.send(data_frame(sid, b"body")
                       + server.headers(sid, [(b"grpc-status", b"0")], end_stream=True)) == [
        ("DataReceived", 1, b"body", 4, False), ("TrailersReceived", 1)]
    assert server.client.streams == {}


def test_trailers_that_do_not_end_the_stream_are_a_stream_error() -> None:
    server = Server()
    sid = server.request()
    server.respond(sid)
    server.stream_error(server.headers(sid, [(b"x-trailer", b"1")]), sid, PROTOCOL_ERROR)


# --- §8.1.1: content-length against DATA ------------------------------------------------------

def length(n: int) -> list[tuple[bytes, bytes]]:
    return [(b":status", b"200"), (b"content-length", b"%d" % n)]


def test_data_past_the_content_length_is_a_stream_error_and_not_handed_on() -> None:
    server = Server()
    sid = server.request()
    server.respond(sid, length(4))
    assert server.send(data_frame(sid, b"ab")) == [("DataReceived", 1, b"ab", 2, False)]
    server.stream_error(data_frame(sid, b"cde"), sid, PROTOCOL_ERROR)


def test_events_say_when_the_body_is_complete_by_its_length_before_end_stream() -> None:
    # The relay ends a response at its content-length's last byte (Go's server sends
    # END_STREAM later, in a frame of its own): the core, which counts the bytes against the
    # length anyway, says so, frame by frame or for a run of frames in one read.
    server = Server()
    sid = server.request()
    [head] = server.client.receive_data(server.headers(sid, length(6)))
    assert isinstance(head, ResponseReceived) and not head.body_complete
    [part] = server.client.receive_data(data_frame(sid, b"ab"))
    assert isinstance(part, DataReceived) and not part.body_complete
    [rest] = server.client.receive_data(data_frame(sid, b"cd") + data_frame(sid, b"ef"))
    assert isinstance(rest, DataReceived) and rest.data == b"cdef"
    assert rest.body_complete and not rest.stream_ended
    [end] = server.client.receive_data(data_frame(sid, b"", True))
    assert isinstance(end, DataReceived) and end.body_complete and end.stream_ended
    # Padded frames take the frame-by-frame path.
    sid = server.request()
    server.respond(sid, length(2))
    padded = DataFrame(sid, data=b"xy", pad_length=3, flags=["PADDED"]).serialize()
    [event] = server.client.receive_data(padded)
    assert isinstance(event, DataReceived) and event.body_complete and not event.stream_ended
    # Without a content-length, only END_STREAM completes the body.
    sid = server.request()
    server.respond(sid)
    [event] = server.client.receive_data(data_frame(sid, b"abc"))
    assert isinstance(event, DataReceived) and not event.body_complete
    [event] = server.client.receive_data(data_frame(sid, b"d", True))
    assert isinstance(event, DataReceived) and event.body_complete


@pytest.mark.parametrize(("fields", "head_request", "complete"), [
    (length(0), False, True),
    ([(b":status", b"204")], False, True),
    ([(b":status", b"304"), (b"content-length", b"10")], False, True),
    (length(10), True, True),  # a HEAD request's response has no content
    (length(10), False, False),
    (OK, False, False),
], ids=["length-0", "204", "304", "head", "length-10", "no-length"])
def test_a_head_without_content_says_the_body_is_complete(
        fields: list[tuple[bytes, bytes]], head_request: bool, complete: bool) -> None:
    server = Server()
    sid = server.request(head_request=head_request)
    [head] = server.client.receive_data(server.headers(sid, fields))
    assert isinstance(head, ResponseReceived) and not head.stream_ended
    assert head.body_complete is complete


def test_the_end_short_of_the_content_length_is_a_stream_error() -> None:
    server = Server()
    sid = server.request()
    server.respond(sid, length(4))
    server.stream_error(data_frame(sid, b"abc", True), sid, PROTOCOL_ERROR)
    other = server.request()
    server.respond(other, length(4))
    server.stream_error(server.headers(other, [(b"x-t", b"1")], end_stream=True), other,
                        PROTOCOL_ERROR)


def test_a_head_that_ends_the_stream_but_declares_content_is_a_stream_error() -> None:
    server = Server()
    sid = server.request()
    server.stream_error(server.headers(sid, length(3), end_stream=True), sid, PROTOCOL_ERROR)


def test_the_head_event_carries_the_declared_length_as_parsed() -> None:
    # The relay takes the core's parse (gateway.wire.h2upstream.relayed_response) rather than
    # parsing the value again: the first content-length, surrounding blanks stripped; -1 for
    # none or one that does not parse; given as declared even where no content may follow.
    cases = [([(b":status", b"200"), (b"content-length", b" 42\t")], 42),
             ([(b":status", b"200")], -1),
             ([(b":status", b"200"), (b"content-length", b"+4")], -1),
             ([(b":status", b"200"), (b"content-length", b"4, 4")], -1),
             ([(b":status", b"304"), (b"content-length", b"10")], 10)]
    for fields, declared in cases:
        server = Server()
        sid = server.request()
        events = server.client.receive_data(server.headers(sid, fields))
        assert [(type(e).__name__, getattr(e, "content_length", None)) for e in events] == [
            ("ResponseReceived", declared)], fields


def test_responses_without_content_may_declare_a_length() -> None:
    server = Server()
    head = server.request([(b":method", b"HEAD"), *REQUEST[1:]], head_request=True)
    assert server.send(server.headers(head, length(10), end_stream=True)) == [
        ("ResponseReceived", head, tuple(length(10)), True)]
    not_modified = [(b":status", b"304"), (b"content-length", b"10")]
    sid = server.request()
    assert server.send(server.headers(sid, not_modified, end_stream=True)) == [
        ("ResponseReceived", sid, tuple(not_modified), True)]
    # but they carry no content
    sid = server.request([(b":method", b"HEAD"), *REQUEST[1:]], head_request=True)
    server.respond(sid, length(10))
    server.stream_error(data_frame(sid, b"x"), sid, PROTOCOL_ERROR)


# --- §5.1: stream states ----------------------------------------------------------------------

@pytest.mark.parametrize("frame", [
    data_frame(3, b"x"), raw(T_HEADERS, F_END_HEADERS, 2, b"\x88"),
    raw(T_HEADERS, F_END_HEADERS, 5, b"\x88"), rst(3, CANCEL), window_update(3, 1),
    rst(2, CANCEL)], ids=["data", "headers-even", "headers-ahead", "rst", "window", "rst-even"])
def test_frames_on_streams_we_never_opened_are_protocol_errors(frame: bytes) -> None:
    server = Server()
    server.request()  # stream 1 only
    server.connection_error(frame, PROTOCOL_ERROR)


@pytest.mark.parametrize("frame", [raw(T_DATA, 0, 0, b"x"), raw(T_HEADERS, F_END_HEADERS, 0,
                                                             b"\x88"),
                                   raw(T_PRIORITY, 0, 0, bytes(5)), rst(0, CANCEL)],
                         ids=["data", "headers", "priority", "rst"])
def test_stream_frames_on_stream_zero_are_protocol_errors(frame: bytes) -> None:
    Server().connection_error(frame, PROTOCOL_ERROR)


@pytest.mark.parametrize("frame", [raw(T_SETTINGS, 0, 1), raw(T_PING, 0, 1, bytes(8)),
                                   raw(T_GOAWAY, 0, 1, bytes(8))],
                         ids=["settings", "ping", "goaway"])
def test_connection_frames_on_a_stream_are_protocol_errors(frame: bytes) -> None:
    server = Server()
    server.request()
    server.connection_error(frame, PROTOCOL_ERROR)


def test_push_promise_is_a_protocol_error() -> None:
    server = Server()
    sid = server.request()
    promise = raw(T_PUSH, F_END_HEADERS, sid, struct.pack(">L", 2) + server.block(REQUEST))
    server.connection_error(promise, PROTOCOL_ERROR)


def test_data_after_the_response_ended_while_we_still_send_is_a_stream_error() -> None:
    server = Server()
    sid = server.request(end_stream=False)  # our request body is still open
    assert server.send(server.headers(sid, length(0), end_stream=True))[0][0] == \
        "ResponseReceived"
    assert sid in server.client.streams  # half-closed (remote)
    server.stream_error(data_frame(sid, b"late"), sid, STREAM_CLOSED)


def test_data_on_a_stream_closed_both_ways_is_a_connection_error() -> None:
    server = Server()
    sid = server.request()
    server.send(server.headers(sid, length(0), end_stream=True))
    server.connection_error(data_frame(sid, b"late"), STREAM_CLOSED)


def test_window_updates_and_resets_on_a_closed_stream_are_ignored() -> None:
    server = Server()
    sid = server.request()
    server.send(server.headers(sid, length(0), end_stream=True))
    assert server.send(window_update(sid, 10) + rst(sid, CANCEL)) == [
        ("FrameIgnored",), ("FrameIgnored",)]
    server.assert_alive()


def test_frames_for_a_stream_we_reset_are_ignored_and_hpack_stays_in_step() -> None:
    server = Server(connection_window=65535)
    sid = server.request()
    server.respond(sid)
    assert server.client.reset_stream(sid, CANCEL) is True
    (reset,) = server.out()
    assert isinstance(reset, RstStreamFrame) and reset.error_code == CANCEL
    assert server.client.reset_stream(sid, CANCEL) is False  # closed: nothing more
    # In flight before the server saw our reset: DATA (counted against the connection
    # window) and a header block that adds to the HPACK table.
    added = [(b":status", b"200"), (b"x-new-field", b"in the dynamic table")]
    assert server.send(data_frame(sid, b"x" * 16000) + server.headers(sid, [(b"x-t", b"1")])
                       + server.headers(sid, added, end_stream=True)) == [("FrameIgnored",)] * 3
    other = server.request()
    assert server.send(server.headers(other, added, end_stream=True)) == [
        ("ResponseReceived", other, tuple(added), True)]
    for _ in range(2):  # 32,000 more: over half the connection window, given back at once
        server.send(data_frame(sid, b"y" * 16000))
    (update,) = server.out()
    assert isinstance(update, WindowUpdateFrame)
    assert (update.stream_id, update.window_increment) == (0, 48000)


def test_only_the_last_resets_are_remembered() -> None:
    server = Server(settings((S_MAX_CONCURRENT_STREAMS, 2000)))
    ids = []
    for _ in range(RECENT_RESETS + 1):
        sid = server.client.send_headers(REQUEST, True)
        server.client.reset_stream(sid, CANCEL)
        ids.append(sid)
    server.client.data_to_send()
    assert server.send(data_frame(ids[1], b"x")) == [("FrameIgnored",)]
    server.connection_error(data_frame(ids[0], b"x"), STREAM_CLOSED)


def test_a_reset_from_the_server_ends_the_stream() -> None:
    server = Server()
    first, second = server.request(), server.request()
    assert server.send(rst(first, REFUSED_STREAM) + rst(second, INTERNAL_ERROR)) == [
        ("StreamReset", first, REFUSED_STREAM, True), ("StreamReset", second, INTERNAL_ERROR, True)]
    assert server.client.streams == {} and server.out() == []


# --- §4.2 and §6: frame sizes -----------------------------------------------------------------

def test_a_frame_over_16384_bytes_is_a_frame_size_error() -> None:
    server = Server()
    sid = server.request()
    server.respond(sid)
    server.connection_error(raw(T_DATA, 0, sid, bytes(16385)), FRAME_SIZE_ERROR)


def test_a_16384_byte_frame_is_fine() -> None:
    server = Server()
    sid = server.request()
    server.respond(sid)
    assert server.send(raw(T_DATA, 0, sid, bytes(16384))) == [
        ("DataReceived", sid, bytes(16384), 16384, False)]


@pytest.mark.parametrize("frame", [
    raw(T_PING, 0, 0, bytes(7)), raw(T_PING, 0, 0, bytes(9)), raw(T_WINDOW_UPDATE, 0, 0, bytes(3)),
    raw(T_RST, 0, 1, bytes(5)), raw(T_SETTINGS, 0, 0, bytes(5)),
    raw(T_SETTINGS, F_ACK, 0, bytes(6)), raw(T_GOAWAY, 0, 0, bytes(7))],
    ids=["ping-7", "ping-9", "window-3", "rst-5", "settings-5", "settings-ack-6", "goaway-7"])
def test_fixed_size_frames_of_the_wrong_size_are_frame_size_errors(frame: bytes) -> None:
    server = Server()
    server.request()
    server.connection_error(frame, FRAME_SIZE_ERROR)


def test_a_priority_frame_of_the_wrong_size_is_a_stream_error() -> None:
    server = Server()
    sid = server.request()
    server.stream_error(raw(T_PRIORITY, 0, sid, bytes(4)), sid, FRAME_SIZE_ERROR)


# --- §6.1, §6.2: padding and priorities ------------------------------------------------------

def test_padding_is_removed_and_counted_in_the_flow_controlled_length() -> None:
    server = Server()
    sid = server.request()
    block = server.block()
    padded_headers = raw(T_HEADERS, F_END_HEADERS | F_PADDED | F_PRIORITY, sid,
                         b"\x03" + struct.pack(">LB", 0, 15) + block + b"\0\0\0")
    assert server.send(padded_headers) == [("ResponseReceived", sid, tuple(OK), False)]
    padded_data = raw(T_DATA, F_PADDED | F_END_STREAM, sid, b"\x04body\0\0\0\0")
    assert server.send(padded_data) == [("DataReceived", sid, b"body", 9, True)]


@pytest.mark.parametrize("ftype,payload", [(T_DATA, b"\x05abcd"), (T_DATA, b""),
                                           (T_HEADERS, b"\x05abcd")])
def test_padding_longer_than_the_frame_is_a_protocol_error(ftype: int, payload: bytes) -> None:
    server = Server()
    sid = server.request()
    if ftype == T_DATA:
        server.respond(sid)
    server.connection_error(raw(ftype, F_PADDED | F_END_HEADERS, sid, payload), PROTOCOL_ERROR)


def test_a_response_depending_on_itself_is_a_stream_error() -> None:
    server = Server()
    sid = server.request()
    frame = raw(T_HEADERS, F_END_HEADERS | F_PRIORITY, sid,
                struct.pack(">LB", sid, 15) + server.block())
    server.stream_error(frame, sid, PROTOCOL_ERROR)
    # decoded all the same: the next block that refers to the table decodes right
    other = server.request()
    server.respond(other)


def test_priority_frames_are_ignored() -> None:
    server = Server()
    sid = server.request()
    assert server.send(raw(T_PRIORITY, 0, sid, struct.pack(">LB", 0, 15))) == [("FrameIgnored",)]
    assert server.send(raw(T_PRIORITY, 0, 8, struct.pack(">LB", 0, 15))) == [("FrameIgnored",)]


def test_unknown_frame_types_are_ignored() -> None:
    server = Server()
    assert server.send(raw(0x21, 0xFF, 0, b"whatever")) == [("FrameIgnored",)]
    server.assert_alive()


# --- §6.10: header blocks ---------------------------------------------------------------------

def test_a_header_block_over_continuation_frames() -> None:
    server = Server()
    sid = server.request()
    block = server.block([*OK, (b"x-long", b"v" * 100)])
    wire = (raw(T_HEADERS, 0, sid, block[:10]) + raw(T_CONTINUATION, 0, sid, block[10:20])
            + raw(T_CONTINUATION, F_END_HEADERS, sid, block[20:]))
    assert server.send(wire) == [
        ("ResponseReceived", sid, (*OK, (b"x-long", b"v" * 100)), False)]


@pytest.mark.parametrize("interruption", [ping(), data_frame(1, b"x"), raw(0x21, 0, 0)],
                         ids=["ping", "data", "unknown"])
def test_a_header_block_interrupted_is_a_protocol_error(interruption: bytes) -> None:
    server = Server()
    sid = server.request()
    block = server.block()
    server.connection_error(raw(T_HEADERS, 0, sid, block[:1]) + interruption, PROTOCOL_ERROR)


def test_continuation_without_headers_or_on_another_stream_is_a_protocol_error() -> None:
    server = Server()
    sid = server.request()
    server.connection_error(raw(T_CONTINUATION, F_END_HEADERS, sid, server.block()),
                            PROTOCOL_ERROR)
    server = Server()
    one, three = server.request(), server.request()
    block = server.block()
    server.connection_error(raw(T_HEADERS, 0, one, block[:1])
                            + raw(T_CONTINUATION, F_END_HEADERS, three, block[1:]),
                            PROTOCOL_ERROR)


def test_too_many_continuation_frames_are_enhance_your_calm() -> None:
    server = Server()
    sid = server.request()
    wire = raw(T_HEADERS, 0, sid) + raw(T_CONTINUATION, 0, sid) * (MAX_CONTINUATIONS + 1)
    server.connection_error(wire, ENHANCE_YOUR_CALM)


def test_a_header_block_longer_than_the_limit_is_refused_before_decoding() -> None:
    server = Server()
    sid = server.request()
    chunk = bytes(16384)
    wire = raw(T_HEADERS, 0, sid, chunk[:8000])
    for _ in range(HEADER_LIST_LIMIT // 16384 + 2):
        wire += raw(T_CONTINUATION, 0, sid, chunk)
    server.connection_error(wire, ENHANCE_YOUR_CALM)


def test_a_decoded_header_list_over_the_limit_is_enhance_your_calm() -> None:
    server = Server()
    sid = server.request()
    big = [*OK, (b"x-big", b"v" * 3000)]
    # one literal into the table, then the same index again and again: a small block
    block = server.block(big) + b"\xbe" * 10
    server.connection_error(raw(T_HEADERS, F_END_HEADERS, sid, block), ENHANCE_YOUR_CALM)


def test_an_undecodable_header_block_is_a_compression_error() -> None:
    server = Server()
    sid = server.request()
    server.connection_error(raw(T_HEADERS, F_END_HEADERS, sid, b"\xff\xff\xff\xff\xff\xff"),
                            COMPRESSION_ERROR)


# --- §6.5: SETTINGS ---------------------------------------------------------------------------

@pytest.mark.parametrize("pairs,code", [
    (((S_ENABLE_PUSH, 1),), PROTOCOL_ERROR),
    (((S_MAX_FRAME_SIZE, 16383),), PROTOCOL_ERROR),
    (((S_MAX_FRAME_SIZE, 2**24),), PROTOCOL_ERROR),
    (((S_INITIAL_WINDOW_SIZE, 2**31),), FLOW_CONTROL_ERROR),
    (((S_MAX_CONCURRENT_STREAMS, 1), (S_MAX_CONCURRENT_STREAMS, 2)), PROTOCOL_ERROR),
    (tuple((0x100 + i, 0) for i in range(MAX_SETTINGS_ENTRIES + 1)), PROTOCOL_ERROR),
], ids=["push", "frame-small", "frame-large", "window-large", "repeated", "too-many"])
def test_settings_out_of_range_are_connection_errors(pairs: tuple[tuple[int, int], ...],
                                                     code: int) -> None:
    Server().connection_error(settings(*pairs), code)


def test_settings_in_range_apply_and_are_acknowledged() -> None:
    server = Server()
    events = server.send(settings((S_ENABLE_PUSH, 0), (S_MAX_FRAME_SIZE, 2**24 - 1),
                                  (S_MAX_CONCURRENT_STREAMS, 7), (S_HEADER_TABLE_SIZE, 0),
                                  (S_MAX_HEADER_LIST_SIZE, 100), (0x77, 1)))
    assert events == [("SettingsChanged",)]
    (ack,) = server.out()
    assert isinstance(ack, SettingsFrame) and ack.flags == {"ACK"}
    client = server.client
    assert client.max_outbound_frame_size == 2**24 - 1
    assert client.peer_max_concurrent_streams == 7
    assert server.send(settings()[:3] + b"\x04\x01" + settings()[5:]) == [("FrameIgnored",)]


def test_a_larger_frame_size_carries_a_large_request_head_in_fewer_frames() -> None:
    server = Server()
    fields = [*REQUEST, (b"x-big", b"v" * 20000)]
    sid = server.client.send_headers(fields, True)
    assert [type(f) for f in server.out()] == [HeadersFrame, ContinuationFrame]
    server.send(settings((S_MAX_FRAME_SIZE, 32768)))
    server.out()
    server.request(fields)  # one HEADERS frame now (checked and decoded by request())
    assert sid == 1


def test_the_servers_max_concurrent_streams_bounds_our_streams() -> None:
    server = Server(settings((S_MAX_CONCURRENT_STREAMS, 2)))
    one = server.request()
    server.request()
    assert not server.client.can_open
    with pytest.raises(NoNewStreams):
        server.client.send_headers(REQUEST, True)
    server.send(server.headers(one, length(0), end_stream=True))
    assert server.client.can_open
    assert server.request() == 5


def test_stream_ids_run_out() -> None:
    server = Server()
    server.client.next_stream_id = 2**31 - 1
    assert server.request() == 2**31 - 1
    assert not server.client.can_open
    with pytest.raises(NoNewStreams):
        server.client.send_headers(REQUEST, True)


# --- §6.9: flow control -----------------------------------------------------------------------

def test_the_stream_window_is_given_back_only_as_the_application_takes_bytes() -> None:
    server = Server(connection_window=1 << 30)
    sid = server.request()
    server.respond(sid)
    server.send(data_frame(sid, b"x" * 16000))
    server.client.acknowledge_received_data(16000, sid)
    assert server.out() == []  # taken, but the server still has over half the window
    for _ in range(2):
        server.send(data_frame(sid, b"x" * 16000))
    assert server.out() == []  # a paused reader: nothing taken, nothing given back
    server.client.acknowledge_received_data(32000, sid)
    (update,) = server.out()
    assert isinstance(update, WindowUpdateFrame)
    assert (update.stream_id, update.window_increment) == (sid, 48000)


def test_data_beyond_the_stream_window_is_a_stream_error() -> None:
    server = Server(connection_window=1 << 30)
    sid = server.request()
    server.respond(sid)
    for _ in range(4):
        server.send(data_frame(sid, b"x" * 16000))
    server.stream_error(data_frame(sid, b"x" * 1536), sid, FLOW_CONTROL_ERROR)


def test_a_run_of_data_frames_stops_at_the_frame_that_breaks_a_rule() -> None:
    # A read of many DATA frames (a watch's events) is taken in one pass; the frame that
    # breaks the stream's window or its content-length is refused as alone, and the frames
    # before it are handed on.
    server = Server(connection_window=1 << 30)
    sid = server.request()
    server.respond(sid)
    server.stream_error(data_frame(sid, b"x" * 16000) * 4 + data_frame(sid, b"y" * 1536), sid,
                        FLOW_CONTROL_ERROR, before=[("DataReceived", sid, b"x" * 64000, 64000,
                                                     False)])
    sid = server.request()
    server.respond(sid, length(5))
    server.stream_error(data_frame(sid, b"ab") + data_frame(sid, b"cd") + data_frame(sid, b"ef"),
                        sid, PROTOCOL_ERROR, before=[("DataReceived", sid, b"abcd", 4, False)])


def test_data_beyond_the_connection_window_is_a_connection_error() -> None:
    server = Server(initial_window_size=1 << 20)  # connection window: the default 65,535
    sid = server.request()
    server.respond(sid)
    wire = data_frame(sid, b"x" * 16384) * 3 + data_frame(sid, b"x" * 16383)
    # the connection window is given back on receipt, once a read took it past half (all of
    # what that read took, in one WINDOW_UPDATE), not when the stream's data is acknowledged
    events = server.client.receive_data(wire[:3 * (16384 + 9)])
    assert len(events) == 1 and server.client._recv_window > 16383
    assert [(f.stream_id, f.window_increment) for f in server.out()] == [(0, 16384 * 3)]
    client = ClientConnection(max_header_list_size=HEADER_LIST_LIMIT, initial_window_size=1 << 20)
    client.initiate()
    client.receive_data(settings())
    client.data_to_send()
    sid = client.send_headers(REQUEST, True)
    client.receive_data(raw(T_HEADERS, F_END_HEADERS, sid, b"\x88"))
    client._recv_window = 100  # as if the server had used the rest
    with pytest.raises(ServerProtocolError) as info:
        client.receive_data(data_frame(sid, b"x" * 101))
    assert info.value.code == FLOW_CONTROL_ERROR


def test_we_send_within_the_servers_windows() -> None:
    server = Server(settings((S_INITIAL_WINDOW_SIZE, 10)))
    sid = server.request(end_stream=False)
    assert server.client.local_flow_control_window(sid) == 10
    with pytest.raises(ValueError):
        server.client.send_data(sid, b"x" * 11)
    server.client.send_data(sid, b"x" * 10)
    assert server.client.local_flow_control_window(sid) == 0
    assert server.send(window_update(sid, 5)) == [("WindowUpdated", sid)]
    assert server.client.local_flow_control_window(sid) == 5


def test_a_smaller_initial_window_makes_open_windows_negative() -> None:
    server = Server(settings((S_INITIAL_WINDOW_SIZE, 100)))
    sid = server.request(end_stream=False)
    server.client.send_data(sid, b"x" * 80)
    server.out()
    assert server.send(settings((S_INITIAL_WINDOW_SIZE, 50))) == [("SettingsChanged",)]
    server.out()
    assert server.client.local_flow_control_window(sid) == -30  # §6.9.2
    with pytest.raises(ValueError):
        server.client.send_data(sid, b"x")
    assert server.send(window_update(sid, 31)) == [("WindowUpdated", sid)]
    assert server.client.local_flow_control_window(sid) == 1
    server.client.end_stream(sid)  # an empty END_STREAM takes no window
    assert [f.flags for f in server.out()] == [{"END_STREAM"}]


def test_a_larger_initial_window_opens_every_stream() -> None:
    server = Server(settings((S_INITIAL_WINDOW_SIZE, 0)))
    sid = server.request(end_stream=False)
    assert server.client.local_flow_control_window(sid) == 0
    assert server.send(settings((S_INITIAL_WINDOW_SIZE, 1000))) == [
        ("SettingsChanged",), ("WindowUpdated", 0)]
    assert server.client.local_flow_control_window(sid) == 1000


def test_window_update_rules() -> None:
    server = Server()
    server.connection_error(window_update(0, 0), PROTOCOL_ERROR)
    server = Server()
    sid = server.request()
    server.stream_error(window_update(sid, 0), sid, PROTOCOL_ERROR)
    sid = server.request()
    server.stream_error(window_update(sid, 2**31 - 1), sid, FLOW_CONTROL_ERROR)
    server.connection_error(window_update(0, 2**31 - 1), FLOW_CONTROL_ERROR)
    server = Server()
    server.request(end_stream=False)
    server.send(window_update(1, 2**31 - 1 - 65535))
    server.connection_error(settings((S_INITIAL_WINDOW_SIZE, 65536)), FLOW_CONTROL_ERROR)


# --- §6.8: GOAWAY -----------------------------------------------------------------------------

def test_goaway_closes_the_streams_it_did_not_process_and_lets_the_others_finish() -> None:
    server = Server()
    one, three, five = server.request(), server.request(), server.request()
    assert server.send(goaway(one, debug=b"shutting down")) == [
        ("ConnectionTerminated", NO_ERROR, 1, (three, five))]
    assert not server.client.can_open
    with pytest.raises(NoNewStreams):
        server.client.send_headers(REQUEST, True)
    assert set(server.client.streams) == {one}
    assert server.send(data_frame(three, b"late")) == [("FrameIgnored",)]
    server.respond(one)
    assert server.send(data_frame(one, b"done", True)) == [("DataReceived", 1, b"done", 4, True)]
    # A later GOAWAY may lower the last stream id, never raise it.
    server.send(goaway(7))
    assert server.client.goaway_received == one


def test_close_connection_sends_goaway_and_opens_nothing_more() -> None:
    server = Server()
    server.request()
    server.client.close_connection()
    (frame,) = server.out()
    assert isinstance(frame, GoAwayFrame)
    assert (frame.last_stream_id, frame.error_code) == (0, NO_ERROR)
    assert not server.client.can_open
    server.client.close_connection()
    assert server.out() == []


# --- §6.7: PING -------------------------------------------------------------------------------

def test_pings_are_answered_with_their_payload_and_acks_ignored() -> None:
    server = Server()
    assert server.send(ping(b"abcdefgh")) == [("PingReceived",)]
    (answer,) = server.out()
    assert isinstance(answer, PingFrame) and answer.flags == {"ACK"}
    assert answer.opaque_data == b"abcdefgh"
    assert server.send(ping(ack=True)) == [("FrameIgnored",)]
    assert server.out() == []


# --- floods -----------------------------------------------------------------------------------

def test_a_ping_flood_is_enhance_your_calm_before_its_answers_are_queued() -> None:
    server = Server(answered=FrameBudget(ANSWERED_BURST, 0.0))
    error = server.connection_error(ping() * (ANSWERED_BURST + 100), ENHANCE_YOUR_CALM)
    assert "flood" in str(error)


def test_ping_answers_within_the_budget_then_the_flood_stops() -> None:
    server = Server(answered=FrameBudget(5, 0.0))
    with pytest.raises(ServerProtocolError):
        server.client.receive_data(ping() * 10)
    frames = server.out()
    assert sum(isinstance(f, PingFrame) for f in frames) == 4  # the SETTINGS spent one
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == ENHANCE_YOUR_CALM


def test_a_settings_flood_is_enhance_your_calm() -> None:
    server = Server(answered=FrameBudget(ANSWERED_BURST, 0.0))
    server.connection_error(settings() * ANSWERED_BURST, ENHANCE_YOUR_CALM)


@pytest.mark.parametrize("frame", [window_update(0, 1), raw(0x21, 0, 0), ping(ack=True)],
                         ids=["window-update", "unknown", "ping-ack"])
def test_floods_of_frames_that_cost_only_parsing_are_enhance_your_calm(frame: bytes) -> None:
    server = Server(cheap=FrameBudget(CHEAP_BURST, 0.0))
    server.connection_error(frame * (CHEAP_BURST + 1), ENHANCE_YOUR_CALM)


def test_an_empty_data_flood_is_enhance_your_calm() -> None:
    server = Server(cheap=FrameBudget(50, 0.0))
    sid = server.request()
    server.respond(sid)
    server.connection_error(data_frame(sid, b"") * 51, ENHANCE_YOUR_CALM)


def test_broken_stream_rules_in_a_flood_are_enhance_your_calm() -> None:
    server = Server(settings((S_MAX_CONCURRENT_STREAMS, 1000)),
                    resets=FrameBudget(RESET_BURST, 0.0))
    ids = [server.client.send_headers(REQUEST, True) for _ in range(RESET_BURST + 1)]
    server.out()
    server.connection_error(b"".join(data_frame(sid, b"early") for sid in ids),
                            ENHANCE_YOUR_CALM)


# --- interop: h2's server role, in memory ------------------------------------------------------

class H2Server:
    """``h2``'s server side, wired to a :class:`ClientConnection` by hand (bytes both ways)."""

    def __init__(self, **settings: int) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100, **settings})
        self.conn.initiate_connection()
        self.client = ClientConnection(max_header_list_size=65536, connection_window=1 << 24)
        self.client.initiate()
        self.received: list[Any] = []
        self.events: list[Event] = []
        self.pump()

    def pump(self) -> None:
        """Carry bytes both ways until neither side has anything to say. The server takes
        request bodies as they come (acknowledges them at once)."""
        while True:
            up = self.client.data_to_send()
            if up:
                for event in self.conn.receive_data(up):
                    self.received.append(event)
                    if isinstance(event, h2.events.DataReceived):
                        self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                            event.stream_id)
            down = self.conn.data_to_send()
            if down:
                self.events += self.client.receive_data(down)
            if not up and not down:
                return

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


def body_of(events: list[Event], sid: int) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, DataReceived) and e.stream_id == sid)


def test_interop_requests_bodies_and_flow_control_both_ways_with_h2s_server() -> None:
    server = H2Server()
    assert summary(server.take())[:1] == [("SettingsChanged",)]
    big_request = bytes(range(256)) * 800  # 200 KB: several of h2's 64 KiB windows
    sid = server.client.send_headers([(b":method", b"POST"), *REQUEST[1:]], False)
    sent = 0
    while sent < len(big_request):  # as the agent does: within the windows, then wait
        window = min(server.client.local_flow_control_window(sid),
                     server.client.max_outbound_frame_size, len(big_request) - sent)
        assert window > 0  # the server acknowledged what it took: the window reopened
        server.client.send_data(sid, big_request[sent:sent + window])
        sent += window
        server.pump()
    server.client.end_stream(sid)
    server.pump()
    got = b"".join(e.data for e in server.received if isinstance(e, h2.events.DataReceived))
    assert got == big_request
    assert any(isinstance(e, h2.events.StreamEnded) for e in server.received)
    request = next(e for e in server.received if isinstance(e, h2.events.RequestReceived))
    assert dict(request.headers)[b"authorization"] == b"Bearer agent-token"
    # A response larger than our stream window: h2 sends as our window allows, and we give it
    # back as the application takes the bytes.
    big_response = b"r" * 300_000
    server.conn.send_headers(sid, [(b":status", b"200"), (b"content-length", b"300000")])
    pending = memoryview(big_response)
    got = b""
    while pending:
        room = min(server.conn.local_flow_control_window(sid),
                   server.conn.max_outbound_frame_size, len(pending))
        if room:
            server.conn.send_data(sid, pending[:room].tobytes(), end_stream=room == len(pending))
            pending = pending[room:]
        server.pump()
        events = server.take()
        for event in events:
            if isinstance(event, DataReceived):
                server.client.acknowledge_received_data(event.flow_controlled_length, sid)
        got += body_of(events, sid)
        server.pump()
    server.pump()
    got += body_of(server.take(), sid)
    assert got == big_response
    assert sid not in server.client.streams


def test_interop_settings_ping_trailers_resets_and_goaway_from_h2s_server() -> None:
    server = H2Server()
    server.take()
    one = server.client.send_headers(REQUEST, True)
    two = server.client.send_headers(REQUEST, True)
    three = server.client.send_headers(REQUEST, True)
    server.pump()
    server.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000,
                                 h2.settings.SettingCodes.MAX_FRAME_SIZE: 20000})
    server.conn.ping(b"12345678")
    server.conn.send_headers(one, [(b":status", b"200")])
    server.conn.send_data(one, b"body")
    server.conn.send_headers(one, [(b"x-checksum", b"1")], end_stream=True)
    server.conn.reset_stream(two, h2.errors.ErrorCodes.REFUSED_STREAM)
    server.pump()
    assert summary(server.take()) == [
        ("SettingsChanged",), ("PingReceived",), ("ResponseReceived", one, ((b":status", b"200"),),
                                                  False),
        ("DataReceived", one, b"body", 4, False), ("TrailersReceived", one),
        ("StreamReset", two, REFUSED_STREAM, True)]
    assert any(isinstance(e, h2.events.PingAckReceived) for e in server.received)
    assert server.client.max_outbound_frame_size == 20000
    server.conn.close_connection(last_stream_id=one)
    server.pump()
    assert summary(server.take()) == [("ConnectionTerminated", NO_ERROR, one, (three,))]



# --- receive-window auto-tuning ---------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tuned(budget: int = 1 << 20, max_window: int = 4 * 65535) -> tuple[Server, Clock,
                                                                          WindowBudget]:
    clock = Clock()
    window_budget = WindowBudget(budget)
    server = Server(connection_window=1 << 30, max_stream_window=max_window,
                    window_budget=window_budget, clock=clock)
    return server, clock, window_budget


def take(server: Server, sid: int, n: int) -> list[int]:
    """The server sends ``n`` bytes on ``sid``, the application takes them at once: the
    WINDOW_UPDATE increments that go out for the stream."""
    for piece in range(0, n, 16000):
        size = min(16000, n - piece)
        server.send(data_frame(sid, b"x" * size))
        server.client.acknowledge_received_data(size, sid)
    return [f.window_increment for f in server.out()
            if isinstance(f, WindowUpdateFrame) and f.stream_id == sid]


def test_a_window_taken_fast_doubles_up_to_its_ceiling_within_the_budget() -> None:
    server, clock, budget = tuned()
    sid = server.request()
    server.respond(sid)
    clock.now += 1  # the response came late: no growth at the first update
    assert take(server, sid, 48000) == [48000]  # half the window used: credit goes back
    clock.now += 0.01  # half a window again within GROW_WITHIN: it doubles (+65,535)
    assert take(server, sid, 33000) == [33000 + 65535]
    clock.now += 0.01  # half of 131,070 within GROW_WITHIN: doubles to 262,140, the ceiling
    assert take(server, sid, 66000) == [66000 + 131070]
    clock.now += 0.01
    assert take(server, sid, 132000) == [132000]  # at the ceiling: no more growth
    assert budget.used == 4 * 65535 - 65535
    # more than the grown window is still a flow-control error
    fits = 262140 // 16384
    server.stream_error(b"".join(data_frame(sid, b"y" * 16384) for _ in range(fits + 1)), sid,
                        FLOW_CONTROL_ERROR, before=[("DataReceived", sid, b"y" * 16384 * fits,
                                                     16384 * fits, False)])
    assert budget.used == 0  # the reset stream gave its growth back


def test_no_growth_without_a_budget_or_when_the_reader_is_slow() -> None:
    server = Server(connection_window=1 << 30)  # no budget: the window stays at 65,535
    sid = server.request()
    server.respond(sid)
    assert take(server, sid, 33000) + take(server, sid, 33000) == [33000, 33000]
    server, clock, budget = tuned()
    sid = server.request()
    server.respond(sid)
    for _ in range(3):
        clock.now += 0.2  # taken, but slowly: the reader is the limit, not the window
        assert take(server, sid, 33000) == [33000]
    assert budget.used == 0


def test_the_budget_is_shared_and_growth_goes_back_when_a_stream_ends() -> None:
    server, clock, budget = tuned(budget=65535)
    one, two = server.request(), server.request()
    clock.now += 0.5
    for sid in (one, two):
        server.respond(sid)
        assert take(server, sid, 33000) == [33000]
    clock.now += 0.001
    assert take(server, one, 33000) == [33000 + 65535]  # the whole budget
    assert take(server, two, 33000) == [33000]  # none left
    server.send(data_frame(one, b"", True))
    assert budget.used == 0
    clock.now += 0.001
    assert take(server, two, 33000) == [33000 + 65535]


def test_a_lost_connection_gives_its_streams_growth_back() -> None:
    server, clock, budget = tuned()
    one, two = server.request(), server.request()
    clock.now += 0.5
    for sid in (one, two):
        server.respond(sid)
        assert take(server, sid, 33000) == [33000]
    clock.now += 0.001
    for sid in (one, two):
        assert take(server, sid, 33000) == [33000 + 65535]
    assert budget.used == 2 * 65535
    server.client.connection_lost()
    assert budget.used == 0 and not server.client.streams
    assert server.client.receive_data(data_frame(one, b"x")) == []  # nothing more accepted


def test_a_grown_window_taken_slowly_again_shrinks_back_to_the_initial_window() -> None:
    server, clock, budget = tuned()
    sid = server.request()
    server.respond(sid)
    clock.now += 0.5
    assert take(server, sid, 33000) == [33000]
    clock.now += 0.001
    assert take(server, sid, 33000) == [33000 + 65535]  # 131,070
    clock.now += 0.001
    assert take(server, sid, 66000) == [66000 + 131070]  # 262,140
    assert budget.used == 196605
    clock.now += 5  # a watch after its burst: the window goes back, the credit withheld
    assert take(server, sid, 132000) == []  # 132,000 of the 196,605 taken back
    assert budget.used == 64605
    assert take(server, sid, 0) == []
    clock.now += 5
    assert take(server, sid, 66000) == [66000 - 64605]  # the rest taken back
    assert budget.used == 0
    stream = server.client.streams[sid]
    # the server's credit is the initial window again: 65,535 more fits, one byte more not
    assert stream.recv_target == 65535 and stream.recv_window == 65535
    server.stream_error(raw(T_DATA, 0, sid, b"z" * 16384) * 3 + raw(T_DATA, 0, sid, b"z" * 16383)
                        + raw(T_DATA, 0, sid, b"z"), sid, FLOW_CONTROL_ERROR,
                        before=[("DataReceived", sid, b"z" * 65535, 65535, False)])
