"""HTTP/1.1 message framing as the agent needs it: heads parsed strictly, bodies only delimited.

The agent relays bytes verbatim; it must only know (a) the request head, to rewrite identity
headers, and (b) where each request and response ends, so that a connection goes back to the
pool only between complete messages and no byte past the end of a request body reaches the
apiserver (a smuggled second request would ride on the agent's connection).

Contracts:

* :func:`parse_request_head` / :func:`parse_response_head` take a complete head (through the
  blank line) and raise :class:`MessageError` for anything a strict server refuses: bad request
  line, obs-fold, control characters, duplicate differing ``Content-Length``, ``Content-Length``
  with ``Transfer-Encoding``, a transfer coding other than ``chunked``.
* A :class:`BodyTracker` is fed the bytes after the head and returns how many of them belong to
  the message; ``complete`` turns true exactly at its end. It never copies body data except a
  bounded chunk-size line or trailer line split across reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LINE = 8192  # a chunk-size or trailer line longer than this is refused
MAX_TRAILER_BYTES = 65536

_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_TARGET = re.compile(rb"^[\x21-\x7e]+$")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_STATUS_LINE = re.compile(rb"^HTTP/1\.([01]) ([0-9]{3})(?: ([\x09\x20-\x7e\x80-\xff]*))?$")
_CHUNK_SIZE = re.compile(rb"^([0-9A-Fa-f]{1,16})[ \t]*(?:;[\x09\x20-\x7e\x80-\xff]*)?$")

Headers = list[tuple[bytes, bytes]]


class MessageError(ValueError):
    """A message the agent refuses to relay; ``status`` is what a server would answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def find_head_end(buf: bytes | bytearray, start: int = 0) -> int:
    """Index just past the blank line ending the head, or -1 if not there yet."""
    i = buf.find(b"\r\n\r\n", max(0, start - 3))
    return -1 if i < 0 else i + 4


def _parse_fields(lines: list[bytes]) -> Headers:
    headers: Headers = []
    for line in lines:
        if not line:
            continue
        if line[:1] in (b" ", b"\t"):
            raise MessageError("obsolete line folding in header")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise MessageError("malformed header line")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise MessageError("control character in header value")
        headers.append((name, value))
    return headers


def _split_head(head: bytes) -> list[bytes]:
    if not head.endswith(b"\r\n\r\n"):
        raise MessageError("incomplete head")
    lines = head[:-4].split(b"\r\n")
    if any(b"\n" in line or b"\r" in line for line in lines):
        raise MessageError("bare CR or LF in head")
    return lines


def header_values(headers: Headers, name: bytes) -> list[bytes]:
    lowered = name.lower()
    return [v for k, v in headers if k.lower() == lowered]


def _tokens(headers: Headers, name: bytes) -> list[bytes]:
    out: list[bytes] = []
    for value in header_values(headers, name):
        out.extend(t.strip().lower() for t in value.split(b",") if t.strip())
    return out


@dataclass
class Framing:
    """How a body is delimited: ``length`` bytes, ``chunked``, or until close."""

    length: int | None = 0
    chunked: bool = False
    until_close: bool = False


def _body_framing(headers: Headers, *, response: bool) -> Framing:
    te = _tokens(headers, b"transfer-encoding")
    cls = header_values(headers, b"content-length")
    if te:
        if cls:
            raise MessageError("both Content-Length and Transfer-Encoding")
        if te != [b"chunked"]:
            if response and te[-1] != b"chunked":
                return Framing(length=None, until_close=True)
            raise MessageError("unsupported Transfer-Encoding", status=501)
        return Framing(length=None, chunked=True)
    if cls:
        values = {v.strip() for c in cls for v in c.split(b",")}
        if len(values) != 1:
            raise MessageError("conflicting Content-Length values")
        value = values.pop()
        if not value.isdigit() or len(value) > 18:
            raise MessageError("malformed Content-Length")
        return Framing(length=int(value))
    if response:
        return Framing(length=None, until_close=True)
    return Framing(length=0)


@dataclass
class RequestHead:
    method: bytes
    target: bytes
    headers: Headers
    framing: Framing
    upgrade: bool  # Connection: upgrade + Upgrade: ... (the response may be 101)


