"""Bearer tokens from a request, with kube-apiserver's semantics (sans-IO).

:func:`extract_token` returns the caller's token and the headers to forward:

* ``Authorization``: at most one header (more -> 400: which one counts would be ambiguous). An
  empty value means "no token". Otherwise it must be ``Bearer <token>``: scheme
  case-insensitive, one space, a non-empty token without whitespace (kube-apiserver splits on a
  single space too). Another scheme or a malformed value -> :class:`BearerError` (401): the
  gateway can verify nothing but hub bearer tokens.
* WebSocket: browsers cannot set ``Authorization``, so Kubernetes also accepts the subprotocol
  ``base64url.bearer.authorization.k8s.io.<base64url(token)>`` in ``Sec-WebSocket-Protocol``
  (k8s.io/apiserver/pkg/authentication/request/websocket). As there, it is considered only for
  a WebSocket upgrade (``Upgrade: websocket`` and ``Connection`` naming ``upgrade``); a second
  token protocol, bad base64url (unpadded, RFC 4648 §5), a token that is not UTF-8, or a token
  without at least one other subprotocol (the server must echo one back) -> 401. An
  ``Authorization`` header takes precedence.
* Every token subprotocol is always removed from the forwarded ``Sec-WebSocket-Protocol``
  (whether it was used or not), and the header is dropped when nothing is left: a hub token never
  crosses the gateway (DESIGN §6 rule 2). ``Authorization`` itself is removed later by
  :func:`gateway.hub.admission.headers.rewrite_request_headers`.

Error messages never contain the token.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from gateway.wire.websocket import BEARER_PROTOCOL_PREFIX

Headers = list[tuple[bytes, bytes]]

_B64URL = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_TOKEN_CHARS = bytes(range(0x21, 0x7F))  # visible ASCII


class BearerError(ValueError):
    """A credential the gateway refuses (``status`` 401, or 400 for an ambiguous request); the
    message never includes the token."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class BearerToken:
    token: str | None  # None: the request carries no token
    source: str  # "authorization", "websocket-protocol" or "" (no token)
    headers: Headers  # the request headers with every token subprotocol removed


def _is_websocket(headers: Headers) -> bool:
    upgrade: bytes | None = None
    connection: list[bytes] = []
    for name, value in headers:
        lname = name.lower()
        if lname == b"upgrade" and upgrade is None:
            upgrade = value
        elif lname == b"connection":
            connection.extend(t.strip(b" \t").lower() for t in value.split(b","))
    return upgrade is not None and upgrade.strip().lower() == b"websocket" and (
        b"upgrade" in connection
    )


def _authorization(value: bytes) -> str | None:
    value = value.strip(b" \t")
    if not value:
        return None
    scheme, sep, token = value.partition(b" ")
    if scheme.lower() != b"bearer":
        raise BearerError("only Bearer tokens are accepted")
    if not sep or not token or token.translate(None, _TOKEN_CHARS):
        raise BearerError("malformed Authorization header: expected 'Bearer <token>'")
    return token.decode("ascii")


def _decode_protocol_token(encoded: bytes, status: int = 401) -> str:
    if encoded.translate(None, _B64URL) or len(encoded) % 4 == 1:
        raise BearerError("invalid base64url bearer token subprotocol", status)
    try:
        raw = base64.urlsafe_b64decode(encoded + b"=" * (-len(encoded) % 4))
        return raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise BearerError("invalid base64url bearer token subprotocol", status) from exc


def strip_token_subprotocols(headers: Headers) -> tuple[Headers, list[bytes], list[bytes]]:
    """Headers without token subprotocols, the remaining protocols, and the token ones found."""
    out: Headers = []
    others: list[bytes] = []
    tokens: list[bytes] = []
    for name, value in headers:
        if name.lower() != b"sec-websocket-protocol":
            out.append((name, value))
            continue
        kept: list[bytes] = []
        for proto in value.split(b","):
            proto = proto.strip(b" \t")
            if proto.startswith(BEARER_PROTOCOL_PREFIX):
                tokens.append(proto[len(BEARER_PROTOCOL_PREFIX) :])
            elif proto:
                kept.append(proto)
        others.extend(kept)
        if kept:
            out.append((name, b", ".join(kept)))
    return out, others, tokens


def extract_token(headers: Headers) -> BearerToken:
    """The caller's bearer token (or None) and the forwardable headers. Raises BearerError."""
    auth = [value for name, value in headers if name.lower() == b"authorization"]
    if len(auth) > 1:
        raise BearerError("more than one Authorization header", status=400)
    forwarded, others, encoded_tokens = strip_token_subprotocols(headers)
    token = _authorization(auth[0]) if auth else None
    websocket = bool(encoded_tokens) and _is_websocket(headers)
    if token is not None:
        if websocket and any(_decode_protocol_token(e, status=400) not in ("", token)
                             for e in encoded_tokens):
            raise BearerError("the Authorization header and the bearer token subprotocol carry "
                              "different tokens", status=400)
        return BearerToken(token, "authorization", forwarded)
    if websocket:
        if len(encoded_tokens) > 1:
            raise BearerError("more than one bearer token subprotocol")
        ws_token = _decode_protocol_token(encoded_tokens[0])
        if ws_token:
            if not others:
                raise BearerError("bearer token subprotocol without another subprotocol")
            return BearerToken(ws_token, "websocket-protocol", forwarded)
    return BearerToken(None, "", forwarded)
