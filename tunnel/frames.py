"""Sans-IO frame codec (PROTOCOL.md, "Frames"). Pure functions over bytes, no state.

Header, 12 bytes, big-endian::

    length u32 | type u8 | flags u8 | reserved u16 (0) | stream_id u32 (top bit 0)

``length`` counts the payload only. ``decode_frames`` checks every length against the limit
*before* waiting for the payload, so a peer cannot make us buffer more than one maximum frame.
Encoders return small ``bytes`` headers; DATA payloads are never copied (the header and the
caller's buffer go to ``transport.writelines`` side by side).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from tunnel.errors import (
    BadFlags,
    BadFrameLength,
    BadSettings,
    BadStreamId,
    FrameTooLarge,
    MetadataTooLarge,
    TruncatedPayload,
    UnknownFrameType,
)
from tunnel.targets import Target, decode_target, encode_target

HEADER = struct.Struct("!IBBHI")
HEADER_SIZE = HEADER.size  # 12

# Frame types.
(SETTINGS, OPEN, OPEN_ACK, OPEN_FAIL, DATA, WINDOW_UPDATE, RESET, PING, PONG, GOAWAY,
 DRAIN) = range(11)
TYPE_NAMES = ("SETTINGS", "OPEN", "OPEN_ACK", "OPEN_FAIL", "DATA", "WINDOW_UPDATE", "RESET",
              "PING", "PONG", "GOAWAY", "DRAIN")

# Flags.
FLAG_FIN = 0x01  # OPEN, DATA: the sender's direction ends with this frame
FLAG_ACK = 0x01  # SETTINGS: acknowledges the peer's SETTINGS (empty payload)
ALLOWED_FLAGS = {SETTINGS: FLAG_ACK, OPEN: FLAG_FIN, DATA: FLAG_FIN}

# Settings identifiers.
S_INITIAL_WINDOW, S_MAX_FRAME_SIZE, S_MAX_CONCURRENT_STREAMS, S_MAX_METADATA_SIZE = 1, 2, 3, 4
# Sent by the hub only: which hub process this session reached, and how many share its address
# (several gateway workers or replicas): an agent keeps one session to each.
S_HUB_INSTANCE, S_HUB_INSTANCES = 5, 6
# Sent by the agent only, for the hub's view of its fleet: the agent's release (major << 24 |
# minor << 16 | patch) and a random id of the agent process (its replicas differ).
S_AGENT_VERSION, S_AGENT_INSTANCE = 7, 8
MAX_HUB_INSTANCES = 64
MAX_WINDOW = 2**31 - 1
MIN_FRAME_SIZE, MAX_FRAME_SIZE_LIMIT = 16 * 1024, 16 * 1024 * 1024
DEFAULT_INITIAL_WINDOW = 256 * 1024
DEFAULT_MAX_FRAME_SIZE = 64 * 1024
DEFAULT_MAX_CONCURRENT_STREAMS = 10_000
DEFAULT_MAX_METADATA_SIZE = 16 * 1024
CONNECTION_WINDOW = 16 * 1024 * 1024  # fixed; returned on receipt
MAX_OPEN_FAIL_MESSAGE = 1024
MAX_GOAWAY_MESSAGE = 1024
PING_PAYLOAD = 8

_U32 = struct.Struct("!I")
_U16 = struct.Struct("!H")
_SETTING = struct.Struct("!HI")
_GOAWAY = struct.Struct("!II")

# Types that must use stream 0 / must not.
_CONNECTION_TYPES = frozenset((SETTINGS, PING, PONG, GOAWAY, DRAIN))


def header(ftype: int, flags: int, stream_id: int, length: int) -> bytes:
    return HEADER.pack(length, ftype, flags, 0, stream_id)


def encode_settings(settings: dict[int, int]) -> bytes:
    payload = b"".join(_SETTING.pack(k, v) for k, v in sorted(settings.items()))
    return header(SETTINGS, 0, 0, len(payload)) + payload


def encode_settings_ack() -> bytes:
    return header(SETTINGS, FLAG_ACK, 0, 0)


def encode_open_payload(target: Target, metadata: bytes, initial_data: bytes = b"") -> bytes:
    tgt = encode_target(target)
    return tgt + _U16.pack(len(metadata)) + metadata + initial_data


def encode_open(stream_id: int, target: Target, metadata: bytes, initial_data: bytes = b"",
                fin: bool = False) -> bytes:
    payload = encode_open_payload(target, metadata, initial_data)
    return header(OPEN, FLAG_FIN if fin else 0, stream_id, len(payload)) + payload


def encode_open_ack(stream_id: int) -> bytes:
    return header(OPEN_ACK, 0, stream_id, 0)


def encode_open_fail(stream_id: int, code: int, message: str = "") -> bytes:
    msg = message.encode("utf-8", "replace")[:MAX_OPEN_FAIL_MESSAGE]
    return header(OPEN_FAIL, 0, stream_id, 2 + len(msg)) + _U16.pack(code) + msg


def data_header(stream_id: int, length: int, fin: bool = False) -> bytes:
    return HEADER.pack(length, DATA, FLAG_FIN if fin else 0, 0, stream_id)


def encode_data(stream_id: int, data: bytes, fin: bool = False) -> bytes:
    return data_header(stream_id, len(data), fin) + data


def encode_window_update(stream_id: int, increment: int) -> bytes:
    return header(WINDOW_UPDATE, 0, stream_id, 4) + _U32.pack(increment)


def encode_reset(stream_id: int, code: int) -> bytes:
    return header(RESET, 0, stream_id, 4) + _U32.pack(code)


def encode_ping(opaque: bytes) -> bytes:
    return header(PING, 0, 0, PING_PAYLOAD) + opaque


def encode_pong(opaque: bytes | memoryview) -> bytes:
    return header(PONG, 0, 0, PING_PAYLOAD) + bytes(opaque)


def encode_goaway(last_stream_id: int, code: int, message: str = "") -> bytes:
    msg = message.encode("utf-8", "replace")[:MAX_GOAWAY_MESSAGE]
    return header(GOAWAY, 0, 0, 8 + len(msg)) + _GOAWAY.pack(last_stream_id, code) + msg


def encode_drain() -> bytes:
    return header(DRAIN, 0, 0, 0)


class Frame:
    """One decoded frame. ``payload`` is a memoryview into the receive buffer: valid only until
    the caller hands control back to the buffer owner (copy it to keep it)."""

    __slots__ = ("flags", "payload", "stream_id", "type")

    def __init__(self, ftype: int, flags: int, stream_id: int, payload: memoryview) -> None:
        self.type = ftype
        self.flags = flags
        self.stream_id = stream_id
        self.payload = payload

    def __repr__(self) -> str:
        return (f"Frame({TYPE_NAMES[self.type]}, flags={self.flags:#x}, "
                f"stream={self.stream_id}, len={len(self.payload)})")


def decode_frames(buf: memoryview, max_frame_size: int) -> Iterator[tuple[Frame, int]]:
    """Yield ``(frame, end_offset)`` for each complete frame at the start of ``buf``.

    Stops at the first incomplete frame. Raises a ``ProtocolError`` subclass as soon as a header
    is invalid, even if its payload has not arrived yet (so nothing is buffered for it).
    """
    offset, end = 0, len(buf)
    unpack = HEADER.unpack_from
    while end - offset >= HEADER_SIZE:
        length, ftype, flags, reserved, stream_id = unpack(buf, offset)
        check_header(length, ftype, flags, reserved, stream_id, max_frame_size)
        start = offset + HEADER_SIZE
        if end - start < length:
            return
        offset = start + length
        yield Frame(ftype, flags, stream_id, buf[start:offset]), offset


def check_header(length: int, ftype: int, flags: int, reserved: int, stream_id: int,
                 max_frame_size: int) -> None:
    if ftype > DRAIN:
        raise UnknownFrameType(f"unknown frame type {ftype}")
    if length > max_frame_size:
        raise FrameTooLarge(f"{TYPE_NAMES[ftype]} of {length} bytes > max {max_frame_size}")
    if reserved or stream_id & 0x80000000:
        raise BadFlags("reserved header bits set")
    if flags & ~ALLOWED_FLAGS.get(ftype, 0):
        raise BadFlags(f"flags {flags:#x} not allowed on {TYPE_NAMES[ftype]}")
    if ftype in _CONNECTION_TYPES:
        if stream_id:
            raise BadStreamId(f"{TYPE_NAMES[ftype]} on stream {stream_id}, must be 0")
    elif ftype != WINDOW_UPDATE and not stream_id:
        raise BadStreamId(f"{TYPE_NAMES[ftype]} on stream 0")
    fixed = _FIXED_LENGTH.get(ftype)
    if fixed is not None and length != fixed:
        raise BadFrameLength(f"{TYPE_NAMES[ftype]} payload {length} bytes, must be {fixed}")
    if ftype == SETTINGS and (length % _SETTING.size or (flags & FLAG_ACK and length)):
        raise BadFrameLength(f"SETTINGS payload {length} bytes")
    if ftype == OPEN_FAIL and not 2 <= length <= 2 + MAX_OPEN_FAIL_MESSAGE:
        raise BadFrameLength(f"OPEN_FAIL payload {length} bytes")
    if ftype == GOAWAY and not 8 <= length <= 8 + MAX_GOAWAY_MESSAGE:
        raise BadFrameLength(f"GOAWAY payload {length} bytes")


_FIXED_LENGTH = {OPEN_ACK: 0, WINDOW_UPDATE: 4, RESET: 4, PING: PING_PAYLOAD,
                 PONG: PING_PAYLOAD, DRAIN: 0}


# Payload parsers (the header was already checked by check_header).

def parse_settings(payload: memoryview) -> dict[int, int]:
    out: dict[int, int] = {}
    for i in range(0, len(payload), _SETTING.size):
        key, value = _SETTING.unpack_from(payload, i)
        check_setting(key, value)
        out[key] = value
    return out


def check_setting(key: int, value: int) -> None:
    if key == S_INITIAL_WINDOW:
        ok = 1024 <= value <= MAX_WINDOW
    elif key == S_MAX_FRAME_SIZE:
        ok = MIN_FRAME_SIZE <= value <= MAX_FRAME_SIZE_LIMIT
    elif key == S_MAX_CONCURRENT_STREAMS:
        ok = value <= 1_000_000
    elif key == S_MAX_METADATA_SIZE:
        ok = 256 <= value <= 1024 * 1024
    elif key == S_HUB_INSTANCE:
        ok = value != 0
    elif key == S_HUB_INSTANCES:
        ok = 1 <= value <= MAX_HUB_INSTANCES
    elif key in (S_AGENT_VERSION, S_AGENT_INSTANCE):
        ok = value != 0
    else:
        ok = True  # unknown settings are ignored, so later versions can add some
    if not ok:
        raise BadSettings(f"setting {key} = {value} out of range")


def parse_open(payload: memoryview, max_metadata: int) -> tuple[Target, bytes, memoryview]:
    """Return (target, metadata, initial_data view)."""
    target, offset = decode_target(payload)
    if offset + 2 > len(payload):
        raise TruncatedPayload("OPEN ends before the metadata length")
    (mlen,) = _U16.unpack_from(payload, offset)
    offset += 2
    if mlen > max_metadata:
        raise MetadataTooLarge(f"OPEN metadata {mlen} bytes > {max_metadata}")
    if offset + mlen > len(payload):
        raise TruncatedPayload("OPEN metadata truncated")
    return target, bytes(payload[offset:offset + mlen]), payload[offset + mlen:]


def parse_u32(payload: memoryview) -> int:
    value: int = _U32.unpack_from(payload)[0]
    return value


def parse_open_fail(payload: memoryview) -> tuple[int, str]:
    (code,) = _U16.unpack_from(payload)
    return code, bytes(payload[2:]).decode("utf-8", "replace")


def parse_goaway(payload: memoryview) -> tuple[int, int, str]:
    last, code = _GOAWAY.unpack_from(payload)
    return last, code, bytes(payload[8:]).decode("utf-8", "replace")
