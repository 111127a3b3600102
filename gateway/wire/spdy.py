"""Just enough SPDY/3 to end a spliced Kubernetes stream (exec/attach over SPDY) properly.

After a ``101`` the gateway relays raw bytes. To tell ``kubectl exec`` why its session ends, it
must put a Status on the session's *error stream*, between the apiserver's frames:

* :class:`FrameBoundary` follows one direction, reading only the 8-byte frame headers (payload
  skipped by counting), and says where the next frame starts;
* with ``read_headers`` (the client-to-server direction) it also inflates the header blocks of
  the client's SYN_STREAM and HEADERS frames -- one zlib stream per direction with the SPDY/3
  dictionary, so every block must be read in order -- to learn which stream the client opened
  with ``streamtype: error`` (:attr:`FrameBoundary.error_stream`). A control frame larger than
  ``MAX_CONTROL_FRAME`` or a header block that does not parse ends the header reading (no
  error stream is known then: the caller closes the connection instead);
* :func:`data_frame` builds the DATA frame (with FIN) that carries the Status.

Sans-IO. The dictionary is the one of the SPDY/3 draft, §2.6.10.1 (kubesim has its own copy:
production code never imports kubesim).
"""

from __future__ import annotations

import struct
import zlib

SYN_STREAM = 1
HEADERS = 8
FLAG_FIN = 0x01
MAX_CONTROL_FRAME = 64 * 1024
MAX_HEADER_BLOCK = 256 * 1024  # inflated


def _header_dictionary() -> bytes:
    """The SPDY/3 zlib dictionary (spec section 2.6.10.1): length-prefixed words, then a tail."""
    words = [
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
        "HTTP/1.1",
        "url",
        "public",
        "set-cookie",
        "keep-alive",
        "origin",
    ]
    tail = (
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417"
        "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently"
        "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error"
        "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct "
        "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,"
        "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
        "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8"
        "charset=iso-8859-1,utf-,*,enq=0."
    )
    out = bytearray()
    for word in words:
        out += struct.pack(">I", len(word)) + word.encode()
    return bytes(out) + tail.encode()


HEADER_DICTIONARY = _header_dictionary()


class FrameBoundary:
    """Follows one direction of a SPDY/3 connection; see the module docstring."""

    __slots__ = ("_control", "_control_kind", "_head", "_inflate", "_remaining", "error_stream")

    def __init__(self, *, read_headers: bool = False) -> None:
        self._head = bytearray()  # a frame header received in part
        self._remaining = 0  # payload bytes of the current frame still to come
        self._control: bytearray | None = None  # a SYN_STREAM/HEADERS payload being collected
        self._control_kind = 0
        self._inflate = zlib.decompressobj(zdict=HEADER_DICTIONARY) if read_headers else None
        self.error_stream: int | None = None

    @property
    def at_boundary(self) -> bool:
        return self._remaining == 0 and not self._head

    def feed(self, data: bytes | bytearray | memoryview, *, until_boundary: bool = False) -> int:
        """Bytes consumed: all of ``data``, or with ``until_boundary`` up to the end of the
        frame in progress (0 if already at a boundary)."""
        pos, n = 0, len(data)
        if until_boundary and self.at_boundary:
            return 0
        while pos < n:
            if self._remaining:
                take = min(self._remaining, n - pos)
                if self._control is not None:
                    self._control += data[pos:pos + take]
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._frame_done()
                    if until_boundary:
                        return pos
                continue
            take = min(8 - len(self._head), n - pos)
            self._head += data[pos:pos + take]
            pos += take
            if len(self._head) == 8:
                self._start_frame(bytes(self._head))
                self._head.clear()
                if not self._remaining:
                    self._frame_done()
                    if until_boundary:
                        return pos
        return pos

    def _start_frame(self, head: bytes) -> None:
        first, flags_length = struct.unpack("!II", head)
        self._remaining = flags_length & 0xFFFFFF
        control = bool(first & 0x80000000)
        kind = first & 0xFFFF
        if (self._inflate is not None and control and kind in (SYN_STREAM, HEADERS)
                and self._remaining <= MAX_CONTROL_FRAME):
            self._control = bytearray()
            self._control_kind = kind
        elif self._inflate is not None and control and kind in (SYN_STREAM, HEADERS):
            self._inflate = None  # too large to follow: header reading ends here

    def _frame_done(self) -> None:
        payload, self._control = self._control, None
        if payload is None or self._inflate is None:
            return
        # SYN_STREAM: stream id, associated id, priority + slot, then the block; HEADERS:
        # stream id, then the block.
        if len(payload) < 4:
            self._inflate = None
            return
        stream_id = struct.unpack_from("!I", payload)[0] & 0x7FFFFFFF
        block = payload[10:] if self._control_kind == SYN_STREAM else payload[4:]
        try:
            headers = _header_block(self._inflate.decompress(bytes(block), MAX_HEADER_BLOCK))
        except (zlib.error, ValueError, struct.error):
            self._inflate = None
            return
        if headers.get(b"streamtype") == b"error":
            self.error_stream = stream_id
            self._inflate = None  # found: nothing more to read in headers


def _header_block(block: bytes) -> dict[bytes, bytes]:
    """A SPDY/3 name/value block (32-bit counts and lengths); raises ValueError if malformed."""
    (count,), pos = struct.unpack_from("!I", block), 4
    out: dict[bytes, bytes] = {}
    for _ in range(count):
        (size,) = struct.unpack_from("!I", block, pos)
        name = block[pos + 4:pos + 4 + size]
        pos += 4 + size
        (size,) = struct.unpack_from("!I", block, pos)
        value = block[pos + 4:pos + 4 + size]
        pos += 4 + size
        if pos > len(block):
            raise ValueError("header block truncated")
        out[name.lower()] = value
    return out


def data_frame(stream_id: int, payload: bytes, *, fin: bool = True) -> bytes:
    return struct.pack("!II", stream_id & 0x7FFFFFFF,
                       ((FLAG_FIN if fin else 0) << 24) | len(payload)) + payload
