"""SPDY/3.1 framing, sans-IO: bytes in, frames out; frames in, bytes out.

Only what Kubernetes streaming (exec/attach/port-forward via moby/spdystream) needs, but every
frame type of SPDY/3 is parsed so a peer's SETTINGS, PING or WINDOW_UPDATE never breaks us.

Wire format (draft-mbelshe-httpbis-spdy-00 / SPDY/3):
  control frame: |1|version(15)|type(16)|flags(8)|length(24)|payload
  data frame:    |0|stream-id(31)|flags(8)|length(24)|payload
Header blocks (SYN_STREAM, SYN_REPLY, HEADERS) are
  uint32 count, then per pair: uint32 len, name, uint32 len, value (several values joined by NUL),
compressed with one zlib stream per direction for the whole connection (SYNC_FLUSH after each
block), primed with the SPDY/3 dictionary. Names must be lowercase: Go's framer rejects others.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from enum import IntEnum

VERSION = 3
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
FLAG_SETTINGS_CLEAR = 0x01
MAX_FRAME_LENGTH = (1 << 24) - 1
DEFAULT_MAX_FRAME = 1 << 20  # we never need more; a larger frame is a broken or hostile peer
MAX_HEADER_BLOCK = 256 * 1024  # decompressed; guards against zlib bombs


class FrameType(IntEnum):
    SYN_STREAM = 1
    SYN_REPLY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PING = 6
    GOAWAY = 7
    HEADERS = 8
    WINDOW_UPDATE = 9


class RstStatus(IntEnum):
    PROTOCOL_ERROR = 1
    INVALID_STREAM = 2
    REFUSED_STREAM = 3
    UNSUPPORTED_VERSION = 4
    CANCEL = 5
    INTERNAL_ERROR = 6
    FLOW_CONTROL_ERROR = 7
    STREAM_IN_USE = 8
    STREAM_ALREADY_CLOSED = 9
    INVALID_CREDENTIALS = 10
    FRAME_TOO_LARGE = 11


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


class SpdyError(Exception):
    """The peer broke SPDY framing; the connection cannot continue."""


class UnsupportedVersion(SpdyError):
    pass


class FrameTooLarge(SpdyError):
    pass


class MalformedFrame(SpdyError):
    pass


class HeaderBlockError(SpdyError):
    pass


Headers = tuple[tuple[str, str], ...]  # lowercase names; one entry per value


@dataclass(frozen=True)
class SynStream:
    stream_id: int
    headers: Headers = ()
    associated_id: int = 0
    priority: int = 0
    slot: int = 0
    fin: bool = False
    unidirectional: bool = False


@dataclass(frozen=True)
class SynReply:
    stream_id: int
    headers: Headers = ()
    fin: bool = False


@dataclass(frozen=True)
class HeadersFrame:
    stream_id: int
    headers: Headers = ()
    fin: bool = False


@dataclass(frozen=True)
class RstStream:
    stream_id: int
    status: int


@dataclass(frozen=True)
class Settings:
    entries: tuple[tuple[int, int, int], ...] = ()  # (flags, id, value)
    clear: bool = False


@dataclass(frozen=True)
class Ping:
    ping_id: int


@dataclass(frozen=True)
class GoAway:
    last_good_stream_id: int
    status: int = 0


@dataclass(frozen=True)
class WindowUpdate:
    stream_id: int
    delta: int


@dataclass(frozen=True)
class Data:
    stream_id: int
    data: bytes = b""
    fin: bool = False


Frame = (
    SynStream | SynReply | HeadersFrame | RstStream | Settings | Ping | GoAway | WindowUpdate | Data
)


def header_value(headers: Headers, name: str) -> str | None:
    """First value of `name` (case-insensitive), or None."""
    name = name.lower()
    for key, value in headers:
        if key == name:
            return value
    return None


def _pack_header_block(headers: Headers) -> bytes:
    grouped: dict[str, list[str]] = {}
    for name, value in headers:
        grouped.setdefault(name.lower(), []).append(value)
    out = bytearray(struct.pack(">I", len(grouped)))
    for name, values in grouped.items():
        raw_name = name.encode()
        raw_value = b"\x00".join(v.encode() for v in values)
        out += struct.pack(">I", len(raw_name)) + raw_name
        out += struct.pack(">I", len(raw_value)) + raw_value
    return bytes(out)


def _unpack_header_block(block: bytes) -> Headers:
    view = memoryview(block)
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(view):
            raise HeaderBlockError("header block truncated")
        chunk = bytes(view[pos : pos + n])
        pos += n
        return chunk

    (count,) = struct.unpack(">I", take(4))
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for _ in range(count):
        (name_len,) = struct.unpack(">I", take(4))
        name = take(name_len).decode("latin-1")
        (value_len,) = struct.unpack(">I", take(4))
        value = take(value_len).decode("latin-1")
        if not name:
            raise HeaderBlockError("empty header name")
        if name != name.lower():
            raise HeaderBlockError(f"header name {name!r} is not lowercase")
        if name in seen:
            raise HeaderBlockError(f"header {name!r} appears twice")
        seen.add(name)
        pairs.extend((name, v) for v in value.split("\x00"))
    if pos != len(view):
        raise HeaderBlockError("trailing bytes after the header block")
    return tuple(pairs)


class FrameEncoder:
    """Serialises frames; owns this direction's header compressor (one per connection)."""

    def __init__(self) -> None:
        self._zlib = zlib.compressobj(
            zlib.Z_BEST_COMPRESSION, zlib.DEFLATED, 15, zdict=HEADER_DICTIONARY
        )

    def _block(self, headers: Headers) -> bytes:
        raw = _pack_header_block(headers)
        return self._zlib.compress(raw) + self._zlib.flush(zlib.Z_SYNC_FLUSH)

    @staticmethod
    def _control(kind: FrameType, flags: int, payload: bytes) -> bytes:
        if len(payload) > MAX_FRAME_LENGTH:
            raise FrameTooLarge(f"control payload of {len(payload)} bytes")
        return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(payload)) + payload

    def encode(self, frame: Frame) -> bytes:
        match frame:
            case Data(stream_id, data, fin):
                if len(data) > MAX_FRAME_LENGTH:
                    raise FrameTooLarge(f"data payload of {len(data)} bytes")
                flags = FLAG_FIN if fin else 0
                return struct.pack(
                    ">II", stream_id & 0x7FFFFFFF, (flags << 24) | len(data)
                ) + bytes(data)
            case SynStream():
                flags = (FLAG_FIN if frame.fin else 0) | (
                    FLAG_UNIDIRECTIONAL if frame.unidirectional else 0
                )
                payload = struct.pack(
                    ">IIBB",
                    frame.stream_id & 0x7FFFFFFF,
                    frame.associated_id & 0x7FFFFFFF,
                    (frame.priority & 0x7) << 5,
                    frame.slot,
                )
                return self._control(
                    FrameType.SYN_STREAM, flags, payload + self._block(frame.headers)
                )
            case SynReply(stream_id, headers, fin):
                return self._control(
                    FrameType.SYN_REPLY,
                    FLAG_FIN if fin else 0,
                    struct.pack(">I", stream_id) + self._block(headers),
                )
            case HeadersFrame(stream_id, headers, fin):
                return self._control(
                    FrameType.HEADERS,
                    FLAG_FIN if fin else 0,
                    struct.pack(">I", stream_id) + self._block(headers),
                )
            case RstStream(stream_id, status):
                return self._control(FrameType.RST_STREAM, 0, struct.pack(">II", stream_id, status))
            case Settings(entries, clear):
                payload = struct.pack(">I", len(entries)) + b"".join(
                    struct.pack(">II", (flags << 24) | ident, value)
                    for flags, ident, value in entries
                )
                return self._control(
                    FrameType.SETTINGS, FLAG_SETTINGS_CLEAR if clear else 0, payload
                )
            case Ping(ping_id):
                return self._control(FrameType.PING, 0, struct.pack(">I", ping_id))
            case GoAway(last, status):
                return self._control(FrameType.GOAWAY, 0, struct.pack(">II", last, status))
            case WindowUpdate(stream_id, delta):
                return self._control(
                    FrameType.WINDOW_UPDATE, 0, struct.pack(">II", stream_id, delta)
                )
        raise TypeError(f"not a SPDY frame: {frame!r}")


