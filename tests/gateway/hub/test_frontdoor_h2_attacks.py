"""HTTP/2's known attacks against the front door (issue 15 item 3), each through a real TLS
socket: refused, or bounded."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator

import hpack
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from gateway.hub.config import FrontDoorLimits
from gateway.wire.h2server import ANSWERED_BURST, CHEAP_BURST, MAX_SETTINGS_ENTRIES, RESET_BURST
from tests.gateway.hub.h2client import H2Client, RawH2
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    FakeStream,
    Harness,
    Tls,
    h2tls,  # noqa: F401 - the session fixture
    running,
    tls,  # noqa: F401 - the session fixture
)

PROTOCOL_ERROR, FLOW_CONTROL_ERROR, REFUSED_STREAM, ENHANCE_YOUR_CALM = 1, 3, 7, 11


async def hold_agent(stream: FakeStream) -> None:
    """Answers the head of a watch, then holds the stream until it is reset."""
    await stream.request()
    stream.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
    await stream.wait(lambda: stream.closed, timeout=60)


@pytest.fixture
async def gw(h2tls: Tls) -> AsyncIterator[Harness]:  # noqa: F811
    async with running(h2tls, limits=FrontDoorLimits(max_h2_streams=8)) as harness:
        harness.connect_cluster("c1")
        harness.connect_cluster("hold", hold_agent)
        yield harness


@pytest.fixture
async def raw(gw: Harness) -> AsyncIterator[RawH2]:
    r = await RawH2.connect(gw.port, gw.tls.ca_file)
    yield r
    await r.close()


async def warm_token(gw: Harness) -> None:
    """One request first, so the token's review is cached and later ones admit at once."""
    c = await H2Client.connect(gw.port, gw.tls.ca_file)
    try:
        assert (await c.request("/c1/version", token=HUB_TOKEN)).status == 200
    finally:
        await c.close()


async def test_rapid_reset_is_bounded(gw: Harness, raw: RawH2) -> None:
    """CVE-2023-44487: open and reset streams as fast as possible; past the reset budget the
    connection ends with GOAWAY ENHANCE_YOUR_CALM, and the tunnel streams opened stay bounded."""
    await warm_token(gw)
    before = len(gw.streams("c1"))
    sid = 1
    for _ in range(20):  # bounded: 20 batches of 100 HEADERS + RST_STREAM
        batch = bytearray()
        for _ in range(100):
            f = HeadersFrame(sid)
            f.data = raw.headers_block("/c1/api/v1/pods", HUB_TOKEN)
            f.flags.add("END_STREAM")
            f.flags.add("END_HEADERS")
            batch += f.serialize() + RstStreamFrame(sid, error_code=8).serialize()
            sid += 2
        raw.send(bytes(batch))
        await asyncio.sleep(0)
        if raw.closed.is_set():
            break
    await raw.wait_closed()
    assert raw.goaway is not None and raw.goaway.error_code == ENHANCE_YOUR_CALM
    opened = len(gw.streams("c1")) - before
    assert opened <= RESET_BURST + 100, opened
    assert sid > 2 * RESET_BURST  # the budget, not something else, ended it
    assert gw.gateway.metrics.h2_calmed == 1


async def test_continuation_flood_is_refused(gw: Harness, raw: RawH2) -> None:
    """CVE-2024-27316: a header block that never ends (HEADERS without END_HEADERS and endless
    CONTINUATION frames) is a connection error long before memory grows."""
    raw.headers(1, raw.headers_block("/c1/version", HUB_TOKEN), end_headers=False)
    sent = 0
    for _ in range(100):  # bounded: up to 100 x 100 frames of 1 KiB
        batch = b"".join(ContinuationFrame(1, data=b"\x40" + b"a" * 1023).serialize()
                         for _ in range(100))
        raw.send(batch)
        sent += 100
        await asyncio.sleep(0.01)
        if raw.closed.is_set():
            break
    await raw.wait_closed()
    assert raw.goaway is not None and raw.goaway.error_code in (PROTOCOL_ERROR,
                                                                ENHANCE_YOUR_CALM)
    assert sent < 10_000
    assert gw.streams("c1") == []


