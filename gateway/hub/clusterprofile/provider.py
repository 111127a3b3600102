"""The gateway's entry in a ClusterProfile's ``status.accessProviders``: pure computations.

The writer keeps exactly one entry named after its provider (``hubproxy`` by default,
``open-cluster-management`` for drop-in use with OCM consumers) and never touches anything
else: other providers keep their order and content, ``status.conditions`` and the rest of
``status`` are not part of the patch. The patch carries ``metadata.resourceVersion`` so a
concurrent writer makes it fail with 409 instead of being overwritten.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

EXEC_EXTENSION = "client.authentication.k8s.io/exec"
GROUP = "multicluster.x-k8s.io"
VERSION = "v1alpha1"
PLURAL = "clusterprofiles"


class NotACABundle(ValueError):
    """The bundle has no CA certificate: publishing a leaf would break on its rotation."""


def ca_certificates_only(pem_bundle: bytes) -> bytes:
    """The CA certificates of a PEM bundle, in order; leaves are dropped.

    Consumers pin what we publish, so it must be the issuing CA, which outlives the serving
    certificate it signs.
    """
    try:
        certificates = x509.load_pem_x509_certificates(pem_bundle)
    except ValueError as exc:
        raise NotACABundle(f"not a PEM certificate bundle: {exc}") from None
    kept = []
    for certificate in certificates:
        try:
            constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
        except x509.ExtensionNotFound:
            continue
        if constraints.value.ca:
            kept.append(certificate.public_bytes(Encoding.PEM))
    if not kept:
        raise NotACABundle("the bundle holds no CA certificate (BasicConstraints CA:TRUE)")
    return b"".join(kept)


def access_provider_entry(
    provider_name: str, public_url: str, cluster: str, ca_bundle: bytes
) -> dict[str, Any]:
    """The entry that lets a consumer reach ``cluster`` through this gateway."""
    return {
        "name": provider_name,
        "cluster": {
            "server": f"{public_url.rstrip('/')}/{cluster}",
            "certificate-authority-data": base64.b64encode(ca_bundle).decode(),
            "extensions": [{"name": EXEC_EXTENSION, "extension": {"clusterName": cluster}}],
        },
    }


def merged_access_providers(
    current: list[Any] | None, provider_name: str, entry: Mapping[str, Any] | None
) -> list[Any] | None:
    """The new ``accessProviders`` list, or None when nothing needs to change.

    Our entry replaces the first one with our name, in place; duplicates of our name are
    dropped; ``entry=None`` removes ours. Every other entry stays as it was, in order.
    """
    current = list(current or [])
    result: list[Any] = []
    placed = False
    for item in current:
        if isinstance(item, dict) and item.get("name") == provider_name:
            if entry is not None and not placed:
                result.append(dict(entry))
                placed = True
            continue
        result.append(item)
    if entry is not None and not placed:
        result.append(dict(entry))
    return None if result == current else result


def status_patch(
    profile: Mapping[str, Any], provider_name: str, entry: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """A merge patch for the ``status`` subresource, or None if the profile is already right."""
    status = profile.get("status") or {}
    new = merged_access_providers(status.get("accessProviders"), provider_name, entry)
    if new is None:
        return None
    patch: dict[str, Any] = {
        "metadata": {"resourceVersion": profile["metadata"]["resourceVersion"]},
        "status": {"accessProviders": new},
    }
    if "conditions" in status and status["conditions"] is None:
        # The CRD rejects null; a stray null written by someone else would fail our patch too.
        patch["status"]["conditions"] = []
    return patch


def cluster_of(profile: Mapping[str, Any]) -> str:
    """The cluster a ClusterProfile describes: its name, as OCM and cluster-inventory-api use."""
    return str(profile["metadata"]["name"])
