from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire.http1 import (
    KUBECTL_GET_HEAD,
    NO_BODY,
    ChunkedBody,
    CloseDelimitedBody,
    ContentLengthBody,
    HTTPError,
    Limits,
    _bench,
    find_head_end,
    framing_for_request,
    framing_for_response,
    parse_request_head,
    parse_response_head,
    serialize_request_head,
    serialize_response_head,
)


def req(
    *lines: bytes | str, first: bytes | str = b"GET /c1/api HTTP/1.1", host: bool = True
) -> bytes:
    out = [first if isinstance(first, bytes) else first.encode()]
    if host:
        out.append(b"Host: gw")
    out.extend(x if isinstance(x, bytes) else x.encode() for x in lines)
    return b"\r\n".join(out) + b"\r\n\r\n"


def resp(*lines: bytes | str, first: bytes = b"HTTP/1.1 200 OK") -> bytes:
    out = [first, *(x if isinstance(x, bytes) else x.encode() for x in lines)]
    return b"\r\n".join(out) + b"\r\n\r\n"


def refused(data: bytes, status: int = 400, limits: Limits | None = None) -> HTTPError:
    with pytest.raises(HTTPError) as info:
        if limits:
            parse_request_head(data, limits)
        else:
            parse_request_head(data)
    assert info.value.status == status, str(info.value)
    return info.value


# --- request heads: accepted ---------------------------------------------------------------------


def test_kubectl_get_head() -> None:
    head = parse_request_head(KUBECTL_GET_HEAD)
    assert head.method == b"GET"
    assert head.target == b"/cluster1/api/v1/namespaces/default/pods?limit=500"
    assert head.version == b"HTTP/1.1"
    assert head.host == b"hubproxy.example.com:9092"
    assert head.keep_alive
    assert head.content_length is None and not head.chunked
    assert framing_for_request(head) is NO_BODY
    assert head.names[0] == b"host"
    assert head.headers[2][0] == b"Accept"


def test_headers_keep_order_case_and_duplicates() -> None:
    head = parse_request_head(req("X-A:  1 ", "x-a:\t2", "Accept: */*"))
    assert head.headers == [(b"Host", b"gw"), (b"X-A", b"1"), (b"x-a", b"2"), (b"Accept", b"*/*")]
    assert head.names == [b"host", b"x-a", b"x-a", b"accept"]
    assert head.get_all(b"x-a") == [b"1", b"2"]
    assert head.get(b"missing") is None


def test_target_kept_as_raw_bytes() -> None:
    target = b"/c1/api/v1/namespaces/a%2Fb/pods?x=%00%2e&y=%ZZ"
    head = parse_request_head(req(first=b"GET " + target + b" HTTP/1.1"))
    assert head.target == target


def test_empty_header_value_allowed() -> None:
    assert parse_request_head(req("X-Empty:")).get(b"x-empty") == b""


def test_obs_text_in_value_allowed() -> None:
    assert parse_request_head(req(b"X-U: caf\xc3\xa9")).get(b"x-u") == b"caf\xc3\xa9"


def test_http10_without_host_and_keep_alive_rules() -> None:
    head = parse_request_head(req(first="GET / HTTP/1.0", host=False))
    assert not head.keep_alive
    head = parse_request_head(req("Connection: Keep-Alive", first="GET / HTTP/1.0", host=False))
    assert head.keep_alive


def test_connection_close() -> None:
    head = parse_request_head(req("Connection: close"))
    assert not head.keep_alive
    assert head.connection == frozenset({b"close"})


def test_content_length_and_chunked() -> None:
    head = parse_request_head(req("Content-Length: 5", first="POST /c/x HTTP/1.1"))
    assert head.content_length == 5
    tracker = framing_for_request(head)
    assert isinstance(tracker, ContentLengthBody)
    head = parse_request_head(req("Transfer-Encoding: Chunked", first="POST /c/x HTTP/1.1"))
    assert head.chunked
    assert isinstance(framing_for_request(head), ChunkedBody)
    head = parse_request_head(req("Content-Length: 0", first="POST /c/x HTTP/1.1"))
    assert framing_for_request(head) is NO_BODY


def test_expect_100_continue() -> None:
    assert parse_request_head(req("Expect: 100-Continue")).expect_continue
    head = parse_request_head(req("Expect: 100-continue", first="GET / HTTP/1.0", host=False))
    assert not head.expect_continue