async def test_hpack_bomb_is_refused(gw: Harness, raw: RawH2) -> None:
    """A 4 KB dynamic-table entry referenced 100 times decodes to 400 KB from a 4 KB block:
    over the header-list limit (the HTTP/1.1 head limit, 64 KiB), a connection error."""
    encoder = hpack.Encoder()
    headers = [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"),
               (":path", "/c1/version"), ("authorization", f"Bearer {HUB_TOKEN}")]
    block = encoder.encode(headers + [("x-bomb", "a" * 4000)] * 100)
    assert len(block) < 5000
    raw.headers(1, block)
    await raw.wait_closed()
    assert raw.goaway is not None and raw.goaway.error_code in (PROTOCOL_ERROR,
                                                                ENHANCE_YOUR_CALM)
    assert gw.streams("c1") == []


async def test_header_limits_match_http1(gw: Harness) -> None:
    """More fields than HTTP/1.1 allows (128) is a 431 Status on that stream; the connection
    carries on."""
    c = await H2Client.connect(gw.port, gw.tls.ca_file)
    try:
        many = [(f"x-f{i}", "v") for i in range(200)]
        r = await c.request("/c1/version", token=HUB_TOKEN, extra=many)
        assert r.status == 431 and r.ended
        assert (await c.request("/c1/version", token=HUB_TOKEN)).status == 200
    finally:
        await c.close()
    assert len(gw.streams("c1")) == 1


@pytest.mark.parametrize("frame", ["ping", "settings"])
async def test_ping_and_settings_floods_are_bounded(gw: Harness, raw: RawH2, frame: str) -> None:
    one = (PingFrame(0, opaque_data=b"12345678") if frame == "ping" else SettingsFrame(0))
    for _ in range(10):  # bounded: 10 x 100 frames
        raw.send(one.serialize() * 100)
        await asyncio.sleep(0.01)
        if raw.closed.is_set():
            break
    await raw.wait_closed()
    assert raw.goaway is not None and raw.goaway.error_code == ENHANCE_YOUR_CALM
    acks = len([f for f in raw.frames if isinstance(f, (PingFrame, SettingsFrame))
                and "ACK" in f.flags])
    assert acks <= ANSWERED_BURST + 2


def settings_frame(entries: list[tuple[int, int]]) -> bytes:
    payload = b"".join(struct.pack(">HL", key, value) for key, value in entries)
    return struct.pack(">BHBBL", 0, len(payload), 4, 0, 0) + payload


@pytest.mark.parametrize("entries", [2730, MAX_SETTINGS_ENTRIES])
async def test_settings_flood_with_streams_open_is_bounded(h2tls: Tls, entries: int  # noqa: F811
                                                           ) -> None:
    """Issue 24: with 250 streams open, 150 SETTINGS frames of 2,730 INITIAL_WINDOW_SIZE
    entries (2.4 MB) cost the gateway ~6 s of CPU (every stream walked for every entry) and
    held another connection's request that long; no GOAWAY. Now a frame of more than 100
    entries is PROTOCOL_ERROR at once, and frames of 100 distinct entries spend the parsing
    budget per entry (ENHANCE_YOUR_CALM after ~50 of them)."""
    async with running(h2tls) as harness:  # the default limit: 250 streams per connection
        harness.connect_cluster("c1")
        harness.connect_cluster("hold", hold_agent)
        await warm_token(harness)
        raw = await RawH2.connect(harness.port, harness.tls.ca_file)
        other = await H2Client.connect(harness.port, harness.tls.ca_file)
        try:
            raw.send(b"".join(_headers_frame(raw, 1 + 2 * i) for i in range(250)))
            await raw.wait_for(lambda: len(harness.streams("hold")) == 250, timeout=20)
            if entries > MAX_SETTINGS_ENTRIES:
                frames = [settings_frame([(4, 65535 + i % 2) for i in range(entries)])] * 2
            else:  # distinct ids: INITIAL_WINDOW_SIZE and unknown ones
                frames = [settings_frame([(4, 65535 + j)] + [(0x100 + i, 1)
                                                            for i in range(entries - 1)])
                          for j in range(2)]
            acks_before = len([f for f in raw.frames_of(SettingsFrame) if "ACK" in f.flags])
            cpu = time.process_time()
            raw.send(b"".join(frames[k % 2] for k in range(150)))
            started = time.monotonic()
            answer = await other.request("/c1/version", token=HUB_TOKEN, timeout=30)
            waited = time.monotonic() - started
            await raw.wait_closed(timeout=30)
            cpu = time.process_time() - cpu  # the gateway's and both clients' (one process)
        finally:
            await other.close()
            await raw.close()
        acks = len([f for f in raw.frames_of(SettingsFrame) if "ACK" in f.flags]) - acks_before
        assert raw.goaway is not None
        if entries > MAX_SETTINGS_ENTRIES:
            assert raw.goaway.error_code == PROTOCOL_ERROR and acks == 0
        else:
            assert raw.goaway.error_code == ENHANCE_YOUR_CALM
            assert acks <= CHEAP_BURST // MAX_SETTINGS_ENTRIES
        assert answer.status == 200 and waited < 2.0, waited
        assert cpu < 2.0, cpu
        assert all(s.closed for s in harness.streams("hold"))  # the held streams ended too


