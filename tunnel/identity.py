"""Who an agent is: the cluster named in its verified client certificate, and nothing else.

DESIGN §4: the cluster name comes from the URI SAN ``hubproxy://cluster/<name>`` of the
certificate the TLS layer verified against the agent CA. What the agent says over the tunnel
never names a cluster, so an agent for ``c1`` cannot register as ``c2``.

(``certs.identity`` holds the same prefix and name rule for issuing; the tunnel depends on no
other package of ours, so the check lives here too.)
"""

from __future__ import annotations

import re

from cryptography import x509

CLUSTER_URI_PREFIX = "hubproxy://cluster/"
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")


class AgentIdentityError(ValueError):
    """The peer certificate does not name exactly one valid cluster (or, with
    ``about_protocol``, the connection is not TLS 1.3 with our ALPN)."""

    def __init__(self, message: str, *, about_protocol: bool = False) -> None:
        super().__init__(message)
        self.about_protocol = about_protocol


def validate_cluster_name(name: str) -> str:
    if not name or len(name) > 253 or not _SUBDOMAIN.match(name):
        raise AgentIdentityError(
            f"cluster name {name!r} is not a DNS-1123 subdomain (lower-case letters, digits, "
            "'-' and '.', at most 253 characters, starting and ending alphanumeric)"
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
