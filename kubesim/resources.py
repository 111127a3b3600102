"""The API surface kubesim serves: built-in resource types, CRD-defined ones, discovery documents.

A `ResourceType` is one REST resource of one group/version (what an APIResource entry in
discovery describes). The `Registry` holds built-ins plus whatever CustomResourceDefinitions
are currently established, and renders `/api`, `/api/v1`, `/apis` and `/apis/<g>/<v>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CRUD = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    verbs: list[str] = field(default_factory=lambda: list(CRUD))
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    subresources: dict[str, list[str]] = field(default_factory=dict)  # name -> verbs
    schema: dict[str, Any] | None = None  # openAPIV3Schema for CRDs
    # "virtual" resources (reviews) are create-only and never stored.
    virtual: bool = False
    crd_name: str = ""  # the CRD that defines this type, if any
    printer_columns: list[dict[str, Any]] = field(default_factory=list)

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: objects of one group/resource are shared by all versions."""
        return (self.group, self.plural)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def discovery_entries(self) -> list[dict[str, Any]]:
        main: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": self.verbs,
        }
        if self.short_names:
            main["shortNames"] = self.short_names
        if self.categories:
            main["categories"] = self.categories
        entries = [main]
        for sub, verbs in sorted(self.subresources.items()):
            kind = {
                "token": "TokenRequest",
                "exec": "PodExecOptions",
                "attach": "PodAttachOptions",
                "portforward": "PodPortForwardOptions",
                "log": "Pod",
            }.get(sub, self.kind)
            entry: dict[str, Any] = {
                "name": f"{self.plural}/{sub}",
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": kind,
                "verbs": verbs,
            }
            if sub == "token":
                entry["group"], entry["version"] = "authentication.k8s.io", "v1"
            entries.append(entry)
        return entries


_SUB_KINDS = {
    "token": ("authentication.k8s.io", "v1", "TokenRequest"),
    "exec": ("", "v1", "PodExecOptions"),
    "attach": ("", "v1", "PodAttachOptions"),
    "portforward": ("", "v1", "PodPortForwardOptions"),
}


def _aggregated_resource(t: ResourceType) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "resource": t.plural,
        "responseKind": {"group": t.group, "version": t.version, "kind": t.kind},
        "scope": "Namespaced" if t.namespaced else "Cluster",
        "singularResource": t.singular,
        "verbs": t.verbs,
    }
    if t.short_names:
        entry["shortNames"] = t.short_names
    if t.categories:
        entry["categories"] = t.categories
    subs = []
    for sub, verbs in sorted(t.subresources.items()):
        group, version, kind = _SUB_KINDS.get(sub, (t.group, t.version, t.kind))
        subs.append(
            {
                "subresource": sub,
                "responseKind": {"group": group, "version": version, "kind": kind},
                "verbs": verbs,
            }
        )
    if subs:
        entry["subresources"] = subs
    return entry


def _core(plural: str, kind: str, namespaced: bool = True, **kw: Any) -> ResourceType:
    return ResourceType("", "v1", plural, kind.lower(), kind, namespaced, **kw)