async def test_window_update_flood_is_bounded(gw: Harness, raw: RawH2) -> None:
    for _ in range(20):  # bounded: 20 x 1000 frames
        raw.send(WindowUpdateFrame(0, window_increment=1).serialize() * 1000)
        await asyncio.sleep(0.01)
        if raw.closed.is_set():
            break
    await raw.wait_closed()
    assert raw.goaway is not None and raw.goaway.error_code == ENHANCE_YOUR_CALM
    assert CHEAP_BURST < 20_000


async def test_stream_count_is_limited(gw: Harness, raw: RawH2) -> None:
    """SETTINGS_MAX_CONCURRENT_STREAMS (8 here): a ninth open stream is refused alone (RST_STREAM,
    never opened) and the eight go on; a client that keeps opening past the limit spends its
    reset budget and is disconnected."""
    await warm_token(gw)
    settings = await_settings(raw)
    for i in range(8):
        raw.headers(1 + 2 * i, raw.headers_block("/hold/api/v1/pods?watch=1", HUB_TOKEN))
    await raw.wait_for(lambda: len(gw.streams("hold")) == 8)
    raw.headers(17, raw.headers_block("/hold/api/v1/pods?watch=1", HUB_TOKEN))
    await raw.wait_for(lambda: raw.frames_of(RstStreamFrame, 17))
    assert (await settings)[SettingsFrame.MAX_CONCURRENT_STREAMS] == 8
    assert raw.frames_of(RstStreamFrame, 17)[0].error_code in (PROTOCOL_ERROR, REFUSED_STREAM)
    assert raw.goaway is None and len(gw.streams("hold")) == 8
    assert not any(s.closed for s in gw.streams("hold"))
    sid = 19
    for _ in range(20):  # bounded: 20 batches of 100 streams past the limit
        batch = b"".join(_headers_frame(raw, sid + 2 * i) for i in range(100))
        sid += 200
        raw.send(batch)
        await asyncio.sleep(0)
        if raw.closed.is_set():
            break
    await raw.wait_closed()
    assert raw.goaway is not None and raw.goaway.error_code == ENHANCE_YOUR_CALM
    assert len(gw.streams("hold")) == 8


def _headers_frame(raw: RawH2, sid: int) -> bytes:
    frame = HeadersFrame(sid)
    frame.data = raw.headers_block("/hold/api/v1/pods?watch=1", HUB_TOKEN)
    frame.flags.add("END_STREAM")
    frame.flags.add("END_HEADERS")
    return frame.serialize()


async def await_settings(raw: RawH2) -> dict[int, int]:
    await raw.wait_for(lambda: raw.frames_of(SettingsFrame))
    return dict(raw.frames_of(SettingsFrame)[0].settings)


