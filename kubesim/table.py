"""Server-side printing: `meta.k8s.io/v1` Table responses, which `kubectl get` asks for.

Columns follow kube-apiserver's printers for the built-in types (pods: NAME READY STATUS
RESTARTS AGE, services: TYPE CLUSTER-IP ..., ...), `additionalPrinterColumns` for CRDs, and
NAME/AGE otherwise. Rows carry PartialObjectMetadata, the full object, or nothing, per
`includeObject`. The same module answers metadata-only requests (`as=PartialObjectMetadata`,
`as=PartialObjectMetadataList`), the other server-side transformation clients negotiate.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubesim.resources import ResourceType

TABLE_MEDIA = "as=Table"


def wants_table(accept: str) -> bool:
    """True when the first acceptable media type asks for a Table (kubectl get does)."""
    first = accept.split(",")[0]
    return TABLE_MEDIA in first.replace(" ", "") and "g=meta.k8s.io" in first.replace(" ", "")


def wants_partial_metadata(accept: str) -> bool:
    """True when the client asks for metadata only (client-go's metadata client does)."""
    first = accept.split(",")[0].replace(" ", "")
    return "g=meta.k8s.io" in first and (
        "as=PartialObjectMetadata;" in first + ";" or "as=PartialObjectMetadataList" in first
    )


def partial(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def partial_list(items: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "items": [partial(o) for o in items],
    }


def _age(ts: str | None) -> str:
    if not ts:
        return "<unknown>"
    try:
        then = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<invalid>"
    seconds = max(0, int((datetime.now(UTC) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def _col(
    name: str, type_: str = "string", priority: int = 0, fmt: str = "", desc: str = ""
) -> dict[str, Any]:
    return {
        "name": name,
        "type": type_,
        "format": fmt,
        "description": desc or name,
        "priority": priority,
    }


NAME = _col("Name", fmt="name", desc="Name must be unique within a namespace.")
AGE = _col(
    "Age",
    desc="CreationTimestamp is a timestamp representing the server time when this object "
    "was created.",
)


def _pod_cells(pod: dict[str, Any]) -> list[Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    containers = (pod.get("spec") or {}).get("containers") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    phase = (pod.get("status") or {}).get("phase", "Pending")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        phase = "Terminating"
    status = pod.get("status") or {}
    return [
        f"{ready}/{len(containers)}",
        phase,
        restarts,
        _age(pod["metadata"].get("creationTimestamp")),
        status.get("podIP", "<none>"),
        (pod.get("spec") or {}).get("nodeName", "<none>"),
        "<none>",
        "<none>",
    ]


def _svc_cells(svc: dict[str, Any]) -> list[Any]:
    spec = svc.get("spec") or {}
    ports = (
        ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or [])
        or "<none>"
    )
    selector = (
        ",".join(f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items())) or "<none>"
    )
    return [
        spec.get("type", "ClusterIP"),
        spec.get("clusterIP", "<none>"),
        "<none>",
        ports,
        _age(svc["metadata"].get("creationTimestamp")),
        selector,
    ]


def _json_path(obj: Any, path: str) -> Any:
    for part in path.strip(".").split("."):
        if not part:
            continue
        if isinstance(obj, dict):
            obj = obj.get(part)
        else:
            return None
    return obj


def columns_and_cells(rtype: ResourceType) -> tuple[list[dict[str, Any]], Any]:
    key = rtype.key
    created = lambda o: _age(o["metadata"].get("creationTimestamp"))  # noqa: E731
    if key == ("", "pods"):
        cols = [
            NAME,
            _col("Ready"),
            _col("Status"),
            _col("Restarts", "integer"),
            AGE,
            _col("IP", priority=1),
            _col("Node", priority=1),
            _col("Nominated Node", priority=1),
            _col("Readiness Gates", priority=1),
        ]
        return cols, _pod_cells
    if key == ("", "services"):
        cols = [
            NAME,
            _col("Type"),
            _col("Cluster-IP"),
            _col("External-IP"),
            _col("Port(s)"),
            AGE,
            _col("Selector", priority=1),
        ]
        return cols, _svc_cells
    if key == ("", "namespaces"):
        return [NAME, _col("Status"), AGE], lambda o: [
            (o.get("status") or {}).get("phase", ""),
            created(o),
        ]
    if key == ("", "configmaps"):
        return [NAME, _col("Data", "integer"), AGE], lambda o: [
            len(o.get("data") or {}) + len(o.get("binaryData") or {}),
            created(o),
        ]
    if key == ("", "secrets"):
        return [NAME, _col("Type"), _col("Data", "integer"), AGE], lambda o: [
            o.get("type", "Opaque"),
            len(o.get("data") or {}),
            created(o),
        ]
    if key == ("", "serviceaccounts"):
        return [NAME, _col("Secrets", "integer"), AGE], lambda o: [
            len(o.get("secrets") or []),
            created(o),
        ]
    if key[1] in ("rolebindings", "clusterrolebindings"):

        def binding_cells(o: dict[str, Any]) -> list[Any]:
            ref = o.get("roleRef") or {}
            subjects = o.get("subjects") or []

            def names(kind: str) -> str:
                return ", ".join(s.get("name", "") for s in subjects if s.get("kind") == kind)

            return [
                f"{ref.get('kind')}/{ref.get('name')}",
                created(o),
                names("User"),
                names("Group"),
                ", ".join(
                    f"{s.get('namespace')}/{s.get('name')}"
                    for s in subjects
                    if s.get("kind") == "ServiceAccount"
                ),
            ]

        return [
            NAME,
            _col("Role"),
            AGE,
            _col("Users", priority=1),
            _col("Groups", priority=1),
            _col("ServiceAccounts", priority=1),
        ], binding_cells
    if key[1] in ("roles", "clusterroles", "customresourcedefinitions"):
        return [NAME, _col("Created At", fmt="date")], lambda o: [
            o["metadata"].get("creationTimestamp")
        ]
    if rtype.printer_columns:
        cols = [NAME]
        getters = []
        for pc in rtype.printer_columns:
            cols.append(
                _col(
                    pc["name"],
                    pc.get("type", "string"),
                    pc.get("priority", 0),
                    pc.get("format", ""),
                    pc.get("description", ""),
                )
            )
            getters.append(pc.get("jsonPath", ""))
        cols.append(AGE)
        return cols, lambda o: [_json_path(o, p) for p in getters] + [created(o)]
    return [NAME, AGE], lambda o: [created(o)]


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def to_table(
    rtype: ResourceType,
    objects: list[dict[str, Any]],
    resource_version: str,
    include: str = "Metadata",
    headers: bool = True,
    continue_token: str = "",
) -> dict[str, Any]:
    cols, cells = columns_and_cells(rtype)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [obj["metadata"]["name"], *cells(obj)]}
        ref = _row_object(obj, include)
        if ref is not None:
            row["object"] = ref
        rows.append(row)
    meta: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    table: dict[str, Any] = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": cols if headers else None,
        "rows": rows,
    }
    return table