def test_upgrade_only_when_connection_nominates_it() -> None:
    head = parse_request_head(req("Connection: Upgrade", "Upgrade: websocket"))
    assert head.upgrade == b"websocket"
    assert parse_request_head(req("Upgrade: websocket")).upgrade is None


# --- request heads: refused ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b"GET /c1/api  HTTP/1.1",
        b"GET  /c1/api HTTP/1.1",
        b"GET /c1/api HTTP/1.1 ",
        b"GET /c1/api",
        b"GET",
        b"",
        b" GET /c1/api HTTP/1.1",
        b"GET\t/c1/api HTTP/1.1",
        b"G(T /c1/api HTTP/1.1",
        b"GET /c1/\x80 HTTP/1.1",
        b"GET /c1/api HTTP/1.1x",
        b"GET /c1/api http/1.1",
        b"GET /c1/api HTTP/11",
    ],
)
def test_malformed_request_line_400(line: bytes) -> None:
    refused(req(first=line))


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.2", b"HTTP/3.0"])
def test_unsupported_version_505(version: bytes) -> None:
    refused(req(first=b"GET / " + version), 505)


def test_rule7_request_line_too_long_414() -> None:
    limits = Limits(max_request_line=100)
    refused(req(first=b"GET /" + b"a" * 200 + b" HTTP/1.1"), 414, limits)


def test_rule7_head_too_large_431() -> None:
    limits = Limits(max_head_bytes=300)
    refused(req(*[f"X-{i}: {'v' * 20}" for i in range(20)]), 431, limits)


def test_rule7_too_many_headers_431() -> None:
    refused(req(*[f"X-{i}: v" for i in range(10)]), 431, Limits(max_headers=5))


def test_rule7_field_line_too_long_431() -> None:
    refused(req("X-Big: " + "v" * 300), 431, Limits(max_field_line=100))


def test_rule6_obs_fold_refused() -> None:
    err = refused(req("X-A: 1", " continued"))
    assert "folding" in str(err)
    refused(req("X-A: 1", "\tcontinued"))


@pytest.mark.parametrize(
    "line",
    [
        b"X-A : 1",
        b"X-A\t: 1",
        b" X-A: 1",
        b"X A: 1",
        b"X(A): 1",
        b": no-name",
        b"no-colon",
        b"X-\xc3\xa9: 1",
        b"X-A\x00: 1",
    ],
)
def test_invalid_header_names_refused(line: bytes) -> None:
    refused(req(line))


@pytest.mark.parametrize(
    "value", [b"a\x00b", b"a\x01b", b"a\x7fb", b"a\x1bb", b"a\rb", b"a\nb", b"a\x0bb", b"a\x0cb"]
)
def test_rule6_control_characters_in_values_refused(value: bytes) -> None:
    refused(req(b"X-A: " + value))


def test_rule6_bare_lf_line_ending_refused() -> None:
    refused(b"GET / HTTP/1.1\nHost: gw\r\n\r\n")
    refused(b"GET / HTTP/1.1\r\nHost: gw\nX-A: 1\r\n\r\n")


def test_leading_empty_lines_ignored() -> None:
    assert parse_request_head(b"\r\n\r\nGET / HTTP/1.1\r\nHost: gw\r\n\r\n").target == b"/"
    refused(b"\nGET / HTTP/1.1\r\nHost: gw\r\n\r\n")
    refused(b"\r\n\r\n")
    data = b"\r\n\r\nGET / HTTP/1.1\r\nHost: gw\r\n\r\n"
    assert find_head_end(data) == len(data)
    assert find_head_end(b"\r\n\r\n") == -1


def test_incomplete_head_refused() -> None:
    refused(b"GET / HTTP/1.1\r\nHost: gw\r\n")


def test_missing_host_in_http11_refused() -> None:
    refused(req(host=False))


def test_duplicate_host_refused() -> None:
    refused(req("Host: other"))


@pytest.mark.parametrize("host", [b"a b", b"a,b", b"a/b", b"user@a"])
def test_invalid_host_refused(host: bytes) -> None:
    refused(req(b"Host: " + host, host=False))


@pytest.mark.parametrize(
    "lines",
    [
        ["Content-Length: 5", "Content-Length: 5"],
        ["Content-Length: 5", "Content-Length: 6"],
        ["Content-Length: 5, 5"],
        ["Content-Length: +5"],
        ["Content-Length: -1"],
        ["Content-Length: 0x10"],
        ["Content-Length: 5 5"],
        ["Content-Length:"],
        ["Content-Length: 1" + "0" * 30],
    ],
)
def test_rule6_bad_content_length_refused(lines: list[str]) -> None:
    refused(req(*lines, first="POST / HTTP/1.1"))


