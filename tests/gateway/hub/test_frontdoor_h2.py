"""The front door over HTTP/2 (gateway.hub.frontdoor_h2), with a raw ``h2`` client over real
TLS against the in-process gateway harness (fake tunnel sessions)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import h2.events
import h2.settings
import pytest

from gateway.hub.frontdoor_h2 import FLUSH_AT, REQUESTS_PER_TURN, H2FrontDoor
from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    FakeStream,
    Harness,
    Tls,
    h2tls,  # noqa: F401 - the session fixture
    running,
    tls,  # noqa: F401 - the session fixture
)
from tests.support import eventually


@pytest.fixture
async def gw(h2tls: Tls) -> AsyncIterator[Harness]:  # noqa: F811
    async with running(h2tls) as harness:
        harness.connect_cluster("c1")
        yield harness


@pytest.fixture
async def client(gw: Harness) -> AsyncIterator[H2Client]:
    c = await H2Client.connect(gw.port, gw.tls.ca_file)
    yield c
    await c.close()


async def test_get_through_h2(gw: Harness, client: H2Client) -> None:
    r = await client.request("/c1/api/v1/namespaces/default/pods?limit=1", token=HUB_TOKEN)
    assert r.status == 200 and r.ended
    echoed = json.loads(r.body)
    assert echoed["method"] == "GET"
    assert echoed["target"] == "/api/v1/namespaces/default/pods?limit=1"
    names = [n.lower() for n, _ in echoed["headers"]]
    assert "authorization" not in names
    assert ["host", "localhost"] in [[n.lower(), v] for n, v in echoed["headers"]]


async def test_a_burst_is_admitted_a_few_requests_per_loop_turn(gw: Harness, client: H2Client
                                                                ) -> None:
    """Sixteen requests in one read: REQUESTS_PER_TURN of them reach the tunnel before the
    event loop turns (the rest of the loop's work, responses included, runs in between), the
    others follow in order in later turns, and all sixteen are answered."""
    assert (await client.request("/c1/version", token=HUB_TOKEN)).status == 200  # token cached
    [door] = [c for c in gw.gateway.connections if isinstance(c, H2FrontDoor)]
    flush, client.flush = client.flush, lambda: None  # type: ignore[method-assign]
    sids = [client.start(f"/c1/api/v1/namespaces/n{i}/pods", token=HUB_TOKEN) for i in range(16)]
    client.flush = flush  # type: ignore[method-assign]
    burst = client.conn.data_to_send()
    before = len(gw.streams("c1"))
    door.data_received(burst)  # the sixteen HEADERS, as one read from the socket
    assert len(gw.streams("c1")) - before == REQUESTS_PER_TURN
    responses = [await client.wait(sid) for sid in sids]
    assert [r.status for r in responses] == [200] * 16 and all(r.ended for r in responses)
    targets = [json.loads(r.body)["target"] for r in responses]
    assert targets == [f"/api/v1/namespaces/n{i}/pods" for i in range(16)]
    opened = [bytes(s.received) for s in gw.streams("c1")[before:]]
    assert [b"/namespaces/n%d/" % i in data for i, data in enumerate(opened)] == [True] * 16


async def test_last_data_frame_ends_the_stream(gw: Harness, client: H2Client) -> None:
    """A complete body's last DATA frame carries END_STREAM: no empty frame after it."""
    sid = client.start("/c1/api/v1/namespaces/default/pods?limit=1", token=HUB_TOKEN)
    r = await client.wait(sid)
    assert r.status == 200 and r.ended and r.body
    data = [e for e in client.events
            if isinstance(e, h2.events.DataReceived) and e.stream_id == sid]
    assert data and all(e.data for e in data)
    assert data[-1].stream_ended is not None


async def test_refusal_is_a_status_on_its_stream_and_the_connection_carries_on(
        gw: Harness, client: H2Client) -> None:
    r = await client.request("/c1/version")  # no token
    assert r.status == 401 and r.ended
    assert r.headers["www-authenticate"] == 'Bearer realm="hubproxy"'
    assert json.loads(r.body)["code"] == 401
    r = await client.request("/c1/version", token=HUB_TOKEN,
                             extra=[("impersonate-user", "system:admin")])
    assert r.status == 403
    r = await client.request("/nope/version", token=HUB_TOKEN)
    assert r.status == 404
    assert (await client.request("/c1/version", token=HUB_TOKEN)).status == 200
    assert len(gw.streams("c1")) == 1  # only the admitted request reached the cluster


async def test_streams_run_concurrently_on_one_connection(gw: Harness, client: H2Client
                                                           ) -> None:
    sids = [client.start(f"/c1/api/v1/namespaces/ns{i}/pods", token=HUB_TOKEN)
            for i in range(20)]
    for i, sid in enumerate(sids):
        r = await client.wait(sid)
        assert r.status == 200 and r.ended
        assert json.loads(r.body)["target"] == f"/api/v1/namespaces/ns{i}/pods"
    assert gw.gateway.metrics.requests_h2 == 20


async def test_body_with_content_length_is_forwarded(gw: Harness, client: H2Client) -> None:
    body = b'{"kind":"ConfigMap"}'
    r = await client.request("/c1/api/v1/namespaces/default/configmaps", method="POST",
                             token=HUB_TOKEN, body=body,
                             extra=[("content-length", str(len(body))),
                                    ("content-type", "application/json")])
    assert r.status == 200
    echoed = json.loads(r.body)
    assert echoed["method"] == "POST" and echoed["body"] == body.decode()
    assert ["content-length", str(len(body))] in [[n.lower(), v] for n, v in echoed["headers"]]


async def test_body_without_content_length_is_forwarded_chunked(gw: Harness, client: H2Client
                                                                ) -> None:
    sid = client.start("/c1/api/v1/namespaces/default/configmaps", method="POST",
                       token=HUB_TOKEN, end_stream=False)
    for part in (b"abc", b"defgh", b"ij"):
        client.conn.send_data(sid, part)
    client.conn.end_stream(sid)
    client.flush()
    r = await client.wait(sid)
    assert r.status == 200
    echoed = json.loads(r.body)
    # Chunk boundaries are the gateway's (what came during admission travels as one chunk).
    from gateway.wire.http1 import ChunkedBody

    framed = echoed["body"].encode()
    tracker = ChunkedBody()
    assert tracker.feed(framed) == len(framed) and tracker.complete
    assert tracker.body_bytes == 10 and b"abc" in framed and framed.endswith(b"ij\r\n0\r\n\r\n")
    assert ["transfer-encoding", "chunked"] in [[n.lower(), v] for n, v in echoed["headers"]]


async def test_chunked_body_over_the_limit_is_413(h2tls: Tls) -> None:  # noqa: F811
    from gateway.hub.config import FrontDoorLimits

    async with running(h2tls, limits=FrontDoorLimits(max_request_body=1000)) as harness:
        harness.connect_cluster("c1")
        c = await H2Client.connect(harness.port, harness.tls.ca_file)
        try:
            sid = c.start("/c1/api/v1/namespaces/default/configmaps", method="POST",
                          token=HUB_TOKEN, end_stream=False)
            c.conn.send_data(sid, b"x" * 1500)
            c.flush()
            r = await c.wait(sid)
            assert r.status == 413
            r = await c.request("/c1/api/v1/namespaces/default/configmaps", method="POST",
                                token=HUB_TOKEN, body=b"x" * 2000,
                                extra=[("content-length", "2000")])
            assert r.status == 413  # declared: refused by admission, as over HTTP/1.1
        finally:
            await c.close()


async def test_chunked_response_is_dechunked_into_data(gw: Harness, client: H2Client) -> None:
    async def chunked_agent(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n"
                    b"Keep-Alive: timeout=5\r\nContent-Type: text/plain\r\n\r\n5\r\nhello\r\n")
        await asyncio.sleep(0.05)
        stream.send(b"1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nx-trailer: t\r\n\r\n")
        stream.send_eof()

    gw.connect_cluster("chunky", chunked_agent)
    r = await client.request("/chunky/api/v1/pods", token=HUB_TOKEN)
    assert r.status == 200 and r.ended and r.reset is None
    assert bytes(r.body) == b"hello world"
    assert r.headers["content-type"] == "text/plain"
    for hop in ("transfer-encoding", "connection", "keep-alive"):
        assert hop not in r.headers


async def test_large_body_to_a_client_with_wide_windows_streams_with_back_pressure(
        gw: Harness) -> None:
    """A client whose windows let 16 MiB through at once: the gateway writes the body as it
    comes (its writes are batched per loop turn, but never a whole body), so the transport's
    pause_writing holds the tunnel back; the buffer never grows past the not-reading bound
    and the stream ends cleanly with every byte."""
    size, piece = 16 * 1024 * 1024, 64 * 1024

    async def big_agent(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        sent = 0
        while sent < size:
            await stream.wait(lambda: not stream.paused, timeout=20)
            stream.send(b"x" * piece)  # as fast as the gateway lets it: many in one turn
            sent += piece
        stream.send_eof()

    gw.connect_cluster("big", big_agent)
    wide = 1 << 24
    client = await H2Client.connect(gw.port, gw.tls.ca_file,
                                    settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: wide})
    try:
        door = next(c for c in gw.gateway.connections if isinstance(c, H2FrontDoor))
        writes: list[int] = []
        write = door.transport.write

        def recording_write(data: bytes) -> None:
            writes.append(len(data))
            write(data)

        door.transport.write = recording_write
        client.conn.increment_flow_control_window(wide)
        client.flush()
        r = await client.request("/big/api/v1/namespaces/default/pods/p/log", token=HUB_TOKEN,
                                 timeout=30)
        assert r.status == 200 and r.reset is None and r.ended
        assert len(r.body) == size
        # Handed to the transport as it came (FLUSH_AT at a time), never as one 16 MiB write.
        assert FLUSH_AT <= 256 * 1024
        assert sum(writes) > size and max(writes) <= 512 * 1024
    finally:
        await client.close()


@pytest.mark.parametrize("chunked", [True, False])
async def test_body_held_back_by_the_clients_window_survives_reuse_of_the_tunnels_buffer(
        gw: Harness, client: H2Client, chunked: bool) -> None:
    """The tunnel hands the Exchange views of its read buffer, reused once the call returns:
    what the client's window (64 KiB by default) holds back of a larger piece must reach the
    client as it was, not as the buffer's later contents."""
    size = 300_000
    body = bytes(range(256)) * (size // 256) + b"e" * (size % 256)

    async def reusing_agent(stream: FakeStream) -> None:
        await stream.request()
        framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % size
        stream.send(b"HTTP/1.1 200 OK\r\n" + framing + b"\r\n\r\n")
        buf = bytearray(b"%x\r\n" % size + body + b"\r\n" if chunked else body)
        stream.send(memoryview(buf))  # type: ignore[arg-type]
        buf[:] = b"x" * len(buf)  # the tunnel reads its next bytes into the same buffer
        if chunked:
            stream.send(b"0\r\n\r\n")
        stream.send_eof()

    gw.connect_cluster("reuse", reusing_agent)
    r = await client.request("/reuse/api/v1/namespaces/default/pods/p/log", token=HUB_TOKEN)
    assert r.status == 200 and r.ended and r.reset is None
    assert r.body == body


async def test_truncated_response_resets_the_stream(gw: Harness, client: H2Client) -> None:
    async def short_agent(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        stream.send_eof()

    gw.connect_cluster("short", short_agent)
    r = await client.request("/short/api/v1/pods", token=HUB_TOKEN)
    assert r.status == 200 and not r.ended
    assert r.reset is not None  # never a clean end for a body cut short


async def test_head_request(gw: Harness, client: H2Client) -> None:
    async def head_agent(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
        stream.send_eof()

    gw.connect_cluster("heads", head_agent)
    r = await client.request("/heads/api/v1/pods", method="HEAD", token=HUB_TOKEN)
    assert r.status == 200 and r.ended and r.body == b""
    assert r.headers["content-length"] == "1234"


async def test_request_body_is_acknowledged_only_as_the_tunnel_takes_it(
        gw: Harness, client: H2Client) -> None:
    """While the tunnel stream's send window is full, the client's stream window is not given
    back; it is once the tunnel takes data again."""
    sid = client.start("/c1/api/v1/namespaces/default/configmaps", method="POST",
                       token=HUB_TOKEN, extra=[("content-length", "200000")],
                       end_stream=False)
    client.conn.send_data(sid, b"a" * 1000)
    client.flush()
    streams = gw.streams("c1")
    await eventually(lambda: streams and len(streams[0].received) > 1000)
    exchange = streams[0].protocol
    exchange.pause_writing()  # what the tunnel does when the stream's credit is used up
    sent = 1000
    while client.conn.local_flow_control_window(sid) > 0:
        n = min(client.conn.local_flow_control_window(sid), 16384)
        client.conn.send_data(sid, b"b" * n)
        sent += n
    client.flush()
    await eventually(lambda: streams[0].received.count(b"b") == sent - 1000)
    await asyncio.sleep(0.2)
    assert client.conn.local_flow_control_window(sid) == 0  # no credit while paused
    assert sent == 65535
    exchange.resume_writing()
    await eventually(lambda: client.conn.local_flow_control_window(sid) > 0)
    client.conn.reset_stream(sid)
    client.flush()


async def test_a_body_that_fills_its_window_during_admission_gets_it_back(
        gw: Harness, client: H2Client) -> None:
    """The first request of a token is admitted in a later loop turn (a hub review); the body
    that arrived meanwhile fills the stream window, and the WINDOW_UPDATE for it must leave
    when the tunnel stream opens, not wait for some other write."""
    size = 100_000
    sid = client.start("/c1/api/v1/namespaces/default/configmaps", method="POST",
                       token=HUB_TOKEN, extra=[("content-length", str(size))], end_stream=False)
    sent = 0
    while sent < size:
        await eventually(lambda: client.conn.local_flow_control_window(sid) > 0, timeout=3)
        n = min(client.conn.local_flow_control_window(sid), 16384, size - sent)
        client.conn.send_data(sid, b"a" * n, end_stream=sent + n == size)
        client.flush()
        sent += n
    r = await client.wait(sid)
    assert r.status == 200 and len(json.loads(r.body)["body"]) == size


async def test_watch_is_audited_with_its_protocol(gw: Harness, client: H2Client,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    async def watch_agent(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"b\r\n{\"type\":1}\n\r\n")
        await stream.wait(lambda: stream.closed, timeout=30)

    gw.connect_cluster("w", watch_agent)
    caplog.set_level(logging.INFO, logger="hubproxy.audit")
    gw.gateway.audit_trail.lines = True
    sid = client.start("/w/api/v1/pods?watch=1", token=HUB_TOKEN)
    await client.wait(sid, lambda r: bytes(r.body) == b'{"type":1}\n')
    live = gw.gateway.metrics.render().decode()
    assert "hubproxy_h2_client_connections 1" in live and "hubproxy_h2_open_streams 1" in live
    client.conn.reset_stream(sid)
    client.flush()
    await eventually(lambda: gw.streams("w")[0].closed)
    records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "hubproxy.audit"]
    events = {(r["event"], r.get("protocol")) for r in records}
    assert ("stream_start", "h2") in events and ("stream_end", "h2") in events
    await client.close()
    await eventually(lambda: gw.gateway.metrics.h2_streams_count == 1)
    assert gw.gateway.metrics.h2_streams_sum == 1
    text = gw.gateway.metrics.render().decode()
    assert 'hubproxy_requests_by_protocol_total{protocol="h2"} 1' in text
    assert "hubproxy_h2_streams_per_connection_count 1" in text


async def test_http1_still_served_and_counted(gw: Harness) -> None:
    from tests.gateway.hub.test_frontdoor_harness import get, read_response

    reader, writer = await gw.open()  # the harness' client offers no ALPN: HTTP/1.1
    writer.write(get("/c1/version"))
    status, _, _ = await read_response(reader)
    assert status == 200
    writer.close()
    assert gw.gateway.metrics.requests_h1 == 1 and gw.gateway.metrics.requests_h2 == 0


async def test_rule1_revoked_token_ends_an_h2_watch_cleanly(h2tls: Tls) -> None:  # noqa: F811
    """Revocation reaches watches that are streams of an HTTP/2 connection too: the watch ends
    with END_STREAM after its last whole event, the cluster's stream is reset, the connection
    carries on and the re-list gets 401."""
    from tests.gateway.hub.test_frontdoor_harness import USERS

    token = "hub-token-DAVE-h2-revocable"
    USERS[token] = {"username": "dave", "uid": "uid-d", "groups": [], "extra": {}}
    event = b'{"type":"ADDED"}\n'
    streams: list[FakeStream] = []

    async def watch_agent(stream: FakeStream) -> None:
        await stream.request()
        streams.append(stream)
        stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"%x\r\n%s\r\n" % (len(event), event))
        await stream.wait(lambda: stream.closed, timeout=25)

    try:
        async with running(h2tls, token_cache_ttl=0.5) as harness:
            harness.connect_cluster("c1", watch_agent)
            c = await H2Client.connect(harness.port, harness.tls.ca_file)
            try:
                sid = c.start("/c1/api/v1/namespaces/team/configmaps?watch=1", token=token)
                await c.wait(sid, lambda r: bytes(r.body) == event)
                await asyncio.sleep(1.5)  # revalidated while valid: still open
                assert not c.responses[sid].ended
                del USERS[token]
                r = await c.wait(sid, timeout=8)
                assert r.ended and r.reset is None and bytes(r.body) == event
                await eventually(lambda: streams[0].closed)
                again = await c.request("/c1/api/v1/namespaces/team/configmaps", token=token)
                assert again.status == 401
            finally:
                await c.close()
    finally:
        USERS.pop(token, None)


async def test_response_fields_are_plain_literals_with_no_dynamic_table(gw: Harness) -> None:
    """The front door's HPACK encoder is gateway.wire.hpackfields.FieldEncoder: no Huffman
    coding in pure Python and no dynamic table. The raw HEADERS block carries the value as is,
    and a standard decoder reads it without ever adding to its table."""
    import hpack
    from hyperframe.frame import HeadersFrame

    from tests.gateway.hub.h2client import RawH2

    raw = await RawH2.connect(gw.port, gw.tls.ca_file)
    try:
        raw.headers(1, raw.headers_block("/c1/version", HUB_TOKEN))
        await raw.wait_for(lambda: bool(raw.frames_of(HeadersFrame, 1)))
        block = raw.frames_of(HeadersFrame, 1)[0].data
        assert b"application/json" in block
        decoder = hpack.Decoder()
        fields = dict(decoder.decode(block))
        assert fields[":status"] == "200" and fields["content-type"] == "application/json"
        assert not decoder.header_table.dynamic_entries
    finally:
        await raw.close()
