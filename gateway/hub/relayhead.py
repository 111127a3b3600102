"""The framing of a response head that is relayed as it is (sans-IO).

An HTTP/1.1 client gets the response head as the bytes the agent sent: the gateway only needs
its status and where its body ends. For the common answer -- HTTP/1.1, a final status, one
``Content-Length``, no ``Transfer-Encoding`` or ``Connection`` -- :func:`relayed_head` finds
those in a few C-level passes instead of parsing every field. It accepts only heads that
:func:`gateway.wire.http1.parse_response_head` (the one parser of the rules) accepts with the
same framing, and returns None for anything else -- unusual framing, a 1xx, a large head, or a
head breaking any rule -- which then goes to that parser, to be refused or read in full.

The common small answer comes whole in one tunnel read: its head and exactly its
``Content-Length`` body. :func:`whole_response` recognises that case, so the exchange relays it
in one write without a head object or a body tracker (nothing more may follow it).
"""

from __future__ import annotations

import re

from gateway.wire.http1 import ResponseHead, plain_content_length

# Below this size a head cannot hold more fields than any limit allows (each field line is
# at least 4 bytes: 2048 bytes hold fewer than 512 fields, lines far shorter than 64 KiB).
MAX_RELAYED_HEAD = 2048

# Everything parse_response_head checks byte by byte, as one expression: an HTTP/1.1 status
# line with a final status and an optional reason, then fields whose names are tokens and
# whose values hold no control character but HTAB, each line ended by CRLF (so no bare CR or
# LF, no obs-fold, no space before a colon), then the empty line.
# Possessive repeats (*+, ++): what each one may match never holds what follows it (a name
# no colon, a value no CR, a field line starts with a token byte, not CR), so giving nothing
# back changes no answer, and the matcher keeps no backtracking state per byte and per line.
_VALUE = rb"[\t\x20-\x7e\x80-\xff]*+"
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]++"
_PLAIN_HEAD = re.compile(
    rb"HTTP/1\.1 [2-9][0-9]{2}(?: " + _VALUE + rb")?\r\n(?:" + _TOKEN + rb":" + _VALUE
    + rb"\r\n)*+\r\n")

# The fields that decide the framing, looked for in the lowered head (a field line starts
# after a CRLF, and no value holds one): the plain case has exactly one, Content-Length.
_CONTENT_LENGTH = b"\r\ncontent-length:"
_OTHER_FRAMING = (b"\r\ntransfer-encoding:", b"\r\nconnection:")


def _plain_length(raw: bytes) -> int | None:
    """The ``Content-Length`` of ``raw`` (a complete response head) when it is the plain case
    above; else None."""
    if len(raw) > MAX_RELAYED_HEAD or _PLAIN_HEAD.fullmatch(raw) is None:
        return None
    lower = raw.lower()
    at = lower.find(_CONTENT_LENGTH)
    if (at < 0 or lower.find(_CONTENT_LENGTH, at + 1) >= 0 or _OTHER_FRAMING[0] in lower
            or _OTHER_FRAMING[1] in lower):
        return None
    value_at = at + len(_CONTENT_LENGTH)
    return plain_content_length(raw[value_at:raw.index(b"\r\n", value_at)].strip(b" \t"))


def relayed_head(raw: bytes) -> ResponseHead | None:
    """``raw`` (a complete response head) as a :class:`ResponseHead` with its status, reason
    and ``content_length`` and no fields, when it is the plain case above; else None."""
    length = _plain_length(raw)
    if length is None:
        return None
    line_end = raw.index(b"\r\n")
    return ResponseHead(b"HTTP/1.1", int(raw[9:12]), raw[13:line_end], [], [],
                        content_length=length)


_HEAD_END = b"\r\n\r\n"
# Answers whose body is not what their Content-Length says (RFC 9110 §6.4.1; see
# gateway.wire.http1.framing_for_response): left to the full reading.
_NO_BODY_STATUS = (b"204", b"304")
_NO_BODY_METHODS = (b"HEAD", b"CONNECT")


def whole_response(data: bytes, method: bytes) -> tuple[int, int] | None:
    """``(status, head_end)`` when ``data`` is exactly one whole response to a ``method``
    request: a plain head (see :func:`relayed_head`) ending at ``head_end``, then exactly the
    ``Content-Length`` bytes of its body; else None (read it with :func:`relayed_head` or the
    full parser). Keep-alive, not close-delimited, nothing more to come."""
    end = data.find(_HEAD_END, 0, MAX_RELAYED_HEAD)
    if end < 0 or method in _NO_BODY_METHODS:
        return None
    end += 4
    if data[9:12] in _NO_BODY_STATUS or _plain_length(data[:end]) != len(data) - end:
        return None
    return int(data[9:12]), end
