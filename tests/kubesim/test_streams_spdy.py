"""SPDY/3.1 framing and the server session, byte by byte (no sockets)."""

from __future__ import annotations

import asyncio
import struct
import zlib

import pytest

from kubesim.streams import spdy
from kubesim.streams.spdy_session import SpdySession, SpdyStream

ALL_FRAMES: list[spdy.Frame] = [
    spdy.SynStream(
        1,
        (("streamtype", "error"), ("port", "8080"), ("requestid", "0")),
        associated_id=0,
        priority=3,
        slot=0,
    ),
    spdy.SynStream(3, (("streamtype", "stdin"),), fin=True, unidirectional=True),
    spdy.SynReply(1),
    spdy.SynReply(3, (("a", "1"), ("a", "2")), fin=True),
    spdy.HeadersFrame(5, (("x", "y"),), fin=False),
    spdy.RstStream(7, spdy.RstStatus.CANCEL),
    spdy.Settings(((0, 7, 65536), (1, 4, 100)), clear=True),
    spdy.Settings(),
    spdy.Ping(1),
    spdy.GoAway(9, 0),
    spdy.WindowUpdate(1, 4096),
    spdy.Data(1, b"hello"),
    spdy.Data(3, b"", fin=True),
]


def test_dictionary_is_the_spdy3_one() -> None:
    # Spec 2.6.10.1: 1423 bytes, starting with "\0\0\0\7options", ending with "enq=0.".
    assert len(spdy.HEADER_DICTIONARY) == 1423
    assert spdy.HEADER_DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert spdy.HEADER_DICTIONARY.endswith(b",*,enq=0.")


def test_every_frame_round_trips_in_one_buffer() -> None:
    encoder, decoder = spdy.FrameEncoder(), spdy.FrameDecoder()
    wire = b"".join(encoder.encode(frame) for frame in ALL_FRAMES)
    assert decoder.feed(wire) == ALL_FRAMES
    assert decoder.buffered == 0


def test_every_frame_round_trips_fed_one_byte_at_a_time() -> None:
    encoder, decoder = spdy.FrameEncoder(), spdy.FrameDecoder()
    wire = b"".join(encoder.encode(frame) for frame in ALL_FRAMES)
    got: list[spdy.Frame] = []
    for i in range(len(wire)):
        got += decoder.feed(wire[i : i + 1])
    assert got == ALL_FRAMES


def test_fixed_frames_have_the_exact_wire_bytes() -> None:
    encoder = spdy.FrameEncoder()
    assert encoder.encode(spdy.Ping(1)) == bytes.fromhex("80030006 00000004 00000001")
    assert encoder.encode(spdy.Data(5, b"ab", fin=True)) == bytes.fromhex("00000005 01000002 6162")
    assert encoder.encode(spdy.RstStream(3, 5)) == bytes.fromhex(
        "80030003 00000008 00000003 00000005"
    )
    assert encoder.encode(spdy.GoAway(7, 0)) == bytes.fromhex("80030007 00000008 00000007 00000000")
    assert encoder.encode(spdy.WindowUpdate(1, 0x10000)) == bytes.fromhex(
        "80030009 00000008 00000001 00010000"
    )


def test_syn_stream_layout_and_header_block_use_the_dictionary() -> None:
    wire = spdy.FrameEncoder().encode(spdy.SynStream(1, (("streamtype", "data"),), priority=2))
    version, kind, flags_length = struct.unpack(">HHI", wire[:8])
    assert (version, kind, flags_length >> 24) == (0x8003, 1, 0)
    assert flags_length & 0xFFFFFF == len(wire) - 8
    sid, assoc, pri, slot = struct.unpack(">IIBB", wire[8:18])
    assert (sid, assoc, pri >> 5, slot) == (1, 0, 2, 0)
    # The block is a zlib stream whose header names the SPDY dictionary (FDICT + its adler32).
    block = wire[18:]
    assert block[1] & 0x20
    assert struct.unpack(">I", block[2:6])[0] == zlib.adler32(spdy.HEADER_DICTIONARY)
    inflater = zlib.decompressobj(zdict=spdy.HEADER_DICTIONARY)
    raw = inflater.decompress(block)
    assert raw == (
        struct.pack(">I", 1)
        + struct.pack(">I", 10)
        + b"streamtype"
        + struct.pack(">I", 4)
        + b"data"
    )


def test_header_compression_context_spans_frames() -> None:
    # The second block can only be inflated by a decoder that saw the first one.
    encoder = spdy.FrameEncoder()
    first = encoder.encode(spdy.SynStream(1, (("streamtype", "error"),)))
    second = encoder.encode(spdy.SynStream(3, (("streamtype", "error"),)))
    assert spdy.FrameDecoder().feed(first + second)[1].headers == (("streamtype", "error"),)
    with pytest.raises(spdy.HeaderBlockError):
        spdy.FrameDecoder().feed(second)


def test_multi_valued_headers_are_nul_joined_on_the_wire() -> None:
    wire = spdy.FrameEncoder().encode(spdy.SynReply(1, (("a", "1"), ("a", "2"))))
    raw = zlib.decompressobj(zdict=spdy.HEADER_DICTIONARY).decompress(wire[12:])
    assert raw == struct.pack(">II", 1, 1) + b"a" + struct.pack(">I", 3) + b"1\x002"


def test_unknown_control_frame_types_are_skipped() -> None:
    unknown = struct.pack(">HHI", 0x8003, 0x000A, 4) + b"\x00\x00\x00\x00"
    ping = spdy.FrameEncoder().encode(spdy.Ping(3))
    assert spdy.FrameDecoder().feed(unknown + ping) == [spdy.Ping(3)]


