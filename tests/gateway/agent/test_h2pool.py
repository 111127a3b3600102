"""The agent's exchanges over HTTP/2 to a real TLS HTTP/2 server (tests/gateway/agent/h2server),
driven through fake tunnel streams: sharing, stream caps, flow control per stream, cancel,
resets, GOAWAY, request bodies, and HTTP/1.1 for upgrades and for servers without h2."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import h2.errors
import hpack
import pytest
import trustme

from gateway.agent.agent import Agent
from gateway.agent.kubeapi import from_kubeconfig
from gateway.agent.pool import UpstreamPool
from gateway.wire.hpackfields import FieldEncoder
from tests.gateway.agent import h2server
from tests.gateway.agent.conftest import FakeStream, Upstream
from tests.gateway.agent.test_exchange import (
    FakePolicy,
    get,
    identity_metadata,
    open_stream,
    write_kubeconfig,
)
from tests.gateway.agent.test_fast_path import ImmediatePolicy
from tests.support import eventually
from tunnel.connection import OpenRequest
from tunnel.errors import OpenErrorCode
from tunnel.targets import KubeAPITarget

KUBE = KubeAPITarget()


# h2 by default (required: a server without it is refused), as these tests are about the
# HTTP/2 path; ``auto`` (every request over HTTP/2 when the server offers it) has its own.
async def make_agent(server: h2server.H2Server, ca_file: str, tmp_path: Path, *,
                     protocol: str = "h2", max_streams: int = 100,
                     idle_timeout: float = 30.0, policy: type[FakePolicy] = FakePolicy) -> Agent:
    token_file = tmp_path / "token"
    token_file.write_text("agent-token\n")
    up = Upstream(server.host, server.port, ca_file, None)  # type: ignore[arg-type]
    access = from_kubeconfig(str(write_kubeconfig(tmp_path / "kc", up, token_file)))
    return Agent(cluster="c1", policy=policy((server.host, server.port), {}), kube=access,
                 pool=UpstreamPool(h2_max_streams=max_streams, idle_timeout=idle_timeout),
                 apiserver_protocol=protocol)


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.crt"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
async def server(ca: trustme.CA) -> AsyncIterator[h2server.H2Server]:
    srv = await h2server.start(ca.issue_cert("127.0.0.1"))
    yield srv
    assert srv.server is not None
    srv.server.close()


def unchunked(body: bytes) -> bytes:
    """A chunked body's payload (the chunk-size lines are hex: they may hold a "b")."""
    out, rest = b"", body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if not size:
            return out
        out, rest = out + rest[:size], rest[size + 2:]


def request(agent: Agent, path: str, *extra: str, body: bytes = b"",
            method: str = "GET") -> FakeStream:
    data = get(path, *extra) if method == "GET" else (
        f"{method} {path} HTTP/1.1\r\nHost: gw\r\n" + "".join(f"{h}\r\n" for h in extra)
        + "\r\n").encode() + body
    return open_stream(agent, KUBE, identity_metadata(), data)


