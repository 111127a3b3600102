"""Strict HTTP/1.1 for a reverse proxy: heads parsed, bodies only delimited (sans-IO).

Nothing here reads a socket. The gateway and the agent feed bytes in and get back parsed heads
and "this many of those bytes belong to the current message". Bodies are never buffered or
copied: they are relayed verbatim, so a tracker only has to know where a message ends (which is
what stops a smuggled second request riding behind a body).

Request heads (:func:`parse_request_head`) are refused with :class:`HTTPError` carrying the status
to answer with:

* 400 -- malformed request line, method not a token, request-target not printable ASCII, header
  name not a token (incl. whitespace before the colon), obs-fold, bare CR or LF, NUL or other
  control characters anywhere in the head (HTAB allowed in values), missing ``Host`` in
  HTTP/1.1 or more than one ``Host``, a ``Content-Length`` that is not plain digits, repeated
  (even with equal values) or listed, ``Content-Length`` together with ``Transfer-Encoding``,
  ``Transfer-Encoding`` in HTTP/1.0, ``chunked`` more than once.
* 414 -- request line longer than ``Limits.max_request_line``.
* 431 -- head larger than ``Limits.max_head_bytes``, more than ``Limits.max_headers`` fields, or
  a field line longer than ``Limits.max_field_line``.
* 417 -- an ``Expect`` other than ``100-continue``.
* 501 -- a ``Transfer-Encoding`` other than exactly ``chunked``.
* 505 -- an HTTP version other than 1.0 and 1.1.

Empty lines (CRLF) before a request-line are ignored, as RFC 9112 §2.2 recommends.

Response heads (:func:`parse_response_head`) break the same rules with status 502 (the upstream
is at fault). For responses, ``Transfer-Encoding`` whose final coding is ``chunked`` is chunked
(codings before it travel untouched); any other ``Transfer-Encoding`` means close-delimited, as
RFC 9112 §6.3 says.

Headers stay a list of ``(name, value)`` bytes in their original order and case; ``names`` holds
the lower-cased names at the same indexes, computed once.

Body framing: :func:`framing_for_request` / :func:`framing_for_response` pick a tracker;
``tracker.feed(data) -> int`` returns how many leading bytes of ``data`` belong to the message and
sets ``tracker.complete`` exactly when its last byte was fed; bytes past that belong to the next
message. ``feed_eof()`` says the peer closed: fine for a close-delimited body, otherwise
:class:`HTTPError` (truncated message). HEAD, 1xx, 204 and 304 responses have no body; CONNECT is
refused (405), this gateway is not a forward proxy. :class:`ChunkedBody` is also the one
de-chunker (``feed(data, payload=pieces)``), for where HTTP/2 is on one side and the payload
has to leave its chunk framing (the agent's HTTP/2 upstream, the HTTP/2 front door).

Speed: this is the hot path. Parsing works on whole lines with ``bytes.split``/``partition`` and
validates with ``bytes.translate`` (one C-level pass per field, no regex per header). A
~700-byte kubectl GET head (11 fields) parses in about 7 µs on the development machine (CPython
3.11, one core of the 2-core CI box; ``python -m gateway.wire.http1`` prints the current figure).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NoReturn

from mypy_extensions import mypyc_attr

Headers = list[tuple[bytes, bytes]]

# --- byte classes -------------------------------------------------------------------------------
# RFC 9110 tchar. ``name.translate(None, _TCHAR)`` deletes every token byte: anything left over
# means the name is not a token. One C loop per field, no regex.
_TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Bytes a head may contain freely: everything except controls other than HTAB, and DEL. CR and LF
# are left over by the translate below and then must be exactly the CRLFs between lines.
_HEAD_OK = bytes(b for b in range(256) if b == 9 or (b >= 0x20 and b != 0x7F))
# Request-target: visible ASCII only (non-ASCII must be percent-encoded by the client).
_TARGET_OK = bytes(range(0x21, 0x7F))
_DIGITS = b"0123456789"
_HEX = b"0123456789abcdefABCDEF"
# chunk-ext: anything printable (quoted strings included) plus HTAB; no controls.
_EXT_OK = bytes(b for b in range(256) if b == 9 or (b >= 0x20 and b != 0x7F))

_CRLF = b"\r\n"
_FIELD_SEPARATOR = b": "  # between a field's name and value in a serialised head
_HTTP11 = b"HTTP/1.1"
_HTTP10 = b"HTTP/1.0"
_MAX_CONTENT_LENGTH_DIGITS = 18  # < 2**63


@mypyc_attr(native_class=False)
class HTTPError(ValueError):
    """A message refused; ``status`` is what to answer with (or 502 for upstream messages)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits for heads; anything beyond is refused (DESIGN §6 rule 7)."""

    max_head_bytes: int = 64 * 1024  # request/status line + all fields + blank line
    max_request_line: int = 16 * 1024
    max_field_line: int = 16 * 1024
    max_headers: int = 128


DEFAULT_LIMITS = Limits()


@dataclass(slots=True)
class RequestHead:
    method: bytes
    target: bytes  # raw request-target, exactly as sent
    version: bytes  # b"HTTP/1.1" or b"HTTP/1.0"
    headers: Headers
    names: list[bytes]  # lower-cased names, same indexes as headers
    content_length: int | None = None
    chunked: bool = False
    keep_alive: bool = True
    expect_continue: bool = False
    connection: frozenset[bytes] = frozenset()  # lower-cased Connection tokens
    upgrade: bytes | None = None  # Upgrade value when Connection nominates "upgrade"

    def get(self, name: bytes) -> bytes | None:
        """First value of a header (``name`` lower-case), or None."""
        return _get(self.headers, self.names, name)

    def get_all(self, name: bytes) -> list[bytes]:
        return [self.headers[i][1] for i, n in enumerate(self.names) if n == name]

    @property
    def host(self) -> bytes | None:
        return self.get(b"host")


@dataclass(slots=True)
class ResponseHead:
    version: bytes
    status: int
    reason: bytes
    headers: Headers
    names: list[bytes]
    content_length: int | None = None
    chunked: bool = False
    close_delimited: bool = False  # Transfer-Encoding without a final chunked
    keep_alive: bool = True
    connection: frozenset[bytes] = field(default_factory=frozenset)

    def get(self, name: bytes) -> bytes | None:
        return _get(self.headers, self.names, name)

    def get_all(self, name: bytes) -> list[bytes]:
        return [self.headers[i][1] for i, n in enumerate(self.names) if n == name]

    @property
    def is_interim(self) -> bool:
        """1xx other than 101: another head follows (e.g. ``100 Continue``)."""
        return 100 <= self.status < 200 and self.status != 101

    @property
    def is_switching(self) -> bool:
        """``101 Switching Protocols``: after this head both directions are raw bytes."""
        return self.status == 101


def _get(headers: Headers, names: list[bytes], name: bytes) -> bytes | None:
    try:
        return headers[names.index(name)][1]
    except ValueError:
        return None


# --- finding the head ---------------------------------------------------------------------------


def find_head_end(
    buf: bytes | bytearray,
    start: int = 0,
    *,
    max_head_bytes: int = DEFAULT_LIMITS.max_head_bytes,
    max_request_line: int = DEFAULT_LIMITS.max_request_line,
) -> int:
    """Index just past the blank line that ends the head, or -1 when more bytes are needed.

    ``start`` is where the previous search stopped (searching resumes 3 bytes earlier so a
    CRLFCRLF split across reads is found). Raises 414 once more than ``max_request_line`` bytes
    arrived without the end of the first line, 431 once ``max_head_bytes`` bytes arrived without
    a complete head: a client cannot make us buffer without bound.
    """
    lead = 0  # empty lines before the request-line are ignored (RFC 9112 §2.2)
    while buf.startswith(b"\r\n", lead):
        lead += 2
    i = buf.find(b"\r\n\r\n", max(lead, start - 3), max_head_bytes)
    if i >= 0:
        return i + 4
    n = len(buf)
    if n - lead > max_request_line and buf.find(b"\r\n", lead, lead + max_request_line + 2) < 0:
        raise HTTPError("request line too long", 414)
    if n >= max_head_bytes:
        raise HTTPError("request header fields too large", 431)
    return -1


# --- parsing ------------------------------------------------------------------------------------


def _split_head(data: bytes, status: int, limits: Limits) -> list[bytes]:
    """Lines of a complete head (through CRLFCRLF), checked for forbidden bytes."""
    if len(data) > limits.max_head_bytes:
        raise HTTPError("header fields too large", 431 if status == 400 else status)
    if not data.endswith(b"\r\n\r\n"):
        raise HTTPError("incomplete message head", status)
    head = data[:-4]
    lines = head.split(b"\r\n")
    # One C pass: what is left after deleting every allowed byte must be exactly the CRLFs that
    # separated the lines. A NUL/control byte, or a bare CR or LF (a classic smuggling vector),
    # leaves something else.
    leftover = head.translate(None, _HEAD_OK)
    if leftover != _CRLF * (len(lines) - 1):
        if leftover.replace(b"\r", b"").replace(b"\n", b""):
            raise HTTPError("control character in message head", status)
        raise HTTPError("bare CR or LF in message head", status)
    return lines


def _parse_fields(lines: list[bytes], status: int, limits: Limits) -> tuple[Headers, list[bytes]]:
    if len(lines) - 1 > limits.max_headers:
        raise HTTPError("too many header fields", 431 if status == 400 else status)
    headers: Headers = []
    too_long = 431 if status == 400 else status
    raw_names: list[bytes] = []
    for line in lines[1:]:
        if len(line) > limits.max_field_line:
            raise HTTPError("header field too large", too_long)
        name, colon, value = line.partition(b":")
        if not colon or not name:
            _bad_field_line(line, status)
        raw_names.append(name)
        headers.append((name, value.strip(b" \t")))
    if not raw_names:
        return headers, []
    # One C pass over every name (each byte is judged alone): what is left after deleting the
    # token characters must be exactly the line feeds that joined them (no name holds one: the
    # head's lines are split on CRLF and bare CR or LF is refused); the loop only finds the
    # culprit. The same joined bytes are lowered in one pass too.
    joined = b"\n".join(raw_names)
    if joined.translate(None, _TCHAR) != b"\n" * (len(raw_names) - 1):
        for line, name in zip(lines[1:], raw_names, strict=True):
            if name.translate(None, _TCHAR):
                _bad_field_line(line, status)
    return headers, joined.lower().split(b"\n")


def _bad_field_line(line: bytes, status: int) -> NoReturn:
    if line[:1] in (b" ", b"\t"):
        raise HTTPError("obsolete line folding in header", status)
    if b":" not in line:
        raise HTTPError("header line without a colon", status)
    raise HTTPError("invalid header name", status)


def plain_content_length(value: bytes) -> int | None:
    """``value`` as a ``Content-Length``: plain ASCII digits, at most 18 of them (below
    2**63); None for anything else (signs, spaces, lists, empty)."""
    if not value or value.translate(None, _DIGITS) or len(value) > _MAX_CONTENT_LENGTH_DIGITS:
        return None
    return int(value)


def _content_length(values: list[bytes], status: int) -> int:
    if len(values) != 1:
        raise HTTPError("more than one Content-Length", status)
    length = plain_content_length(values[0])
    if length is None:
        raise HTTPError("invalid Content-Length", status)
    return length


def _codings(values: list[bytes]) -> list[bytes]:
    return [c.strip(b" \t").lower() for v in values for c in v.split(b",")]


def _connection_tokens(values: list[bytes]) -> frozenset[bytes]:
    tokens = {t for t in _codings(values) if t}
    return frozenset(tokens)


_FRAMING_NAMES = frozenset(
    (b"host", b"content-length", b"connection", b"transfer-encoding", b"expect")
)


def parse_request_head(data: bytes, limits: Limits = DEFAULT_LIMITS) -> RequestHead:
    """Parse a complete request head (through the blank line). Raises :class:`HTTPError`."""
    data = bytes(data)
    # RFC 9112 §2.2: ignore empty lines before the request-line (some clients send a stray CRLF
    # after a body). Bounded: the whole head was already size-checked by the caller's buffer.
    while data.startswith(b"\r\n"):
        data = data[2:]
    end = data.find(b"\r\n")
    if end > limits.max_request_line or (end < 0 and len(data) > limits.max_request_line):
        raise HTTPError("request line too long", 414)
    lines = _split_head(data, 400, limits)
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise HTTPError("malformed request line", 400)
    method, target, version = parts
    if not method or method.translate(None, _TCHAR):
        raise HTTPError("invalid method", 400)
    if not target or target.translate(None, _TARGET_OK):
        raise HTTPError("invalid request target", 400)
    if version != _HTTP11 and version != _HTTP10:
        if version.startswith(b"HTTP/") and len(version) == 8 and version[6:7] == b".":
            raise HTTPError("HTTP version not supported", 505)
        raise HTTPError("malformed request line", 400)

    headers, names = _parse_fields(lines, 400, limits)
    head = RequestHead(method, target, version, headers, names)
    http11 = version == _HTTP11

    hosts = 0
    host = b""
    cl_values: list[bytes] = []
    te_values: list[bytes] = []
    conn_values: list[bytes] = []
    expect: list[bytes] = []
    for i, name in enumerate(names):
        if name not in _FRAMING_NAMES:  # one set lookup for the common case
            continue
        if name == b"host":
            host = headers[i][1]  # (more than one is refused below)
            hosts += 1
        elif name == b"content-length":
            cl_values.append(headers[i][1])
        elif name == b"connection":
            conn_values.append(headers[i][1])
        elif name == b"transfer-encoding":
            te_values.append(headers[i][1])
        else:
            expect.append(headers[i][1])

    if hosts > 1 or (http11 and hosts == 0):
        raise HTTPError("exactly one Host header is required", 400)
    if b"," in host or b" " in host or b"\t" in host or b"/" in host or b"@" in host:
        raise HTTPError("invalid Host header", 400)
    if te_values:
        if cl_values:
            raise HTTPError("both Content-Length and Transfer-Encoding", 400)
        if not http11:
            raise HTTPError("Transfer-Encoding in an HTTP/1.0 request", 400)
        codings = _codings(te_values)
        if codings != [b"chunked"]:
            if codings.count(b"chunked") > 1:
                raise HTTPError("chunked applied more than once", 400)
            raise HTTPError("unsupported Transfer-Encoding", 501)
        head.chunked = True
    elif cl_values:
        head.content_length = _content_length(cl_values, 400)
    if conn_values:
        head.connection = _connection_tokens(conn_values)
    if http11:
        head.keep_alive = b"close" not in head.connection
    else:
        head.keep_alive = b"keep-alive" in head.connection and b"close" not in head.connection
    if expect:
        if [e.strip(b" \t").lower() for e in expect] != [b"100-continue"]:
            raise HTTPError("unsupported expectation", 417)
        # HTTP/1.0 clients cannot handle an interim response (RFC 9110 §10.1.1).
        head.expect_continue = http11
    if b"upgrade" in head.connection:
        head.upgrade = head.get(b"upgrade")
    return head


def parse_response_head(data: bytes, limits: Limits = DEFAULT_LIMITS) -> ResponseHead:
    """Parse a complete response head. Every violation is :class:`HTTPError` with status 502."""
    lines = _split_head(bytes(data), 502, limits)
    version, _, rest = lines[0].partition(b" ")
    if version != _HTTP11 and version != _HTTP10:
        raise HTTPError("upstream sent an unsupported HTTP version", 502)
    code, _, reason = rest.partition(b" ")
    if len(code) != 3 or code.translate(None, _DIGITS) or code[:1] == b"0":
        raise HTTPError("upstream sent a malformed status line", 502)
    headers, names = _parse_fields(lines, 502, limits)
    head = ResponseHead(version, int(code), reason, headers, names)

    cl_values = [headers[i][1] for i, n in enumerate(names) if n == b"content-length"]
    te_values = [headers[i][1] for i, n in enumerate(names) if n == b"transfer-encoding"]
    conn_values = [headers[i][1] for i, n in enumerate(names) if n == b"connection"]
    if conn_values:
        head.connection = _connection_tokens(conn_values)
    if version == _HTTP11:
        head.keep_alive = b"close" not in head.connection
    else:
        head.keep_alive = b"keep-alive" in head.connection and b"close" not in head.connection
    if te_values:
        if cl_values:
            raise HTTPError("upstream sent both Content-Length and Transfer-Encoding", 502)
        codings = _codings(te_values)
        if codings[-1] == b"chunked" and version == _HTTP11:
            if codings.count(b"chunked") > 1:
                raise HTTPError("upstream applied chunked more than once", 502)
            head.chunked = True
        else:
            head.close_delimited = True
            head.keep_alive = False
    elif cl_values:
        head.content_length = _content_length(cl_values, 502)
    return head


# --- body framing -------------------------------------------------------------------------------


class NoBody:
    """A message without a body: complete before any byte."""

    __slots__ = ()
    complete = True

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        return 0

    def feed_eof(self) -> None:
        return None


NO_BODY = NoBody()


class ContentLengthBody:
    """Exactly ``n`` bytes."""

    __slots__ = ("complete", "remaining")

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError("negative Content-Length")
        self.remaining = n
        self.complete = n == 0

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        take = min(len(data), self.remaining)
        self.remaining -= take
        if self.remaining == 0:
            self.complete = True
        return take

    def feed_eof(self) -> None:
        if not self.complete:
            raise HTTPError("connection closed before the end of the body", 400)


class CloseDelimitedBody:
    """Everything until the peer closes (responses only)."""

    __slots__ = ("complete",)

    def __init__(self) -> None:
        self.complete = False

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        return 0 if self.complete else len(data)

    def feed_eof(self) -> None:
        self.complete = True


# ChunkedBody states
_SIZE, _DATA, _DATA_CR, _DATA_LF, _TRAILER, _DONE = range(6)
_NO_VIEW = memoryview(b"")
# A whole chunk-size or trailer line and its CRLF. One C call finds and copies the line, on
# bytes, bytearray and memoryview alike (memoryview has no find()); a line that does not match
# (split across feeds, bare LF, too long) takes the slow path that says which.
_CRLF_LINE = re.compile(rb"([^\n]*)\r\n")


class ChunkedBody:
    """Tracks ``Transfer-Encoding: chunked`` without buffering the payload, and de-chunks it.

    Checks every chunk-size line (1-16 hex digits, optional extensions without control
    characters, CRLF), the CRLF after each chunk's data, and the trailer section (field lines
    like headers, ending with an empty line). Only a chunk-size or trailer line split across
    two feeds is kept, bounded by ``max_line``; trailers in total by ``max_trailer_bytes``.
    ``error_status`` is 400 for request bodies, 502 for response bodies. ``max_body`` (request
    bodies): once the chunk sizes declared so far add up to more, :class:`HTTPError` 413 is
    raised at that chunk's size line, before any of its data is taken.

    This is the one de-chunker: ``feed(data, payload=pieces)`` also appends the payload among
    the bytes it takes to ``pieces``, as memoryview slices of ``data`` (never a copy: the
    HTTP/2 front door de-chunks every chunked response with it). They are views, valid while
    ``data`` is: a caller that keeps a piece past its own use of ``data`` copies it. The
    trailer fields are checked and kept in :attr:`trailers`, never in the payload.
    """

    __slots__ = (
        "_line",
        "_state",
        "_trailer_bytes",
        "body_bytes",
        "complete",
        "error_status",
        "max_body",
        "max_line",
        "max_trailer_bytes",
        "remaining",
        "trailers",
    )

    def __init__(
        self, *, max_line: int = 4096, max_trailer_bytes: int = 16384, error_status: int = 400,
        max_body: int | None = None,
    ) -> None:
        self._state = _SIZE
        self.body_bytes = 0  # payload bytes declared by the chunk sizes so far
        self.max_body = max_body
        self._line = bytearray()
        self._trailer_bytes = 0
        self.remaining = 0
        self.complete = False
        self.error_status = error_status
        self.max_line = max_line
        self.max_trailer_bytes = max_trailer_bytes
        self.trailers: Headers = []

    def _fail(self, message: str) -> HTTPError:
        return HTTPError(message, self.error_status)

    def _take_line(
        self, data: bytes | bytearray | memoryview, pos: int
    ) -> tuple[bytes | None, int]:
        """The next CRLF-terminated line from ``pos`` (joined with a kept partial), without its
        CRLF, and the position after it; or None when ``data`` ends first (the partial is kept).

        Only the line itself is copied (bounded by ``max_line``), never the payload around it.
        """
        kept = self._line
        room = self.max_line + 2 - len(kept)  # what the line may still take, CRLF included
        if not kept:  # the common case: the whole line is here
            found = _CRLF_LINE.match(data, pos, pos + room)
            if found is not None:
                return found.group(1), found.end()
        end = min(len(data), pos + room)
        window = bytes(data[pos:end])  # at most max_line + 2 bytes
        i = window.find(b"\n")
        if i < 0:
            if end - pos >= room:
                raise self._fail("chunk size or trailer line too long")
            kept += window
            return None, end
        line = bytes(kept) + window[: i + 1]
        kept.clear()
        if len(line) < 2 or line[-2] != 13:
            raise self._fail("bare LF in chunked body")
        return line[:-2], pos + i + 1

    @property
    def at_boundary(self) -> bool:
        """Between two chunks: a terminating ``0`` chunk written now ends the body cleanly."""
        return self._state == _SIZE and not self._line

    def feed(
        self, data: bytes | bytearray | memoryview, *, until_boundary: bool = False,
        payload: list[memoryview] | None = None,
    ) -> int:
        """Bytes of ``data`` that belong to the body. With ``until_boundary``, stop right after
        the chunk in progress (see :attr:`at_boundary`; 0 when there is none). With
        ``payload``, the chunk data among those bytes is appended to it (see the class)."""
        if until_boundary and self.at_boundary:
            return 0
        view = _NO_VIEW if payload is None else memoryview(data)
        pos = 0
        n = len(data)
        while pos < n:
            state = self._state
            if state == _DATA:
                remaining = self.remaining
                take = n - pos if n - pos < remaining else remaining
                if payload is not None:
                    payload.append(view[pos : pos + take])
                pos += take
                self.remaining = remaining = remaining - take
                if not remaining:
                    self._state = _DATA_CR
            elif state == _SIZE:
                line, pos = self._take_line(data, pos)
                if line is None:
                    break
                self._chunk_size(line)
            elif state == _DATA_CR:
                if data[pos] != 13:
                    raise self._fail("missing CRLF after chunk data")
                if pos + 1 == n:
                    self._state = _DATA_LF
                    return n
                if data[pos + 1] != 10:
                    raise self._fail("missing CRLF after chunk data")
                pos += 2
                self._state = _SIZE
                if until_boundary:
                    break
            elif state == _DATA_LF:
                if data[pos] != 10:
                    raise self._fail("missing CRLF after chunk data")
                pos += 1
                self._state = _SIZE
                if until_boundary:
                    break
            elif state == _TRAILER:
                line, pos = self._take_line(data, pos)
                if line is None:
                    break
                self._trailer(line)
            else:  # _DONE: the rest belongs to the next message
                break
        return pos

    def _chunk_size(self, line: bytes) -> None:
        size, semi, ext = line.partition(b";")
        size = size.rstrip(b" \t")  # BWS before ';' (RFC 9112 §7.1.1)
        if not size or len(size) > 16 or size.translate(None, _HEX):
            raise self._fail("invalid chunk size")
        if semi and ext.translate(None, _EXT_OK):
            raise self._fail("invalid chunk extension")
        self.remaining = int(size, 16)
        self.body_bytes += self.remaining
        if self.max_body is not None and self.body_bytes > self.max_body:
            raise HTTPError(
                f"the request body is larger than the gateway's limit of {self.max_body} bytes",
                413)
        if self.remaining:
            self._state = _DATA
        else:
            self._state = _TRAILER

    def _trailer(self, line: bytes) -> None:
        if not line:
            self._state = _DONE
            self.complete = True
            return
        self._trailer_bytes += len(line) + 2
        if self._trailer_bytes > self.max_trailer_bytes:
            raise self._fail("trailer section too large")
        name, colon, value = line.partition(b":")
        if not colon or not name or name.translate(None, _TCHAR) or value.translate(None, _EXT_OK):
            raise self._fail("invalid trailer field")
        self.trailers.append((name, value.strip(b" \t")))

    def feed_eof(self) -> None:
        if not self.complete:
            raise self._fail("connection closed before the end of the chunked body")


BodyTracker = NoBody | ContentLengthBody | ChunkedBody | CloseDelimitedBody


def framing_for_request(head: RequestHead, max_body: int | None = None) -> BodyTracker:
    """The tracker for a request body. CONNECT is refused (405): not a forward proxy.
    ``max_body`` bounds a chunked body (413 while it streams); a ``Content-Length`` is the
    caller's to check before reading the body."""
    if head.method == b"CONNECT":
        raise HTTPError("CONNECT is not supported", 405)
    if head.chunked:
        return ChunkedBody(error_status=400, max_body=max_body)
    if head.content_length:
        return ContentLengthBody(head.content_length)
    return NO_BODY


