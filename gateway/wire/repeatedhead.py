"""Reading a request head whose header fields repeat the last one's (sans-IO).

A client sends the same header fields request after request on a keep-alive connection (the
same token, user agent, accept types); only its request line changes. Every rule of
:func:`gateway.wire.http1.parse_request_head` about the fields -- their bytes, names, Host,
``Content-Length``/``Transfer-Encoding``, ``Connection``, ``Expect``, ``Upgrade`` -- depends on
nothing but the field lines and the HTTP version. So when a head's field lines are byte for
byte the last parsed head's and its version is the same, :class:`RepeatedHead` checks only its
request line (three parts; the method a token and the target visible ASCII, by
:func:`gateway.wire.http1.check_request_head`; the length limit) and takes the fields and what
they decided from the last head. Any other head -- other fields, another version, leading empty
lines, a request line that breaks a rule -- goes to ``parse_request_head``, the one parser of the
rules, which reads it in full (or refuses it) and becomes the last head.

What is kept is a copy (the parsed head's lists may be emptied later: a watch drops them); a
connection that stays open for hours forgets it (:meth:`RepeatedHead.forget`).
"""

from __future__ import annotations

from gateway.wire.http1 import Limits, RequestHead, check_request_head, parse_request_head

_CRLF = b"\r\n"


class RepeatedHead:
    """The last parsed head, for the next request: one per client connection at the hub's
    front door, one per agent (the gateway forwards a client's fields unchanged); see the
    module docstring."""

    __slots__ = ("_fields", "_head")

    def __init__(self) -> None:
        self._fields = b""  # the last head's bytes from the end of its request line on
        self._head: RequestHead | None = None  # a private copy of that head (lists copied)

    def forget(self) -> None:
        self._fields, self._head = b"", None

    def parse(self, data: bytes, limits: Limits) -> RequestHead:
        """``parse_request_head(data, limits)``: the same head, or the same HTTPError."""
        line_end = data.find(_CRLF)
        last = self._head
        if (last is not None and line_end > 0 and len(data) <= limits.max_head_bytes
                and data[line_end:] == self._fields):
            head = _with_fields_of(last, data[:line_end], limits)
            if head is not None:
                return head
        head = parse_request_head(data, limits)
        if line_end > 0:  # no empty lines before the request line: its fields start here
            self._fields = data[line_end:]
            self._head = _copy(head)
        return head


def _with_fields_of(last: RequestHead, line: bytes, limits: Limits) -> RequestHead | None:
    """The head made of request line ``line`` and ``last``'s fields, or None when the line
    needs the full parser (to be refused, or because its version differs)."""
    if len(line) > limits.max_request_line:
        return None
    parts = line.split(b" ")
    if len(parts) != 3 or parts[2] != last.version:
        return None
    method, target, version = parts
    try:
        check_request_head(method, target, [])
    except ValueError:
        return None
    return RequestHead(method, target, version, list(last.headers), list(last.names),
                       last.content_length, last.chunked, last.keep_alive,
                       last.expect_continue, last.connection, last.upgrade)


def _copy(head: RequestHead) -> RequestHead:
    return RequestHead(head.method, head.target, head.version, list(head.headers),
                       list(head.names), head.content_length, head.chunked, head.keep_alive,
                       head.expect_continue, head.connection, head.upgrade)
