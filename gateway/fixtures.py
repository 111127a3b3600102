"""The demo's world, reusable: who is who on the hub and the managed clusters, the RBAC that
lets them, the sample pod, and how the gateway and an agent are started.

``hubproxy demo`` builds its clusters from these, and so do the tests and the benchmarks that
run the real processes (against kubesim or a real kube-apiserver): one definition of the demo
identities (:data:`DEMO_USER` is what a managed cluster sees for the hub service account
``demo/demo``), of least-privilege RBAC like ``deploy/``'s, and of the command lines.
"""

from __future__ import annotations

import csv
import io
import json
import os
import ssl
import sys
from pathlib import Path
from typing import Any

from gateway.wire.identity import DEFAULT_PREFIX

DEMO_NAMESPACE = "demo"
DEMO_SA = "demo"
DEMO_USER = f"{DEFAULT_PREFIX}system:serviceaccount:{DEMO_NAMESPACE}:{DEMO_SA}"
GATEWAY_USER = "hubproxy-gateway"  # the gateway's own hub credential
AGENT_USER = "hubproxy-agent"  # each agent's credential on its managed cluster
LOOPBACK = "127.0.0.1"
RBAC = "rbac.authorization.k8s.io/v1"


# ------------------------------------------------------------------------------- RBAC ------
def _role(kind: str, name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": RBAC, "kind": kind, "metadata": {"name": name}, "rules": rules}


def _binding(name: str, role: str, subjects: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    }


def _user(name: str) -> dict[str, Any]:
    return {"kind": "User", "name": name, "apiGroup": "rbac.authorization.k8s.io"}


def hub_rbac(namespace: str = DEMO_NAMESPACE, sa: str = DEMO_SA) -> list[dict[str, Any]]:
    """The gateway may review tokens and access; the demo SA may use the proxy (any cluster)."""
    return [
        _role("ClusterRole", "hubproxy-gateway", [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
             "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
             "verbs": ["create"]},
            # The ClusterProfile access-provider writer (as in deploy/hub/rbac.yaml).
            {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["clusterprofiles"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["clusterprofiles/status"],
             "verbs": ["get", "patch", "update"]},
        ]),
        _binding("hubproxy-gateway", "hubproxy-gateway", [_user(GATEWAY_USER)]),
        _role("ClusterRole", "hubproxy-demo-proxy", [
            {"apiGroups": ["cluster.open-cluster-management.io"],
             "resources": ["managedclusters/proxy"], "verbs": ["get"]},
        ]),
        _binding("hubproxy-demo-proxy", "hubproxy-demo-proxy",
                 [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]),
    ]


def managed_rbac(user: str = DEMO_USER) -> list[dict[str, Any]]:
    """The agent may impersonate; the hub identity may view, create and exec/log/port-forward."""
    return [
        _role("ClusterRole", "hubproxy-agent-impersonate", [
            {"apiGroups": [""], "resources": ["users", "groups"], "verbs": ["impersonate"]},
            # uids and userextras/<any key>: RBAC cannot wildcard the key, and nothing else in
            # authentication.k8s.io has an impersonate verb (same rule as deploy/agent/rbac.yaml).
            {"apiGroups": ["authentication.k8s.io"], "resources": ["*"],
             "verbs": ["impersonate"]},
        ]),
        _binding("hubproxy-agent-impersonate", "hubproxy-agent-impersonate",
                 [_user(AGENT_USER)]),
        _role("ClusterRole", "hubproxy-demo-user", [
            {"apiGroups": [""],
             "resources": ["pods", "configmaps", "services", "namespaces", "events",
                           "serviceaccounts", "pods/log", "pods/status"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods", "configmaps"],
             "verbs": ["create", "update", "patch", "delete"]},
            {"apiGroups": [""], "resources": ["pods/exec", "pods/portforward", "pods/attach"],
             "verbs": ["get", "create"]},
        ]),
        _binding("hubproxy-demo-user", "hubproxy-demo-user", [_user(user)]),
    ]


POD_HTTP_PORT = 8080  # the sample pod's "web server", for kubectl port-forward


def sample_pod(name: str = "demo", namespace: str = "default",
               http_server: int | None = None) -> dict[str, Any]:
    """The sample pod; with ``http_server``, kubesim sends port-forwards to its port 8080 to
    that local HTTP server (the demo's), so ``curl`` through a port-forward gets HTTP."""
    annotations = {"kubesim.hubproxy.dev/log-interval-ms": "500"}
    if http_server is not None:
        annotations[f"kubesim.hubproxy.dev/port-{POD_HTTP_PORT}"] = f"{LOOPBACK}:{http_server}"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "demo"},
                     "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "ports": [{"containerPort": POD_HTTP_PORT}]}]},
    }


# ------------------------------------------------------------------- files and commands ----
def token_csv(rows: list[tuple[str, str, str, list[str]]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for token, user, uid, groups in rows:
        writer.writerow([token, user, uid, ",".join(groups)])
    return out.getvalue()


def write_private(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


def agent_kubeconfig(server: str, ca_file: str, token_file: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "agent",
        "clusters": [{"name": "local", "cluster": {"server": server,
                                                   "certificate-authority": ca_file}}],
        "users": [{"name": "agent", "user": {"tokenFile": token_file}}],
        "contexts": [{"name": "agent", "context": {"cluster": "local", "user": "agent"}}],
    }


def hubproxy_command() -> list[str]:
    return [sys.executable, "-m", "gateway.cli"]


def gateway_args(pki: Path, *, listen: str, tunnel_listen: str, health_listen: str,
                 hub_kubeconfig: Path) -> list[str]:
    return [
        "gateway", "--listen", listen, "--tunnel-listen", tunnel_listen,
        "--health-listen", health_listen, "--tls-dir", str(pki / "gateway"),
        "--tunnel-tls-dir", str(pki / "tunnel-server"),
        "--agent-ca", str(pki / "tunnel-ca" / "ca.crt"),
        "--hub-kubeconfig", str(hub_kubeconfig),
    ]


def agent_args(pki: Path, cluster: str, *, hub: str, kubeconfig: Path,
               health_listen: str) -> list[str]:
    return [
        "agent", "--hub", hub, "--cluster", cluster,
        "--tls-dir", str(pki / "agents" / cluster), "--kubeconfig", str(kubeconfig),
        "--health-listen", health_listen, "--drain-timeout", "5",
    ]


# ------------------------------------------------------------------ a tiny HTTP client ------
def _ssl(ca_file: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=ca_file)
    return ctx


async def request(base: str, ca_file: str, token: str, method: str, path: str,
                  body: Any = None) -> tuple[int, bytes]:
    import aiohttp

    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.request(
        method, base + path, json=body, headers=headers, ssl=_ssl(ca_file)
    ) as resp:
        return resp.status, await resp.read()


async def api(base: str, ca_file: str, token: str, method: str, path: str,
              body: Any = None) -> dict[str, Any]:
    status, payload = await request(base, ca_file, token, method, path, body)
    if status >= 300 and status != 409:  # 409: already exists (rerun with the same --dir)
        raise RuntimeError(f"{method} {path}: HTTP {status}: {payload[:300]!r}")
    return json.loads(payload) if payload else {}
