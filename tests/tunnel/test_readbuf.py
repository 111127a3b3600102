"""Receive buffers sized by what a session is doing (tunnel.readbuf, issue 22), byte by byte.

Reads are simulated as the SSL transports make them: ``get_buffer``, copy up to its length,
``received``, parse, ``consumed``; whatever did not fit goes in the next read. Then real
sessions over TLS.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.tunnel.conftest import Collector, session_pair
from tunnel import frames as f
from tunnel import readbuf
from tunnel.readbuf import ReceiveBuffer
from tunnel.targets import KubeAPITarget

MAX_FRAME = 256 * 1024


class Reader:
    """One session's receive path: bytes in, whole frames out."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.rx = ReceiveBuffer(max_frame)
        self.max_frame = max_frame
        self.frames: list[tuple[int, int, bytes]] = []  # (type, stream, payload)
        self.peak_held = 0

    def read(self, data: bytes) -> None:
        """Deliver ``data`` in as many reads as the offered buffers need."""
        while data:
            buf = self.rx.get_buffer()
            assert len(buf) > 0
            n = min(len(buf), len(data))
            buf[:n] = data[:n]
            data = data[n:]
            view = self.rx.received(n)
            parsed = 0
            for frame, end in f.decode_frames(view, self.max_frame):
                self.frames.append((frame.type, frame.stream_id, bytes(frame.payload)))
                parsed = end
            self.rx.consumed(parsed, view, n)
            self.peak_held = max(self.peak_held, self.rx.held)


def ping(i: int = 1) -> bytes:
    return f.encode_ping(i.to_bytes(8, "big"))


def data_frame(stream: int, size: int, seed: int = 0) -> bytes:
    payload = random.Random(seed).randbytes(size)
    return f.encode_data(stream, payload)


def test_an_idle_session_holds_no_buffer() -> None:
    reader = Reader()
    for i in range(100):
        reader.read(ping(i))
        assert reader.rx.held == 0 and reader.rx.pending == 0
    assert [t for t, _, _ in reader.frames] == [f.PING] * 100
    assert reader.peak_held == 0


SIZES = [0, 1, 4083, 4084, 16 * 1024, 64 * 1024, 200_000, MAX_FRAME]
CHUNKS = [1, 7, 12, 13, 4096, 16 * 1024 + 22, 300 * 1024]


@pytest.mark.parametrize(("size", "chunk"), [
    (size, chunk) for size in SIZES for chunk in CHUNKS
    if chunk >= 4096 or size <= 16 * 1024])  # (one-byte reads of 256 KiB frames: slow, no news)
