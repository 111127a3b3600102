"""ChunkedBody.feed(payload=...): the one de-chunker (RequestBody and ResponseTranslator use it).

Byte-level: the payload and the trailers come out the same however the bytes are split, the
pieces are views of the input (no copy), and every malformed input is refused with HTTPError
wherever it is split.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire.http1 import ChunkedBody, HTTPError

# Two chunks (one with extensions, one with BWS before ';'), an upper-case hex size, the
# last-chunk with an extension, two trailer fields; then the next message's first bytes.
BODY = (b"5\r\nhello\r\n"
        b"6;ext=1;q=\"a b\"\r\n world\r\n"
        b"1A \t;x\r\n" + b"z" * 26 + b"\r\n"
        b"0;last\r\n"
        b"X-Trailer: t\r\n"
        b"Checksum:  abc \r\n"
        b"\r\n")
PAYLOAD = b"hello world" + b"z" * 26
TRAILERS = [(b"X-Trailer", b"t"), (b"Checksum", b"abc")]
NEXT = b"GET /next HTTP/1.1\r\n"


def dechunk(pieces: list[bytes | bytearray | memoryview], **kwargs: int) -> tuple[
        bytes, int, ChunkedBody]:
    """Feed ``pieces`` in order until the body completes: (payload, bytes taken, tracker)."""
    tracker = ChunkedBody(**kwargs)
    payload: list[memoryview] = []
    taken = 0
    for piece in pieces:
        before = len(payload)
        n = tracker.feed(piece, payload=payload)
        for view in payload[before:]:
            assert isinstance(view, memoryview)
        taken += n
        if tracker.complete:
            break
        assert n == len(piece)  # a body not yet complete takes every byte it is given
    return b"".join(payload), taken, tracker


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_whole_body_payload_trailers_and_end(kind: type) -> None:
    payload, taken, tracker = dechunk([kind(BODY + NEXT)])
    assert payload == PAYLOAD
    assert taken == len(BODY)  # the next message is not taken
    assert tracker.complete and tracker.trailers == TRAILERS


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_split_at_every_byte_boundary(kind: type) -> None:
    data = BODY + NEXT
    for cut in range(len(data) + 1):
        payload, taken, tracker = dechunk([kind(data[:cut]), kind(data[cut:])])
        assert (payload, taken, tracker.trailers) == (PAYLOAD, len(BODY), TRAILERS), cut
        assert tracker.complete, cut


def test_split_at_every_pair_of_boundaries() -> None:
    data = b"3;e\r\nabc\r\n2\r\nde\r\n0\r\nT: v\r\n\r\n" + NEXT
    end = len(data) - len(NEXT)
    for a, b in itertools.combinations(range(len(data) + 1), 2):
        payload, taken, tracker = dechunk([data[:a], data[a:b], data[b:]])
        assert (payload, taken, tracker.trailers) == (b"abcde", end, [(b"T", b"v")]), (a, b)


def test_byte_by_byte() -> None:
    data = memoryview(BODY + NEXT)
    payload, taken, tracker = dechunk([data[i:i + 1] for i in range(len(data))])
    assert (payload, taken, tracker.trailers) == (PAYLOAD, len(BODY), TRAILERS)


def test_pieces_are_views_of_the_input_not_copies() -> None:
    data = bytearray(b"400\r\n" + b"p" * 0x400 + b"\r\n0\r\n\r\n")
    pieces: list[memoryview] = []
    ChunkedBody().feed(data, payload=pieces)
    assert len(pieces) == 1 and pieces[0].obj is data and len(pieces[0]) == 0x400
    data[5] = ord("Q")  # the view sees the caller's buffer: nothing was copied
    assert bytes(pieces[0][:2]) == b"Qp"
    pieces.clear()  # (releases the export, so the caller may resize its buffer again)
    view = memoryview(b"2\r\nab\r\n3\r\ncde\r\n")
    ChunkedBody().feed(view, payload=pieces)
    assert [bytes(p) for p in pieces] == [b"ab", b"cde"]
    assert all(p.obj is view.obj for p in pieces)


def test_a_chunk_split_across_feeds_comes_out_as_it_arrives() -> None:
    tracker = ChunkedBody()
    pieces: list[memoryview] = []
    assert tracker.feed(b"a\r\n01234", payload=pieces) == 8
    assert [bytes(p) for p in pieces] == [b"01234"]  # not held back until the chunk ends
    pieces.clear()
    assert tracker.feed(b"56789\r\n", payload=pieces) == 7
    assert [bytes(p) for p in pieces] == [b"56789"]


def test_without_payload_the_tracker_takes_the_same_bytes() -> None:
    data = BODY + NEXT
    for cut in range(len(data) + 1):
        plain, dechunking = ChunkedBody(), ChunkedBody()
        for part in (data[:cut], data[cut:]):
            assert plain.feed(part) == dechunking.feed(part, payload=[]), cut
        assert plain.complete and dechunking.complete


def test_until_boundary_with_payload_stops_after_the_chunk_in_progress() -> None:
    tracker = ChunkedBody(error_status=502)
    pieces: list[memoryview] = []
    tracker.feed(b"3\r\nab", payload=pieces)
    n = tracker.feed(b"c\r\n4\r\nwxyz\r\n0\r\n\r\n", until_boundary=True, payload=pieces)
    assert n == 3 and b"".join(pieces) == b"abc"
    assert tracker.at_boundary and not tracker.complete


@settings(max_examples=150, deadline=None)
@given(
    chunks=st.lists(st.binary(min_size=1, max_size=70), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=8),
    trailers=st.lists(st.sampled_from([b"A: 1", b"B-c:x y", b"D:"]), max_size=3),
    kind=st.sampled_from([bytes, bytearray, memoryview]),
)
def test_any_body_any_split(chunks: list[bytes], cuts: list[int], trailers: list[bytes],
                            kind: type) -> None:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    body += b"0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n"
    data = body + NEXT
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    payload, taken, tracker = dechunk([kind(data[a:b]) for a, b in itertools.pairwise(points)])
    assert payload == b"".join(chunks) and taken == len(body) and tracker.complete
    assert len(tracker.trailers) == len(trailers)


MALFORMED = [
    b"g\r\n",  # chunk-size hex only
    b"0x5\r\n",
    b"+5\r\n",
    b"-1\r\n",
    b" 5\r\n",  # no whitespace before the size
    b"5 5\r\n",
    b"\r\n",  # no size at all
    b";ext\r\n",
    b"1" * 17 + b"\r\n",  # more than 16 hex digits
    b"5\nhello\r\n",  # bare LF after the size
    b"5\r\r\nhello\r\n",  # bare CR
    b"5;e\x00\r\nhello\r\n",  # control character in an extension
    b"5;e\x7f\r\n",
    b"5;" + b"e" * 5000 + b"\r\n",  # extension beyond max_line
    b"5\r\nhelloXX",  # no CRLF after the data
    b"5\r\nhello\rX",
    b"5\r\nhello\n\r\n",
    b"5\r\nhello\r\r\n",
    b"0\r\nbad trailer\r\n",  # trailer without a colon
    b"0\r\nX-A : b\r\n",  # whitespace before the colon
    b"0\r\n: b\r\n",  # empty name
    b"0\r\nX(A): b\r\n",  # name not a token
    b"0\r\nX-A: b\x01\r\n",  # control character in a value
    b"0\r\nX-A: b\n\r\n",  # bare LF in a trailer line
    b"0\r\n\n",  # bare LF as the end of the trailers
    b"0\r\n" + b"X-Long: " + b"v" * 5000 + b"\r\n\r\n",  # trailer line beyond max_line
    b"0\r\n" + b"X-A: 0123456789\r\n" * 1200 + b"\r\n",  # trailer section beyond 16 KiB
]


@pytest.mark.parametrize("data", MALFORMED)
@pytest.mark.parametrize("status", [400, 502])
def test_malformed_refused_whole(data: bytes, status: int) -> None:
    with pytest.raises(HTTPError) as info:
        ChunkedBody(error_status=status).feed(data, payload=[])
    assert info.value.status == status


@pytest.mark.parametrize("data", MALFORMED)
def test_malformed_refused_wherever_it_is_split(data: bytes) -> None:
    step = max(1, len(data) // 64)  # every boundary of the short ones, a sample of the long
    for cut in range(0, len(data) + 1, step):
        tracker = ChunkedBody(error_status=502)
        with pytest.raises(HTTPError) as info:
            for part in (data[:cut], memoryview(data)[cut:]):
                tracker.feed(part, payload=[])
        assert info.value.status == 502, cut
    tracker = ChunkedBody(error_status=502)
    with pytest.raises(HTTPError):
        for i in range(len(data)):
            tracker.feed(data[i:i + 1], payload=[])


def test_size_line_is_bounded_across_feeds() -> None:
    tracker = ChunkedBody(max_line=64)
    tracker.feed(b"5;" + b"e" * 40, payload=[])  # kept, under the bound
    with pytest.raises(HTTPError, match="too long"):
        tracker.feed(b"e" * 30, payload=[])


def test_request_body_limit_refuses_before_any_payload() -> None:
    tracker = ChunkedBody(max_body=10)
    pieces: list[memoryview] = []
    tracker.feed(b"4\r\nabcd\r\n", payload=pieces)
    with pytest.raises(HTTPError) as info:
        tracker.feed(b"7\r\nefghijk\r\n", payload=pieces)
    assert info.value.status == 413
    assert b"".join(pieces) == b"abcd"


def test_truncated_body_is_refused_at_eof() -> None:
    tracker = ChunkedBody(error_status=502)
    pieces: list[memoryview] = []
    tracker.feed(b"5\r\nhel", payload=pieces)
    assert b"".join(pieces) == b"hel"
    with pytest.raises(HTTPError) as info:
        tracker.feed_eof()
    assert info.value.status == 502
