"""The front door over a real tunnel session pair (tunnel.connection), agent side in-test.

The hub end is a real ``TunnelSession`` (as the tunnel listener registers it); the agent end is
a real ``TunnelSession`` with an ``on_open`` that accepts and answers from canned bytes, so
framing, flow control, half-close and resets are the tunnel's own.
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
from typing import Any

import pytest

from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    Harness,
    Tls,
    get,
    h2tls,  # noqa: F401
    parse_raw,
    read_response,
    running,
    tls,  # noqa: F401
)
from tunnel.connection import OpenRequest, TunnelSession

pytestmark = pytest.mark.timeout(30)


class CannedAgent:
    """Agent-side StreamProtocol: collect the request until EOF, answer, half-close."""

    def __init__(self, record: list[dict[str, Any]], hold: asyncio.Event | None) -> None:
        self.record = record
        self.hold = hold
        self.received = bytearray()
        self.stream: Any = None
        self.lost: Exception | str | None = "open"

    def connection_made(self, stream: Any) -> None:
        self.stream = stream
        stream.accept()

    def data_received(self, data: bytes | memoryview) -> None:
        self.received += data

    def eof_received(self) -> None:
        entry = {"received": bytes(self.received), "metadata": self.stream.metadata}
        self.record.append(entry)
        body = b"x" * 100_000
        self.stream.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        self.stream.write(body)
        self.stream.write_eof()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


class WatchAgent(CannedAgent):
    def data_received(self, data: bytes | memoryview) -> None:
        self.received += data
        if b"\r\n\r\n" in self.received and not self.record:
            self.record.append({"received": bytes(self.received)})
            self.stream.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                              b"5\r\nfirst\r\n")

    def eof_received(self) -> None:
        pass  # a watch goes on after the request ended


async def session_pair(agents: list[CannedAgent], factory: type[CannedAgent]
                       ) -> tuple[TunnelSession, TunnelSession, list[Any]]:
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    record: list[dict[str, Any]] = []

    def on_open(request: OpenRequest) -> CannedAgent:
        agent = factory(record, None)
        agents.append(agent)
        return agent

    _, hub = await loop.create_connection(lambda: TunnelSession(name="hub"), sock=a)
    _, agent = await loop.create_connection(lambda: TunnelSession(on_open=on_open, name="agent"),
                                            sock=b)
    return hub, agent, record


async def with_tunnel(h: Harness, factory: type[CannedAgent]
                      ) -> tuple[TunnelSession, TunnelSession, list[Any], list[CannedAgent]]:
    agents: list[CannedAgent] = []
    hub, agent, record = await session_pair(agents, factory)
    h.registry.add("real", hub)
    return hub, agent, record, agents


async def test_request_and_response_through_real_tunnel(tls) -> None:  # noqa: F811
    async with running(tls) as h:
        hub, agent, record, _ = await with_tunnel(h, CannedAgent)
        reader, writer = await h.open()
        body = b"y" * 300_000  # more than one initial window
        writer.write(b"POST /real/api/v1/x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer "
                     + HUB_TOKEN.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        status, _, out = await read_response(reader)
        assert status == 200 and len(out) == 100_000
        writer.write(get("/real/api/v1/y"))  # keep-alive over the real stream lifecycle
        assert (await read_response(reader))[0] == 200
        writer.close()
        sent = record[0]["received"]
        assert sent.endswith(body)
        assert HUB_TOKEN.encode() not in sent
        assert json.loads(record[0]["metadata"])["user"].startswith("cluster:hub:")
        hub.close()
        agent.close()


async def test_client_disconnect_resets_real_stream(tls) -> None:  # noqa: F811
    async with running(tls) as h:
        hub, agent, _record, agents = await with_tunnel(h, WatchAgent)
        reader, writer = await h.open()
        writer.write(get("/real/api/v1/pods?watch=1"))
        async with asyncio.timeout(5):
            await reader.readuntil(b"5\r\nfirst\r\n")
        writer.close()
        async with asyncio.timeout(5):
            while agents[0].lost == "open":
                await asyncio.sleep(0.01)
        assert agents[0].lost is not None  # reset reached the agent: the watch is cancelled
        hub.close()
        agent.close()


async def test_session_closed_mid_request_is_503(tls) -> None:  # noqa: F811
    class Silent(CannedAgent):
        def eof_received(self) -> None:
            pass

    async with running(tls) as h:
        hub, agent, _, _ = await with_tunnel(h, Silent)
        reader, writer = await h.open()
        writer.write(get("/real/api"))
        await asyncio.sleep(0.1)
        agent.close()  # the agent goes away before answering
        status, _, body = await read_response(reader)
        assert status in (502, 503)
        assert json.loads(body)["kind"] == "Status"
        writer.close()
        hub.close()


async def test_stream_on_a_session_that_just_closed_is_503(tls) -> None:  # noqa: F811
    async with running(tls) as h:
        hub, agent, _, _ = await with_tunnel(h, CannedAgent)
        hub.close()
        h.registry.pick = lambda cluster: hub  # the race: picked just before it closed
        status, _, body = parse_raw(await h.exchange(get("/real/api", close=True)))
        assert status == 503
        assert json.loads(body)["message"] == "the connection to the cluster was lost"
        agent.close()


class FirehoseAgent(CannedAgent):
    """A watch that emits 40 x 100 kB events as fast as the stream's window allows."""

    total = 40

    def data_received(self, data: bytes | memoryview) -> None:
        self.received += data
        if b"\r\n\r\n" in self.received and not self.record:
            self.record.append({"received": bytes(self.received)})
            self.sent = 0
            self.paused_seen = False
            self.writing_paused = False
            self.stream.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            self._pump()

    def _pump(self) -> None:
        while not self.writing_paused and self.sent < self.total:
            event = (b'{"name":"big-%02d","blob":"' % self.sent) + b"x" * 100_000 + b'"}\n'
            self.stream.write(b"%x\r\n" % len(event) + event + b"\r\n")
            self.sent += 1

    def eof_received(self) -> None:
        pass

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.paused_seen = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._pump()


