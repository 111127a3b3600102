"""Flow control end to end over real TLS: head-of-line isolation, integrity, violations."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import ssl
import struct
import time

from tests.tunnel.conftest import Collector, session_pair
from tunnel import frames as f
from tunnel.connection import TunnelSession
from tunnel.errors import GoAwayCode, ResetCode, StreamReset
from tunnel.session_state import SessionConfig
from tunnel.targets import KubeAPITarget

WINDOW = 256 * 1024


async def pump(stream, proto, data: bytes, chunk: int = 64 * 1024, eof: bool = True) -> None:
    """Write ``data`` honouring pause_writing/resume_writing (what a socket relay does)."""
    view = memoryview(data)
    for i in range(0, len(view), chunk):
        while proto.paused > proto.resumed:
            await proto.writable.wait()
            proto.writable.clear()
        stream.write(view[i:i + chunk])
        if i % (8 * chunk) == 0:
            await asyncio.sleep(0)
    if eof:
        stream.write_eof()


class Sender(Collector):
    def __init__(self, keep: bool = False) -> None:
        super().__init__(keep)
        self.writable = asyncio.Event()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.writable.set()


class Sink(Collector):
    """Agent side: accepts and consumes; optionally stalls (pause_reading) from the start."""

    def __init__(self, stall: bool = False) -> None:
        super().__init__()
        self.stall = stall
        self.done = asyncio.get_running_loop().create_future()

    def connection_made(self, stream) -> None:
        super().connection_made(stream)
        stream.accept()
        if self.stall:
            stream.pause_reading()

    def eof_received(self) -> None:
        super().eof_received()
        self.stream.write_eof()
        if not self.done.done():
            self.done.set_result(time.monotonic())


class Echo(Sender):
    """Agent side: echoes, mapping its own write back-pressure to pause_reading on the stream."""

    def connection_made(self, stream) -> None:
        super().connection_made(stream)
        stream.accept()

    def data_received(self, data) -> None:
        super().data_received(data)
        self.stream.write(data)

    def pause_writing(self) -> None:
        super().pause_writing()
        self.stream.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.stream.resume_reading()

    def eof_received(self) -> None:
        super().eof_received()
        self.stream.write_eof()


async def _run_parallel(tls_contexts, n: int, size: int, stall: bool):
    sinks: list[Sink] = []

    def on_open(req):
        sink = Sink(stall=stall and not sinks)
        sinks.append(sink)
        return sink

    hub, agent, server = await session_pair(tls_contexts, on_open=on_open)
    payload = os.urandom(size)
    senders = [Sender() for _ in range(n + (1 if stall else 0))]
    streams = [hub.open_stream(KubeAPITarget(), b"", s) for s in senders]
    t0 = time.monotonic()
    tasks = [asyncio.create_task(pump(st, s, payload))
             for st, s in zip(streams, senders, strict=True)]
    for _ in range(500):
        if len(sinks) == len(senders):
            break
        await asyncio.sleep(0.01)
    movers = sinks[1:] if stall else sinks
    await asyncio.wait_for(asyncio.gather(*(s.done for s in movers)), 30)
    elapsed = time.monotonic() - t0
    return hub, agent, server, sinks, senders, tasks, payload, elapsed


async def test_head_of_line_isolation(tls_contexts):
    n, size = 20, 2 * 1024 * 1024
    hub0, _agent0, server0, *_, base = await _run_parallel(tls_contexts, n, size, stall=False)
    hub0.close()
    server0.close()

    hub, agent, server, sinks, senders, tasks, payload, elapsed = await _run_parallel(
        tls_contexts, n, size, stall=True)
    stalled = sinks[0]
    digest = hashlib.sha256(payload).hexdigest()
    for sink in sinks[1:]:
        assert sink.count == size and sink.sha.hexdigest() == digest
    # The others moved at (nearly) full speed despite one consumer that reads nothing.
    assert elapsed < max(3 * base, base + 1.0), (elapsed, base)
    # The stalled stream holds at most its window inside the tunnel, nothing was delivered.
    await asyncio.sleep(0.2)
    buffered = sum(len(c) for c in stalled.stream._pending or ())
    assert stalled.count == 0 and 0 < buffered <= WINDOW
    assert not hub.closed and not agent.closed
    assert senders[0].paused >= 1  # back-pressure reached the stalled stream's producer only
    assert all(s.paused == s.resumed for s in senders[1:])
    # Resume: every byte arrives intact.
    stalled.stream.resume_reading()
    await asyncio.wait_for(stalled.done, 20)
    assert stalled.count == size and stalled.sha.hexdigest() == digest
    await asyncio.gather(*tasks)
    hub.close()
    server.close()


async def test_integrity_many_streams_random_sizes_echo(tls_contexts):
    rng = random.Random(7)
    sizes = [64 * 1024 * 1024, 0, 1, 65535, 65536, 65537, 256 * 1024 + 3]
    sizes += [rng.randrange(0, 512 * 1024) for _ in range(40)]
    hub, agent, server = await session_pair(tls_contexts, on_open=lambda req: Echo())
    procs, streams, datas = [], [], []
    for size in sizes:
        data = os.urandom(size) if size < 1 << 20 else (os.urandom(1 << 20) * (size >> 20))
        p = Sender()
        procs.append(p)
        datas.append(data)
        streams.append(hub.open_stream(KubeAPITarget(), b"", p, initial_data=data[:1000]))
    tasks = [asyncio.create_task(pump(s, p, d[1000:], chunk=256 * 1024))
             for s, p, d in zip(streams, procs, datas, strict=True)]
    t0 = time.monotonic()
    results = await asyncio.wait_for(asyncio.gather(*(p.lost for p in procs)), 60)
    elapsed = time.monotonic() - t0
    await asyncio.gather(*tasks)
    assert results == [None] * len(sizes)
    for p, d in zip(procs, datas, strict=True):
        assert p.count == len(d) and p.sha.hexdigest() == hashlib.sha256(d).hexdigest()
        assert p.eof
    assert hub.active_streams == 0 and agent.active_streams == 0
    print(f"echo of {sum(sizes) / 2**20:.0f} MiB each way in {elapsed:.2f}s")
    hub.close()
    server.close()


async def test_agent_half_closes_first_and_reset_mid_stream(tls_contexts):
    agent_side: list[Collector] = []

    class Answer(Collector):
        def connection_made(self, stream) -> None:
            super().connection_made(stream)
            agent_side.append(self)
            stream.accept()
            stream.write(b"early answer")
            stream.write_eof()  # agent's direction ends while the hub keeps sending

    hub, _agent, server = await session_pair(tls_contexts, on_open=lambda req: Answer())
    a, b = Sender(keep=True), Sender()
    sa = hub.open_stream(KubeAPITarget(), b"", a)
    sb = hub.open_stream(KubeAPITarget(), b"", b)
    await asyncio.wait_for(a.eof_event.wait(), 5)
    assert bytes(a.data) == b"early answer"
    sa.write(b"x" * 100_000)
    sa.write_eof()
    assert await asyncio.wait_for(a.lost, 5) is None
    assert await asyncio.wait_for(agent_side[0].lost, 5) is None
    assert agent_side[0].count == 100_000 and agent_side[0].eof
    # Reset mid-stream: the agent side sees StreamReset(CANCEL); the session goes on.
    sb.write(b"y" * 50_000)
    await asyncio.sleep(0.05)
    sb.reset(ResetCode.CANCEL)
    exc = await asyncio.wait_for(agent_side[1].lost, 5)
    assert isinstance(exc, StreamReset) and exc.code == ResetCode.CANCEL
    assert isinstance(await b.lost, StreamReset)
    c = Sender()
    hub.open_stream(KubeAPITarget(), b"", c).write_eof()
    assert await asyncio.wait_for(c.lost, 5) is None
    hub.close()
    server.close()


async def test_peer_exceeding_window_gets_flow_control_goaway(tls_contexts):
    """A hand-crafted hub ignores the agent's 16 KiB window: the agent sends GOAWAY and closes."""
    server_ctx, client_ctx = tls_contexts
    loop = asyncio.get_running_loop()
    made: list[TunnelSession] = []

    def make_agent():
        s = TunnelSession(config=SessionConfig(initial_window=16 * 1024),
                          on_open=lambda req: Sink(), name="agent")
        made.append(s)
        return s

    server = await loop.create_server(make_agent, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                   server_hostname="hub.test")
    writer.write(f.encode_settings({}) + f.encode_open(1, KubeAPITarget(), b"")
                 + f.encode_data(1, b"z" * 16 * 1024) + f.encode_data(1, b"!"))
    got = await asyncio.wait_for(reader.read(), 5)  # until EOF
    frames = [(fr.type, bytes(fr.payload)) for fr, _ in
              f.decode_frames(memoryview(got), 1 << 20)]
    goaways = [p for t, p in frames if t == f.GOAWAY]
    assert goaways and struct.unpack_from("!II", goaways[0])[1] == GoAwayCode.FLOW_CONTROL
    assert made[0].closed
    writer.close()
    server.close()


