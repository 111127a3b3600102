"""Frames handed to TLS: small ones joined into one piece (one record), large ones never copied."""

from __future__ import annotations

import asyncio
import ssl

import trustme

from tests.tunnel.conftest import Collector, session_pair
from tunnel import frames
from tunnel.connection import ALPN
from tunnel.targets import KubeAPITarget
from tunnel.tlswrites import COPY_BELOW, tls_pieces


def test_small_neighbours_are_joined_in_order():
    pieces = [b"hdr1", memoryview(b"payload-1"), b"hdr2", bytearray(b"p2")]
    assert tls_pieces(pieces) == [b"hdr1payload-1hdr2p2"]


def test_a_large_piece_is_passed_as_it_is_between_joined_runs():
    big = memoryview(bytes(COPY_BELOW))
    out = tls_pieces([b"a", b"b", big, b"c", b"d"])
    assert out == [b"ab", big, b"cd"]
    assert out[1] is big  # never copied


def test_a_lone_piece_is_not_copied():
    small = memoryview(b"x" * 100)
    big = bytes(COPY_BELOW * 2)
    assert tls_pieces([small])[0] is small
    out = tls_pieces([big, small])
    assert out[0] is big and out[1] is small


def test_nothing_in_nothing_out():
    assert tls_pieces([]) == []


def test_the_bytes_are_unchanged_for_a_real_flush():
    header = frames.data_header(3, 5, False)
    pieces = [header, b"hello", frames.data_header(3, 0, True), bytes(40_000), b"tail"]
    assert b"".join(tls_pieces(pieces)) == b"".join(pieces)


def counting_tls() -> tuple[ssl.SSLContext, ssl.SSLContext, dict[str, int]]:
    """Hub (server) and agent (client) contexts over one CA whose SSLObjects count their
    ``write`` calls (one each per TLS record or more) in the returned dict."""
    writes = {"hub": 0, "agent": 0}

    def counting(side: str) -> type[ssl.SSLObject]:
        class Counting(ssl.SSLObject):
            def write(self, data) -> int:  # type: ignore[override]
                writes[side] += 1
                return super().write(data)
        return Counting

    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("hub.test").configure_cert(server)
    ca.configure_trust(server)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(client)
    ca.issue_cert("agent.test").configure_cert(client)
    for context, side in ((server, "hub"), (client, "agent")):
        context.set_alpn_protocols([ALPN])
        context.sslobject_class = counting(side)
    return server, client, writes


class Answer(Collector):
    """Agent side: accepts, answers a small response after the request's EOF, half-closes;
    ``delay``: a moment later, as an upstream would."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay

    def connection_made(self, stream) -> None:
        super().connection_made(stream)
        stream.accept()

    def eof_received(self) -> None:
        super().eof_received()
        if self.delay:
            asyncio.get_running_loop().call_later(self.delay, self.answer)
        else:
            self.answer()

    def answer(self) -> None:
        self.stream.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
        self.stream.write(b"ok")
        self.stream.write_eof()


async def test_many_small_responses_of_one_turn_leave_in_a_few_tls_writes():
    """Forty streams answered in one loop turn: their OPEN_ACK, DATA and FIN frames (well over
    a hundred pieces) reach TLS as a few writes, not one record per frame header and payload."""
    server, client, writes = counting_tls()
    hub, agent, listener = await session_pair((server, client), on_open=lambda req: Answer())
    await asyncio.sleep(0.05)  # settled: SETTINGS and the first pings are out
    clients = [Collector(keep=True) for _ in range(40)]
    for collector in clients:
        stream = hub.open_stream(KubeAPITarget(), b"", collector, initial_data=b"GET / ...")
        stream.write_eof()
    writes["agent"] = 0
    for collector in clients:
        assert await asyncio.wait_for(collector.lost, 5) is None
        assert bytes(collector.data).endswith(b"\r\n\r\nok")
    # One write per flush of the agent: the OPENs arrive in one or a few reads.
    assert writes["agent"] <= 8, writes
    hub.close()
    await asyncio.wait_for(agent.wait_closed(), 5)
    listener.close()


async def test_a_short_request_costs_one_write_each_way():
    """The OPEN carries the request and its FIN; the agent's OPEN_ACK waits for the answer and
    leaves with it. Before: the hub wrote the OPEN, then the FIN; the agent the OPEN_ACK, then
    the answer (two writes and two wake-ups of the peer each way)."""
    server, client, writes = counting_tls()
    hub, agent, listener = await session_pair((server, client),
                                              on_open=lambda r: Answer(delay=0.02))
    await asyncio.sleep(0.05)  # settled: SETTINGS and the first pings are out
    for _ in range(3):
        writes["hub"] = writes["agent"] = 0
        collector = Collector(keep=True)
        stream = hub.open_stream(KubeAPITarget(), b"", collector,
                                 initial_data=b"GET / HTTP/1.1\r\n\r\n", fin=True)
        stream.write_eof()  # a no-op now: the OPEN carried the FIN
        assert await asyncio.wait_for(collector.lost, 5) is None
        assert bytes(collector.data).endswith(b"\r\n\r\nok")
        assert (writes["hub"], writes["agent"]) == (1, 1)
    hub.close()
    await asyncio.wait_for(agent.wait_closed(), 5)
    listener.close()