def framing_for_response(head: ResponseHead, request_method: bytes) -> BodyTracker:
    """The tracker for a response body, given the method of the request it answers.

    1xx (incl. 101: what follows is no longer HTTP), 204, 304 and any answer to HEAD have no
    body whatever their headers say. Answers to CONNECT are refused (502).
    """
    if request_method == b"CONNECT":
        raise HTTPError("CONNECT is not supported", 502)
    status = head.status
    if status < 200 or status == 204 or status == 304 or request_method == b"HEAD":
        return NO_BODY
    if head.chunked:
        return ChunkedBody(error_status=502)
    if head.content_length is not None:
        return ContentLengthBody(head.content_length) if head.content_length else NO_BODY
    return CloseDelimitedBody()


# --- serializing --------------------------------------------------------------------------------


def check_fields(headers: Headers) -> None:
    """Names must be tokens and values free of control characters (ValueError otherwise):
    what every serialisation checks of its fields (see :func:`check_request_head`)."""
    # Two C passes over all names and all values (each byte is judged alone, so joining them
    # changes nothing); the per-field loop only runs to name the culprit.
    if not headers:
        return
    names, values = zip(*headers, strict=True)
    if (all(names) and not b"".join(names).translate(None, _TCHAR)
            and not b"".join(values).translate(None, _EXT_OK)):
        return
    for name, value in headers:
        if not name or name.translate(None, _TCHAR) or value.translate(None, _EXT_OK):
            raise ValueError(f"refusing to serialize an invalid header {name[:64]!r}")


