"""The ExecCredential exchange of a client-go exec credential plugin: what client-go writes into
``KUBERNETES_EXEC_INFO`` (``client.authentication.k8s.io/v1`` or ``v1beta1``), checked, and the
``ExecCredential`` the plugin answers with.

Shared by ``hubproxy-creds`` (:mod:`gateway.access.creds`) and its hub modes
(:mod:`gateway.access.hubtokens`). Only the standard library: it is part of every credential
refresh, a process start.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_TOKEN_FILE = SERVICEACCOUNT_DIR / "token"

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")


class CredentialError(Exception):
    """A failure to report on stderr as one line. Messages never contain a token."""

    exit_code = 1


@dataclass(frozen=True)
class ExecRequest:
    """What the plugin needs from ``KUBERNETES_EXEC_INFO``."""

    api_version: str
    cluster_name: str
    server: str


def parse_exec_info(raw: str | None, cluster_name: str | None = None) -> ExecRequest:
    """Validate an ExecCredential input document as client-go writes it.

    ``cluster_name`` (``--cluster``) stands in for the cluster information when the client
    cannot send it: Argo CD before 3.5, whose ``execProviderConfig`` has no
    ``provideClusterInfo``. What the client sends, when it sends it, wins.
    """
    if raw is None or not raw.strip():
        raise CredentialError(
            "KUBERNETES_EXEC_INFO is not set: run hubproxy-creds as a client-go exec plugin"
            " with provideClusterInfo: true"
        )
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CredentialError(f"KUBERNETES_EXEC_INFO is not valid JSON: {exc.msg}") from None
    if not isinstance(document, dict):
        raise CredentialError("KUBERNETES_EXEC_INFO must be a JSON object (an ExecCredential)")
    if document.get("kind") != "ExecCredential":
        raise CredentialError(
            f"KUBERNETES_EXEC_INFO has kind {document.get('kind')!r}, expected ExecCredential"
        )
    api_version = document.get("apiVersion")
    if api_version not in EXEC_API_VERSIONS:
        raise CredentialError(
            f"unsupported ExecCredential apiVersion {api_version!r};"
            f" supported: {', '.join(EXEC_API_VERSIONS)}"
        )
    spec = document.get("spec")
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    if not isinstance(cluster, dict) and cluster_name is not None:
        cluster = {"config": {"clusterName": cluster_name}}
    if not isinstance(cluster, dict):
        raise CredentialError(
            "no cluster information in KUBERNETES_EXEC_INFO: set provideClusterInfo: true"
            " in the exec configuration (or pass --cluster NAME)"
        )
    config = cluster.get("config")
    cluster_name = config.get("clusterName") if isinstance(config, dict) else None
    if not isinstance(cluster_name, str) or not cluster_name:
        raise CredentialError(
            "spec.cluster.config.clusterName is missing: add the exec extension"
            ' client.authentication.k8s.io/exec {"clusterName": "<cluster>"} to the cluster'
        )
    if len(cluster_name) > 253 or not _DNS1123_SUBDOMAIN.match(cluster_name):
        raise CredentialError(
            f"clusterName {cluster_name!r} is not a valid DNS-1123 subdomain"
        )
    server = cluster.get("server")
    return ExecRequest(api_version, cluster_name, server if isinstance(server, str) else "")


def token_expiry(token: str) -> datetime | None:
    """The ``exp`` claim of a JWT, unverified (the issuer verifies); None for opaque tokens."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return None
    try:
        return datetime.fromtimestamp(exp, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def token_claims(token: str) -> dict[str, object]:
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


def exec_credential(api_version: str, token: str, expires: datetime | None) -> dict[str, object]:
    status: dict[str, str] = {"token": token}
    if expires is not None:
        status["expirationTimestamp"] = expires.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": api_version, "kind": "ExecCredential", "status": status}


def read_token_file(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise CredentialError(f"cannot read token file {path}: {exc.strerror}") from None
    if not token:
        raise CredentialError(f"token file {path} is empty")
    return token
