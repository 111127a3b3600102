"""The minimal OpenAPI v3 that kubectl needs to create and apply objects.

kubectl (1.27+) validates with `--validate=strict` by default: it looks in `/openapi/v3` for
the PATCH operation of the object's GroupVersionKind and, when that operation declares the
`fieldValidation` query parameter, leaves validation to the server instead of downloading
schemas. So every group/version gets a document with one PATCH operation per kind (tagged with
`x-kubernetes-group-version-kind`, declaring `fieldValidation`) and no component schemas; with
no schema for the kind, `kubectl apply` computes strategic merge patches from its compiled-in
types (built-ins) or uses JSON merge patch (custom resources). `/openapi/v2` is not served.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kubesim.resources import Registry

_FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "schema": {"type": "string", "uniqueItems": True},
    "description": "fieldValidation instructs the server on how to handle objects in the "
    "request containing unknown or duplicate fields.",
}


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def gv_document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = [t for t in registry.all() if t.group == group and t.version == version]
    if not types:
        return None
    paths: dict[str, Any] = {}
    for t in types:
        if t.virtual:
            continue
        prefix = "/" + _gv_path(group, version)
        if t.namespaced:
            prefix += "/namespaces/{namespace}"
        gvk = {"group": group, "version": version, "kind": t.kind}
        paths[f"{prefix}/{t.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{t.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [_FIELD_VALIDATION],
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kubesim)", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }


def index(registry: Registry) -> dict[str, Any]:
    gvs = {("", "v1")}
    for group, versions in registry.group_versions().items():
        for version in versions:
            gvs.add((group, version))
    paths = {}
    for group, version in sorted(gvs):
        doc = gv_document(registry, group, version)
        digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:64].upper()
        paths[_gv_path(group, version)] = {
            "serverRelativeURL": f"/openapi/v3/{_gv_path(group, version)}?hash={digest}"
        }
    return {"paths": paths}