async def test_garbage_from_peer_closes_session_with_protocol_goaway(tls_contexts):
    server_ctx, client_ctx = tls_contexts
    loop = asyncio.get_running_loop()
    made: list[TunnelSession] = []
    server = await loop.create_server(
        lambda: made.append(TunnelSession(on_open=lambda r: None)) or made[-1],
        "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                   server_hostname="hub.test")
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        got = await asyncio.wait_for(reader.read(), 5)
    except (ConnectionError, ssl.SSLError):
        got = b""
    assert made[0].closed and "protocol error" in made[0].close_reason
    if got:
        types = [fr.type for fr, _ in f.decode_frames(memoryview(got), 1 << 20)]
        assert types[-1] == f.GOAWAY
    writer.close()
    server.close()


async def test_ping_flood_gets_flood_goaway(tls_contexts):
    server_ctx, client_ctx = tls_contexts
    loop = asyncio.get_running_loop()
    made: list[TunnelSession] = []

    def make_agent():
        made.append(TunnelSession(on_open=lambda req: Sink(), name="agent"))
        return made[-1]

    server = await loop.create_server(make_agent, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                   server_hostname="hub.test")
    writer.write(f.encode_settings({}) + f.encode_ping(b"floodflo") * 200)
    got = await asyncio.wait_for(reader.read(), 5)
    frames = [(fr.type, bytes(fr.payload)) for fr, _ in
              f.decode_frames(memoryview(got), 1 << 20)]
    goaways = [p for t, p in frames if t == f.GOAWAY]
    assert goaways and struct.unpack_from("!II", goaways[-1])[1] == GoAwayCode.FLOOD
    assert sum(1 for t, _ in frames if t == f.PONG) <= 50
    assert made[0].closed
    writer.close()
    server.close()
