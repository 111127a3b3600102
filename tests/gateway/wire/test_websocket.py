"""WebSocket frame boundaries and goodbye frames (gateway.wire.websocket), byte by byte."""

from __future__ import annotations

import json
import struct

import pytest

from gateway.wire.websocket import FrameBoundary, channel_status_frame, close_frame


def frame(payload: bytes, opcode: int = 2, masked: bool = False) -> bytes:
    n = len(payload)
    mask = 0x80 if masked else 0
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, mask | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, mask | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, mask | 127, n)
    return head + (b"k3y!" if masked else b"") + payload


# Every length encoding (7-bit, 16-bit, 64-bit), an empty frame, a masked one, a close frame.
FRAMES = [frame(b""), frame(b"a" * 5), frame(b"b" * 300), frame(b"c" * 70000),
          frame(b"d" * 3, masked=True), frame(b"\x03x", opcode=8)]
STREAM = b"".join(FRAMES)
BOUNDARIES = {sum(len(f) for f in FRAMES[:i]) for i in range(len(FRAMES) + 1)}


def test_byte_by_byte_the_boundaries_are_exactly_between_frames() -> None:
    tracker = FrameBoundary()
    for i in range(len(STREAM)):
        assert tracker.at_boundary == (i in BOUNDARIES), i
        assert tracker.feed(STREAM[i:i + 1]) == 1
    assert tracker.at_boundary


@pytest.mark.parametrize("split", [1, 2, 3, 7, 11, 301, 70003, 70020])
def test_until_boundary_stops_at_the_end_of_the_frame_in_progress(split: int) -> None:
    tracker = FrameBoundary()
    assert tracker.feed(STREAM[:split]) == split
    n = tracker.feed(STREAM[split:], until_boundary=True)
    expected = 0 if split in BOUNDARIES else min(b for b in BOUNDARIES if b > split) - split
    assert n == expected
    assert tracker.at_boundary


def test_goodbye_frames() -> None:
    close = close_frame(1008, "x" * 200)
    assert close[0] == 0x88 and close[1] == 125  # a control frame's payload limit
    assert struct.unpack("!H", close[2:4])[0] == 1008
    # A multi-byte character is never cut in half.
    close = close_frame(1008, "é" * 100)
    close[4:].decode("utf-8")
    status = channel_status_frame(401, "Unauthorized", "no longer valid")
    assert status[0] == 0x82
    payload = status[4:] if status[1] == 126 else status[2:]
    assert payload[0] == 3
    assert json.loads(payload[1:]) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "no longer valid", "reason": "Unauthorized", "code": 401}