@dataclass
class FrameDecoder:
    """Incremental parser: `feed(bytes)` returns every complete frame, keeps the rest.

    Unknown control frame types are skipped (as SPDY/3 requires). Raises a `SpdyError`
    subclass on anything that cannot be SPDY/3; after that the decoder must not be used.
    """

    max_frame_size: int = DEFAULT_MAX_FRAME
    _buffer: bytearray = field(default_factory=bytearray)
    _zlib: zlib._Decompress = field(
        default_factory=lambda: zlib.decompressobj(zdict=HEADER_DICTIONARY)
    )

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        while len(self._buffer) >= 8:
            first, flags_length = struct.unpack_from(">II", self._buffer)
            length = flags_length & 0xFFFFFF
            if length > self.max_frame_size:
                raise FrameTooLarge(f"frame of {length} bytes (limit {self.max_frame_size})")
            if len(self._buffer) < 8 + length:
                break
            payload = bytes(self._buffer[8 : 8 + length])
            del self._buffer[: 8 + length]
            flags = flags_length >> 24
            if first & 0x80000000:
                frame = self._control(first, flags, payload)
                if frame is not None:
                    frames.append(frame)
            else:
                frames.append(Data(first & 0x7FFFFFFF, payload, bool(flags & FLAG_FIN)))
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def _headers(self, block: bytes) -> Headers:
        try:
            raw = self._zlib.decompress(block, MAX_HEADER_BLOCK)
        except zlib.error as exc:
            raise HeaderBlockError(f"header block does not inflate: {exc}") from exc
        if self._zlib.unconsumed_tail:
            raise HeaderBlockError(f"header block larger than {MAX_HEADER_BLOCK} bytes")
        return _unpack_header_block(raw)

    def _control(self, first: int, flags: int, payload: bytes) -> Frame | None:
        version = (first >> 16) & 0x7FFF
        kind = first & 0xFFFF
        if version != VERSION:
            raise UnsupportedVersion(f"SPDY version {version}")

        def need(n: int) -> None:
            if len(payload) < n:
                raise MalformedFrame(f"{FrameType(kind).name} payload of {len(payload)} bytes")

        match kind:
            case FrameType.SYN_STREAM:
                need(10)
                sid, assoc, pri, slot = struct.unpack_from(">IIBB", payload)
                return SynStream(
                    sid & 0x7FFFFFFF,
                    self._headers(payload[10:]),
                    assoc & 0x7FFFFFFF,
                    pri >> 5,
                    slot,
                    bool(flags & FLAG_FIN),
                    bool(flags & FLAG_UNIDIRECTIONAL),
                )
            case FrameType.SYN_REPLY | FrameType.HEADERS:
                need(4)
                (sid,) = struct.unpack_from(">I", payload)
                cls = SynReply if kind == FrameType.SYN_REPLY else HeadersFrame
                return cls(sid & 0x7FFFFFFF, self._headers(payload[4:]), bool(flags & FLAG_FIN))
            case FrameType.RST_STREAM:
                need(8)
                sid, status = struct.unpack_from(">II", payload)
                return RstStream(sid & 0x7FFFFFFF, status)
            case FrameType.SETTINGS:
                need(4)
                (count,) = struct.unpack_from(">I", payload)
                if len(payload) != 4 + 8 * count:
                    raise MalformedFrame(f"SETTINGS with {count} entries in {len(payload)} bytes")
                entries = []
                for i in range(count):
                    flag_id, value = struct.unpack_from(">II", payload, 4 + 8 * i)
                    entries.append((flag_id >> 24, flag_id & 0xFFFFFF, value))
                return Settings(tuple(entries), bool(flags & FLAG_SETTINGS_CLEAR))
            case FrameType.PING:
                need(4)
                return Ping(struct.unpack_from(">I", payload)[0])
            case FrameType.GOAWAY:
                need(4)
                (last,) = struct.unpack_from(">I", payload)
                status = struct.unpack_from(">I", payload, 4)[0] if len(payload) >= 8 else 0
                return GoAway(last & 0x7FFFFFFF, status)
            case FrameType.WINDOW_UPDATE:
                need(8)
                sid, delta = struct.unpack_from(">II", payload)
                return WindowUpdate(sid & 0x7FFFFFFF, delta & 0x7FFFFFFF)
        return None