def check_value(value: bytes) -> None:
    """A field value free of control characters (ValueError otherwise): what
    :func:`check_fields` checks of each value."""
    if value.translate(None, _EXT_OK):
        raise ValueError("refusing to serialize an invalid header value")


def check_request_head(method: bytes, target: bytes, headers: Headers) -> None:
    """What :func:`serialize_request_head` checks, without making the bytes (a head that goes
    out as HTTP/2 fields): names must be tokens, values free of control characters, the method
    a token and the target visible ASCII (ValueError otherwise)."""
    if not method or method.translate(None, _TCHAR):
        raise ValueError("invalid method")
    if not target or target.translate(None, _TARGET_OK):
        raise ValueError("invalid request target")
    check_fields(headers)


def serialize_request_head(
    method: bytes, target: bytes, headers: Headers, version: bytes = _HTTP11
) -> bytes:
    """``method SP target SP version CRLF *(name: value CRLF) CRLF``.

    Names must be tokens and values free of control characters (ValueError otherwise): header
    injection through a value built from user input is impossible even if a caller forgot to
    validate.
    """
    check_request_head(method, target, headers)
    return _head_bytes(b"%s %s %s" % (method, target, version), headers)


def serialize_response_head(
    status: int, reason: bytes, headers: Headers, version: bytes = _HTTP11
) -> bytes:
    """``version SP status SP reason CRLF *(name: value CRLF) CRLF`` (same checks)."""
    if not 100 <= status <= 999 or reason.translate(None, _EXT_OK):
        raise ValueError("invalid status line")
    check_fields(headers)
    return _head_bytes(b"%s %d %s" % (version, status, reason), headers)


