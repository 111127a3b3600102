"""Who an agent is: the cluster named in its verified client certificate, and nothing else.

DESIGN §4: the cluster name comes from the certificate the TLS layer verified against the
agent CA: its URI SAN ``hubproxy://cluster/<name>``, or, for agents installed as an Open
Cluster Management add-on, the subject OCM gives them (:class:`AgentNaming`). What the agent
says over the tunnel never names a cluster, so an agent for ``c1`` cannot register as ``c2``.

The prefix and the name rule live here, the one place both sides read: ``certs`` issues with
them (``certs.identity``) and the tunnel checks with them. The tunnel imports nothing else of
ours.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from cryptography import x509

CLUSTER_URI_PREFIX = "hubproxy://cluster/"


class AgentIdentityError(ValueError):
    """The peer certificate does not name exactly one valid cluster (or, with
    ``about_protocol``, the connection is not TLS 1.3 with our ALPN)."""

    def __init__(self, message: str, *, about_protocol: bool = False) -> None:
        super().__init__(message)
        self.about_protocol = about_protocol


# Kubernetes IsDNS1123Subdomain: lower-case labels joined by dots, at most 253 characters.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
MAX_NAME_LENGTH = 253
MAX_LABEL_LENGTH = 63


def validate_cluster_name(name: object) -> str:
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


# What Open Cluster Management's add-on registration puts in the subject of an add-on agent's
# client certificate when the CustomSigner registration leaves the subject unset
# (addon.open-cluster-management.io RegistrationSpec.customSigner.subject):
#   CN = system:open-cluster-management:cluster:<cluster>:addon:<addon>:agent:<agent>
OCM_SUBJECT_PREFIX = "system:open-cluster-management:cluster:"
_OCM_AGENT = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


NAMING_SCHEMES = ("uri", "ocm")


@dataclass(frozen=True)
class AgentNaming:
    """Where the cluster name of an agent certificate is read from; one scheme per gateway.

    ``uri`` (default): exactly one URI SAN ``hubproxy://cluster/<name>`` (``hubproxy certs``).
    ``ocm``: the subject common name OCM gives the add-on ``ocm_addon``'s agents (above). A
    certificate of another add-on, or with another shape, names no cluster.
    """

    scheme: str = "uri"
    ocm_addon: str = "hubproxy"

    def __post_init__(self) -> None:
        if self.scheme not in NAMING_SCHEMES:
            raise ValueError(f"agent naming scheme {self.scheme!r}: expected uri or ocm")
        if not _OCM_AGENT.fullmatch(self.ocm_addon):
            raise ValueError(f"OCM add-on name {self.ocm_addon!r} is not a DNS-1123 label")

    def cluster_of(self, certificate: x509.Certificate) -> str:
        if self.scheme == "ocm":
            return self._ocm_cluster(certificate)
        return _uri_cluster(certificate)

    def _ocm_cluster(self, certificate: x509.Certificate) -> str:
        with warnings.catch_warnings():
            # OCM's subjects are longer than X.509's 64-character CN bound, which Go (OCM's
            # signer) does not enforce and cryptography warns about on every read.
            warnings.filterwarnings("ignore", "Attribute's length", UserWarning)
            names = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        if len(names) != 1:
            raise AgentIdentityError("client certificate must have exactly one subject CN")
        common_name = names[0].value
        if isinstance(common_name, bytes):
            common_name = common_name.decode("utf-8", "replace")
        if not common_name.startswith(OCM_SUBJECT_PREFIX):
            raise AgentIdentityError(
                f"client certificate CN is not an OCM add-on agent ({OCM_SUBJECT_PREFIX}...)")
        # <cluster>:addon:<addon>:agent:<agent>; a cluster name never holds ':'.
        parts = common_name[len(OCM_SUBJECT_PREFIX):].split(":")
        if len(parts) != 5 or parts[1] != "addon" or parts[3] != "agent":
            raise AgentIdentityError("client certificate CN is not an OCM add-on agent subject")
        cluster, _, addon, _, agent = parts
        if addon != self.ocm_addon:
            raise AgentIdentityError(
                f"client certificate belongs to OCM add-on {addon!r}, not {self.ocm_addon!r}")
        if not _OCM_AGENT.fullmatch(agent):
            raise AgentIdentityError("client certificate names an invalid OCM agent")
        return validate_cluster_name(cluster)


URI_NAMING = AgentNaming()


def _uri_cluster(certificate: x509.Certificate) -> str:
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


def cluster_from_certificate(der: bytes | None, naming: AgentNaming = URI_NAMING) -> str:
    """The one cluster the certificate names under ``naming``, or AgentIdentityError."""
    if not der:
        raise AgentIdentityError("no client certificate")
    try:
        certificate = x509.load_der_x509_certificate(der)
    except ValueError:
        raise AgentIdentityError("unreadable client certificate") from None
    return naming.cluster_of(certificate)