async def test_slow_reader_pauses_the_tunnel_then_gets_every_event(tls) -> None:  # noqa: F811
    async with running(tls) as h:
        hub, agent, _, agents = await with_tunnel(h, FirehoseAgent)
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.setblocking(False)
        await asyncio.get_running_loop().sock_connect(raw, ("127.0.0.1", h.port))
        reader, writer = await asyncio.open_connection(sock=raw, ssl=h.tls.client,
                                                       server_hostname="localhost")
        writer.write(get("/real/api/v1/configmaps?watch=1"))
        await asyncio.sleep(1.0)
        assert agents[0].paused_seen  # the tunnel's window pushed back on the agent
        # Meanwhile other requests on other connections flow.
        data = await h.exchange(get("/c1-missing/api", close=True))
        assert parse_raw(data)[0] in (404, 503)
        received = bytearray()
        async with asyncio.timeout(20):
            while received.count(b'"name":"big-') < FirehoseAgent.total:
                chunk = await reader.read(1 << 20)
                assert chunk, "connection closed early"
                received += chunk
        assert all(b'"name":"big-%02d"' % i in received for i in range(FirehoseAgent.total))
        writer.close()
        hub.close()
        agent.close()


async def test_a_finished_request_leaves_nothing_to_the_cyclic_collector(
        h2tls: Tls) -> None:  # noqa: F811
    """A request's objects on the hub (its exchange, the request, its HTTP/2 stream, its head)
    are freed when it ends, by reference counting: none is left in a reference cycle (the
    exchange and its tunnel stream, an HTTP/2 stream and its request) for the cyclic collector,
    which otherwise ran a young collection every few dozen requests to find them."""
    async with running(h2tls) as h:
        hub, agent, _, _ = await with_tunnel(h, CannedAgent)
        reader, writer = await h.open()  # no ALPN: HTTP/1.1
        client = await H2Client.connect(h.port, h.tls.ca_file)
        writer.write(get("/real/api/v1/warm"))  # the token cached, every module imported
        assert (await read_response(reader))[0] == 200
        assert (await client.request("/real/api/v1/warm", token=HUB_TOKEN)).status == 200
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what any collection finds stays in gc.garbage
        try:
            for i in range(5):
                writer.write(get(f"/real/api/v1/h1-{i}"))
                assert (await read_response(reader))[0] == 200
                r = await client.request(f"/real/api/v1/h2-{i}", token=HUB_TOKEN)
                assert r.status == 200
            await asyncio.sleep(0.1)  # the streams' last frames
            gc.collect()
            left = {type(o).__name__ for o in gc.garbage}
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert not left & {"Exchange", "Request", "H2Stream", "RequestHead", "Admitted",
                           "TunnelStream"}, sorted(left)
        writer.close()
        await client.close()
        hub.close()
        agent.close()
