"""Create certificate authorities and issue the certificates hubproxy needs (pure, no files).

Three kinds of leaf, each with only the extensions its role needs:

* serving certificates (gateway :9092 from the front CA, tunnel server :8091 from the tunnel CA):
  EKU serverAuth, SANs as DNS names or IP addresses;
* agent client certificates (from the tunnel CA): EKU clientAuth, CN = cluster and the URI SAN
  ``hubproxy://cluster/<cluster>`` that the hub reads the identity from.

CAs are self-signed with ``BasicConstraints(ca=True, path_length=0)`` (they sign leaves only) and
``keyCertSign``/``cRLSign``; every certificate carries SKI and, for leaves, the AKI of its issuer,
so OpenSSL, Go (kubectl) and Python all build the chain.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.identity import cluster_uri, validate_cluster_name

KeyType = Literal["ec", "rsa"]
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
KEY_TYPES: tuple[KeyType, ...] = ("ec", "rsa")

# Tolerate a little clock skew between the issuing machine and the peers.
BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: PrivateKey


def new_key(key_type: KeyType = "ec") -> PrivateKey:
    """EC P-256 (default) or RSA-2048."""
    if key_type == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"unknown key type {key_type!r}: expected one of {', '.join(KEY_TYPES)}")


def parse_san(value: str) -> x509.GeneralName:
    """A ``--*-san`` value: an IP address (v4 or v6) or a DNS name (wildcards allowed)."""
    value = value.strip()
    if not value:
        raise ValueError("empty subject alternative name")
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        pass
    if any(c.isspace() or c in "/:@" for c in value) or not value.isascii():
        raise ValueError(f"invalid subject alternative name {value!r}: not an IP or DNS name")
    return x509.DNSName(value.lower())


def create_ca(common_name: str, *, days: int, key_type: KeyType = "ec") -> Issued:
    """A self-signed CA that may sign leaves only (path length 0)."""
    key = new_key(key_type)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        _validity(x509.CertificateBuilder(), days)
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(_serial())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
    )
    return Issued(builder.sign(key, hashes.SHA256()), key)


def issue_server(
    ca: Issued, common_name: str, sans: list[str], *, days: int, key_type: KeyType = "ec"
) -> Issued:
    """A serving certificate (EKU serverAuth) for the given DNS names / IP addresses."""
    if not sans:
        raise ValueError("a serving certificate needs at least one subject alternative name")
    names = _dedupe([parse_san(s) for s in sans])
    return _issue_leaf(
        ca,
        common_name,
        names,
        ExtendedKeyUsageOID.SERVER_AUTH,
        days=days,
        key_type=key_type,
    )


def issue_agent(ca: Issued, cluster: str, *, days: int, key_type: KeyType = "ec",
                valid_from: datetime.datetime | None = None) -> Issued:
    """An agent client certificate: CN=<cluster>, URI SAN hubproxy://cluster/<cluster>.

    Valid for ``days`` from ``valid_from`` (default now); a past start makes an expired
    certificate, which tests of the hub's refusals need.
    """
    validate_cluster_name(cluster)
    return _issue_leaf(
        ca,
        cluster,
        [x509.UniformResourceIdentifier(cluster_uri(cluster))],
        ExtendedKeyUsageOID.CLIENT_AUTH,
        days=days,
        key_type=key_type,
        valid_from=valid_from,
    )


def _issue_leaf(
    ca: Issued,
    common_name: str,
    names: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    *,
    days: int,
    key_type: KeyType,
    valid_from: datetime.datetime | None = None,
) -> Issued:
    key = new_key(key_type)
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        _validity(x509.CertificateBuilder(), days, valid_from)
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(_serial())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(key_encipherment=isinstance(key, rsa.RSAPrivateKey)), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        # A leaf whose only name is in the SAN must mark the SAN critical only if the subject is
        # empty; ours has a CN, so non-critical is right.
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
    )
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def _validity(builder: x509.CertificateBuilder, days: int,
              valid_from: datetime.datetime | None = None) -> x509.CertificateBuilder:
    if days < 1:
        raise ValueError(f"--days must be at least 1, got {days}")
    now = valid_from or datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - BACKDATE).not_valid_after(
        now + datetime.timedelta(days=days)
    )


def _key_usage(*, cert_sign: bool = False, key_encipherment: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _serial() -> int:
    # 159 random bits: positive, unpredictable, within RFC 5280's 20 octets.
    return secrets.randbits(159) | 1


def _dedupe(names: list[x509.GeneralName]) -> list[x509.GeneralName]:
    seen: list[x509.GeneralName] = []
    for name in names:
        if name not in seen:
            seen.append(name)
    return seen