def test_frames_of_every_size_class_in_reads_of_every_size(size: int, chunk: int) -> None:
    reader = Reader()
    stream = data_frame(1, size, seed=size) + ping(7) + data_frame(3, size // 3, seed=1)
    for i in range(0, len(stream), chunk):
        reader.read(stream[i:i + chunk])
    assert reader.frames == [
        (f.DATA, 1, random.Random(size).randbytes(size)),
        (f.PING, 0, (7).to_bytes(8, "big")),
        (f.DATA, 3, random.Random(1).randbytes(size // 3)),
    ]
    assert reader.rx.pending == 0
    # Never more than a frame and a read, however the bytes came.
    assert reader.peak_held <= reader.rx.bulk_size
    reader.read(ping())  # quiet again
    assert reader.rx.held == 0


def test_a_frame_bigger_than_the_idle_buffer_is_kept_whole() -> None:
    reader = Reader()
    frame = data_frame(1, 100_000)
    reader.read(frame[:5000])  # a small read: the frame's start waits in a buffer of its size
    assert reader.rx.pending == 5000
    assert reader.rx.held >= len(frame)
    reader.read(frame[5000:])
    assert reader.frames == [(f.DATA, 1, frame[f.HEADER_SIZE:])]
    assert reader.rx.pending == 0
    reader.read(ping())  # the next small read that leaves nothing gives the buffer back
    assert reader.rx.held == 0


@pytest.mark.parametrize("split", range(1, f.HEADER_SIZE))
def test_a_header_split_across_reads(split: int) -> None:
    reader = Reader()
    frame = data_frame(5, 3000)
    reader.read(frame[:split])
    assert reader.rx.pending == split and reader.frames == []
    assert 0 < reader.rx.held <= readbuf.MIN_PRIVATE
    reader.read(frame[split:])
    assert reader.frames == [(f.DATA, 5, frame[f.HEADER_SIZE:])]
    assert reader.rx.held == 0


def test_bulk_keeps_one_buffer_then_idle_gives_it_back() -> None:
    reader = Reader()
    bulk = b"".join(data_frame(1, MAX_FRAME, seed=i) for i in range(12))
    # Reads as uvloop makes them in a bulk copy: up to 256 KiB, ending anywhere.
    sizes = random.Random(3)
    pos = 0
    held = set()
    while pos < len(bulk):
        n = sizes.randint(100 * 1024, 256 * 1024)
        reader.read(bulk[pos:pos + n])
        pos += n
        held.add(reader.rx.held)
    assert len(reader.frames) == 12
    assert all(payload == random.Random(i).randbytes(MAX_FRAME)
               for i, (_, _, payload) in enumerate(reader.frames))
    assert max(held) <= reader.rx.bulk_size
    reader.read(ping())
    assert reader.rx.held == 0


def test_many_sessions_share_the_scratch_and_keep_their_own_partial_frames() -> None:
    rng = random.Random(22)
    readers = [Reader() for _ in range(500)]
    streams = [data_frame(1, rng.randint(1, 40_000), seed=i) + ping(i)
               for i in range(len(readers))]
    positions = [0] * len(readers)
    while any(p < len(s) for p, s in zip(positions, streams, strict=True)):
        for i, reader in enumerate(readers):  # interleaved, as a loop serves many sockets
            n = rng.randint(1, 9000)
            reader.read(streams[i][positions[i]:positions[i] + n])
            positions[i] += n
    for i, reader in enumerate(readers):
        assert reader.frames == [(f.DATA, 1, streams[i][f.HEADER_SIZE:-20]),
                                 (f.PING, 0, i.to_bytes(8, "big"))]
    assert sum(reader.rx.held for reader in readers) == 0


def test_a_read_nested_in_another_sessions_parse_gets_its_own_buffer() -> None:
    outer, inner = Reader(), Reader()
    frame = ping(1)
    buf = outer.rx.get_buffer()
    buf[:len(frame)] = frame
    view = outer.rx.received(len(frame))
    # While the outer bytes are parsed (they are in the scratch), a consumer makes another
    # session read: it must not land in the scratch.
    inner.read(data_frame(3, 100) + ping(2))
    assert bytes(view) == frame  # untouched
    outer.rx.consumed(len(frame), view, len(frame))
    assert [t for t, _, _ in inner.frames] == [f.DATA, f.PING]
    assert inner.rx.held == 0 and outer.rx.held == 0


def test_release_after_a_failed_parse_frees_the_scratch() -> None:
    broken, other = Reader(), Reader()
    buf = broken.rx.get_buffer()
    buf[:4] = b"\xff\xff\xff\xff"
    broken.rx.received(4)
    broken.rx.release()  # the session failed (protocol error) and never calls consumed
    other.read(ping(3))
    assert other.frames == [(f.PING, 0, (3).to_bytes(8, "big"))]
    assert other.rx.held == 0  # it read through the scratch again


async def test_real_sessions_hold_no_receive_buffer_when_idle_even_after_bulk(
        tls_contexts) -> None:
    from tunnel.session_state import SessionConfig

    class Echo(Collector):
        def connection_made(self, stream) -> None:
            super().connection_made(stream)
            stream.accept()

        def data_received(self, data) -> None:
            super().data_received(data)
            self.stream.write(data)

        def eof_received(self) -> None:
            super().eof_received()
            self.stream.write_eof()

    quick = SessionConfig(ping_after=0.1, dead_after=1.0)
    hub, agent, server = await session_pair(tls_contexts, hub_config=quick, agent_config=quick,
                                            on_open=lambda req: Echo())
    await asyncio.sleep(0.2)
    assert hub.receive_buffer_size == 0 and agent.receive_buffer_size == 0
    client = Collector()
    stream = hub.open_stream(KubeAPITarget(), b"", client)
    payload = random.Random(4).randbytes(6 * 1024 * 1024)
    stream.write(payload)
    stream.write_eof()
    assert await asyncio.wait_for(client.lost, 20) is None
    assert client.count == len(payload)
    await asyncio.sleep(0.4)  # a few keepalive exchanges: small reads that leave nothing
    assert hub.receive_buffer_size == 0 and agent.receive_buffer_size == 0
    hub.close()
    server.close()
