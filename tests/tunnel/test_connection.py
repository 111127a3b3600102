"""asyncio adapter end to end over real TLS on 127.0.0.1."""

from __future__ import annotations

import asyncio

from tests.tunnel.conftest import Collector, session_pair
from tunnel.connection import OpenRequest
from tunnel.errors import OpenErrorCode, OpenRefused
from tunnel.targets import KubeAPITarget, ServiceTarget


class Echo(Collector):
    """Agent side: accepts, echoes everything, half-closes after the peer's EOF."""

    def connection_made(self, stream) -> None:
        super().connection_made(stream)
        stream.accept()

    def data_received(self, data) -> None:
        super().data_received(data)
        self.stream.write(data)

    def eof_received(self) -> None:
        super().eof_received()
        self.stream.write_eof()


async def test_echo_with_0rtt_and_half_close(tls_contexts):
    requests: list[OpenRequest] = []

    def on_open(req: OpenRequest):
        requests.append(req)
        return Echo()

    hub, agent, server = await session_pair(tls_contexts, on_open=on_open)
    client = Collector(keep=True)
    stream = hub.open_stream(KubeAPITarget(), b'{"user":"u"}', client, initial_data=b"hello ")
    assert stream.stream_id == 1 and client.stream is stream
    stream.write(b"world")
    stream.write_eof()
    assert await asyncio.wait_for(client.lost, 5) is None
    assert bytes(client.data) == b"hello world" and client.eof
    assert requests == [OpenRequest(1, KubeAPITarget(), b'{"user":"u"}')]
    assert hub.active_streams == 0 and agent.active_streams == 0
    hub.close()
    await asyncio.wait_for(agent.wait_closed(), 5)
    assert agent.closed
    server.close()


async def test_refusal_is_typed(tls_contexts):
    class Refuser(Collector):
        def connection_made(self, stream) -> None:
            super().connection_made(stream)
            stream.refuse(OpenErrorCode.DENIED, "service not allow-listed")

    hub, agent, server = await session_pair(tls_contexts, on_open=lambda req: Refuser())
    client = Collector()
    hub.open_stream(ServiceTarget("ns", "svc", 80), b"", client)
    exc = await asyncio.wait_for(client.lost, 5)
    assert isinstance(exc, OpenRefused) and exc.code == OpenErrorCode.DENIED
    assert exc.message == "service not allow-listed"
    # on_open returning None refuses with DENIED too
    agent.on_open = lambda req: None
    client2 = Collector()
    hub.open_stream(KubeAPITarget(), b"", client2)
    exc2 = await asyncio.wait_for(client2.lost, 5)
    assert isinstance(exc2, OpenRefused) and exc2.code == OpenErrorCode.DENIED
    hub.close()
    server.close()
