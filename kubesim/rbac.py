"""RBAC-lite: the rbac.authorization.k8s.io/v1 evaluation rules over objects in the store.

Matches kube-apiserver's RBAC authorizer for what kubesim serves: verbs, apiGroups, resources
(`*`, `pods/log`, `*/scale`), resourceNames, nonResourceURLs (`/healthz`, `/apis/*`),
Role/ClusterRole referenced by RoleBinding (namespaced) or ClusterRoleBinding (everywhere),
subjects User/Group/ServiceAccount. Members of `system:masters` are allowed everything, as the
real apiserver's superuser authorizer does. Denials carry kube-apiserver's exact message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubesim import status
from kubesim.auth import SA_PREFIX, UserInfo
from kubesim.store import Store

RBAC_GROUP = "rbac.authorization.k8s.io"
SUPERUSER_GROUP = "system:masters"


@dataclass(frozen=True)
class Attributes:
    """authorizer.Attributes: what a request (or an impersonation step) wants to do."""

    user: UserInfo
    verb: str
    resource_request: bool
    namespace: str = ""
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    path: str = ""


def forbidden_message(attrs: Attributes) -> str:
    if not attrs.resource_request:
        return f'User "{attrs.user.name}" cannot {attrs.verb} path "{attrs.path}"'
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    return (
        f'User "{attrs.user.name}" cannot {attrs.verb} resource "{resource}" '
        f'in API group "{attrs.api_group}" {where}'
    )


def forbidden_error(attrs: Attributes, reason: str = "") -> status.StatusError:
    """responsewriters.Forbidden: NewForbidden(group/resource, name, message[: reason])."""
    message = forbidden_message(attrs)
    if reason:
        message = f"{message}: {reason}"
    if not attrs.resource_request:
        return status.forbidden("", "", "", message)
    return status.forbidden(attrs.api_group, attrs.resource, attrs.name, message)


def _resource_matches(rule: dict[str, Any], attrs: Attributes) -> bool:
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    for resource in rule.get("resources") or []:
        if resource in ("*", combined):
            return True
        if attrs.subresource and resource == f"*/{attrs.subresource}":
            return True
    return False


def _url_matches(rule: dict[str, Any], path: str) -> bool:
    for url in rule.get("nonResourceURLs") or []:
        if url == "*" or url == path or (url.endswith("*") and path.startswith(url[:-1])):
            return True
    return False


def rule_allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource_request:
        return _url_matches(rule, attrs.path)
    groups = rule.get("apiGroups") or []
    if "*" not in groups and attrs.api_group not in groups:
        return False
    if not _resource_matches(rule, attrs):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def subject_matches(subject: dict[str, Any], user: UserInfo, binding_namespace: str) -> bool:
    kind = subject.get("kind")
    name = subject.get("name", "")
    if kind == "User":
        return user.name == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"{SA_PREFIX}{namespace}:{name}"
    return False


def _describe(subject: dict[str, Any]) -> str:
    if subject.get("kind") == "ServiceAccount":
        return f'ServiceAccount "{subject.get("namespace", "")}/{subject.get("name", "")}"'
    return f'{subject.get("kind")} "{subject.get("name", "")}"'


class Authorizer:
    def __init__(self, store: Store) -> None:
        self.store = store

    def authorize(self, attrs: Attributes) -> tuple[bool, str]:
        """(allowed, reason). The reason is kube-apiserver's RBAC allow reason, or "" on denial."""
        if SUPERUSER_GROUP in attrs.user.groups:
            return True, ""
        for binding in self.store.iter_raw((RBAC_GROUP, "clusterrolebindings")):
            reason = self._binding_allows(binding, attrs, "")
            if reason:
                return True, reason
        if attrs.resource_request and attrs.namespace:
            for binding in self.store.iter_raw((RBAC_GROUP, "rolebindings"), attrs.namespace):
                reason = self._binding_allows(binding, attrs, attrs.namespace)
                if reason:
                    return True, reason
        return False, ""

    def _binding_allows(self, binding: dict[str, Any], attrs: Attributes, namespace: str) -> str:
        subjects = binding.get("subjects") or []
        matched = next((s for s in subjects if subject_matches(s, attrs.user, namespace)), None)
        if matched is None:
            return ""
        ref = binding.get("roleRef") or {}
        if ref.get("kind") == "ClusterRole":
            role = self.store.get_raw((RBAC_GROUP, "clusterroles"), "", ref.get("name", ""))
        elif ref.get("kind") == "Role" and namespace:
            role = self.store.get_raw((RBAC_GROUP, "roles"), namespace, ref.get("name", ""))
        else:
            role = None
        if role is None:
            return ""
        if not any(rule_allows(rule, attrs) for rule in role.get("rules") or []):
            return ""
        kind = "ClusterRoleBinding" if not namespace else "RoleBinding"
        where = (
            f'"{binding["metadata"]["name"]}"'
            if not namespace
            else f'"{binding["metadata"]["name"]}/{namespace}"'
        )
        role = f'{ref["kind"]} "{ref["name"]}"'
        return f"RBAC: allowed by {kind} {where} of {role} to {_describe(matched)}"


