"""What a Kubernetes API request is about, from its method and target alone (pure).

The same reading kube-apiserver's ``RequestInfoFactory`` makes of a request (its audit events'
``verb`` and ``objectRef``, its authorization attributes), so that an audit event the gateway
writes for a request says what the managed apiserver's own event for it says:

* ``/api/<version>/...`` and ``/apis/<group>/<version>/...`` are resource requests:
  ``[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]``, the verb from the method (POST
  create, GET/HEAD get, PUT update, PATCH patch, DELETE delete); a GET without a name is
  ``list``, or ``watch`` when ``?watch=`` is anything but ``0``/``false``; a DELETE without a
  name is ``deletecollection``; the legacy ``/watch/`` and ``/proxy/`` path segments are the
  verb (a ``proxy`` request has no subresource); ``namespaces/<ns>/status|finalize`` is the
  namespace itself; a list or watch whose ``fieldSelector`` pins ``metadata.name`` names it.
* anything else (``/version``, ``/healthz``, ``/api``, ``/apis/<group>``) is a non-resource
  request whose verb is the method, lower-cased.

The target is the path and query after the gateway's ``/<cluster>`` prefix, undecoded as it
was forwarded; path segments are percent-decoded here, as Go's ``URL.Path`` is. The query is
read as Go's ``url.ParseQuery`` reads it (:func:`query_value`: pairs split at ``&``, a pair
with a ``;`` or a bad escape skipped, names and values decoded, the first value counts) and a
flag as kube-apiserver converts it (:func:`query_flag`: false only when absent, ``0`` or
``false`` in any case). What that makes of each spelling of ``watch`` and ``follow``, as the
real kube-apiserver showed it: :mod:`gateway.wire.requestclass`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

_SPECIAL_VERBS = frozenset({"proxy", "watch"})
_NO_SUBRESOURCE_VERBS = frozenset({"proxy"})
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
          "DELETE": "delete"}


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """kube-apiserver's ``RequestInfo``, the fields an audit event carries."""

    verb: str
    is_resource: bool = False
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    name: str = ""
    subresource: str = ""


def _segments(path: str) -> list[str]:
    # Go decodes the whole path (URL.Path) before RequestInfo splits it: %2F is a "/".
    path = (unquote(path) if "%" in path else path).strip("/")
    return path.split("/") if path else []


_HEX = frozenset(b"0123456789abcdefABCDEF")


def query_value(query: bytes, name: bytes) -> bytes | None:
    """The first value of parameter ``name``, decoded, as Go's ``url.ParseQuery`` (and so
    kube-apiserver) reads ``query``; None when there is none."""
    for pair in query.split(b"&"):
        if not pair or b";" in pair:
            continue
        key, _, value = pair.partition(b"=")
        if key != name and ((b"%" not in key and b"+" not in key)
                            or _query_unescape(key) != name):
            continue
        if b"%" in value or b"+" in value:
            decoded = _query_unescape(value)
            if decoded is None:
                continue
            value = decoded
        return value
    return None


def query_flag(query: bytes, name: bytes) -> bool:
    """Parameter ``name`` as a bool, the way kube-apiserver converts query parameters
    (``runtime.Convert_Slice_string_To_bool``): absent, ``0`` or ``false`` in any case (Go's
    ``strings.EqualFold``) is false; anything else, the empty string included, is true."""
    value = query_value(query, name)
    # EqualFold with "false": ASCII case, and U+017F (long s) folds to "s".
    return value is not None and value != b"0" \
        and value.replace(b"\xc5\xbf", b"s").lower() != b"false"


def _query_unescape(text: bytes) -> bytes | None:
    """Go's ``QueryUnescape``: ``+`` is a space, ``%XX`` a byte; None for a bad escape."""
    pieces = text.replace(b"+", b" ").split(b"%")
    out = [pieces[0]]
    for piece in pieces[1:]:
        if len(piece) < 2 or piece[0] not in _HEX or piece[1] not in _HEX:
            return None
        out.append(bytes((int(piece[:2], 16),)))
        out.append(piece[2:])
    return b"".join(out)


def _selected_name(selector: str) -> str:
    """The name a field selector requires exactly (``metadata.name=x`` or ``==x``), if it is a
    valid path segment name; else ""."""
    if "\\" in selector:  # escaped values: not worth parsing for an audit field
        return ""
    for term in selector.split(","):
        key, sep, value = term.partition("==")
        if not sep:
            key, sep, value = term.partition("=")
            if key.endswith("!"):
                continue
        if sep and key.strip() == "metadata.name":
            value = value.strip()
            if value and value not in (".", "..") and "/" not in value and "%" not in value:
                return value
    return ""


def request_info(method: bytes | str, target: bytes | str) -> RequestInfo:
    """See the module docstring. ``target`` is ``/api...`` (path and query, undecoded)."""
    if isinstance(method, bytes):
        method = method.decode("ascii", "replace")
    if isinstance(target, str):
        target = target.encode("latin-1")
    raw_path, _, raw_query = target.partition(b"?")
    path = raw_path.decode("latin-1")
    parts = _segments(path)
    plain = RequestInfo(verb=method.lower())
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return plain
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return plain
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    if parts and parts[0] in _SPECIAL_VERBS:
        if len(parts) < 2:
            return plain  # kube-apiserver: "unable to determine kind and namespace from url"
        verb, parts = parts[0], parts[1:]
    else:
        verb = _VERBS.get(method, "")
    namespace = ""
    if parts and parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0] if parts else ""
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 and verb not in _NO_SUBRESOURCE_VERBS else ""
    if not name and verb == "get":
        verb = "watch" if raw_query and query_flag(raw_query, b"watch") else "list"
        selector = query_value(raw_query, b"fieldSelector") if raw_query else None
        if selector:
            name = _selected_name(selector.decode("utf-8", "replace"))
    elif not name and verb == "delete":
        verb = "deletecollection"
    return RequestInfo(verb, True, group, version, namespace, resource, name, subresource)
