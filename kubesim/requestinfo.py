"""RequestInfo: what an API path and method mean, as k8s.io/apiserver's RequestInfoFactory decides.

`/api/v1/namespaces/ns/pods/name/log` -> resource request, group "", version v1, namespace ns,
resource pods, name name, subresource log, verb get. Anything outside `/api` and `/apis/<g>/<v>`
is a non-resource request (`/healthz`, `/version`, `/apis` discovery, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

_NAMESPACE_SUBRESOURCES = {"status", "finalize"}
_METHOD_VERBS = {
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
    "GET": "get",
    "HEAD": "get",
}


@dataclass(frozen=True)
class RequestInfo:
    resource_request: bool
    path: str
    verb: str
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    parts_count: int = 0  # path segments after group/version, for "too deep" checks


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true")


def parse(method: str, path: str, query: dict[str, str]) -> RequestInfo:
    segments = [s for s in path.strip("/").split("/")] if path.strip("/") else []
    verb = method.lower()
    if not segments or segments[0] not in ("api", "apis"):
        return RequestInfo(False, path, verb)
    if segments[0] == "api":
        if len(segments) < 2:
            return RequestInfo(False, path, verb)
        group, version, rest = "", segments[1], segments[2:]
    else:
        if len(segments) < 3:
            return RequestInfo(False, path, verb)
        group, version, rest = segments[1], segments[2], segments[3:]
    if not rest:
        # /api/v1 or /apis/g/v discovery is a non-resource request.
        return RequestInfo(False, path, verb)

    verb = _METHOD_VERBS.get(method, method.lower())
    if rest[0] == "watch":  # deprecated /watch/ prefix
        verb, rest = "watch", rest[1:]
    namespace = ""
    if rest and rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if not name and verb == "get":
        verb = "watch" if _truthy(query.get("watch")) else "list"
    elif name and verb == "get" and _truthy(query.get("watch")):
        verb = "watch"
    if verb == "delete" and not name:
        verb = "deletecollection"
    return RequestInfo(
        True, path, verb, group, version, namespace, resource, subresource, name, len(rest)
    )
