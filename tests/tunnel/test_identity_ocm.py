"""Agent naming: the cluster from an OCM add-on certificate's subject, and nothing looser."""

from __future__ import annotations

import datetime
import warnings

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from tunnel.identity import (
    URI_NAMING,
    AgentIdentityError,
    AgentNaming,
    cluster_from_certificate,
)

OCM = AgentNaming("ocm", "hubproxy")


def certificate(*common_names: str, organizations: tuple[str, ...] = (),
                uris: tuple[str, ...] = ()) -> bytes:
    """A self-signed certificate with these subject names (naming never verifies signatures:
    TLS did that before)."""
    key = ec.generate_private_key(ec.SECP256R1())
    # OCM subjects exceed X.509's 64-character CN bound; Go (OCM's signer) does not enforce it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, cn, _validate=False)
                      for cn in common_names]
    attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(x509.Name(attributes))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1)))
    if uris:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.UniformResourceIdentifier(u) for u in uris]), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(Encoding.DER)


def ocm_subject(cluster: str, addon: str = "hubproxy", agent: str = "x7k2p") -> str:
    return f"system:open-cluster-management:cluster:{cluster}:addon:{addon}:agent:{agent}"


def test_ocm_default_subject_names_its_cluster() -> None:
    der = certificate(ocm_subject("prod.eu-west"), organizations=(
        "system:open-cluster-management:cluster:prod.eu-west:addon:hubproxy",
        "system:open-cluster-management:addon:hubproxy", "system:authenticated"))
    assert cluster_from_certificate(der, OCM) == "prod.eu-west"


@pytest.mark.parametrize(("common_names", "reason"), [
    ((ocm_subject("c1", addon="cluster-proxy"),), "belongs to OCM add-on 'cluster-proxy'"),
    (("c1",), "not an OCM add-on agent"),
    (("system:open-cluster-management:cluster:c1:addon:hubproxy",), "not an OCM add-on agent"),
    ((ocm_subject("c1") + ":extra",), "not an OCM add-on agent"),
    (("system:open-cluster-management:cluster:c1:addin:hubproxy:agent:a",), "not an OCM"),
    ((ocm_subject("C1"),), "invalid cluster name"),
    ((ocm_subject("c1", agent="Agent_1"),), "invalid OCM agent"),
    ((ocm_subject("c1"), ocm_subject("c2")), "exactly one subject CN"),
    ((), "exactly one subject CN"),
])
def test_ocm_naming_refuses_every_other_subject(common_names: tuple[str, ...],
                                                reason: str) -> None:
    with pytest.raises(AgentIdentityError, match=reason):
        cluster_from_certificate(certificate(*common_names), OCM)


def test_each_scheme_reads_only_its_own_place() -> None:
    """A gateway in ocm mode ignores URI SANs, and one in uri mode ignores OCM subjects: one
    CA can never make a certificate count twice."""
    ocm_only = certificate(ocm_subject("c1"))
    uri_only = certificate("c2", uris=("hubproxy://cluster/c2",))
    assert cluster_from_certificate(ocm_only, OCM) == "c1"
    assert cluster_from_certificate(uri_only, URI_NAMING) == "c2"
    with pytest.raises(AgentIdentityError, match="no subjectAltName"):
        cluster_from_certificate(ocm_only, URI_NAMING)
    with pytest.raises(AgentIdentityError, match="not an OCM add-on agent"):
        cluster_from_certificate(uri_only, OCM)


def test_naming_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="expected uri or ocm"):
        AgentNaming("cn")
    with pytest.raises(ValueError, match="not a DNS-1123 label"):
        AgentNaming("ocm", "Hub:Proxy")
