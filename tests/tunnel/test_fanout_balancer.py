"""An agent's fan-out behind a load balancer that spreads its dials over hub instances on
separate ports, as a Kubernetes Service or HAProxy does (a real TCP front on 127.0.0.1, TLS
passing through it): a new instance is reached within seconds although most dials land on
instances the agent already holds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from tests.tunnel.pki import PKI, make_pki
from tunnel.connection import SessionConfig
from tunnel.dialer import AgentDialer, HubFanout
from tunnel.listener import TunnelListener, start_tunnel_listener
from tunnel.registry import SessionRegistry


class Front:
    """A TCP balancer: each connection goes to the port ``pick()`` names; bytes are relayed."""

    def __init__(self, pick: Callable[[], int]) -> None:
        self.pick = pick
        self.routed: list[int] = []  # the backend port of each connection, in order
        self.server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = self.pick()
        self.routed.append(port)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._copy(src, dst))
            self._relays.add(task)
            task.add_done_callback(self._relays.discard)

    @staticmethod
    async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._relays):
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)


async def instance(pki: PKI, number: int, peers: tuple[int, ...]) -> TunnelListener:
    # hub_instances 1: the listed set (HUB_PEER) alone says how many there are, as with Leases.
    return await start_tunnel_listener(
        "127.0.0.1", 0, pki.hub_context(), SessionRegistry(),
        SessionConfig(hub_instance=number, hub_instances=1, hub_peers=peers))


def held(fanout: HubFanout) -> list[int]:
    return sorted(s.hub_instance for s in fanout.sessions if not s.closed and not s.draining)


async def test_an_agent_reaches_a_fourth_instance_within_seconds_behind_a_round_robin_front(
    tmp_path,
) -> None:
    """Scale 3 -> 4 behind round robin. Other clients' connections share the balancer, so the
    new instance's turns may all go to them for a while: here the agent's first 12 dials after
    the scale reach instances it holds (a run of misses that a uniform balancer gives 3% of
    the time with 1 chance in 4 per dial), then round robin over all four. An agent that backs
    off after three misses in a row (0.75^3: 42% of the time) sleeps for minutes by then."""
    pki = make_pki(tmp_path)
    listeners = [await instance(pki, n, (1, 2, 3)) for n in (1, 2, 3)]
    ports = [listener.port for listener in listeners]
    turns = {"next": 0, "taken": 0}
    routable = list(ports)

    def round_robin() -> int:
        if turns["taken"] > 0:  # the newest instance's turns go to other clients
            turns["taken"] -= 1
            pool = routable[:-1]
        else:
            pool = routable
        turns["next"] += 1
        return pool[turns["next"] % len(pool)]

    front = Front(round_robin)
    front_port = await front.start()
    context = pki.agent_context("c1")
    fanout = HubFanout(lambda f: AgentDialer("127.0.0.1", front_port, lambda: context,
                                             lambda request: None, server_hostname="localhost",
                                             fanout=f))
    task = asyncio.ensure_future(fanout.run())
    try:
        async with asyncio.timeout(20):
            while held(fanout) != [1, 2, 3]:
                await asyncio.sleep(0.02)
        fourth = await instance(pki, 4, (1, 2, 3, 4))
        listeners.append(fourth)
        turns["taken"] = 12
        routable.append(fourth.port)
        dials_before = len(front.routed)
        scaled = time.monotonic()
        for listener in listeners[:3]:
            listener.announce_hub_peers((1, 2, 3, 4))
        try:
            async with asyncio.timeout(10):
                while held(fanout) != [1, 2, 3, 4]:
                    await asyncio.sleep(0.02)
        except TimeoutError:
            raise AssertionError(
                f"holds {held(fanout)} {time.monotonic() - scaled:.1f} s after the scale, "
                f"{len(front.routed) - dials_before} dials") from None
        dials = len(front.routed) - dials_before
        assert 13 <= dials <= 17, dials  # 12 misses, then at most one round of four
        assert fourth.registry.clusters() == {"c1"}
    finally:
        await fanout.drain(1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await front.close()
        for listener in listeners:
            listener.close()
