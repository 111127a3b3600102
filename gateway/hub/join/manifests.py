"""The managed cluster's side of a join: the agent manifests ``cluster add`` prints (pure).

The same objects as ``deploy/agent`` (namespace, ServiceAccount, the impersonation
ClusterRole, Deployment, PodDisruptionBudget; tests/gateway/hub/join checks they do not drift),
with what a join changes:

* Secret ``hubproxy-agent-credentials`` holds the join token and the hub CA (``ca.crt``); the
  agent replaces the token with the key it makes and the certificate the hub signs
  (``tls.key``, ``tls.crt``) and keeps them there across restarts and renewals;
* a Role lets the agent's ServiceAccount get and update **that one Secret** (resourceNames),
  nothing else in the namespace;
* the agent's certificate files live in a memory-backed emptyDir it writes itself.

The impersonation ClusterRole is one of the agent's two profiles (``IMPERSONATION_RULES``):
``legacy`` (deploy/agent/rbac.yaml, the default, as deploy/agent) or ``read-only``
(deploy/agent/profiles/read-only: constrained impersonation, reads only). Both name the
ClusterRole ``hubproxy-agent-impersonator``, so applying one replaces the other:
:func:`profile_of` says which one a cluster's ClusterRole is, for ``cluster add`` to refuse
that without ``--force``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

NAMESPACE = "hubproxy-agent"
ACCOUNT = "hubproxy-agent"
CREDENTIALS = "hubproxy-agent-credentials"
TLS_DIR = "/var/run/hubproxy/agent-tls"
DEFAULT_IMAGE = "ghcr.io/hubproxy/hubproxy:0.1.0"
_LABELS = {"app.kubernetes.io/name": "hubproxy-agent", "app.kubernetes.io/part-of": "hubproxy"}
IMPERSONATOR = "hubproxy-agent-impersonator"  # the ClusterRole (and binding) of every profile

LEGACY = "legacy"
READ_ONLY = "read-only"
# The rules of each profile's ClusterRole, as deploy/agent/rbac.yaml and
# deploy/agent/profiles/read-only/rbac.yaml write them (tests check that they do not drift).
IMPERSONATION_RULES: dict[str, list[dict[str, Any]]] = {
    LEGACY: [
        {"apiGroups": [""], "resources": ["users", "groups"], "verbs": ["impersonate"]},
        {"apiGroups": ["authentication.k8s.io"], "resources": ["*"], "verbs": ["impersonate"]},
    ],
    READ_ONLY: [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["*"],
         "verbs": ["impersonate:user-info"]},
        {"apiGroups": ["*"], "resources": ["*"],
         "verbs": ["impersonate-on:user-info:get", "impersonate-on:user-info:list",
                   "impersonate-on:user-info:watch"]},
        {"nonResourceURLs": ["*"], "verbs": ["impersonate-on:user-info:get"]},
    ],
}
PROFILES = tuple(IMPERSONATION_RULES)
DEFAULT_PROFILE = LEGACY  # what deploy/agent uses
_RULE_LISTS = ("apiGroups", "resources", "resourceNames", "nonResourceURLs", "verbs")


def _canonical(rules: Iterable[Mapping[str, Any]]) -> frozenset[tuple[tuple[str, ...], ...]]:
    """Rules compared as RBAC reads them: order of rules and of values does not matter, an
    empty list is no list."""
    return frozenset(tuple(tuple(sorted(rule.get(key) or ())) for key in _RULE_LISTS)
                     for rule in rules)


_CANONICAL = {name: _canonical(rules) for name, rules in IMPERSONATION_RULES.items()}


def profile_of(rules: Iterable[Mapping[str, Any]]) -> str | None:
    """The profile whose ClusterRole has exactly these rules; None for any other rules."""
    found = _canonical(rules)
    return next((name for name, canonical in _CANONICAL.items() if canonical == found), None)


def agent_manifests(*, cluster: str, hub: str, token: str, hub_ca_pem: str,
                    image: str = DEFAULT_IMAGE, hub_server_name: str | None = None,
                    replicas: int = 2, profile: str = DEFAULT_PROFILE) -> list[dict[str, Any]]:
    meta = {"namespace": NAMESPACE, "labels": dict(_LABELS)}
    env = [
        {"name": "HUBPROXY_HUB", "value": hub},
        {"name": "HUBPROXY_CLUSTER", "value": cluster},
        {"name": "HUBPROXY_TLS_DIR", "value": TLS_DIR},
        {"name": "HUBPROXY_CREDENTIALS_SECRET", "value": f"{NAMESPACE}/{CREDENTIALS}"},
        {"name": "HUBPROXY_HEALTH_LISTEN", "value": "0.0.0.0:8000"},
    ]
    if hub_server_name:
        env.append({"name": "HUBPROXY_HUB_SERVER_NAME", "value": hub_server_name})
    probe = {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 10,
             "timeoutSeconds": 3, "failureThreshold": 3}
    return [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": NAMESPACE, "labels": {
             "pod-security.kubernetes.io/enforce": "restricted",
             "app.kubernetes.io/part-of": "hubproxy"}}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": True,
         "metadata": {"name": ACCOUNT, **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": IMPERSONATOR, "labels": dict(_LABELS)},
         "rules": [{key: list(values) for key, values in rule.items()}
                   for rule in IMPERSONATION_RULES[profile]]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": IMPERSONATOR, "labels": dict(_LABELS)},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": IMPERSONATOR},
         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "hubproxy-agent-credentials", **meta},
         "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [CREDENTIALS],
                    "verbs": ["get", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "hubproxy-agent-credentials", **meta},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "hubproxy-agent-credentials"},
         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": CREDENTIALS, **meta},
         "stringData": {"join-token": token, "ca.crt": hub_ca_pem}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "hubproxy-agent", **meta},
         "spec": {
             "replicas": replicas,
             "selector": {"matchLabels": {"app.kubernetes.io/name": "hubproxy-agent"}},
             "template": {
                 "metadata": {"labels": {"app.kubernetes.io/name": "hubproxy-agent",
                                         "app.kubernetes.io/component": "agent"}},
                 "spec": {
                     "serviceAccountName": ACCOUNT,
                     "terminationGracePeriodSeconds": 45,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                         "runAsGroup": 65532, "fsGroup": 65532,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{
                         "name": "agent", "image": image, "imagePullPolicy": "IfNotPresent",
                         "command": ["hubproxy", "agent"], "env": env,
                         "ports": [{"name": "health", "containerPort": 8000,
                                    "protocol": "TCP"}],
                         "livenessProbe": probe,
                         "readinessProbe": {**probe, "httpGet": {"path": "/readyz",
                                                                 "port": "health"},
                                            "periodSeconds": 5, "failureThreshold": 2},
                         "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                       "limits": {"memory": "256Mi"}},
                         "securityContext": {"allowPrivilegeEscalation": False,
                                             "readOnlyRootFilesystem": True,
                                             "runAsNonRoot": True,
                                             "capabilities": {"drop": ["ALL"]}},
                         "volumeMounts": [{"name": "agent-tls", "mountPath": TLS_DIR},
                                          {"name": "tmp", "mountPath": "/tmp"}],
                     }],
                     "volumes": [
                         {"name": "agent-tls", "emptyDir": {"medium": "Memory",
                                                            "sizeLimit": "1Mi"}},
                         {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
                     ],
                 },
             },
         }},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": {"name": "hubproxy-agent", **meta},
         "spec": {"minAvailable": 1,
                  "selector": {"matchLabels": {"app.kubernetes.io/name": "hubproxy-agent"}}}},
    ]


def render(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)
