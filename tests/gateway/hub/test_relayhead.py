"""The framing-only reading of a relayed response head (``gateway.hub.relayhead``) agrees with
the one parser of the rules, ``parse_response_head``: it never accepts a head that parser
refuses, never reads other framing from one it accepts, and leaves every case it does not
handle to that parser."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.hub.exchange import RESPONSE_LIMITS
from gateway.hub.relayhead import MAX_RELAYED_HEAD, relayed_head, whole_response
from gateway.wire.http1 import HTTPError, framing_for_response, parse_response_head

PLAIN = (b"HTTP/1.1 200 OK\r\nAudit-Id: 2d8b7b0e\r\nContent-Type: application/json\r\n"
         b"Date: Fri, 27 Nov 2026 18:00:00 GMT\r\nContent-Length: 1234\r\n\r\n")


def _agrees(raw: bytes) -> None:
    fast = relayed_head(raw)
    if fast is None:
        return
    full = parse_response_head(raw, RESPONSE_LIMITS)  # raises if the fast one was wrong
    assert (fast.version, fast.status, fast.reason, fast.content_length, fast.chunked,
            fast.close_delimited, fast.keep_alive) == (
        full.version, full.status, full.reason, full.content_length, full.chunked,
        full.close_delimited, full.keep_alive)
    for method in (b"GET", b"HEAD"):
        assert type(framing_for_response(fast, method)) is type(framing_for_response(full, method))


def test_the_plain_answer_is_read_without_its_fields() -> None:
    head = relayed_head(PLAIN)
    assert head is not None and (head.status, head.reason, head.content_length) == (
        200, b"OK", 1234)
    assert head.headers == [] and head.keep_alive
    _agrees(PLAIN)
    head = relayed_head(b"HTTP/1.1 404\r\ncontent-length:  7 \r\n\r\n")
    assert head is not None and (head.status, head.reason, head.content_length) == (404, b"", 7)


@pytest.mark.parametrize("raw", [
    # other framing, or a connection header: the full parser decides
    PLAIN.replace(b"Content-Length: 1234", b"Transfer-Encoding: chunked"),
    PLAIN.replace(b"Date:", b"Connection: close\r\nDate:"),
    PLAIN.replace(b"Content-Length: 1234\r\n", b""),
    PLAIN.replace(b"Date:", b"content-length: 1234\r\nDate:"),
    PLAIN.replace(b"HTTP/1.1", b"HTTP/1.0"),
    PLAIN.replace(b"200 OK", b"101 Switching Protocols"),
    PLAIN.replace(b"200 OK", b"100 Continue"),
    PLAIN.replace(b"Date:", b"X-Big: " + b"a" * MAX_RELAYED_HEAD + b"\r\nDate:"),
    # broken heads: left to the parser, which refuses them
    PLAIN.replace(b"1234", b"+1234"),
    PLAIN.replace(b"1234", b"12,34"),
    PLAIN.replace(b"Content-Length:", b"Content-Length :"),
    PLAIN.replace(b"Audit-Id: 2d8b7b0e\r\n", b"Audit-Id: 2d8b\r\n 7b0e\r\n"),
    PLAIN.replace(b"Audit-Id: 2d8b7b0e", b"Audit-Id: 2d8b\n7b0e"),
    PLAIN.replace(b"Audit-Id: 2d8b7b0e", b"Audit-Id: 2d8b\r7b0e"),
    PLAIN.replace(b"Audit-Id: 2d8b7b0e", b"Audit-Id: 2d8b\x007b0e"),
    PLAIN.replace(b"Audit-Id: 2d8b7b0e", b"Audit-Id: 2d8b\x7f7b0e"),
    PLAIN.replace(b"Audit-Id:", b"Audit Id:"),
    PLAIN.replace(b"Audit-Id:", b":"),
    PLAIN.replace(b"200 OK", b"200OK"),
    PLAIN.replace(b"200 OK", b"099 OK"),
    PLAIN.replace(b"200 OK", b"20 OK"),
    PLAIN.replace(b"200 OK", b"2000 OK"),
    PLAIN.replace(b"OK\r\n", b"OK\x01\r\n"),
    PLAIN[:-2],
])
def test_anything_else_is_left_to_the_parser(raw: bytes) -> None:
    assert relayed_head(raw) is None


_BYTES = st.sampled_from([b"a", b"Z", b"0", b"-", b":", b" ", b"\t", b"\r", b"\n", b"\r\n",
                          b"\x00", b"\x7f", b"\xe9", b",", b"+", b"content-length",
                          b"Content-Length: 5", b"Transfer-Encoding: chunked", b"connection",
                          b"HTTP/1.1 ", b"200", b"\r\n\r\n"])


@settings(max_examples=1000, deadline=None)
@given(st.lists(_BYTES, max_size=24))
def test_it_never_disagrees_with_the_parser_on_mutated_heads(parts: list[bytes]) -> None:
    raw = b"".join(parts)
    for candidate in (raw, PLAIN[:40] + raw + b"\r\n\r\n", PLAIN[:-4] + b"\r\n" + raw + b"\r\n\r\n",
                      b"HTTP/1.1 200 OK\r\n" + raw + b"\r\n\r\n"):
        try:
            parse_response_head(candidate, RESPONSE_LIMITS)
        except HTTPError:
            assert relayed_head(candidate) is None
            continue
        _agrees(candidate)


def _whole_agrees(data: bytes, method: bytes) -> None:
    """whole_response says (status, end) only for one whole response, as the parser reads it."""
    whole = whole_response(data, method)
    if whole is None:
        return
    status, end = whole
    full = parse_response_head(data[:end], RESPONSE_LIMITS)  # raises if it was wrong
    assert full.status == status and full.keep_alive and not full.close_delimited
    tracker = framing_for_response(full, method)
    assert tracker.feed(data[end:]) == len(data) - end and tracker.complete


def test_a_whole_plain_response_is_recognised() -> None:
    body = b"x" * 1234
    assert whole_response(PLAIN + body, b"GET") == (200, len(PLAIN))
    _whole_agrees(PLAIN + body, b"GET")
    assert whole_response(b"HTTP/1.1 404\r\ncontent-length: 0\r\n\r\n", b"GET") == (404, 35)


@pytest.mark.parametrize(("data", "method"), [
    (PLAIN + b"x" * 1233, b"GET"),  # part of its body: the tracker follows the rest
    (PLAIN + b"x" * 1235, b"GET"),  # more than its body: the stream contract is broken
    (PLAIN[:-2], b"GET"),  # no end of head
    (PLAIN + b"x" * 1234, b"HEAD"),  # no body whatever Content-Length says
    (PLAIN + b"x" * 1234, b"CONNECT"),
    (PLAIN.replace(b"200 OK", b"204 No Content").replace(b"1234", b"0"), b"GET"),
    (PLAIN.replace(b"200 OK", b"304 Not Modified").replace(b"1234", b"0"), b"GET"),
    (PLAIN.replace(b"Content-Length: 1234", b"Transfer-Encoding: chunked") + b"0\r\n\r\n",
     b"GET"),
    (PLAIN.replace(b"200 OK", b"100 Continue").replace(b"1234", b"0"), b"GET"),
    (PLAIN.replace(b"Date:", b"X-Big: " + b"a" * MAX_RELAYED_HEAD + b"\r\nDate:")
     + b"x" * 1234, b"GET"),
])
def test_anything_but_one_whole_plain_response_is_left_to_the_exchange(
        data: bytes, method: bytes) -> None:
    assert whole_response(data, method) is None


@settings(max_examples=500, deadline=None)
@given(st.lists(_BYTES, max_size=24), st.integers(0, 8), st.sampled_from([b"GET", b"HEAD"]))
def test_whole_never_disagrees_with_the_parser(parts: list[bytes], extra: int,
                                               method: bytes) -> None:
    raw = b"".join(parts)
    for head in (raw, b"HTTP/1.1 200 OK\r\n" + raw + b"\r\n\r\n",
                 b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n" + raw + b"\r\n\r\n"):
        for data in (head, head + b"b" * extra):
            try:
                parse_response_head(data[:data.find(b"\r\n\r\n") + 4], RESPONSE_LIMITS)
            except HTTPError:
                assert whole_response(data, method) is None
                continue
            _whole_agrees(data, method)