def test_rule6_content_length_with_transfer_encoding_refused() -> None:
    refused(req("Content-Length: 5", "Transfer-Encoding: chunked", first="POST / HTTP/1.1"))
    refused(req("Transfer-Encoding: chunked", "Content-Length: 5", first="POST / HTTP/1.1"))


@pytest.mark.parametrize(
    "te", ["gzip", "identity", "gzip, chunked", "chunked, gzip", "chunked;q=1", "xchunked"]
)
def test_transfer_encoding_other_than_chunked_501(te: str) -> None:
    refused(req(f"Transfer-Encoding: {te}", first="POST / HTTP/1.1"), 501)


def test_chunked_twice_refused() -> None:
    refused(req("Transfer-Encoding: chunked, chunked", first="POST / HTTP/1.1"))
    refused(
        req("Transfer-Encoding: chunked", "Transfer-Encoding: chunked", first="POST / HTTP/1.1")
    )


def test_transfer_encoding_in_http10_refused() -> None:
    refused(req("Transfer-Encoding: chunked", first="POST / HTTP/1.0"))


def test_unknown_expectation_417() -> None:
    refused(req("Expect: something"), 417)


def test_connect_refused() -> None:
    head = parse_request_head(req(first="CONNECT gw:443 HTTP/1.1"))
    with pytest.raises(HTTPError) as info:
        framing_for_request(head)
    assert info.value.status == 405


# --- finding the head ----------------------------------------------------------------------------


def test_find_head_end_across_reads() -> None:
    data = KUBECTL_GET_HEAD + b"next"
    buf = bytearray()
    end = -1
    pos = 0
    for i in range(len(data)):
        buf += data[i : i + 1]
        end = find_head_end(buf, pos)
        pos = len(buf)
        if end >= 0:
            break
    assert end == len(KUBECTL_GET_HEAD)


def test_rule7_find_head_end_bounded_431() -> None:
    with pytest.raises(HTTPError) as info:
        find_head_end(b"GET / HTTP/1.1\r\n" + b"x" * 100, max_head_bytes=64)
    assert info.value.status == 431
    assert find_head_end(b"GET / HTTP/1.1\r\n", max_head_bytes=64) == -1


def test_find_head_end_long_request_line_414() -> None:
    with pytest.raises(HTTPError) as info:
        find_head_end(b"GET /" + b"a" * 100, max_request_line=64)
    assert info.value.status == 414
    assert find_head_end(b"GET /" + b"a" * 50, max_request_line=64) == -1


# --- response heads ------------------------------------------------------------------------------


def test_response_head() -> None:
    head = parse_response_head(resp("Content-Type: application/json", "Content-Length: 2"))
    assert (head.version, head.status, head.reason) == (b"HTTP/1.1", 200, b"OK")
    assert head.content_length == 2
    assert isinstance(framing_for_response(head, b"GET"), ContentLengthBody)


def test_response_reason_may_be_empty_or_have_spaces() -> None:
    assert parse_response_head(resp(first=b"HTTP/1.1 404 ")).reason == b""
    assert parse_response_head(resp(first=b"HTTP/1.1 404")).reason == b""
    assert parse_response_head(resp(first=b"HTTP/1.1 404 Not Found")).reason == b"Not Found"


def test_interim_and_switching() -> None:
    cont = parse_response_head(resp(first=b"HTTP/1.1 100 Continue"))
    assert cont.is_interim and not cont.is_switching
    sw = parse_response_head(
        resp("Upgrade: websocket", "Connection: Upgrade", first=b"HTTP/1.1 101 Switching Protocols")
    )
    assert sw.is_switching and not sw.is_interim
    assert framing_for_response(sw, b"GET") is NO_BODY


@pytest.mark.parametrize(
    "line",
    [b"HTTP/2 200 OK", b"HTTP/1.1 20 OK", b"HTTP/1.1 2000 OK", b"HTTP/1.1 abc", b"garbage",
     b"HTTP/1.1 099 x"],
)
def test_malformed_status_line_502(line: bytes) -> None:
    with pytest.raises(HTTPError) as info:
        parse_response_head(resp(first=line))
    assert info.value.status == 502


@pytest.mark.parametrize(
    "lines",
    [
        ["Content-Length: 1", "Content-Length: 1"],
        ["Content-Length: 1", "Transfer-Encoding: chunked"],
        ["X-A: a\x00"],
        ["X-A : 1"],
        ["X-A: 1", " fold"],
    ],
)
def test_bad_response_heads_502(lines: list[str]) -> None:
    with pytest.raises(HTTPError) as info:
        parse_response_head(resp(*lines))
    assert info.value.status == 502