def builtin_types() -> list[ResourceType]:
    create_only = ["create"]
    return [
        _core(
            "namespaces",
            "Namespace",
            False,
            short_names=["ns"],
            verbs=["create", "delete", "get", "list", "patch", "update", "watch"],
            subresources={"status": ["get", "patch", "update"]},
        ),
        _core(
            "pods",
            "Pod",
            short_names=["po"],
            categories=["all"],
            subresources={
                "status": ["get", "patch", "update"],
                "log": ["get"],
                "exec": ["create", "get"],
                "attach": ["create", "get"],
                "portforward": ["create", "get"],
            },
        ),
        _core("configmaps", "ConfigMap", short_names=["cm"]),
        _core("secrets", "Secret"),
        _core(
            "services",
            "Service",
            short_names=["svc"],
            categories=["all"],
            subresources={"status": ["get", "patch", "update"]},
        ),
        _core(
            "serviceaccounts",
            "ServiceAccount",
            short_names=["sa"],
            subresources={"token": ["create"]},
        ),
        _core("events", "Event", short_names=["ev"]),
        ResourceType("rbac.authorization.k8s.io", "v1", "roles", "role", "Role", True),
        ResourceType(
            "rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding", True
        ),
        ResourceType(
            "rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole", False
        ),
        ResourceType(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "clusterrolebinding",
            "ClusterRoleBinding",
            False,
        ),
        ResourceType(
            "authentication.k8s.io",
            "v1",
            "tokenreviews",
            "tokenreview",
            "TokenReview",
            False,
            verbs=create_only,
            virtual=True,
        ),
        ResourceType(
            "authentication.k8s.io",
            "v1",
            "selfsubjectreviews",
            "selfsubjectreview",
            "SelfSubjectReview",
            False,
            verbs=create_only,
            virtual=True,
        ),
        ResourceType(
            "authorization.k8s.io",
            "v1",
            "subjectaccessreviews",
            "subjectaccessreview",
            "SubjectAccessReview",
            False,
            verbs=create_only,
            virtual=True,
        ),
        ResourceType(
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
            "selfsubjectaccessreview",
            "SelfSubjectAccessReview",
            False,
            verbs=create_only,
            virtual=True,
        ),
        ResourceType(
            "authorization.k8s.io",
            "v1",
            "selfsubjectrulesreviews",
            "selfsubjectrulesreview",
            "SelfSubjectRulesReview",
            False,
            verbs=create_only,
            virtual=True,
        ),
        ResourceType(
            "authorization.k8s.io",
            "v1",
            "localsubjectaccessreviews",
            "localsubjectaccessreview",
            "LocalSubjectAccessReview",
            True,
            verbs=create_only,
            virtual=True,
        ),
        ResourceType(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "customresourcedefinition",
            "CustomResourceDefinition",
            False,
            short_names=["crd", "crds"],
            categories=["api-extensions"],
            subresources={"status": ["get", "patch", "update"]},
        ),
    ]


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CustomResourceDefinition."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        subs = version.get("subresources") or {}
        out.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=list(names.get("shortNames") or []),
                categories=list(names.get("categories") or []),
                subresources={k: ["get", "patch", "update"] for k in subs if k == "status"},
                schema=((version.get("schema") or {}).get("openAPIV3Schema")),
                crd_name=crd["metadata"]["name"],
                printer_columns=list(version.get("additionalPrinterColumns") or []),
            )
        )
    return out


class Registry:
    """Built-in types plus CRD types, looked up by group/version/plural."""

    def __init__(self) -> None:
        self._builtin = builtin_types()
        self._crd: dict[str, list[ResourceType]] = {}  # CRD name -> its types

    def all(self) -> list[ResourceType]:
        types = list(self._builtin)
        for crd_types in self._crd.values():
            types.extend(crd_types)
        return types

    def set_crd(self, crd: dict[str, Any]) -> None:
        self._crd[crd["metadata"]["name"]] = types_from_crd(crd)

    def remove_crd(self, name: str) -> None:
        self._crd.pop(name, None)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        for t in self.all():
            if t.group == group and t.version == version and t.plural == plural:
                return t
        return None

    def by_key(self, group: str, plural: str) -> ResourceType | None:
        for t in self.all():
            if t.group == group and t.plural == plural:
                return t
        return None

    def group_versions(self) -> dict[str, list[str]]:
        """group -> versions in order of appearance (first is preferred)."""
        groups: dict[str, list[str]] = {}
        for t in self.all():
            if not t.group:
                continue
            versions = groups.setdefault(t.group, [])
            if t.version not in versions:
                versions.append(t.version)
        return groups

    # --- discovery documents -------------------------------------------------------------
    def api_versions(self, server_address: str) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
            ],
        }

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.group_versions().get(group)
        if not versions:
            return None
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    def api_group_list(self) -> dict[str, Any]:
        groups = [self.api_group(g) for g in self.group_versions()]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def aggregated(self, core: bool) -> dict[str, Any]:
        """apidiscovery.k8s.io/v2 APIGroupDiscoveryList: `/api` (core) or `/apis` (the rest)."""
        groups = {"": ["v1"]} if core else self.group_versions()
        items = []
        for group, versions in groups.items():
            entries = []
            for version in versions:
                types = [t for t in self.all() if t.group == group and t.version == version]
                entries.append(
                    {
                        "version": version,
                        "freshness": "Current",
                        "resources": [_aggregated_resource(t) for t in types],
                    }
                )
            items.append(
                {"metadata": {"name": group, "creationTimestamp": None}, "versions": entries}
            )
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        }

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        types = [t for t in self.all() if t.group == group and t.version == version]
        if not types:
            return None
        resources: list[dict[str, Any]] = []
        for t in types:
            resources.extend(t.discovery_entries())
        doc: dict[str, Any] = {
            "kind": "APIResourceList",
            "groupVersion": types[0].group_version,
            "resources": resources,
        }
        if group:
            doc["apiVersion"] = "v1"
        return doc
