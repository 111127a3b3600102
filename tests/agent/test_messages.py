"""HTTP/1.1 framing as the agent uses it: strict heads, exact body ends, chunked split anywhere."""

from __future__ import annotations

import pytest

from gateway.agent.messages import (
    BodyTracker,
    Framing,
    MessageError,
    find_head_end,
    parse_request_head,
    parse_response_head,
)


def test_request_head_parsed_and_upgrade_detected() -> None:
    head = parse_request_head(
        b"GET /api/v1/pods/x/exec?command=ls HTTP/1.1\r\nHost: a\r\n"
        b"Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n"
    )
    assert head.method == b"GET" and head.target == b"/api/v1/pods/x/exec?command=ls"
    assert head.upgrade and head.framing.length == 0


@pytest.mark.parametrize("raw", [
    b"GET /x HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"GET /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"GET /x HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
    b"GET /x HTTP/1.1\r\nX: a\x00b\r\n\r\n",
    b"GET /x HTTP/1.1\r\nBad Name: a\r\n\r\n",
    b"GET /x y HTTP/1.1\r\n\r\n",
    b"GET /x HTTP/1.0\r\n\r\n",
    b"GET /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"GET /x HTTP/1.1\nX: a\r\n\r\n",
])
def test_request_heads_a_strict_server_refuses(raw: bytes) -> None:
    with pytest.raises(MessageError):
        parse_request_head(raw)


def test_response_framing_rules() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    assert parse_response_head(ok, b"GET").framing.length == 5
    assert parse_response_head(ok, b"HEAD").framing.length == 0
    r = parse_response_head(b"HTTP/1.1 200 OK\r\n\r\n", b"GET")
    assert r.framing.until_close and not r.keep_alive
    r = parse_response_head(b"HTTP/1.1 204 No Content\r\n\r\n", b"DELETE")
    assert r.framing.length == 0 and r.keep_alive
    r = parse_response_head(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                            b"GET")
    assert not r.keep_alive
    r = parse_response_head(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
                            b"GET")
    assert r.status == 101


def test_chunked_end_found_whatever_the_split() -> None:
    body = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nTrailer: x\r\n\r\n"
    extra = b"NEXT"
    data = body + extra
    for size in range(1, 12):
        tracker = BodyTracker(Framing(length=None, chunked=True))
        consumed = 0
        for i in range(0, len(data), size):
            piece = data[i : i + size]
            n = tracker.feed(piece)
            consumed += n
            if tracker.complete:
                break
        assert tracker.complete and consumed == len(body), size


@pytest.mark.parametrize("bad", [b"zz\r\n", b"4\r\nWikiXX", b"1" * 20 + b"\r\n"])
def test_chunked_malformed_refused(bad: bytes) -> None:
    tracker = BodyTracker(Framing(length=None, chunked=True))
    with pytest.raises(MessageError):
        tracker.feed(bad + b"\r\n")


def test_content_length_tracker_stops_at_the_end() -> None:
    tracker = BodyTracker(Framing(length=5))
    assert tracker.feed(b"abc") == 3 and not tracker.complete
    assert tracker.feed(b"deXYZ") == 2 and tracker.complete
    assert tracker.feed(b"more") == 0


def test_find_head_end_across_reads() -> None:
    buf = bytearray(b"GET / HTTP/1.1\r\nA: b\r\n\r")
    assert find_head_end(buf) == -1
    start = len(buf)
    buf += b"\nbody"
    assert find_head_end(buf, start) == len(buf) - 4