async def test_streams_opened_but_never_read_hold_one_window(gw: Harness) -> None:
    """A client that never gives flow-control credit back gets at most its window on that
    stream; the gateway stops reading the tunnel stream (no buffering), and another stream on
    the same connection is not held up."""
    big = b"x" * 1_000_000

    async def big_agent(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
        for i in range(0, len(big), 16384):
            if stream.closed:
                return
            await stream.wait(lambda: not stream.paused or stream.closed, timeout=30)
            stream.send(big[i:i + 16384])
        stream.send_eof()

    gw.connect_cluster("big", big_agent)
    c = await H2Client.connect(gw.port, gw.tls.ca_file, auto_ack=False)
    try:
        sid = c.start("/big/api/v1/pods", token=HUB_TOKEN)
        await c.wait(sid, lambda r: len(r.body) >= 65535)
        await asyncio.sleep(0.3)
        assert len(c.responses[sid].body) == 65535  # the initial window, not a byte more
        stream = gw.streams("big")[0]
        assert stream.paused
        # Another stream on the same connection still completes (the connection window is
        # not used up: the client's own connection window is 65535 as well, so this one is
        # small).
        c.auto_ack = True
        c.conn.acknowledge_received_data(65535, sid)  # connection credit only matters here
        c.flush()
        r = await c.request("/c1/version", token=HUB_TOKEN)
        assert r.status == 200 and r.ended
        c.auto_ack = False
    finally:
        await c.close()


def post_block(raw: RawH2, length: int, cluster: str = "c1") -> bytes:
    return raw.encoder.encode([(":method", "POST"), (":scheme", "https"),
                               (":authority", "localhost"),
                               (":path", f"/{cluster}/api/v1/namespaces/default/configmaps"),
                               ("authorization", f"Bearer {HUB_TOKEN}"),
                               ("content-length", str(length))])


async def assert_stream_reset_alone(gw: Harness, raw: RawH2, sid: int, opened: int) -> None:
    """Stream ``sid`` is reset PROTOCOL_ERROR (RFC 9113 §8.1.1: a malformed request is a
    stream error); ``opened`` tunnel streams exist; the connection carries on."""
    await raw.wait_for(lambda: raw.frames_of(RstStreamFrame, sid))
    assert raw.frames_of(RstStreamFrame, sid)[0].error_code == PROTOCOL_ERROR
    assert len(gw.streams("c1")) == opened
    raw.headers(sid + 2, raw.headers_block("/c1/version", HUB_TOKEN))
    await raw.wait_for(lambda: any(f.stream_id == sid + 2 and "END_STREAM" in f.flags
                                   for f in raw.frames))
    assert statuses(raw)[sid + 2] == 200 and raw.goaway is None


async def test_body_larger_than_content_length_is_refused(gw: Harness, raw: RawH2) -> None:
    """DATA past a declared Content-Length resets the stream before a byte of that frame is
    forwarded. (It was a connection error, GOAWAY PROTOCOL_ERROR, until issue 24: RFC 9113
    §8.1.1 makes it a stream error, as Go's server has it.)"""
    await warm_token(gw)
    raw.headers(1, post_block(raw, 10, "hold"), end_stream=False)  # answered, then held
    raw.send(DataFrame(1, data=b"0123456789").serialize())
    await raw.wait_for(lambda: len(gw.streams("hold")) == 1
                       and gw.streams("hold")[0].received.endswith(b"0123456789"))
    raw.send(DataFrame(1, data=b"SMUGGLED-GET / HTTP/1.1\r\n\r\n", flags=["END_STREAM"])
             .serialize())
    await assert_stream_reset_alone(gw, raw, 1, opened=1)
    stream = gw.streams("hold")[0]
    assert b"SMUGGLED" not in stream.received
    assert stream.closed and stream.reset_code is not None  # the managed side's stream too


async def test_rule2_headers_that_end_a_post_with_a_content_length_reach_no_cluster(
        gw: Harness, raw: RawH2) -> None:
    """Issue 24: HEADERS with END_STREAM and ``content-length: 5`` reached the managed
    apiserver as a POST with no body before the gateway found it malformed. Now no tunnel
    stream is opened, even with the token's review cached (admission would be immediate)."""
    await warm_token(gw)
    raw.headers(1, post_block(raw, 5), end_stream=True)
    await assert_stream_reset_alone(gw, raw, 1, opened=1)  # warm_token's
    assert not any(b"POST" in s.received for s in gw.streams("c1"))


async def test_rule2_a_body_ending_short_in_the_same_read_reaches_no_cluster(
        gw: Harness, raw: RawH2) -> None:
    """HEADERS (content-length 5) and DATA of 3 bytes with END_STREAM in one read: the stream
    is reset before its request's turn comes, and the request is never admitted."""
    await warm_token(gw)
    frames = bytearray()
    headers = HeadersFrame(1)
    headers.data = post_block(raw, 5)
    headers.flags.add("END_HEADERS")
    frames += headers.serialize()
    frames += DataFrame(1, data=b"{}\n", flags=["END_STREAM"]).serialize()
    raw.send(bytes(frames))
    await assert_stream_reset_alone(gw, raw, 1, opened=1)
    assert not any(b"POST" in s.received for s in gw.streams("c1"))


@pytest.mark.parametrize("scheme", ["https\r\nimpersonate-user: admin", "ftp", ""],
                         ids=["crlf", "ftp", "empty"])
async def test_rule2_scheme_is_https_or_http(gw: Harness, raw: RawH2, scheme: str) -> None:
    """Issue 24: ``:scheme`` was never checked (only dropped); CR/LF in it was accepted."""
    encoder = hpack.Encoder()
    block = encoder.encode([(":method", "GET"), (":scheme", scheme),
                            (":authority", "localhost"), (":path", "/c1/version"),
                            ("authorization", f"Bearer {HUB_TOKEN}")])
    raw.encoder = encoder  # later blocks share its dynamic table
    raw.headers(1, block)
    await assert_malformed_answered_400(gw, raw)


def statuses(raw: RawH2) -> dict[int, int]:
    """The ``:status`` of every response HEADERS the server sent, by stream (decoded in order:
    the server's HPACK state runs across streams)."""
    decoder = hpack.Decoder()
    out: dict[int, int] = {}
    for frame in raw.frames_of(HeadersFrame):
        fields = dict(decoder.decode(frame.data))
        out[frame.stream_id] = int(fields[":status"])
    return out


async def assert_malformed_answered_400(gw: Harness, raw: RawH2) -> None:
    """Stream 1 carried a malformed request: it is answered 400 and ended (RFC 9113 §8.1.1,
    as nginx does), nothing reaches the cluster, and the connection carries on (stream 3)."""
    await raw.wait_for(lambda: any(f.stream_id == 1 and "END_STREAM" in f.flags
                                   for f in raw.frames))
    assert statuses(raw)[1] == 400
    assert gw.streams("c1") == []
    raw.headers(3, raw.headers_block("/c1/version", HUB_TOKEN))
    await raw.wait_for(lambda: any(f.stream_id == 3 and "END_STREAM" in f.flags
                                   for f in raw.frames))
    assert statuses(raw)[3] == 200
    assert raw.goaway is None
    assert len(gw.streams("c1")) == 1


@pytest.mark.parametrize("fields", [
    [("X-Upper", "1")],  # upper-case name
    [("connection", "keep-alive")],  # connection-specific
    [("transfer-encoding", "chunked")],
    [("te", "gzip")],  # te other than trailers
    [(":protocol", "websocket")],  # extended CONNECT was not offered
    [("x-a", " padded")],  # whitespace around a value
    [("host", "elsewhere.example")],  # a second authority
])
async def test_malformed_requests_are_refused(gw: Harness, raw: RawH2,
                                              fields: list[tuple[str, str]]) -> None:
    raw.headers(1, raw.headers_block("/c1/version", HUB_TOKEN, extra=fields))
    await assert_malformed_answered_400(gw, raw)


async def test_missing_or_misplaced_pseudo_header_is_refused(gw: Harness, raw: RawH2) -> None:
    block = raw.encoder.encode([(":method", "GET"), (":scheme", "https"),
                                (":authority", "localhost"), ("authorization",
                                                              f"Bearer {HUB_TOKEN}"),
                                (":path", "/c1/version")])  # :path after a regular field
    raw.headers(1, block)
    await assert_malformed_answered_400(gw, raw)
    block = raw.encoder.encode([(":method", "GET"), (":scheme", "https"),
                                (":authority", "localhost")])  # no :path
    raw.headers(5, block)
    await raw.wait_for(lambda: any(f.stream_id == 5 and "END_STREAM" in f.flags
                                   for f in raw.frames))
    assert statuses(raw)[5] == 400
    assert len(gw.streams("c1")) == 1  # only stream 3's


async def test_goaway_on_drain(gw: Harness, raw: RawH2) -> None:
    """Shutdown sends GOAWAY naming the last stream, then ends the watch in flight cleanly
    (END_STREAM after its last whole event, no reset: the client re-watches through another
    gateway instance, issue 13), then closes. Frames by hand: h2's client state machine drops
    frames that follow a GOAWAY in the same read."""
    raw.headers(1, raw.headers_block("/hold/api/v1/pods?watch=1", token=HUB_TOKEN))
    await raw.wait_for(lambda: any(f.stream_id == 1 and type(f).__name__ == "HeadersFrame"
                                   for f in raw.frames))
    shutdown = asyncio.ensure_future(gw.gateway.shutdown(timeout=1.0))
    await raw.wait_for(lambda: raw.goaway is not None and any(
        f.stream_id == 1 and "END_STREAM" in f.flags for f in raw.frames))
    assert raw.goaway is not None
    assert raw.goaway.error_code == 0
    assert raw.goaway.last_stream_id == 1
    on_stream = [f for f in raw.frames if f.stream_id == 1]
    assert any("END_STREAM" in f.flags for f in on_stream)
    assert not [f for f in on_stream if type(f).__name__ == "RstStreamFrame"]
    await shutdown
    await raw.wait_closed()


@pytest.mark.parametrize("field", [("x-a\r\nimpersonate-user", "admin"),
                                   ("x-a", "v\r\nImpersonate-User: admin"),
                                   ("x-a", "v\nImpersonate-User: admin")],
                         ids=["crlf-in-name", "crlf-in-value", "lf-in-value"])
async def test_rule2_no_header_injection_into_the_http1_request(
        gw: Harness, raw: RawH2, field: tuple[str, str]) -> None:
    """HPACK carries any bytes; none of them may become a line of the HTTP/1.1 head the agent
    reads: the request is refused (a 400 on the stream, or a connection error)."""
    encoder = hpack.Encoder()
    block = encoder.encode([(":method", "GET"), (":scheme", "https"),
                            (":authority", "localhost"), (":path", "/c1/version"),
                            ("authorization", f"Bearer {HUB_TOKEN}"), field])
    raw.headers(1, block)
    await raw.wait_for(lambda: raw.goaway is not None or any(
        f.stream_id == 1 and "END_STREAM" in f.flags for f in raw.frames))
    assert gw.streams("c1") == []


async def test_stalled_body_and_idle_connection_are_timed_out(h2tls: Tls) -> None:  # noqa: F811
    """A stream whose body never comes gets 408 after --idle-timeout (the cluster's stream is
    reset); a connection with no stream left is closed with GOAWAY after it too."""
    limits = FrontDoorLimits(idle_timeout=0.5)
    async with running(h2tls, limits=limits) as harness:
        harness.connect_cluster("c1")
        c = await H2Client.connect(harness.port, harness.tls.ca_file)
        try:
            sid = c.start("/c1/api/v1/namespaces/default/configmaps", method="POST",
                          token=HUB_TOKEN, extra=[("content-length", "10")], end_stream=False)
            c.conn.send_data(sid, b"01234")  # half the body, then nothing
            c.flush()
            r = await c.wait(sid, timeout=5)
            assert r.status == 408
            stream = harness.streams("c1")[0]
            assert stream.closed and stream.reset_code is not None
            async with asyncio.timeout(5):
                await c.closed.wait()
            assert c.goaway is not None and c.goaway.error_code == 0
        finally:
            await c.close()
