"""Cluster records and the signing CA in hub Secrets (kubernetes-asyncio; thin).

Writes use the read ``resourceVersion`` (optimistic concurrency): of two gateway replicas that
try to burn the same token, the API server lets exactly one update through and answers the
other 409, which :class:`Conflict` reports. That is what makes a token single-use across
replicas and ``--workers`` without any lock of our own.
"""

from __future__ import annotations

import base64
from typing import Any

from certs.issue import Issued
from gateway.hub.join.records import RECORD_LABEL, ClusterRecord, secret_name


class Conflict(Exception):
    """Someone else changed (or created) the record first."""


class CASecretError(ValueError):
    """The signing CA Secret is missing or unreadable (joining is then refused)."""


class RecordStore:
    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes_asyncio import client

        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace

    async def get(self, cluster: str) -> tuple[ClusterRecord, str] | None:
        """(record, resourceVersion), or None when the cluster has no record."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            secret = await self.core.read_namespaced_secret(secret_name(cluster), self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return ClusterRecord.from_data(secret.data), secret.metadata.resource_version

    async def list(self) -> list[ClusterRecord]:
        secrets = await self.core.list_namespaced_secret(
            self.namespace, label_selector=f"{RECORD_LABEL}=true")
        out = []
        for secret in secrets.items:
            try:
                out.append(ClusterRecord.from_data(secret.data))
            except (ValueError, TypeError):
                continue  # a damaged record names no cluster we could act on
        return sorted(out, key=lambda r: r.cluster)

    async def put(self, record: ClusterRecord, resource_version: str | None) -> None:
        """Create (``resource_version`` None) or replace the record; Conflict if it moved."""
        from kubernetes_asyncio.client.exceptions import ApiException

        body = {
            "apiVersion": "v1", "kind": "Secret", "type": "hubproxy.dev/cluster-record",
            "metadata": {"name": secret_name(record.cluster), "namespace": self.namespace,
                         "labels": {RECORD_LABEL: "true",
                                    "app.kubernetes.io/part-of": "hubproxy"},
                         **({"resourceVersion": resource_version} if resource_version else {})},
            "data": record.to_data(),
        }
        try:
            if resource_version is None:
                await self.core.create_namespaced_secret(self.namespace, body)
            else:
                await self.core.replace_namespaced_secret(
                    secret_name(record.cluster), self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(record.cluster) from None
            raise

    async def read_ca(self, name: str) -> Issued:
        """The tunnel CA (``tls.crt`` + ``tls.key``) from Secret ``name``."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            secret = await self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as exc:
            raise CASecretError(f"cannot read the CA Secret {self.namespace}/{name} "
                                f"(HTTP {exc.status})") from None
        data = secret.data or {}
        try:
            cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
            key = serialization.load_pem_private_key(base64.b64decode(data["tls.key"]), None)
        except (KeyError, ValueError, TypeError):
            raise CASecretError(f"the CA Secret {self.namespace}/{name} needs a PEM tls.crt "
                                "and an unencrypted PEM tls.key") from None
        return Issued(cert, key)  # type: ignore[arg-type]