@pytest.mark.parametrize(
    ("status", "method", "lines"),
    [
        (204, b"GET", ["Content-Length: 10"]),
        (304, b"GET", ["Content-Length: 10"]),
        (200, b"HEAD", ["Content-Length: 10"]),
        (200, b"HEAD", ["Transfer-Encoding: chunked"]),
        (103, b"GET", []),
    ],
)
def test_responses_without_body(status: int, method: bytes, lines: list[str]) -> None:
    head = parse_response_head(resp(*lines, first=b"HTTP/1.1 %d X" % status))
    assert framing_for_response(head, method) is NO_BODY


def test_response_framing_choices() -> None:
    chunked = parse_response_head(resp("Transfer-Encoding: gzip, chunked"))
    assert isinstance(framing_for_response(chunked, b"GET"), ChunkedBody)
    not_final = parse_response_head(resp("Transfer-Encoding: chunked, gzip"))
    assert not_final.close_delimited and not not_final.keep_alive
    assert isinstance(framing_for_response(not_final, b"GET"), CloseDelimitedBody)
    none = parse_response_head(resp())
    assert isinstance(framing_for_response(none, b"GET"), CloseDelimitedBody)
    with pytest.raises(HTTPError):
        framing_for_response(none, b"CONNECT")


def test_http10_response_keep_alive() -> None:
    assert not parse_response_head(resp(first=b"HTTP/1.0 200 OK")).keep_alive
    assert parse_response_head(resp("Connection: keep-alive", first=b"HTTP/1.0 200 OK")).keep_alive


# --- body trackers -------------------------------------------------------------------------------


def test_content_length_body_stops_at_the_end() -> None:
    t = ContentLengthBody(5)
    assert t.feed(b"abc") == 3 and not t.complete
    assert t.feed(memoryview(b"deGET /")) == 2 and t.complete
    assert t.feed(b"more") == 0
    t2 = ContentLengthBody(3)
    t2.feed(b"a")
    with pytest.raises(HTTPError):
        t2.feed_eof()


def test_close_delimited_body() -> None:
    t = CloseDelimitedBody()
    assert t.feed(b"abc") == 3 and not t.complete
    t.feed_eof()
    assert t.complete


CHUNKED = b"5\r\nhello\r\n6;ext=1;q=\"a b\"\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"


def test_chunked_whole() -> None:
    t = ChunkedBody()
    assert t.feed(CHUNKED + b"GET / HTTP/1.1\r\n") == len(CHUNKED)
    assert t.complete
    assert t.trailers == [(b"X-Trailer", b"t")]


def test_chunked_byte_by_byte_with_memoryview() -> None:
    t = ChunkedBody()
    data = memoryview(CHUNKED + b"NEXT")
    consumed = 0
    for i in range(len(data)):
        consumed += t.feed(data[i : i + 1])
        if t.complete:
            break
    assert consumed == len(CHUNKED)
    assert t.complete


