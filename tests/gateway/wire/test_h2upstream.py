"""gateway.wire.h2upstream: the agent's HTTP/1.1 request heads to HTTP/2 fields, request bodies
to payload, HTTP/2 response fields to HTTP/1.1 heads. Pure: bytes in, bytes out."""

from __future__ import annotations

import pytest

from gateway.wire.h2upstream import (
    RequestBody,
    relayed_response,
    request_body,
    request_fields,
    response_head,
)
from gateway.wire.http1 import (
    HTTPError,
    framing_for_response,
    parse_request_head,
    parse_response_head,
)


def head(text: bytes):  # type: ignore[no-untyped-def]
    return parse_request_head(text)


def test_request_fields_pseudo_headers_first_then_lower_cased_fields() -> None:
    fields = request_fields(head(
        b"GET /api/v1/namespaces/team/configmaps?watch=1 HTTP/1.1\r\n"
        b"Host: 10.0.0.1:6443\r\nAccept: application/json\r\nUser-Agent: kubectl\r\n"
        b"Authorization: Bearer agent\r\nImpersonate-User: cluster:hub:alice\r\n\r\n"))
    assert fields == [
        (b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"10.0.0.1:6443"),
        (b":path", b"/api/v1/namespaces/team/configmaps?watch=1"),
        (b"accept", b"application/json"), (b"user-agent", b"kubectl"),
        (b"authorization", b"Bearer agent"), (b"impersonate-user", b"cluster:hub:alice"),
    ]


