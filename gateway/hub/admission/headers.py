"""What request headers cross the gateway (DESIGN §2.5, §6 rule 2) -- one place decides.

:func:`rewrite_request_headers` takes the client's headers (after
:func:`gateway.hub.admission.bearer.extract_token`) and returns the headers to send through the
tunnel, in the client's order. It is the only function that decides what crosses; the agent
then adds identity last (``gateway.wire.identity``).

Refused (:class:`HeaderRefused`, the gateway answers with ``status`` and the message):

* 403 -- any header whose name starts with ``impersonate`` in any case and with any suffix
  (``Impersonate-User``, ``impersonate-extra-x``, ``Impersonate_User``, ``ImpersonateFoo``): the
  caller asked to act as someone else, and saying so beats silently dropping it.
* 403 -- ``X-Hubproxy-*``: reserved for gateway/agent control.
* 403 -- underscore aliases: a name containing ``_`` that reads as a sensitive name once ``_`` is
  ``-`` and leading/trailing ones are dropped (``X_Remote_User``, ``Content_Length``,
  ``X_Forwarded_For``, ``Authorization_``...). Many servers (CGI/WSGI,
  some proxies) fold ``_`` and ``-`` together, so such a header could pass for the real one.
* 400 -- a ``Connection`` header nominating a security-relevant header (``Authorization``,
  ``Host``, ``Content-Length``, ``Transfer-Encoding``, ``Impersonate*``, ``X-Forwarded-*``,
  ``Forwarded``, ``X-Remote-*``, ``X-Hubproxy-*``, ``Sec-WebSocket-*``, ``Cookie``): a classic way
  to make a proxy delete a header the next hop relies on.

Removed:

* ``Authorization`` and ``Proxy-Authorization`` (hub credentials never leave the hub), any
  ``base64url.bearer.authorization.k8s.io.`` WebSocket subprotocol (again, defence in depth).
* hop-by-hop headers (:data:`HOP_BY_HOP`) and every header the ``Connection`` header nominates.
  ``Upgrade`` is kept, with a fresh ``Connection: Upgrade``, when the request is an upgrade.
* ``X-Remote-*`` (authenticating-proxy identity headers), ``X-Forwarded-*``, ``Forwarded`` and
  ``X-Real-Ip`` from the client: the gateway is the edge, so nothing a client says about the
  forwarding chain is kept. They are rebuilt from what the gateway saw:
  ``X-Forwarded-For: <client ip>``, ``X-Forwarded-Proto``, ``X-Forwarded-Host`` (the client's
  Host) and the equivalent ``Forwarded``.
* On the Kubernetes API form only (:data:`API_FORM_ONLY_STRIPPED`): ``Cookie``, which
  kube-apiserver never reads on API paths, while a dashboard may keep a hub token in one (it
  would reach every managed cluster); and the client's ``Audit-ID``, which the agent sets to
  the gateway's request id. A request to a Service (``to_service``) keeps both: its cookies
  belong to the application.

Kept on purpose: ``Transfer-Encoding`` and ``Content-Length``. Unlike Go's ReverseProxy, which
re-frames the body, the gateway relays the body bytes verbatim, so the framing headers must
describe them; http1 already refused every ambiguous combination. ``Host`` is kept (the agent
sets its own for the kube-apiserver). ``Expect`` is kept for the gateway server to decide on.
"""

from __future__ import annotations

import functools
import ipaddress

from gateway.hub.admission.bearer import strip_token_subprotocols
from gateway.wire.identity import AUDIT_ID, IMPERSONATE_PREFIX

Headers = list[tuple[bytes, bytes]]

# One list of hop-by-hop headers (RFC 9110 §7.6.1 plus the de-facto ones Go's ReverseProxy
# removes), minus Transfer-Encoding (see the module docstring) and Upgrade (handled explicitly).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"proxy-authenticate",
        b"proxy-authorization",
    }
)

CONTROL_PREFIX = b"x-hubproxy-"
_IMPERSONATE = IMPERSONATE_PREFIX

# Removed from client requests and, for X-Forwarded-*/Forwarded, rebuilt by the gateway.
_STRIPPED_EXACT = frozenset({b"authorization", b"forwarded", b"x-real-ip", b"upgrade"})
_STRIPPED_PREFIXES = (b"x-remote-", b"x-forwarded-")
API_FORM_ONLY_STRIPPED = frozenset({b"cookie", AUDIT_ID.lower()})

# Names whose underscore aliases are refused, and which Connection may not nominate.
_SENSITIVE_EXACT = frozenset(
    {
        b"authorization",
        b"proxy-authorization",
        b"host",
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"upgrade",
        b"forwarded",
        b"x-real-ip",
        b"cookie",
    }
)
_SENSITIVE_PREFIXES = (_IMPERSONATE, b"x-remote-", b"x-forwarded-", CONTROL_PREFIX)
# Connection tokens that are not header names to delete.
_CONNECTION_OPTIONS = frozenset({b"close", b"keep-alive", b"upgrade"})