def test_wrong_version_is_refused() -> None:
    with pytest.raises(spdy.UnsupportedVersion):
        spdy.FrameDecoder().feed(struct.pack(">HHII", 0x8002, 6, 4, 1))


def test_oversized_frame_is_refused_before_buffering() -> None:
    decoder = spdy.FrameDecoder(max_frame_size=1024)
    with pytest.raises(spdy.FrameTooLarge):
        decoder.feed(struct.pack(">II", 1, 2048))


def test_short_control_payload_is_malformed() -> None:
    with pytest.raises(spdy.MalformedFrame):
        spdy.FrameDecoder().feed(struct.pack(">HHI", 0x8003, 3, 4) + b"\x00\x00\x00\x01")


def _raw_block_frame(raw_block: bytes) -> bytes:
    deflater = zlib.compressobj(zdict=spdy.HEADER_DICTIONARY)
    block = deflater.compress(raw_block) + deflater.flush(zlib.Z_SYNC_FLUSH)
    payload = struct.pack(">I", 1) + block
    return struct.pack(">HHI", 0x8003, 2, len(payload)) + payload


@pytest.mark.parametrize(
    ("raw_block", "why"),
    [
        (struct.pack(">II", 1, 1) + b"A" + struct.pack(">I", 1) + b"x", "not lowercase"),
        (
            struct.pack(">II", 2, 1)
            + b"a"
            + struct.pack(">I", 1)
            + b"x"
            + struct.pack(">I", 1)
            + b"a"
            + struct.pack(">I", 1)
            + b"y",
            "appears twice",
        ),
        (struct.pack(">II", 1, 9) + b"a", "truncated"),
        (struct.pack(">II", 1, 0) + struct.pack(">I", 0), "empty header name"),
    ],
)
def test_bad_header_blocks_are_refused(raw_block: bytes, why: str) -> None:
    with pytest.raises(spdy.HeaderBlockError, match=why):
        spdy.FrameDecoder().feed(_raw_block_frame(raw_block))


def test_garbage_header_block_is_refused() -> None:
    payload = struct.pack(">I", 1) + b"not zlib at all"
    with pytest.raises(spdy.HeaderBlockError):
        spdy.FrameDecoder().feed(struct.pack(">HHI", 0x8003, 2, len(payload)) + payload)


# -- session -------------------------------------------------------------------------------------


class _Client:
    """The client half: encodes what kubectl's spdystream would send, decodes our answers."""

    def __init__(self) -> None:
        self.encoder = spdy.FrameEncoder()
        self.decoder = spdy.FrameDecoder()
        self.received: list[spdy.Frame] = []
        self.streams: list[SpdyStream] = []
        self.session = SpdySession(self.streams.append, self._on_wire)

    def _on_wire(self, data: bytes) -> None:
        self.received += self.decoder.feed(data)

    def send(self, *frames: spdy.Frame) -> None:
        self.session.feed(b"".join(self.encoder.encode(f) for f in frames))


async def test_session_hands_out_streams_and_relays_data_until_fin() -> None:
    client = _Client()
    client.send(spdy.SynStream(1, (("streamtype", "stdin"),)), spdy.Data(1, b"abc"))
    (stream,) = client.streams
    assert stream.header("streamType") == "stdin"
    stream.reply()
    stream.write(b"out")
    stream.close()
    assert client.received == [spdy.SynReply(1), spdy.Data(1, b"out"), spdy.Data(1, b"", fin=True)]
    assert await stream.read() == b"abc"
    client.send(spdy.Data(1, b"", fin=True))
    assert await asyncio.wait_for(stream.read(), 1) == b""


async def test_session_echoes_client_pings_only() -> None:
    client = _Client()
    client.send(spdy.Ping(1), spdy.Ping(2))
    assert client.received == [spdy.Ping(1)]


async def test_session_resets_even_or_reused_stream_ids() -> None:
    client = _Client()
    client.send(spdy.SynStream(2), spdy.SynStream(5), spdy.SynStream(3))
    assert [s.stream_id for s in client.streams] == [5]
    assert client.received == [
        spdy.RstStream(2, spdy.RstStatus.PROTOCOL_ERROR),
        spdy.RstStream(3, spdy.RstStatus.PROTOCOL_ERROR),
    ]


async def test_rst_stream_and_connection_loss_end_readers() -> None:
    client = _Client()
    client.send(spdy.SynStream(1), spdy.SynStream(3))
    first, second = client.streams
    client.send(spdy.RstStream(1, spdy.RstStatus.CANCEL))
    assert await asyncio.wait_for(first.read(), 1) == b""
    assert first.reset
    client.session.connection_lost()
    assert await asyncio.wait_for(second.read(), 1) == b""


async def test_broken_framing_sends_goaway_and_closes() -> None:
    client = _Client()
    client.session.feed(struct.pack(">HHII", 0x8002, 6, 4, 1))
    assert client.session.closed.is_set()
    assert client.received == [spdy.GoAway(0, 1)]


async def test_large_writes_are_split_into_bounded_data_frames() -> None:
    client = _Client()
    client.send(spdy.SynStream(1))
    client.streams[0].write(b"x" * 100_000)
    sizes = [len(f.data) for f in client.received if isinstance(f, spdy.Data)]
    assert sum(sizes) == 100_000 and max(sizes) <= 32 * 1024


async def test_streams_finished_both_ways_are_forgotten() -> None:
    client = _Client()
    client.send(spdy.SynStream(1), spdy.SynStream(3, fin=True))
    first, second = client.streams
    assert client.session.open_streams == 2
    second.close()  # remote already FINed in its SYN_STREAM
    assert client.session.open_streams == 1
    first.close()
    assert client.session.open_streams == 1  # still readable
    client.send(spdy.Data(1, b"late", fin=True))
    assert client.session.open_streams == 0
    assert await first.read() == b"late"