async def test_requests_and_watches_share_one_h2_connection(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    watches = [request(agent, "/watch") for _ in range(5)]
    for w in watches:
        await w.wait(lambda w=w: b'{"n":0}' in w.received)
    small = request(agent, "/small")
    await small.wait_done()
    assert small.response() == (200, {"content-length": "5"}, b"small")
    # A body without a length reaches the tunnel chunked, as HTTP/1.1 says.
    status, headers, body = watches[0].response()
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert body == b'8\r\n{"n":0}\n\r\n'
    assert len(server.h2_connections) == 1 and not server.h1_requests
    assert agent.pool.protocol_dials == {"h2": 1}
    head = server.heads[(0, 1)]
    # The agent's credential and the impersonation ride as HTTP/2 fields.
    assert head[b"authorization"] == b"Bearer agent-token"
    assert head[b"impersonate-user"] == b"cluster:hub:system:serviceaccount:demo:demo"
    assert head[b":authority"] == f"127.0.0.1:{server.port}".encode()
    assert b"host" not in head
    for w in watches:
        w.client_reset()
    agent.pool.close()


async def test_a_complete_request_of_a_lone_stream_is_written_before_the_turn_ends(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    """A body-less request whose tunnel stream is its session's only one, on a connection with
    no other stream, leaves in the call that sends it (the c=1 latency path); otherwise it
    waits for the turn's one write, which the other requests of the turn share."""
    # The route known without a lookup: the request goes upstream within the stream's read.
    agent = await make_agent(server, ca_file, tmp_path, policy=ImmediatePolicy)
    first = request(agent, "/small")
    await first.wait_done()  # the connection is up and idle in the pool
    (conn,) = agent.pool.h2_connections()
    for alone in (True, False):
        protocol = agent.on_open(OpenRequest(7, KUBE, identity_metadata()))
        assert protocol is not None
        stream = FakeStream(protocol, KUBE, identity_metadata())
        stream.alone = alone
        stream.send(get("/small"))
        assert len(conn.by_id) == 1  # sent (HEADERS queued or written)
        assert conn.h2.has_data_to_send is not alone
        await stream.wait_done()
        assert stream.response() == (200, {"content-length": "5"}, b"small")
    agent.pool.close()


async def test_the_servers_max_concurrent_streams_opens_more_connections(
        ca: trustme.CA, ca_file: str, tmp_path: Path) -> None:
    server = await h2server.start(ca.issue_cert("127.0.0.1"), max_streams=2)
    try:
        agent = await make_agent(server, ca_file, tmp_path)
        watches = [request(agent, "/watch") for _ in range(5)]
        for w in watches:
            await w.wait(lambda w=w: b'{"n":0}' in w.received)
        assert len(server.h2_connections) == 3
        assert sorted(len(c.handles) for c in agent.pool.h2_connections()) == [1, 2, 2]
        for w in watches:
            w.client_reset()
        agent.pool.close()
    finally:
        assert server.server is not None
        server.server.close()


async def test_the_agents_stream_cap_opens_more_connections(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path, max_streams=3)
    watches = [request(agent, "/watch") for _ in range(7)]
    for w in watches:
        await w.wait(lambda w=w: b'{"n":0}' in w.received)
    assert len(server.h2_connections) == 3
    assert agent.pool.dials == 3  # the concurrent requests waited for one dial at a time
    for w in watches:
        w.client_reset()
    agent.pool.close()


async def test_a_cancelled_stream_is_reset_and_the_others_go_on(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    first, second = request(agent, "/watch"), request(agent, "/watch")
    for w in (first, second):
        await w.wait(lambda w=w: b'{"n":0}' in w.received)
    first.client_reset()
    await eventually(lambda: server.resets == [(0, 1, int(h2.errors.ErrorCodes.CANCEL))])
    after = request(agent, "/small")
    await after.wait_done()
    assert after.response()[2] == b"small"
    assert not second.lost and len(server.h2_connections) == 1
    second.client_reset()
    agent.pool.close()


async def test_a_body_complete_by_its_length_is_not_reset_before_end_stream(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    stream = request(agent, "/split")
    await stream.wait_done()
    assert stream.response() == (200, {"content-length": "5"}, b"split")
    await asyncio.sleep(0.3)  # the END_STREAM came, and no RST_STREAM went
    assert server.resets == []
    again = request(agent, "/small")
    await again.wait_done()
    assert again.response()[2] == b"small" and len(server.h2_connections) == 1
    agent.pool.close()


async def test_the_servers_pings_are_answered(server: h2server.H2Server, ca_file: str,
                                              tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    watch = request(agent, "/watch")
    await watch.wait(lambda: b'{"n":0}' in watch.received)
    server.h2_connections[0].ping(b"12345678")
    await eventually(lambda: server.ping_acks == [b"12345678"])
    watch.client_reset()
    agent.pool.close()


async def test_a_paused_tunnel_stream_holds_only_its_own_window(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    size = 400_000  # several times the 64 KiB stream window
    slow = request(agent, "/watch")
    await slow.wait(lambda: b'{"n":0}' in slow.received)
    slow.protocol.pause_writing()  # the hub-side reader of this stream is slow
    conn = server.h2_connections[0]
    conn.pending[1] = bytearray(b"s" * size)
    conn.send_pending(1)
    conn.flush()
    await asyncio.sleep(0.3)
    held = conn.unsent(1)
    assert held >= size - 65535  # the server could send one window, no more
    assert server.window_updates[(0, 1)] == 0  # nothing acknowledged while paused
    # Another stream on the same connection moves a large body meanwhile.
    fast = request(agent, f"/big?n={size}")
    await fast.wait_done(10)
    assert unchunked(fast.response()[2]) == b"b" * size
    assert conn.unsent(1) == held
    slow.protocol.resume_writing()  # the reader caught up: acknowledged, the rest flows
    await slow.wait(lambda: slow.eof, 10)
    assert slow.response()[2].count(b"s") == size
    agent.pool.close()


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_request_bodies_larger_than_the_window_arrive_whole(
        server: h2server.H2Server, ca_file: str, tmp_path: Path, framing: str) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    payload = bytes(range(256)) * 1000  # 256 KB
    if framing == "chunked":
        wire = b"".join(b"%x\r\n%s\r\n" % (len(payload[i:i + 30000]), payload[i:i + 30000])
                        for i in range(0, len(payload), 30000)) + b"0\r\n\r\n"
        header = "Transfer-Encoding: chunked"
    else:
        wire, header = payload, f"Content-Length: {len(payload)}"
    stream = request(agent, "/echo", header, "Content-Type: application/octet-stream",
                     method="POST")
    for i in range(0, len(wire), 16384):  # as the tunnel delivers it, while the server reads
        stream.send(wire[i:i + 16384])
        await asyncio.sleep(0)
    await stream.wait_done(10)
    status, _, body = stream.response()
    assert status == 200 and body == payload
    head = server.heads[(0, 1)]
    assert b"transfer-encoding" not in head
    assert head.get(b"content-length") == (None if framing == "chunked" else b"%d" % len(payload))
    agent.pool.close()


async def test_a_reset_before_the_response_is_a_502_status(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    stream = request(agent, "/reset")
    await stream.wait_done()
    status, _, body = stream.response()
    assert status == 502 and b'"kind":"Status"' in body.replace(b" ", b"")
    agent.pool.close()


@pytest.mark.parametrize("kind", sorted(h2server.MALFORMED))
async def test_malformed_response_fields_are_a_502_and_the_connection_goes_on(
        kind: bytes, server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # h2's inbound validation is off (gateway.wire.h2upstream.response_head checks instead):
    # nothing of a malformed HEADERS block reaches the tunnel, and only its stream fails.
    agent = await make_agent(server, ca_file, tmp_path)
    bad = request(agent, "/malformed-" + kind.decode())
    await bad.wait_done()
    status, _, body = bad.response()
    assert status == 502 and b'"kind":"Status"' in body.replace(b" ", b"")
    assert b"injected" not in bytes(bad.received) and b"X-Upper" not in bytes(bad.received)
    small = request(agent, "/small")
    await small.wait_done()
    assert small.response() == (200, {"content-length": "5"}, b"small")
    assert len(server.h2_connections) == 1  # the same connection carried the next request
    agent.pool.close()


async def test_credentials_and_impersonation_are_never_indexed(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # RFC 7541 §7.1.3: no intermediary may put the agent's credential or the hub user's
    # identity in a compression context; nothing is in the agent's own (no dynamic table).
    agent = await make_agent(server, ca_file, tmp_path)
    for _ in range(2):
        small = request(agent, "/small")
        await small.wait_done()
    assert sorted(server.fields) == [(0, 1), (0, 3)]
    for fields in server.fields.values():
        never = {f[0] for f in fields if isinstance(f, hpack.NeverIndexedHeaderTuple)}
        assert {b"authorization", b"impersonate-user", b"impersonate-group"} <= never
        assert never <= {b"authorization", b"impersonate-user", b"impersonate-group",
                         b"impersonate-uid"} | {f[0] for f in fields
                                                if f[0].startswith(b"impersonate-extra-")}
        assert dict(fields)[b"authorization"] == b"Bearer agent-token"
    decoder = server.h2_connections[0].conn.decoder
    assert decoder.header_table_size == 0 and not decoder.header_table.dynamic_entries
    agent.pool.close()


async def test_a_clients_header_value_is_not_kept_after_its_request(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # A value a client sent through the gateway may carry a secret: the agent's HPACK encoding
    # keeps nothing of it (no process-wide cache keyed by client bytes); its own fields (the
    # identity, the credential) are kept per hub user, with the user's route.
    agent = await make_agent(server, ca_file, tmp_path)
    secret = "s3cret-6b1d0c"
    for _ in range(2):
        small = request(agent, "/small", f"X-Client-Token-6b1d0c: {secret}")
        await small.wait_done()
        assert small.response()[0] == 200
    assert all(dict(fields)[b"x-client-token-6b1d0c"] == secret.encode()
               for fields in server.fields.values())
    kept = repr(FieldEncoder._cache) + repr(FieldEncoder._names)
    assert "6b1d0c" not in kept
    agent.pool.close()


async def test_a_refused_stream_is_sent_again_if_it_had_no_body(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    stream = request(agent, "/refuse-first")  # the first stream of a fresh connection
    await stream.wait_done()
    assert stream.response() == (200, {"content-length": "5"}, b"again")
    agent.pool.close()


async def test_a_stream_refused_again_is_sent_only_once_more(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # An apiserver that refuses every stream (overloaded, or going away on each connection):
    # one retry on a fresh connection, then a 503 to retry, not a loop of new connections.
    agent = await make_agent(server, ca_file, tmp_path)
    stream = request(agent, "/refuse")
    await stream.wait_done()
    status, headers, _ = stream.response()
    assert status == 503 and headers["retry-after"] == "1"
    assert sum(c.refused for c in server.connections) == 2
    agent.pool.close()


async def test_a_refused_stream_with_a_body_is_a_503_to_retry(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    stream = request(agent, "/refuse", "Content-Length: 2", body=b"{}", method="POST")
    await stream.wait_done()
    status, headers, body = stream.response()
    assert status == 503 and headers["retry-after"] == "1"
    assert b'"kind":"Status"' in body.replace(b" ", b"")
    agent.pool.close()


async def test_goaway_sends_new_requests_to_a_new_connection(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    watch = request(agent, "/watch")
    await watch.wait(lambda: b'{"n":0}' in watch.received)
    old = server.h2_connections[0]
    old.goaway(last_stream_id=1)
    await eventually(lambda: not agent.pool.h2_connections())
    after = request(agent, "/small")
    await after.wait_done()
    assert after.response()[2] == b"small"
    assert len(server.h2_connections) == 2
    # The watch the server had accepted (stream 1) goes on until it ends.
    old.conn.send_data(1, b'{"n":1}\n', end_stream=True)
    old.flush()
    await watch.wait(lambda: watch.eof)
    assert watch.response()[2].endswith(b'8\r\n{"n":1}\n\r\n0\r\n\r\n')
    agent.pool.close()


async def test_streams_above_goaways_last_stream_id_are_retried_on_a_new_connection(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    warm = request(agent, "/small")  # stream 1
    await warm.wait_done()
    late = request(agent, "/late")  # stream 3: the server never processes it
    await eventually(lambda: (0, 3) in server.heads)
    server.h2_connections[0].goaway(last_stream_id=1)
    await late.wait_done()
    assert late.response() == (200, {"content-length": "4"}, b"late")
    assert (1, 1) in server.heads  # sent again, as the first stream of a new connection
    agent.pool.close()


async def test_upgrades_use_http1_even_when_the_server_speaks_h2(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    ws = request(agent, "/api/v1/namespaces/a/pods/p/exec", "Connection: Upgrade",
                 "Upgrade: websocket", "Sec-WebSocket-Version: 13",
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
    await ws.wait_done()
    assert ws.response()[2] == b"h1"
    assert server.h1_requests and server.h1_requests[0].startswith(b"GET /api/v1/")
    assert agent.pool.protocol_dials == {"h1": 1}
    agent.pool.close()


@pytest.mark.parametrize("alpn", [("http/1.1",), ("http/1.1", "h2")])
async def test_a_server_that_picks_http1_gets_http1_from_then_on(
        ca: trustme.CA, ca_file: str, tmp_path: Path, alpn: tuple[str, ...]) -> None:
    # Python's server picks the first of its own list the client offers.
    server = await h2server.start(ca.issue_cert("127.0.0.1"), alpn=alpn)
    try:
        agent = await make_agent(server, ca_file, tmp_path, protocol="auto")
        # The first request probes (its dial offers h2), and the server picks http/1.1.
        for path in ("/api/v1/pods?watch=1", "/small", "/api/v1/pods?watch=1"):
            stream = request(agent, path)
            await stream.wait_done()
            assert stream.response()[2] == b"h1"
        # One probe offered h2, then HTTP/1.1 connections only (one, reused).
        assert [c.alpn for c in server.connections] == ["http/1.1", "http/1.1"]
        assert agent.pool.protocol_dials == {"h1": 1}
        agent.pool.close()
    finally:
        assert server.server is not None
        server.server.close()


async def test_protocol_h2_refuses_a_server_without_it(
        ca: trustme.CA, ca_file: str, tmp_path: Path) -> None:
    server = await h2server.start(ca.issue_cert("127.0.0.1"), alpn=("http/1.1",))
    try:
        agent = await make_agent(server, ca_file, tmp_path, protocol="h2")
        stream = request(agent, "/small")
        await stream.wait_done()
        assert stream.refused is not None and stream.refused[0] == OpenErrorCode.UNREACHABLE
        assert "HTTP/2" in stream.refused[1]
    finally:
        assert server.server is not None
        server.server.close()


async def test_protocol_h1_never_offers_h2(server: h2server.H2Server, ca_file: str,
                                           tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path, protocol="h1")
    stream = request(agent, "/small")
    await stream.wait_done()
    assert stream.response()[2] == b"h1"
    assert [c.alpn for c in server.connections] == ["http/1.1"]
    agent.pool.close()


async def test_an_idle_h2_connection_is_closed_after_the_idle_timeout(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path, idle_timeout=0.5)
    stream = request(agent, "/small")
    await stream.wait_done()
    assert len(agent.pool.h2_connections()) == 1 and agent.pool.idle == 1
    await eventually(lambda: not agent.pool.h2_connections(), timeout=5)
    await eventually(lambda: server.h2_connections[0].transport.is_closing(), timeout=5)
    agent.pool.close()


async def test_auto_sends_short_requests_and_watches_over_one_h2_connection(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path, protocol="auto")
    watch = request(agent, "/watch")
    await watch.wait(lambda: b'{"n":0}' in watch.received)
    for _ in range(3):
        small = request(agent, "/small")
        await small.wait_done()
        assert small.response() == (200, {"content-length": "5"}, b"small")
    assert len(server.connections) == 1 and not server.h1_requests
    assert agent.pool.protocol_dials == {"h2": 1}
    watch.client_reset()
    agent.pool.close()


def test_metrics_show_protocols_connections_and_streams() -> None:
    agent: Any = Agent(cluster="c1", policy=FakePolicy(("127.0.0.1", 1), {}), kube=None)
    agent.pool.protocol_dials.update({"h1": 2, "h2": 3})
    text = agent.metrics.render().decode()
    assert 'hubproxy_agent_upstream_protocol_dials_total{protocol="h2"} 3' in text
    assert 'hubproxy_agent_upstream_protocol_dials_total{protocol="h1"} 2' in text
    assert "hubproxy_agent_upstream_h2_streams 0" in text
    assert 'hubproxy_agent_upstream_h2_streams_max{of="limit"} 100' in text


def recorded_writes(stream: Any) -> list[bytes]:
    """What the agent writes to ``stream`` from now on, one item per write."""
    writes: list[bytes] = []
    original = stream.write

    def recording_write(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        original(data)

    stream.write = recording_write
    return writes


async def test_the_data_frames_of_one_read_reach_the_tunnel_as_one_chunk(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # 50 watch events, 50 DATA frames written at once: one chunk, one write to the tunnel
    # stream (they were 50 of each). The head came in the same read: it rides in that write.
    agent = await make_agent(server, ca_file, tmp_path)
    stream = request(agent, "/events?n=50")
    writes = recorded_writes(stream)
    events = b"".join(b'{"n":%d}\n' % i for i in range(50))
    await stream.wait(lambda: events in bytes(stream.received))
    head_end = writes[0].index(b"\r\n\r\n") + 4
    head, first_body = writes[0][:head_end], writes[0][head_end:]
    assert head.startswith(b"HTTP/1.1 200 ")
    assert [first_body, *writes[1:]] == [b"%x\r\n" % len(events) + events + b"\r\n"]
    stream.client_reset()
    agent.pool.close()


async def test_a_small_responses_head_and_body_reach_the_tunnel_in_one_write(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # HEADERS and DATA(END_STREAM) in one read: one write to the tunnel stream, then EOF (the
    # head and the body were a write each).
    agent = await make_agent(server, ca_file, tmp_path)
    await request(agent, "/small").wait_done()  # the connection is up: the next is one read
    stream = request(agent, "/small")
    writes = recorded_writes(stream)
    await stream.wait_done()
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b"\r\n\r\nsmall")
    assert stream.response()[0] == 200 and stream.response()[2] == b"small"
    agent.pool.close()


async def test_h2_connections_read_into_the_pools_one_buffer_and_relay_every_byte(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # TLS records are decrypted into the pool's shared buffer (no bytes object per read, no
    # buffer per connection); what each read brought is relayed before the next overwrites
    # it, so two bodies interleaved over many reads (frames cut at their ends) arrive whole.
    agent = await make_agent(server, ca_file, tmp_path)
    streams = [request(agent, "/events?n=4000") for _ in range(2)]
    events = b"".join(b'{"n":%d}\n' % i for i in range(4000))
    for stream in streams:
        await stream.wait(lambda stream=stream: len(whole_chunks(stream)) >= len(events), 10)
        assert whole_chunks(stream) == events
    conn = agent.pool.h2_connections()[0]
    assert conn.get_buffer(-1) is agent.pool.read_buffer()
    for stream in streams:
        stream.client_reset()
    agent.pool.close()


def whole_chunks(stream: FakeStream) -> bytes:
    """The payload of the complete chunks of a chunked body still under way."""
    if b"\r\n\r\n" not in stream.received:
        return b""
    out, rest = b"", stream.response()[2]
    while True:
        size_line, crlf, rest = rest.partition(b"\r\n")
        if not crlf or len(rest) < int(size_line, 16) + 2:
            return out
        size = int(size_line, 16)
        out, rest = out + rest[:size], rest[size + 2:]


async def test_a_credential_with_a_control_character_never_reaches_the_apiserver(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # An HTTP/2 stream sends fields, never the HTTP/1.1 bytes whose serialisation checked
    # them: what the agent adds to a head (here its own credential, from a token file with a
    # bell in it) is checked all the same, and the stream is refused before any HEADERS.
    agent = await make_agent(server, ca_file, tmp_path)
    (tmp_path / "token").write_text("agent\x07token, rotated\n")  # read at the next request
    stream = request(agent, "/small")
    await stream.wait_done()
    assert stream.refused is not None and stream.refused[0] == OpenErrorCode.INTERNAL
    assert not server.heads
    agent.pool.close()


async def test_a_body_of_known_length_completes_before_the_servers_end_stream(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    agent = await make_agent(server, ca_file, tmp_path)
    stream = request(agent, "/split-late")  # END_STREAM only 10 s after the body
    await stream.wait_done(2)
    assert stream.response() == (200, {"content-length": "5"}, b"split")
    agent.pool.close()


async def test_a_body_shorter_than_its_content_length_resets_the_tunnel_stream(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # The core's rule (RFC 9113 §8.1.1): END_STREAM short of the content-length is a stream
    # error; the head already went to the client, so the tunnel stream is reset, not ended.
    agent = await make_agent(server, ca_file, tmp_path)
    stream = request(agent, "/short")
    await stream.wait_done()
    assert stream.reset_code is not None and not stream.eof
    small = request(agent, "/small")  # the connection goes on
    await small.wait_done()
    assert small.response()[2] == b"small" and len(server.h2_connections) == 1
    agent.pool.close()


async def test_a_large_body_grows_its_stream_window_and_gives_the_growth_back(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # At 64 KiB a round trip the window, not the reader, limits a large list or log: the
    # stream's window grows while the tunnel takes the bytes, and the budget is whole again
    # once the stream ended.
    agent = await make_agent(server, ca_file, tmp_path)
    size = 3_000_000
    stream = request(agent, f"/big?n={size}")
    await stream.wait_done(20)
    assert unchunked(stream.response()[2]) == b"b" * size
    given = server.window_updates[(0, 1)]
    assert given > size  # more credit than bytes taken: the window grew
    assert agent.pool.h2_window_budget.used == 0
    agent.pool.close()


async def test_a_connection_lost_during_a_large_body_gives_its_growth_back(
        server: h2server.H2Server, ca_file: str, tmp_path: Path) -> None:
    # Grown windows are shared by the agent's connections: one lost with a transfer under way
    # must not keep its share (a few apiserver restarts would leave no stream room to grow).
    agent = await make_agent(server, ca_file, tmp_path)
    budget = agent.pool.h2_window_budget
    stream = request(agent, "/big?n=200000000")
    await stream.wait(lambda: budget.used > 0, 20)
    server.h2_connections[0].transport.abort()
    await stream.wait_done(10)
    assert not stream.eof and budget.used == 0
    agent.pool.close()