class HeaderRefused(ValueError):
    """A request refused because of its headers; ``status`` is 403 or 400."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


def _is_sensitive(lname: bytes) -> bool:
    return lname in _SENSITIVE_EXACT or lname.startswith(_SENSITIVE_PREFIXES)


def _printable(name: bytes) -> str:
    return name[:64].decode("ascii", "replace")


def connection_tokens(headers: Headers) -> list[bytes]:
    """Lower-cased tokens of every ``Connection`` header, in order."""
    tokens: list[bytes] = []
    for name, value in headers:
        if name.lower() == b"connection":
            tokens.extend(t for t in (p.strip(b" \t").lower() for p in value.split(b",")) if t)
    return tokens


def is_upgrade(headers: Headers) -> bytes | None:
    """The ``Upgrade`` value when ``Connection`` nominates ``upgrade``, else None."""
    if b"upgrade" not in connection_tokens(headers):
        return None
    return _upgrade_value(headers)


def _upgrade_value(headers: Headers) -> bytes | None:
    for name, value in headers:
        if name.lower() == b"upgrade":
            return value or None
    return None


def check_client_headers(headers: Headers, tokens: list[bytes] | None = None) -> None:
    """Raise :class:`HeaderRefused` for any header a client may not send (see module doc).

    ``tokens``: the request's :func:`connection_tokens`, when the caller has them already.
    """
    for name, _ in headers:
        lname = name.lower()
        if lname.startswith(_IMPERSONATE):
            raise HeaderRefused(
                f"impersonation headers are not allowed through the gateway ({_printable(name)}):"
                " the gateway impersonates the hub identity of your token"
            )
        if lname.startswith(CONTROL_PREFIX):
            raise HeaderRefused(f"header {_printable(name)} is reserved for hubproxy")
        if b"_" in lname and _is_sensitive(lname.replace(b"_", b"-").strip(b"-")):
            raise HeaderRefused(
                f"header {_printable(name)} is refused: with '_' read as '-' it names a "
                "security-relevant header"
            )
    for token in connection_tokens(headers) if tokens is None else tokens:
        if token in _CONNECTION_OPTIONS:
            continue
        if _is_sensitive(token.replace(b"_", b"-")) or token.startswith(b"sec-websocket-"):
            raise HeaderRefused(
                f"Connection header may not nominate {_printable(token)}", status=400
            )


@functools.lru_cache(maxsize=4096)  # a client keeps its address across requests
def _format_ip(client_ip: str) -> tuple[bytes, bytes]:
    """(X-Forwarded-For value, Forwarded for= value) for an IP literal."""
    try:
        ip = ipaddress.ip_address(client_ip)
    except ValueError:
        return b"unknown", b"unknown"
    text = ip.compressed.encode("ascii")
    if ip.version == 6:
        return text, b'"[' + text + b']"'
    return text, text


def _forwarded_host(host: bytes) -> bytes:
    # Host was validated by http1 (no spaces, commas, slashes); quote it for Forwarded anyway.
    return b'"' + host.replace(b"\\", b"").replace(b'"', b"") + b'"'


def rewrite_request_headers(
    headers: Headers, *, client_ip: str, proto: str = "https", host: bytes | str,
    to_service: bool = False,
) -> Headers:
    """The headers to forward for a client request; ``to_service``: it goes to a Service (the
    ``/proxy-service/`` form), not to the kube-apiserver. Raises :class:`HeaderRefused`."""
    tokens = connection_tokens(headers)
    check_client_headers(headers, tokens)
    host_b = host.encode("ascii") if isinstance(host, str) else host
    proto_b = proto.encode("ascii")
    upgrade = _upgrade_value(headers) if b"upgrade" in tokens else None
    nominated = {t for t in tokens if t not in _CONNECTION_OPTIONS}
    headers, _, _ = strip_token_subprotocols(headers)
    out: Headers = []
    upgrade_kept = False
    for name, value in headers:
        lname = name.lower()
        if (
            lname in HOP_BY_HOP
            or lname in nominated
            or lname in _STRIPPED_EXACT
            or lname.startswith(_STRIPPED_PREFIXES)
            or (not to_service and lname in API_FORM_ONLY_STRIPPED)
        ):
            if lname == b"upgrade" and upgrade is not None and not upgrade_kept:
                out.append((name, value))
                upgrade_kept = True
            continue
        out.append((name, value))
    if upgrade_kept:
        out.append((b"Connection", b"Upgrade"))
    xff, forwarded_for = _format_ip(client_ip)
    out.append((b"X-Forwarded-For", xff))
    out.append((b"X-Forwarded-Proto", proto_b))
    out.append((b"X-Forwarded-Host", host_b))
    out.append(
        (b"Forwarded", b"for=" + forwarded_for + b";proto=" + proto_b + b";host="
         + _forwarded_host(host_b))
    )
    return out