def parse_request_head(head: bytes) -> RequestHead:
    lines = _split_head(head)
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise MessageError("malformed request line")
    method, target, version = parts
    if not _TOKEN.match(method) or not _TARGET.match(target):
        raise MessageError("malformed request line")
    if version != b"HTTP/1.1":
        raise MessageError("only HTTP/1.1 crosses the tunnel", status=505)
    headers = _parse_fields(lines[1:])
    upgrade = b"upgrade" in _tokens(headers, b"connection") and bool(
        header_values(headers, b"upgrade")
    )
    return RequestHead(method, target, headers, _body_framing(headers, response=False), upgrade)


@dataclass
class ResponseHead:
    status: int
    headers: Headers
    framing: Framing
    keep_alive: bool


def parse_response_head(head: bytes, request_method: bytes) -> ResponseHead:
    lines = _split_head(head)
    match = _STATUS_LINE.match(lines[0])
    if match is None:
        raise MessageError("malformed status line", status=502)
    minor, status = match.group(1), int(match.group(2))
    try:
        headers = _parse_fields(lines[1:])
    except MessageError as exc:
        raise MessageError(str(exc), status=502) from None
    connection = _tokens(headers, b"connection")
    keep_alive = minor == b"1" and b"close" not in connection
    if status < 200 or status in (204, 304) or request_method == b"HEAD":
        framing = Framing(length=0)
    else:
        try:
            framing = _body_framing(headers, response=True)
        except MessageError as exc:
            raise MessageError(str(exc), status=502) from None
    if framing.until_close:
        keep_alive = False
    return ResponseHead(status, headers, framing, keep_alive)


def serialize_request_head(method: bytes, target: bytes, headers: Headers) -> bytes:
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        parts += [name, b": ", value, b"\r\n"]
    parts.append(b"\r\n")
    return b"".join(parts)


class BodyTracker:
    """Finds the end of one message body in a byte stream, incrementally."""

    # chunked states
    _SIZE, _DATA, _DATA_CRLF, _TRAILER = range(4)

    def __init__(self, framing: Framing) -> None:
        self.framing = framing
        self.remaining = framing.length or 0
        self.complete = not framing.chunked and not framing.until_close and self.remaining == 0
        self._state = self._SIZE
        self._line = bytearray()
        self._trailer_bytes = 0

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        """How many leading bytes of ``data`` belong to this body (all of them until it ends)."""
        if self.complete:
            return 0
        if self.framing.until_close:
            return len(data)
        if not self.framing.chunked:
            take = min(self.remaining, len(data))
            self.remaining -= take
            self.complete = self.remaining == 0
            return take
        return self._feed_chunked(memoryview(data))

    def _feed_chunked(self, view: memoryview) -> int:
        pos, end = 0, len(view)
        while pos < end and not self.complete:
            if self._state == self._DATA:
                take = min(self.remaining, end - pos)
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self._state = self._DATA_CRLF
                continue
            # Line-oriented states: size line, CRLF after data, trailer lines.
            nl = bytes(view[pos : min(end, pos + MAX_LINE + 2)]).find(b"\n")
            if nl < 0:
                self._line += view[pos:end]
                if len(self._line) > MAX_LINE:
                    raise MessageError("chunk line too long")
                return end
            self._line += view[pos : pos + nl + 1]
            pos += nl + 1
            line = bytes(self._line)
            self._line.clear()
            if len(line) > MAX_LINE + 2 or not line.endswith(b"\r\n"):
                raise MessageError("malformed chunk framing")
            line = line[:-2]
            if self._state == self._DATA_CRLF:
                if line:
                    raise MessageError("missing CRLF after chunk data")
                self._state = self._SIZE
            elif self._state == self._SIZE:
                match = _CHUNK_SIZE.match(line)
                if match is None:
                    raise MessageError("malformed chunk size")
                size = int(match.group(1), 16)
                if size == 0:
                    self._state = self._TRAILER
                else:
                    self.remaining = size
                    self._state = self._DATA
            else:  # trailer section ends with an empty line
                if not line:
                    self.complete = True
                    break
                self._trailer_bytes += len(line)
                if self._trailer_bytes > MAX_TRAILER_BYTES:
                    raise MessageError("trailers too large")
                _parse_fields([line])
        return pos