def test_request_fields_drop_connection_specific_and_nominated_fields() -> None:
    fields = request_fields(head(
        b"POST /api/v1/namespaces HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, X-Hop\r\n"
        b"Keep-Alive: timeout=5\r\nX-Hop: 1\r\nProxy-Connection: x\r\nTE: trailers\r\n"
        b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"))
    assert fields[4:] == [(b"te", b"trailers"), (b"content-type", b"application/json")]


def test_request_fields_keep_te_only_for_trailers() -> None:
    fields = request_fields(head(b"GET / HTTP/1.1\r\nHost: h\r\nTE: gzip\r\n\r\n"))
    assert [n for n, _ in fields] == [b":method", b":scheme", b":authority", b":path"]


def test_request_fields_keep_content_length() -> None:
    fields = request_fields(head(b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n"))
    assert fields[-1] == (b"content-length", b"2")


@pytest.mark.parametrize("text", [
    b"GET /api/v1/namespaces/a/pods/p/exec HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n"
    b"Upgrade: websocket\r\n\r\n",
    b"GET / HTTP/1.0\r\n\r\n",  # no Host
])
def test_request_fields_refuse_upgrades_and_hostless_heads(text: bytes) -> None:
    parsed = head(text)  # a valid HTTP/1.1 head...
    with pytest.raises(ValueError):
        request_fields(parsed)  # ...that HTTP/2 must not carry


def test_request_body_content_length_passes_bytes_and_ends() -> None:
    body = RequestBody(head(b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n"))
    assert not body.complete
    assert body.feed(b"ab") == [b"ab"]
    assert body.feed(b"cdeXX") == [b"cde"]  # bytes past the end are not payload
    assert body.complete


def test_request_body_without_length_is_complete_at_once() -> None:
    assert RequestBody(head(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")).complete
    assert RequestBody(head(b"GET /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n")).complete


def test_request_body_of_a_head_shares_only_the_stateless_empty_one() -> None:
    """request_body: no object per body-less request, a fresh one (its own count) per body."""
    empty = [request_body(head(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")),
             request_body(head(b"GET /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"))]
    assert empty[0] is empty[1] and empty[0].complete and empty[0].feed(b"x") == []
    put = b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n"
    first, second = request_body(head(put)), request_body(head(put))
    assert first is not second
    assert first.feed(b"ab") == [b"ab"] and first.complete and not second.complete
    chunked = request_body(head(b"PUT /x HTTP/1.1\r\nHost: h\r\n"
                                b"Transfer-Encoding: chunked\r\n\r\n"))
    assert chunked.chunked and not chunked.complete


def test_request_body_dechunks_byte_by_byte() -> None:
    wire = b"5;ext=1\r\nhello\r\n1A\r\n" + b"z" * 26 + b"\r\n0\r\nX-Trailer: t\r\n\r\n"
    framed = head(b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
    whole = RequestBody(framed)
    assert b"".join(whole.feed(wire)) == b"hello" + b"z" * 26 and whole.complete
    split = RequestBody(framed)
    out = []
    for i in range(len(wire)):
        assert not split.complete
        out += split.feed(wire[i:i + 1])
    assert b"".join(out) == b"hello" + b"z" * 26 and split.complete


def test_request_body_pieces_are_views_of_what_was_fed() -> None:
    # h2pool copies them into its send buffer at once: the de-chunker copies nothing itself.
    framed = head(b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
    data = bytearray(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    pieces = RequestBody(framed).feed(data)
    assert [bytes(p) for p in pieces] == [b"abc", b"de"]
    assert all(isinstance(p, memoryview) and p.obj is data for p in pieces)
    length = head(b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n")
    [piece] = RequestBody(length).feed(data)
    assert piece.obj is data and bytes(piece) == b"3\r\n"


@pytest.mark.parametrize("wire", [b"x\r\n", b"5\nhello", b"3\r\nabcX", b"0\r\nbad\r\n"])
def test_request_body_refuses_what_the_exchange_refuses(wire: bytes) -> None:
    # The same rules as the agent exchange's own tracker (which sees these bytes first).
    framed = head(b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(HTTPError) as info:
        RequestBody(framed).feed(wire)
    assert info.value.status == 400


def test_response_head_with_length_is_plain() -> None:
    raw, chunked = response_head([(b":status", b"200"), (b"content-type", b"application/json"),
                                  (b"content-length", b"12")], b"GET")
    assert raw == (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                   b"content-length: 12\r\n\r\n")
    assert not chunked


def test_response_head_without_length_is_chunked() -> None:
    raw, chunked = response_head([(b":status", b"200"), (b"content-type", b"application/json"),
                                  (b"date", b"Tue")], b"GET")
    assert chunked
    assert raw == (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ndate: Tue\r\n"
                   b"transfer-encoding: chunked\r\n\r\n")
    parsed = parse_response_head(raw)
    assert parsed.chunked and parsed.keep_alive  # what the exchange will check it with


@pytest.mark.parametrize(("status", "method"), [(b"204", b"DELETE"), (b"304", b"GET"),
                                                (b"200", b"HEAD")])
def test_response_head_never_chunks_a_bodiless_answer(status: bytes, method: bytes) -> None:
    raw, chunked = response_head([(b":status", status)], method)
    assert not chunked and b"transfer-encoding" not in raw
    assert framing_for_response(parse_response_head(raw), method).complete


def test_relayed_response_takes_the_cores_parse_of_the_length() -> None:
    # The client core parsed the content-length already (ResponseReceived.content_length):
    # its figure is the head's, and its -1 (does not parse) is refused as a parse here would.
    fields = [(b":status", b"200"), (b"content-length", b"12")]
    raw, head = relayed_response(fields, b"GET", 12)
    assert (raw, head.content_length, head.chunked) == (
        b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n", 12, False)
    assert relayed_response(fields, b"GET")[1].content_length == 12  # parsed here
    with pytest.raises(HTTPError) as info:
        relayed_response([(b":status", b"200"), (b"content-length", b"1x")], b"GET", -1)
    assert info.value.status == 502 and "content-length" in str(info.value)
    with pytest.raises(HTTPError):  # unchanged: the core's figure is of the first of two
        relayed_response([*fields, (b"content-length", b"12")], b"GET", 12)
    raw, head = relayed_response([(b":status", b"200")], b"GET", -1)  # none: chunked
    assert head.content_length is None and head.chunked


def test_response_head_unknown_status_gets_a_reason() -> None:
    raw, _ = response_head([(b":status", b"599"), (b"content-length", b"0")], b"GET")
    assert raw.startswith(b"HTTP/1.1 599 Unknown\r\n")


@pytest.mark.parametrize("fields", [
    [],
    [(b":status", b"20")],
    [(b":status", b"abc")],
    [(b":status", b"099")],
    [(b":status", b"2000")],
    [(b":status", b"200"), (b"x-bad", b"a\r\nInjected: 1")],
    [(b":status", b"200"), (b"x-bad", b"a\nInjected: 1")],
    [(b":status", b"200"), (b"x-bad", b"a\rInjected: 1")],
    [(b":status", b"200"), (b"x-bad", b"a\x00")],
    [(b":status", b"200"), (b"x-bad", b"a\x7f")],
    [(b":status", b"200"), (b"injected: 1\r\nx-bad", b"a")],
    [(b":status", b"200"), (b"x-bad\n", b"a")],
    [(b":status", b"200"), (b"x bad", b"a")],
    [(b":status", b"200"), (b"x-bad:", b"a")],
    [(b":status", b"200"), (b"", b"a")],
    [(b":status", b"200"), (b"X-Upper", b"a")],  # HTTP/2 names are lower case
    [(b"content-type", b"text/plain")],  # no :status
    [(b"content-type", b"text/plain"), (b":status", b"200")],  # pseudo after a field
    [(b":status", b"200"), (b":status", b"200")],
    [(b":status", b"200"), (b":path", b"/")],  # a request's pseudo-header
    [(b":status", b"200"), (b":bogus", b"x")],
    [(b":status", b"200"), (b"connection", b"close")],
    [(b":status", b"200"), (b"keep-alive", b"timeout=5")],
    [(b":status", b"200"), (b"proxy-connection", b"close")],
    [(b":status", b"200"), (b"transfer-encoding", b"chunked")],
    [(b":status", b"200"), (b"upgrade", b"websocket")],
    [(b":status", b"200"), (b"te", b"trailers")],
])
def test_response_head_refuses_what_http1_cannot_carry(fields: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(HTTPError) as caught:
        response_head(fields, b"GET")
    assert caught.value.status == 502


def test_response_head_passes_every_other_byte_of_a_value_as_it_is() -> None:
    value = bytes(b for b in range(256) if b == 9 or (b >= 0x20 and b != 0x7F))
    raw, _ = response_head([(b":status", b"200"), (b"x-all", value),
                            (b"content-length", b"0")], b"GET")
    assert raw == b"HTTP/1.1 200 OK\r\nx-all: " + value + b"\r\ncontent-length: 0\r\n\r\n"
