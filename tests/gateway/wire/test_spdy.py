"""SPDY/3 frame boundaries and the error stream (gateway.wire.spdy), against kubesim's encoder
(an independent implementation that kubectl talks to in tests/e2e)."""

from __future__ import annotations

import json

from gateway.wire.spdy import FrameBoundary, data_frame
from kubesim.streams.spdy import Data, FrameDecoder, FrameEncoder, Ping, SynStream


def client_frames() -> tuple[list[bytes], int]:
    """What kubectl exec sends: one SYN_STREAM per stream (error first), then stdin data."""
    encoder = FrameEncoder()
    frames = [encoder.encode(SynStream(stream_id, (("streamtype", kind),)))
              for stream_id, kind in ((1, "error"), (3, "stdin"), (5, "stdout"))]
    frames += [encoder.encode(Data(3, b"x" * 300)), encoder.encode(Ping(1)),
               encoder.encode(Data(3, b""))]
    return frames, 1


def test_the_error_stream_is_found_byte_by_byte() -> None:
    frames, error_stream = client_frames()
    tracker = FrameBoundary(read_headers=True)
    stream = b"".join(frames)
    boundaries = {sum(len(f) for f in frames[:i]) for i in range(len(frames) + 1)}
    for i in range(len(stream)):
        assert tracker.at_boundary == (i in boundaries), i
        assert tracker.feed(stream[i:i + 1]) == 1
    assert tracker.error_stream == error_stream


def test_the_error_stream_is_found_when_it_is_not_the_first() -> None:
    encoder = FrameEncoder()
    stream = b"".join(encoder.encode(SynStream(i, (("streamtype", kind),)))
                      for i, kind in ((1, "stdout"), (3, "stderr"), (5, "error")))
    tracker = FrameBoundary(read_headers=True)
    tracker.feed(stream)
    assert tracker.error_stream == 5


def test_until_boundary_stops_after_the_frame_in_progress() -> None:
    frames, _ = client_frames()
    stream = b"".join(frames)
    tracker = FrameBoundary()
    split = len(frames[0]) + len(frames[1]) + len(frames[2]) + 5  # inside the data frame
    tracker.feed(stream[:split])
    assert tracker.feed(stream[split:], until_boundary=True) == len(frames[3]) - 5
    assert tracker.at_boundary


def test_the_status_frame_decodes_as_data_with_fin() -> None:
    status = json.dumps({"kind": "Status", "status": "Failure"}).encode()
    (frame,) = FrameDecoder().feed(data_frame(7, status))
    assert (frame.stream_id, frame.data, frame.fin) == (7, status, True)


def test_the_header_dictionary_is_kubesims() -> None:
    """Two copies of the SPDY/3 zlib dictionary (kubesim imports nothing of ours): one byte
    apart, and one side could not read the other's header blocks."""
    from gateway.wire.spdy import HEADER_DICTIONARY
    from kubesim.streams.spdy import HEADER_DICTIONARY as KUBESIM_DICTIONARY

    assert HEADER_DICTIONARY == KUBESIM_DICTIONARY