def rules_for(store: Store, user: UserInfo, namespace: str) -> list[dict[str, Any]]:
    """Every rule granted to `user` cluster-wide or in `namespace` (SelfSubjectRulesReview)."""
    if SUPERUSER_GROUP in user.groups:
        return [
            {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
            {"verbs": ["*"], "nonResourceURLs": ["*"]},
        ]
    rules: list[dict[str, Any]] = []
    bindings = [(b, "") for b in store.iter_raw((RBAC_GROUP, "clusterrolebindings"))]
    if namespace:
        bindings += [
            (b, namespace) for b in store.iter_raw((RBAC_GROUP, "rolebindings"), namespace)
        ]
    for binding, ns in bindings:
        if not any(subject_matches(s, user, ns) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        if ref.get("kind") == "ClusterRole":
            role = store.get_raw((RBAC_GROUP, "clusterroles"), "", ref.get("name", ""))
        else:
            role = store.get_raw((RBAC_GROUP, "roles"), ns, ref.get("name", "")) if ns else None
        rules.extend((role or {}).get("rules") or [])
    return rules


def bootstrap_policy() -> list[dict[str, Any]]:
    """The defaults every cluster has: discovery for everyone, self-reviews, cluster-admin."""
    labels = {"kubernetes.io/bootstrapping": "rbac-defaults"}

    def cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": f"{RBAC_GROUP}/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels},
            "rules": rules,
        }

    def binding(name: str, role: str, groups: list[str]) -> dict[str, Any]:
        return {
            "apiVersion": f"{RBAC_GROUP}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": labels},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups],
        }

    return [
        cluster_role(
            "cluster-admin",
            [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ],
        ),
        cluster_role(
            "system:discovery",
            [
                {
                    "nonResourceURLs": [
                        "/api",
                        "/api/*",
                        "/apis",
                        "/apis/*",
                        "/healthz",
                        "/livez",
                        "/openapi",
                        "/openapi/*",
                        "/readyz",
                        "/version",
                        "/version/",
                    ],
                    "verbs": ["get"],
                }
            ],
        ),
        cluster_role(
            "system:public-info-viewer",
            [
                {
                    "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
                    "verbs": ["get"],
                }
            ],
        ),
        cluster_role(
            "system:basic-user",
            [
                {
                    "apiGroups": ["authorization.k8s.io"],
                    "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    "verbs": ["create"],
                },
                {
                    "apiGroups": ["authentication.k8s.io"],
                    "resources": ["selfsubjectreviews"],
                    "verbs": ["create"],
                },
            ],
        ),
        binding("cluster-admin", "cluster-admin", [SUPERUSER_GROUP]),
        binding("system:discovery", "system:discovery", ["system:authenticated"]),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            ["system:authenticated", "system:unauthenticated"],
        ),
        binding("system:basic-user", "system:basic-user", ["system:authenticated"]),
    ]
