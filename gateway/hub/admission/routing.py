"""Route ``/<cluster>/<rest>`` to a cluster and an upstream request-target (DESIGN §2.2).

:func:`route` takes the raw request-target bytes and returns a :class:`ClusterRoute`:

* ``/<cluster>/<rest>?<query>`` -> cluster ``<cluster>``, upstream target ``/<rest>?<query>``,
  byte for byte: nothing is decoded or normalised, so the managed apiserver sees exactly what the
  client sent after the prefix. ``/<cluster>`` and ``/<cluster>?q`` become ``/`` and ``/?q``.
  Because nothing is decoded here but the apiserver decodes the path before routing it, the
  Kubernetes API form must not contain anything whose decoding changes the path's *structure*
  (see "Refused" below): then the path the gateway routed, authorized and audited is the path
  the apiserver serves. The query string is not checked (selectors legitimately encode ``/``).
* The service form
  ``/<cluster>/api/v1/namespaces/<ns>/services/[<scheme>:]<svc>:<port>/proxy-service/<path>``
  -> a :class:`ServiceRef` and upstream target ``/<path>`` (+ query). ``<ns>`` and ``<svc>`` are
  DNS-1123 labels, ``<port>`` 1-65535 in plain digits, ``<scheme>`` ``http`` or ``https``
  (default ``http``). Whether the agent lets it through is the agent's allow-list's business.
  The remainder after ``proxy-service/`` belongs to the application behind the Service: it is
  forwarded untouched (not decoded, not normalised) and only the rules that hold for every path
  apply to it (dot-segments, backslash, NUL); an encoded ``/`` or ``.`` or an empty segment in it
  is the application's business, as it would be if the client called the Service directly.

Refused with :class:`RouteError` (400), because Kubernetes API paths never contain them and each
is a known way to make a proxy and an upstream disagree about the path:

* anything but origin-form (absolute-form ``http://...``, authority-form, ``*``), a ``#``;
* an empty or invalid cluster: it must be a DNS-1123 subdomain, so percent-encoding (incl. an
  encoded slash ``%2f``) in the cluster segment is refused too;
* a ``.`` or ``..`` path segment anywhere in the path, literal or percent-encoded in any case
  or mix (``%2e``, ``.%2E``...);
* a backslash (raw or ``%5c``) anywhere in the path, a NUL (raw or ``%00``) anywhere in the
  target;
* in the Kubernetes API form (every path that is not the service form), also an encoded slash
  (``%2f``, any case), an encoded dot (``%2e`` anywhere, not only as a whole segment) and an
  empty segment (``//``; one trailing ``/`` is allowed). The apiserver would decode
  ``/namespaces/demo%2Fconfigmaps`` into a different path from the one routed here, and no
  client encodes an unreserved ``.`` or sends ``//``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

_LOWER_ALNUM = b"abcdefghijklmnopqrstuvwxyz0123456789"
_SUBDOMAIN_CHARS = _LOWER_ALNUM + b"-."
_DIGITS = b"0123456789"
_SERVICE_PREFIX = b"/api/v1/namespaces/"
_PROXY_SERVICE = b"proxy-service"


class RouteError(ValueError):
    """A request-target this gateway refuses to route; ``status`` is the answer (400)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ServiceRef:
    namespace: str
    name: str
    port: int
    scheme: str = "http"


@dataclass(frozen=True, slots=True)
class ClusterRoute:
    cluster: str
    upstream_target: bytes
    service: ServiceRef | None = None


def _is_label(value: bytes) -> bool:
    """DNS-1123 label: 1-63 of [a-z0-9-], starting and ending alphanumeric."""
    return (
        0 < len(value) <= 63
        and not value.translate(None, _LOWER_ALNUM + b"-")
        and value[:1] != b"-"
        and value[-1:] != b"-"
    )


MAX_CLUSTER_NAME = 253  # a DNS-1123 subdomain's length limit


