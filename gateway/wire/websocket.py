"""Just enough WebSocket (RFC 6455) to end a spliced stream properly: frame boundaries and the
frames a server sends to say goodbye.

After a ``101`` the gateway relays raw bytes. To close such a stream itself (the caller's
access was revoked) it must write its own frames *between* the apiserver's frames, never inside
one: :class:`FrameBoundary` follows the server-to-client byte stream, reading only frame
headers (payload is skipped by counting, never buffered), and says where the next frame
starts. Sans-IO: bytes in, positions out.

:func:`close_frame` and :func:`binary_frame` build unmasked frames (server to client, §5.1).
:func:`channel_status_frame` is a Kubernetes stream message on the error channel (3) of
``v4.channel.k8s.io``/``v5.channel.k8s.io``: a ``Status`` that ``kubectl exec`` prints.
"""

from __future__ import annotations

import json
import struct

OP_BINARY = 0x2
OP_CLOSE = 0x8
CLOSE_NORMAL = 1000
CLOSE_POLICY_VIOLATION = 1008
MAX_CLOSE_REASON = 123  # a control frame's payload is at most 125 bytes, 2 are the code
ERROR_CHANNEL = 3
# Subprotocols whose error channel carries a JSON Status (client-go's errorDecoderV4).
STATUS_CHANNEL_PROTOCOLS = frozenset({b"v4.channel.k8s.io", b"v5.channel.k8s.io"})
# A bearer token as a WebSocket subprotocol, ``<prefix><base64url(token)>``: browsers cannot
# set Authorization on a WebSocket, so Kubernetes accepts this too
# (k8s.io/apiserver/pkg/authentication/request/websocket). The hub reads it and strips it
# (gateway.hub.admission.bearer); the agent strips it again before the apiserver.
BEARER_PROTOCOL_PREFIX = b"base64url.bearer.authorization.k8s.io."


class FrameBoundary:
    """Follows a WebSocket byte stream; :attr:`at_boundary` is True between frames.

    Only a frame header split across feeds is kept (at most 14 bytes).
    """

    __slots__ = ("_head", "_remaining")

    def __init__(self) -> None:
        self._head = bytearray()  # a frame header received in part
        self._remaining = 0  # payload bytes of the current frame still to come

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
                pos += take
                self._remaining -= take
                if until_boundary and self.at_boundary:
                    return pos
                continue
            need = _header_size(self._head, data, pos)
            take = min(need - len(self._head), n - pos) if need else min(2, n - pos)
            self._head += data[pos:pos + take]
            pos += take
            if need and len(self._head) == need:
                self._remaining = _payload_length(self._head)
                self._head.clear()
                if until_boundary and self.at_boundary:
                    return pos
        return pos


def _header_size(head: bytearray, data: bytes | bytearray | memoryview, pos: int) -> int:
    """The full header size once its second byte is known, else 0."""
    if len(head) >= 2:
        second = head[1]
    elif len(head) == 1 and pos < len(data):
        second = data[pos]
    elif not head and pos + 1 < len(data):
        second = data[pos + 1]
    else:
        return 0
    length = second & 0x7F
    extended = 2 if length == 126 else 8 if length == 127 else 0
    return 2 + extended + (4 if second & 0x80 else 0)


def _payload_length(head: bytearray) -> int:
    length = head[1] & 0x7F
    if length == 126:
        return int(struct.unpack_from("!H", head, 2)[0])
    if length == 127:
        return int(struct.unpack_from("!Q", head, 2)[0])
    return length


def _frame(opcode: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return header + payload


def binary_frame(payload: bytes) -> bytes:
    return _frame(OP_BINARY, payload)


def close_frame(code: int, reason: str) -> bytes:
    encoded = reason.encode("utf-8")[:MAX_CLOSE_REASON]
    # Never cut a UTF-8 sequence in half (a close reason must be valid UTF-8).
    encoded = encoded.decode("utf-8", "ignore").encode("utf-8")
    return _frame(OP_CLOSE, struct.pack("!H", code) + encoded)


def status_json(code: int, reason: str, message: str) -> bytes:
    """A failure ``Status``, as kube-apiserver writes it on an exec's error channel/stream."""
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": message, "reason": reason, "code": code}
    return json.dumps(status).encode()


def channel_status_frame(code: int, reason: str, message: str) -> bytes:
    """A failure ``Status`` on the error channel, as kube-apiserver sends it for exec."""
    return binary_frame(bytes([ERROR_CHANNEL]) + status_json(code, reason, message))


def exec_goodbye(protocol: bytes, code: int, reason: str, message: str) -> bytes:
    """What ends an exec/attach WebSocket so that kubectl prints ``message``.

    client-go reads the error channel to its end, which a normal close of the connection is
    (as kube-apiserver ends an exec; v5's close-channel message is the client's, kubectl
    discards it from a server), and then decodes the Status. Any other subprotocol gets only a
    close frame that says why (1008, policy violation).
    """
    if protocol not in STATUS_CHANNEL_PROTOCOLS:
        return close_frame(CLOSE_POLICY_VIOLATION, message)
    return channel_status_frame(code, reason, message) + close_frame(CLOSE_NORMAL, "")
