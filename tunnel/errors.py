"""Typed tunnel errors: wire codes (OPEN_FAIL, RESET, GOAWAY) and the exceptions raised for them.

Every way a peer can break the protocol has its own ``ProtocolError`` subclass, so tests (and
logs) say which rule was broken. Each subclass carries the ``GoAwayCode`` sent before closing.
"""

from __future__ import annotations

from enum import IntEnum


class OpenErrorCode(IntEnum):
    """Why an OPEN was refused (OPEN_FAIL payload). Callers map these, never the message."""

    DENIED = 1
    UNREACHABLE = 2
    TIMEOUT = 3
    OVERLOAD = 4
    NO_IDENTITY = 5
    PROTOCOL = 6
    SHUTTING_DOWN = 7
    INTERNAL = 8


class ResetCode(IntEnum):
    """Why a stream was reset (RESET payload)."""

    CANCEL = 1
    PROTOCOL = 2
    FLOW_CONTROL = 3
    INTERNAL = 4
    SESSION_CLOSED = 5
    TIMEOUT = 6
    REFUSED = 7


class GoAwayCode(IntEnum):
    """Why a session is going away (GOAWAY payload)."""

    NO_ERROR = 0
    PROTOCOL = 1
    FLOW_CONTROL = 2
    FLOOD = 3
    INTERNAL = 4
    TIMEOUT = 5
    UNAUTHORIZED = 6  # the hub refuses the agent's certificate (names no cluster)


class TunnelError(Exception):
    """Base of every tunnel error."""


class ProtocolError(TunnelError):
    """The peer broke the wire protocol; the session sends GOAWAY(code) and closes."""

    code: GoAwayCode = GoAwayCode.PROTOCOL


class UnknownFrameType(ProtocolError):
    """A frame type this version does not define."""


class BadFrameLength(ProtocolError):
    """A frame whose payload length does not fit its type (too short, too long, not a multiple)."""


class FrameTooLarge(ProtocolError):
    """A frame larger than the max frame size we advertised (checked before buffering)."""


class BadFlags(ProtocolError):
    """Flags or reserved bits set that the frame type does not allow."""


class BadStreamId(ProtocolError):
    """Stream id 0 where a stream is required (or non-zero where it is forbidden), wrong parity,
    or an OPEN that reuses or goes backwards in ids."""


class StreamStateError(ProtocolError):
    """A frame not allowed in the stream's state (DATA after FIN, ACK for an unknown OPEN)."""


class WindowExceeded(ProtocolError):
    """The peer sent more than the stream or connection window allowed."""

    code = GoAwayCode.FLOW_CONTROL


class WindowOverflow(ProtocolError):
    """A WINDOW_UPDATE of zero, or one that pushes a window beyond 2**31-1."""

    code = GoAwayCode.FLOW_CONTROL


class BadSettings(ProtocolError):
    """An unknown-range or out-of-range SETTINGS value."""


class TruncatedPayload(ProtocolError):
    """A payload that ends inside one of its fields."""


class BadTargetEncoding(ProtocolError):
    """An OPEN whose target does not decode (unknown kind, bad name, bad port, bad UTF-8)."""


class MetadataTooLarge(ProtocolError):
    """OPEN metadata or initial data over the advertised limits."""


class FloodError(ProtocolError):
    """Control frames (PING, SETTINGS, RESET, refused OPENs) arriving faster than allowed."""

    code = GoAwayCode.FLOOD


class StreamError(TunnelError):
    """A stream ended abnormally; passed to ``StreamProtocol.connection_lost``."""


class OpenRefused(StreamError):
    """The peer answered OPEN with OPEN_FAIL."""

    def __init__(self, code: OpenErrorCode, message: str = "") -> None:
        name = OpenErrorCode(code).name
        super().__init__(f"{name}: {message}" if message else name)
        self.code = OpenErrorCode(code)
        self.message = message


class StreamReset(StreamError):
    """The stream was reset (by the peer, or locally because of a stream-level problem)."""

    def __init__(self, code: ResetCode, message: str = "") -> None:
        super().__init__(f"{ResetCode(code).name}: {message}" if message else ResetCode(code).name)
        self.code = ResetCode(code)
        self.message = message


class SessionClosed(StreamError):
    """The session ended (closed, peer dead, protocol error, drain deadline) under the stream."""
