"""ChunkedBody.at_boundary / feed(until_boundary=True): where a response may be ended cleanly."""

from __future__ import annotations

from gateway.wire.http1 import ChunkedBody

BODY = b"5\r\nhello\r\n3;ext=1\r\nabc\r\n"
BOUNDARIES = {0, 10, 24}


def test_boundaries_byte_by_byte() -> None:
    tracker = ChunkedBody(error_status=502)
    for i in range(len(BODY)):
        assert tracker.at_boundary == (i in BOUNDARIES), i
        assert tracker.feed(BODY[i:i + 1]) == 1
    assert tracker.at_boundary


def test_until_boundary_takes_only_the_chunk_in_progress() -> None:
    for split in range(len(BODY)):
        tracker = ChunkedBody(error_status=502)
        tracker.feed(BODY[:split])
        n = tracker.feed(BODY[split:] + b"0\r\n\r\n", until_boundary=True)
        expected = 0 if split in BOUNDARIES else min(b for b in BOUNDARIES if b > split) - split
        assert n == expected, split
        assert tracker.at_boundary and not tracker.complete
