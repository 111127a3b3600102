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
was forwarded; path segments are percent-decoded here, as Go's ``URL.Path`` is.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

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
    path = path.strip("/")
    if not path:
        return []
    parts = path.split("/")
    return [unquote(part) for part in parts] if "%" in path else parts


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


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
    if isinstance(target, bytes):
        target = target.decode("latin-1")
    path, _, raw_query = target.partition("?")
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
        query = parse_qs(raw_query, keep_blank_values=True) if raw_query else {}
        watch = _first(query, "watch")
        verb = "watch" if watch is not None and watch.lower() not in ("0", "false") else "list"
        selector = _first(query, "fieldSelector")
        if selector:
            name = _selected_name(selector)
    elif not name and verb == "delete":
        verb = "deletecollection"
    return RequestInfo(verb, True, group, version, namespace, resource, name, subresource)