@settings(max_examples=200, deadline=None)
@given(
    chunks=st.lists(st.binary(min_size=1, max_size=40), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    trailer=st.booleans(),
    kind=st.sampled_from([bytes, bytearray, memoryview]),
)
def test_chunked_any_split_finds_the_same_end(
    chunks: list[bytes], cuts: list[int], trailer: bool, kind: type
) -> None:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    body += b"0\r\n" + (b"T: v\r\n" if trailer else b"") + b"\r\n"
    data = body + b"POST /next HTTP/1.1\r\n"
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    t = ChunkedBody()
    consumed = 0
    for a, b in itertools.pairwise(points):
        piece = kind(data[a:b])
        n = t.feed(piece)
        consumed += n
        if t.complete:
            break
        assert n == len(piece)
    assert t.complete
    assert consumed == len(body)


def test_rule7_chunked_large_size_not_buffered() -> None:
    t = ChunkedBody()
    assert t.feed(b"FFFFFFFF\r\n") == 10
    assert t.remaining == 0xFFFFFFFF
    assert t.feed(b"x" * 1000) == 1000
    assert len(t._line) == 0


@pytest.mark.parametrize(
    "data",
    [
        b"g\r\n",
        b"\r\n",
        b"-1\r\n",
        b"0x5\r\n",
        b"5\nhello\r\n",
        b"5\r\nhelloXX",
        b"5\r\nhello\n",
        b"1" * 17 + b"\r\n",
        b"5;ext\x00\r\n",
        b"0\r\nbad trailer\r\n",
        b"0\r\nX-A : b\r\n",
        b"0\r\nX-A: b\x01\r\n",
    ],
)
def test_rule6_chunked_malformed_refused(data: bytes) -> None:
    with pytest.raises(HTTPError) as info:
        ChunkedBody().feed(data)
    assert info.value.status == 400


def test_rule7_chunked_size_line_bounded() -> None:
    t = ChunkedBody(max_line=64)
    with pytest.raises(HTTPError):
        t.feed(b"5;" + b"e" * 100)
    t = ChunkedBody(max_line=64)
    t.feed(b"5;" + b"e" * 30)
    with pytest.raises(HTTPError):
        t.feed(b"e" * 40)


def test_rule7_chunked_trailers_bounded() -> None:
    t = ChunkedBody(max_trailer_bytes=100)
    t.feed(b"0\r\n")
    with pytest.raises(HTTPError):
        for i in range(20):
            t.feed(b"X-%d: vvvvvvvvvv\r\n" % i)


def test_chunked_eof_before_end() -> None:
    t = ChunkedBody(error_status=502)
    t.feed(b"5\r\nhel")
    with pytest.raises(HTTPError) as info:
        t.feed_eof()
    assert info.value.status == 502


# --- serializing ---------------------------------------------------------------------------------


def test_serialize_request_head_round_trips() -> None:
    headers = [(b"Host", b"gw"), (b"X-A", b"1"), (b"x-a", b"caf\xc3\xa9")]
    data = serialize_request_head(b"GET", b"/api?x=%2F", headers)
    assert data == b"GET /api?x=%2F HTTP/1.1\r\nHost: gw\r\nX-A: 1\r\nx-a: caf\xc3\xa9\r\n\r\n"
    head = parse_request_head(data)
    assert head.headers == headers


def test_serialize_response_head() -> None:
    data = serialize_response_head(200, b"OK", [(b"Content-Length", b"0")])
    assert data == b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    assert parse_response_head(data).status == 200


@pytest.mark.parametrize(
    "headers", [[(b"X-A", b"1\r\nInjected: 1")], [(b"X A", b"1")], [(b"", b"1")], [(b"X", b"\x00")]]
)
def test_serializer_refuses_header_injection(headers: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(ValueError):
        serialize_request_head(b"GET", b"/", headers)
    with pytest.raises(ValueError):
        serialize_response_head(200, b"OK", headers)


def test_serializer_refuses_bad_request_line() -> None:
    with pytest.raises(ValueError):
        serialize_request_head(b"GET", b"/a b", [])
    with pytest.raises(ValueError):
        serialize_request_head(b"G T", b"/", [])


def test_parse_speed_is_in_the_documented_range() -> None:
    # The docstring quotes ~7 µs; allow for a loaded CI machine but catch a 10x regression.
    assert _bench(2000) < 60.0


@pytest.mark.parametrize("position", [0, 5, 11])
def test_one_bad_field_among_many_is_found_wherever_it_is(position: int) -> None:
    good = [(b"X-Field-%d" % i, b"value %d" % i) for i in range(12)]
    bads = [(b"X Bad", b"v"), (b"X-Bad", b"v\r\nInjected: 1"), (b"", b"v"), (b"X-Bad", b"\x00")]
    for bad in bads:
        headers = list(good)
        headers[position] = bad
        with pytest.raises(ValueError, match="invalid header"):
            serialize_request_head(b"GET", b"/", headers)
    lines = [b"%s: %s" % pair for pair in good]
    lines[position] = b"X(Bad): v"
    raw = b"GET / HTTP/1.1\r\nHost: h\r\n" + b"\r\n".join(lines) + b"\r\n\r\n"
    with pytest.raises(HTTPError, match="invalid header name"):
        parse_request_head(raw)


def test_chunked_request_body_limit_counts_declared_chunk_sizes() -> None:
    from gateway.wire.http1 import ChunkedBody

    tracker = ChunkedBody(max_body=10)
    assert tracker.feed(b"4\r\nabcd\r\n6\r\nefghij\r\n") == 20  # exactly 10: fine
    with pytest.raises(HTTPError) as info:
        tracker.feed(b"1\r\nk\r\n")  # refused at the size line, before its data
    assert info.value.status == 413
    unlimited = ChunkedBody()
    unlimited.feed(b"10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n")
    assert unlimited.complete and unlimited.body_bytes == 16
