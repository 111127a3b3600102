"""Byte-level codec tests: every frame type round-trips, every malformed class is refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunnel import frames as f
from tunnel.errors import (
    BadFlags,
    BadFrameLength,
    BadSettings,
    BadStreamId,
    BadTargetEncoding,
    FrameTooLarge,
    MetadataTooLarge,
    ProtocolError,
    TruncatedPayload,
    UnknownFrameType,
)
from tunnel.targets import KubeAPITarget, ServiceTarget, TCPTarget, decode_target, encode_target


def decode_all(data: bytes, max_frame: int = f.DEFAULT_MAX_FRAME_SIZE):
    return [(fr.type, fr.flags, fr.stream_id, bytes(fr.payload))
            for fr, _ in f.decode_frames(memoryview(data), max_frame)]


def test_header_layout_is_12_bytes_big_endian():
    assert f.header(f.DATA, f.FLAG_FIN, 5, 3) == bytes.fromhex("00000003 04 01 0000 00000005")
    assert f.HEADER_SIZE == 12


@pytest.mark.parametrize(("encoded", "expected"), [
    (f.encode_settings({f.S_INITIAL_WINDOW: 65536}),
     (f.SETTINGS, 0, 0, struct.pack("!HI", 1, 65536))),
    (f.encode_settings_ack(), (f.SETTINGS, f.FLAG_ACK, 0, b"")),
    (f.encode_open_ack(3), (f.OPEN_ACK, 0, 3, b"")),
    (f.encode_open_fail(3, 4, "busy"), (f.OPEN_FAIL, 0, 3, b"\x00\x04busy")),
    (f.encode_data(7, b"abc", fin=True), (f.DATA, f.FLAG_FIN, 7, b"abc")),
    (f.encode_window_update(0, 1000), (f.WINDOW_UPDATE, 0, 0, struct.pack("!I", 1000))),
    (f.encode_window_update(9, 5), (f.WINDOW_UPDATE, 0, 9, struct.pack("!I", 5))),
    (f.encode_reset(9, 1), (f.RESET, 0, 9, b"\x00\x00\x00\x01")),
    (f.encode_ping(b"12345678"), (f.PING, 0, 0, b"12345678")),
    (f.encode_pong(b"12345678"), (f.PONG, 0, 0, b"12345678")),
    (f.encode_goaway(11, 0, "bye"), (f.GOAWAY, 0, 0, struct.pack("!II", 11, 0) + b"bye")),
    (f.encode_drain(), (f.DRAIN, 0, 0, b"")),
])
def test_every_frame_type_round_trips(encoded, expected):
    assert decode_all(encoded) == [expected]


def test_open_carries_target_metadata_and_initial_data():
    raw = f.encode_open(1, ServiceTarget("ns", "svc", 8443, "https"), b"meta", b"GET / HTTP/1.1",
                        fin=True)
    [(ftype, flags, sid, payload)] = decode_all(raw)
    assert (ftype, flags, sid) == (f.OPEN, f.FLAG_FIN, 1)
    assert payload == bytes.fromhex("01 01 20fb 02") + b"ns" + b"\x03svc" + b"\x00\x04meta" \
        + b"GET / HTTP/1.1"
    target, meta, data = f.parse_open(memoryview(payload), 1024)
    assert target == ServiceTarget("ns", "svc", 8443, "https")
    assert (meta, bytes(data)) == (b"meta", b"GET / HTTP/1.1")


@pytest.mark.parametrize("target", [KubeAPITarget(), ServiceTarget("a", "b", 1),
                                    TCPTarget("10.0.0.1", 443), TCPTarget("example.com", 80)])
def test_targets_round_trip(target):
    enc = encode_target(target)
    assert decode_target(enc) == (target, len(enc))


@pytest.mark.parametrize(("raw", "exc"), [
    (b"\x09", BadTargetEncoding),                               # unknown kind
    (b"\x01\x00\x00\x50", TruncatedPayload),                    # service truncated
    (b"\x01\x05\x00\x50\x01a\x01b", BadTargetEncoding),         # unknown scheme
    (b"\x01\x00\x00\x50\x01A\x01b", BadTargetEncoding),         # not a DNS label
    (b"\x01\x00\x00\x00\x01a\x01b", BadTargetEncoding),         # port 0
    (b"\x02\x00\x50\x05ab", TruncatedPayload),                  # host truncated
    (b"\x02\x00\x50\x02\xff\xfe", BadTargetEncoding),           # not ASCII
    (b"\x02\x00\x50\x03a b", BadTargetEncoding),                # whitespace in host
    (b"", TruncatedPayload),
])
def test_bad_target_encodings(raw, exc):
    with pytest.raises(exc):
        decode_target(raw)


@pytest.mark.parametrize(("raw", "exc"), [
    (f.header(42, 0, 0, 0), UnknownFrameType),
    (f.header(f.DATA, 0, 1, 70_000), FrameTooLarge),            # refused before the payload
    (f.HEADER.pack(0, f.DATA, 0, 1, 1), BadFlags),               # reserved bits
    (f.header(f.DATA, 0, 0x80000001, 0), BadFlags),              # stream id top bit
    (f.header(f.DATA, 0x02, 1, 0), BadFlags),
    (f.header(f.RESET, f.FLAG_FIN, 1, 4) + b"\0" * 4, BadFlags),
    (f.header(f.DATA, 0, 0, 0), BadStreamId),
    (f.header(f.PING, 0, 1, 8) + b"\0" * 8, BadStreamId),
    (f.header(f.OPEN, 0, 0, 1) + b"\0", BadStreamId),
    (f.header(f.PING, 0, 0, 7) + b"\0" * 7, BadFrameLength),
    (f.header(f.WINDOW_UPDATE, 0, 1, 3) + b"\0" * 3, BadFrameLength),
    (f.header(f.RESET, 0, 1, 5) + b"\0" * 5, BadFrameLength),
    (f.header(f.OPEN_ACK, 0, 1, 1) + b"\0", BadFrameLength),
    (f.header(f.SETTINGS, 0, 0, 5) + b"\0" * 5, BadFrameLength),
    (f.header(f.SETTINGS, f.FLAG_ACK, 0, 6) + b"\0" * 6, BadFrameLength),
    (f.header(f.OPEN_FAIL, 0, 1, 1) + b"\0", BadFrameLength),
    (f.header(f.GOAWAY, 0, 0, 4) + b"\0" * 4, BadFrameLength),
    (f.header(f.DRAIN, 0, 0, 1) + b"\0", BadFrameLength),
])
def test_malformed_headers(raw, exc):
    with pytest.raises(exc):
        decode_all(raw)


def test_oversize_frame_refused_from_header_alone():
    # Only the 12 header bytes arrived: the decoder must refuse without waiting for 16 MiB.
    with pytest.raises(FrameTooLarge):
        decode_all(f.header(f.DATA, 0, 1, 16 * 1024 * 1024))


@pytest.mark.parametrize(("key", "value"), [
    (f.S_INITIAL_WINDOW, 10), (f.S_INITIAL_WINDOW, 2**31), (f.S_MAX_FRAME_SIZE, 1000),
    (f.S_MAX_FRAME_SIZE, 2**25), (f.S_MAX_CONCURRENT_STREAMS, 2**30), (f.S_MAX_METADATA_SIZE, 1),
])
def test_bad_settings(key, value):
    [(_, _, _, payload)] = decode_all(f.encode_settings({key: value}))
    with pytest.raises(BadSettings):
        f.parse_settings(memoryview(payload))


def test_unknown_settings_are_ignored():
    assert f.parse_settings(memoryview(struct.pack("!HI", 999, 5))) == {999: 5}


def test_open_metadata_limits_and_truncation():
    payload = f.encode_open_payload(KubeAPITarget(), b"x" * 300)
    with pytest.raises(MetadataTooLarge):
        f.parse_open(memoryview(payload), 256)
    with pytest.raises(TruncatedPayload):
        f.parse_open(memoryview(payload[:100]), 1024)
    with pytest.raises(TruncatedPayload):
        f.parse_open(memoryview(b"\x00\x00"), 1024)


def test_partial_frames_wait_for_more_bytes():
    raw = f.encode_data(1, b"x" * 100) + f.encode_ping(b"abcdefgh")
    for cut in range(len(raw)):
        got = list(f.decode_frames(memoryview(raw[:cut]), 1 << 16))
        assert sum(1 for _ in got) == (0 if cut < 112 else 1)
    assert len(decode_all(raw)) == 2


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_decoder_never_crashes_on_garbage(data):
    try:
        for fr, _ in f.decode_frames(memoryview(data), 1024):
            if fr.type == f.SETTINGS:
                f.parse_settings(fr.payload)
            elif fr.type == f.OPEN:
                f.parse_open(fr.payload, 64)
            elif fr.type == f.OPEN_FAIL:
                f.parse_open_fail(fr.payload)
            elif fr.type == f.GOAWAY:
                f.parse_goaway(fr.payload)
    except ProtocolError:
        pass
