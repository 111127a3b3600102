"""Who an agent is: the cluster named in its verified client certificate, and nothing else.

DESIGN §4: the cluster name comes from the URI SAN ``hubproxy://cluster/<name>`` of the
certificate the TLS layer verified against the agent CA. What the agent says over the tunnel
never names a cluster, so an agent for ``c1`` cannot register as ``c2``.

The prefix and the name rule live here, the one place both sides read: ``certs`` issues with
them (``certs.identity``) and the tunnel checks with them. The tunnel imports nothing else of
ours.
"""

from __future__ import annotations

import re

from cryptography import x509

CLUSTER_URI_PREFIX = "hubproxy://cluster/"


class AgentIdentityError(ValueError):
    """The peer certificate does not name exactly one valid cluster."""


# Kubernetes IsDNS1123Subdomain: lower-case labels joined by dots, at most 253 characters.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
MAX_NAME_LENGTH = 253
MAX_LABEL_LENGTH = 63


def validate_cluster_name(name: str) -> str:
    """``name`` unchanged if it is a DNS-1123 subdomain, else :class:`AgentIdentityError`.

    The message says which rule was broken and repeats the name (cluster names are not
    secrets), so a CLI can print it as is.
    """
    if not isinstance(name, str) or not name:
        raise AgentIdentityError("cluster name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise AgentIdentityError(
            f"invalid cluster name {name[:40]!r}...: longer than {MAX_NAME_LENGTH} characters"
        )
    if not _SUBDOMAIN.fullmatch(name):
        raise AgentIdentityError(
            f"invalid cluster name {name!r}: must be a DNS-1123 subdomain (lower-case letters, "
            "digits, '-' and '.', starting and ending with a letter or digit, e.g. 'cluster1' "
            "or 'prod.eu-west')"
        )
    for label in name.split("."):
        if len(label) > MAX_LABEL_LENGTH:
            raise AgentIdentityError(
                f"invalid cluster name {name!r}: label {label[:20]!r}... is longer than "
                f"{MAX_LABEL_LENGTH} characters"
            )
    return name


def cluster_from_certificate(der: bytes | None) -> str:
    """The one cluster the certificate names, or AgentIdentityError."""
    if not der:
        raise AgentIdentityError("no client certificate")
    try:
        certificate = x509.load_der_x509_certificate(der)
    except ValueError:
        raise AgentIdentityError("unreadable client certificate") from None
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise AgentIdentityError("client certificate has no subjectAltName") from None
    names = [
        uri[len(CLUSTER_URI_PREFIX) :]
        for uri in sans.get_values_for_type(x509.UniformResourceIdentifier)
        if uri.startswith(CLUSTER_URI_PREFIX)
    ]
    if len(names) != 1:
        raise AgentIdentityError(
            f"client certificate must name exactly one cluster ({CLUSTER_URI_PREFIX}<name>), "
            f"it names {len(names)}"
        )
    return validate_cluster_name(names[0])