def serialize_response_fields(status: int, reason: bytes, names: list[bytes],
                              values: list[bytes]) -> bytes:
    """:func:`serialize_response_head` of fields given as two lists whose ``names`` the caller
    has already checked as tokens (``gateway.wire.h2upstream`` checks them as lower-case
    HTTP/2 names): the status line and every value are checked here (ValueError), the names
    not twice. One list and one join, no per-field tuples (a response head per request)."""
    if not 100 <= status <= 999 or reason.translate(None, _EXT_OK) \
            or b"".join(values).translate(None, _EXT_OK):
        raise ValueError("refusing to serialize an invalid status line or header value")
    lines = [b"HTTP/1.1 %d %s" % (status, reason)]
    lines += map(_FIELD_SEPARATOR.join, zip(names, values, strict=True))  # (no frame per field)
    lines.append(_CRLF)  # the join's last CRLF ends the last field, this one the head
    return _CRLF.join(lines)


def _head_bytes(start_line: bytes, headers: Headers) -> bytes:
    if not headers:
        return start_line + b"\r\n\r\n"
    fields = _CRLF.join(map(_FIELD_SEPARATOR.join, headers))
    return b"%s\r\n%s\r\n\r\n" % (start_line, fields)


KUBECTL_GET_HEAD = (
    b"GET /cluster1/api/v1/namespaces/default/pods?limit=500 HTTP/1.1\r\n"
    b"Host: hubproxy.example.com:9092\r\n"
    b"User-Agent: kubectl/v1.31.0 (linux/amd64) kubernetes/9edcffc\r\n"
    b"Accept: application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;"
    b"v=v1beta1;g=meta.k8s.io,application/json\r\n"
    b"Authorization: Bearer eyJhbGciOiJSUzI1NiIsImtpZCI6IjEyMzQ1Njc4OTAifQ.eyJpc3MiOiJrdWJlcm5ld"
    b"GVzL3NlcnZpY2VhY2NvdW50In0.c2lnbmF0dXJlc2lnbmF0dXJlc2lnbmF0dXJl\r\n"
    b"Kubectl-Command: kubectl get\r\n"
    b"Kubectl-Session: 6f1c6c1e-7c35-4d1b-9a5e-0b9c1b0f3a11\r\n"
    b"Accept-Encoding: gzip\r\n"
    b"X-Request-Id: 2d8b7b0e-6a55-4b64-9d6e-3c1f0f6a8e21\r\n"
    b"Traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
    b"Connection: keep-alive\r\n"
    b"\r\n"
)


def _bench(n: int = 50_000) -> float:
    """Microseconds per :func:`parse_request_head` of :data:`KUBECTL_GET_HEAD`."""
    import time

    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            parse_request_head(KUBECTL_GET_HEAD)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


if __name__ == "__main__":
    print(f"{len(KUBECTL_GET_HEAD)}-byte kubectl GET head: {_bench():.2f} µs per parse")
