"""Listener and dialer together, beyond the handshake: the hub refuses streams an agent opens,
and keepalive through the real listener/dialer finds a silently dead path (a TCP proxy we
freeze: the sockets stay open, nothing is forwarded), after which the agent reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from tests.support import eventually
from tests.tunnel.conftest import Collector
from tests.tunnel.pki import PKI, make_pki
from tests.tunnel.test_listener_dialer import echo_on_open, echo_through
from tunnel.backoff import Backoff
from tunnel.connection import SessionConfig
from tunnel.dialer import AgentDialer
from tunnel.errors import OpenErrorCode, OpenRefused
from tunnel.listener import start_tunnel_listener
from tunnel.registry import SessionRegistry
from tunnel.targets import KubeAPITarget

FAST = dict(ping_after=0.1, dead_after=0.4)


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    return make_pki(tmp_path)


class FreezableProxy:
    """127.0.0.1 TCP proxy; ``freeze()`` stops forwarding on the connections open right now
    (sockets stay open, as with a peer that hangs or a dropped path), new ones work."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.server: asyncio.Server | None = None
        self.live: list[asyncio.Event] = []  # one "frozen" event per connection
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def freeze(self) -> None:
        for frozen in self.live:
            frozen.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.writers += [writer, up_writer]
        frozen = asyncio.Event()
        self.live.append(frozen)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst, frozen))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    frozen: asyncio.Event) -> None:
        with contextlib.suppress(OSError):
            while not frozen.is_set():
                read = asyncio.ensure_future(src.read(65536))
                stop = asyncio.ensure_future(frozen.wait())
                await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if not read.done():  # frozen: drop nothing on the floor, just stop moving bytes
                    read.cancel()
                    return
                data = read.result()
                if not data:
                    dst.close()
                    return
                dst.write(data)
                await dst.drain()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        for writer in self.writers:
            writer.close()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def test_hub_refuses_a_stream_opened_by_an_agent(pki: PKI) -> None:
    registry = SessionRegistry()
    listener = await start_tunnel_listener("127.0.0.1", 0, pki.hub_context(), registry)
    agent = AgentDialer("127.0.0.1", listener.port, lambda: pki.agent_context("c1"),
                        echo_on_open, SessionConfig(), server_hostname="localhost",
                        backoff=Backoff(base=0.05, cap=0.2))
    task = asyncio.create_task(agent.run())
    try:
        await eventually(lambda: agent.connected and registry.clusters() == {"c1"})
        assert agent.session is not None
        probe = Collector()
        agent.session.open_stream(KubeAPITarget(), b"{}", probe, initial_data=b"GET / HTTP/1.1")
        exc = await asyncio.wait_for(probe.lost, 5)
        assert isinstance(exc, OpenRefused) and exc.code is OpenErrorCode.DENIED
        # The refusal costs the agent nothing: its session still serves the hub.
        assert await echo_through(listener, "c1", b"still here") == b"still here"
    finally:
        await agent.drain(1.0)
        await asyncio.wait_for(task, 5)
        listener.close()
        await listener.wait_closed()


async def test_keepalive_finds_a_frozen_path_and_the_agent_reconnects(pki: PKI) -> None:
    registry = SessionRegistry()
    listener = await start_tunnel_listener("127.0.0.1", 0, pki.hub_context(), registry,
                                           SessionConfig(**FAST))
    proxy = FreezableProxy(listener.port)
    proxy_port = await proxy.start()
    agent = AgentDialer("127.0.0.1", proxy_port, lambda: pki.agent_context("c1"),
                        echo_on_open, SessionConfig(**FAST), server_hostname="localhost",
                        backoff=Backoff(base=0.05, cap=0.2))
    task = asyncio.create_task(agent.run())
    try:
        await eventually(lambda: len(registry.sessions("c1")) == 1)
        first = registry.sessions("c1")[0]
        await asyncio.sleep(0.5)  # idle for longer than dead_after: pings keep it alive
        assert not first.closed
        assert await echo_through(listener, "c1", b"alive") == b"alive"

        in_flight = Collector()
        first.open_stream(KubeAPITarget(), b"{}", in_flight, initial_data=b"x")
        await asyncio.sleep(0.05)
        proxy.freeze()
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(in_flight.lost, 3)
        took = asyncio.get_running_loop().time() - t0
        assert first.closed and first.close_reason == "peer dead"
        assert took < 0.4 + 0.5

        # The agent's side of the frozen path dies too; it dials again through a live path.
        await eventually(lambda: any(s is not first and not s.closed
                                     for s in registry.sessions("c1")))
        assert first not in registry.sessions("c1")
        assert await echo_through(listener, "c1", b"back") == b"back"
        assert agent.connects >= 2
    finally:
        await agent.drain(1.0)
        await asyncio.wait_for(task, 5)
        listener.close()
        await listener.wait_closed()
        await proxy.close()