def is_cluster_name(value: bytes) -> bool:
    """DNS-1123 subdomain: at most 253 bytes of dot-separated labels."""
    if not 0 < len(value) <= MAX_CLUSTER_NAME or value.translate(None, _SUBDOMAIN_CHARS):
        return False
    return all(_is_label(label) for label in value.split(b"."))


def _check_path(path: bytes) -> None:
    lowered = path.lower()
    if b"\\" in path or b"%5c" in lowered:
        raise RouteError("backslash in path")
    if b"." in path or b"%2e" in lowered:
        for segment in lowered.split(b"/"):
            if segment.replace(b"%2e", b".") in (b".", b".."):
                raise RouteError("dot-segment in path")


def _check_api_path(path: bytes) -> None:
    """The Kubernetes API form's extra rules (see the module docstring)."""
    lowered = path.lower()
    if b"%2f" in lowered:
        raise RouteError("encoded slash in path")
    if b"%2e" in lowered:
        raise RouteError("encoded dot in path")
    if b"//" in path:
        raise RouteError("empty segment in path")


def _service(rest: bytes, query: bytes) -> tuple[ServiceRef, bytes] | None:
    """The service form, if ``rest`` is one (None otherwise); RouteError if it is malformed."""
    if not rest.startswith(_SERVICE_PREFIX):
        return None
    # ns / "services" / [scheme:]svc:port / "proxy-service" / path...
    parts = rest[len(_SERVICE_PREFIX) :].split(b"/", 4)
    if len(parts) < 4 or parts[1] != b"services" or parts[3] != _PROXY_SERVICE:
        return None
    namespace, _, spec, _ = parts[:4]
    path = b"/" + parts[4] if len(parts) == 5 else b"/"
    pieces = spec.split(b":")
    if len(pieces) == 2:
        scheme, name, port = b"http", pieces[0], pieces[1]
    elif len(pieces) == 3:
        scheme, name, port = pieces
    else:
        raise RouteError("service must be [<scheme>:]<name>:<port>")
    if scheme not in (b"http", b"https"):
        raise RouteError("service scheme must be http or https")
    if not _is_label(namespace):
        raise RouteError("namespace is not a DNS-1123 label")
    if not _is_label(name):
        raise RouteError("service name is not a DNS-1123 label")
    if (
        not port
        or len(port) > 5
        or port.translate(None, _DIGITS)
        or port[:1] == b"0"
        or int(port) > 65535
    ):
        raise RouteError("service port must be a number from 1 to 65535")
    ref = ServiceRef(namespace.decode(), name.decode(), int(port), scheme.decode())
    return ref, path + query


def _cluster_name(segment: bytes) -> str | None:
    """The first path segment as a cluster name, or None when it is not a DNS-1123
    subdomain. Only segments short enough to be one are remembered (a bounded cache)."""
    return _checked_name(segment) if len(segment) <= MAX_CLUSTER_NAME else None


@functools.lru_cache(maxsize=4096)  # a fleet's names, asked for request after request
def _checked_name(segment: bytes) -> str | None:
    return segment.decode() if is_cluster_name(segment) else None


def route(target: bytes) -> ClusterRoute:
    """Split a raw request-target into cluster and upstream target. Raises :class:`RouteError`."""
    if target[:1] != b"/":
        raise RouteError("request target must be a path (/<cluster>/...)")
    if b"#" in target:
        raise RouteError("fragment in request target")
    if b"%00" in target or b"\x00" in target:
        raise RouteError("NUL in request target")
    q = target.find(b"?")
    path, query = (target, b"") if q < 0 else (target[:q], target[q:])
    slash = path.find(b"/", 1)
    cluster, rest = (path[1:], b"/") if slash < 0 else (path[1:slash], path[slash:])
    if not cluster:
        raise RouteError("missing cluster name: the path must start with /<cluster>/")
    name = _cluster_name(cluster)
    if name is None:
        raise RouteError("cluster name is not a DNS-1123 subdomain")
    _check_path(rest)
    service = _service(rest, query)
    if service is not None:
        return ClusterRoute(name, service[1], service[0])
    _check_api_path(rest)
    return ClusterRoute(name, rest + query)
