"""Kubernetes ``Status`` error bodies and complete HTTP/1.1 error responses.

Every refusal the gateway answers itself is a ``meta/v1 Status`` object, as kube-apiserver
writes them, so kubectl and client libraries show the message instead of a parse error::

    {"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
     "message":"...","reason":"Forbidden","code":403}

Contract:

* ``reason`` is the apiserver's ``StatusReason`` for the code (``REASONS``); codes without one
  (502, 414, 431, 505, ...) omit it, exactly as the apiserver does for ``StatusReasonUnknown``.
* Messages are the caller's fixed wording. As a last line of defence (DESIGN §6 rule 5) they
  are truncated to ``MAX_MESSAGE`` characters, control characters are replaced, and anything that
  looks like a bearer token or JWT is redacted -- but callers must still never put tokens,
  upstream addresses or internal errors into a message.
* :func:`error_response` returns the full response bytes: status line, ``Content-Type:
  application/json``, ``Content-Length``, ``Cache-Control: no-store``, ``Retry-After`` for
  429/503 when given, ``Connection: close`` when asked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

MAX_MESSAGE = 1024

# kube-apiserver's StatusReason per code (k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Gone",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

PHRASES: dict[int, str] = {
    100: "Continue",
    101: "Switching Protocols",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    408: "Request Timeout",
    409: "Conflict",
    410: "Gone",
    411: "Length Required",
    413: "Content Too Large",
    414: "URI Too Long",
    415: "Unsupported Media Type",
    417: "Expectation Failed",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}

# Last-resort scrubbing: "Bearer <anything>" and JWT-shaped strings (three base64url parts, the
# first starting with the base64 of '{"'). The words our own messages put after "bearer"
# ("a bearer token is required") are not secrets and stay readable.
_TOKENISH = re.compile(
    r"(?i)(bearer\s+)(?!(?:tokens?|scheme|authori[sz]ation)\b)[^\s\"',;]+"
    r"|eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def phrase(code: int) -> str:
    """The standard reason phrase for ``code`` (empty when unknown)."""
    return PHRASES.get(code, "")


def _scrub(message: str) -> str:
    message = _CONTROL.sub(" ", message[: MAX_MESSAGE * 2])
    message = _TOKENISH.sub(
        lambda m: (m.group(1) + "[redacted]") if m.group(1) else "[redacted]", message
    )
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return message


def scrub(text: str) -> str:
    """``text`` made safe to log or show: control characters replaced, anything shaped like a
    bearer token or a JWT redacted, at most ``MAX_MESSAGE`` characters."""
    return _scrub(text)


def status_object(
    code: int, message: str, *, reason: str | None = None, retry_after: int | None = None
) -> dict[str, object]:
    """The ``Status`` object as a dict (``reason`` defaults to ``REASONS[code]``)."""
    obj: dict[str, object] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": _scrub(message),
    }
    why = REASONS.get(code, "") if reason is None else reason
    if why:
        obj["reason"] = why
    if retry_after is not None:
        obj["details"] = {"retryAfterSeconds": int(retry_after)}
    obj["code"] = code
    return obj


def status_body(
    code: int, message: str, *, reason: str | None = None, retry_after: int | None = None
) -> bytes:
    """Compact JSON bytes of :func:`status_object`."""
    obj = status_object(code, message, reason=reason, retry_after=retry_after)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def error_response(
    code: int,
    message: str,
    *,
    reason: str | None = None,
    close: bool = False,
    retry_after: int | None = None,
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
    head_only: bool = False,
) -> bytes:
    """A complete HTTP/1.1 response carrying a ``Status`` body.

    ``retry_after`` is sent (header and ``details.retryAfterSeconds``) only for 429 and 503.
    ``head_only`` omits the body but keeps its ``Content-Length`` (answer to a HEAD request).
    ``extra_headers`` must already be valid (e.g. ``WWW-Authenticate``); they are not checked.
    """
    if retry_after is not None and code not in (429, 503):
        retry_after = None
    body = status_body(code, message, reason=reason, retry_after=retry_after)
    lines = [
        b"HTTP/1.1 %d %s" % (code, phrase(code).encode("ascii")),
        b"Content-Type: application/json",
        b"Cache-Control: no-store",
        b"X-Content-Type-Options: nosniff",
        b"Content-Length: %d" % len(body),
    ]
    if retry_after is not None:
        lines.append(b"Retry-After: %d" % max(0, int(retry_after)))
    lines.extend(name + b": " + value for name, value in extra_headers)
    if close:
        lines.append(b"Connection: close")
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    return head if head_only else head + body
