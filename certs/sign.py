"""Certificate signing requests for joining agents: made by the agent, signed by the hub (pure).

The agent makes its key and a CSR itself (:func:`agent_csr`), so no private key ever leaves
the managed cluster. The hub signs with :func:`sign_agent_csr`, which takes **only the public
key** from the CSR (after checking the CSR's self-signature, i.e. that the requester holds the
key): the subject, the URI SAN and every extension come from the hub's own decision, the
cluster bound to the join token. Whatever name or extension the CSR asks for is ignored.

Lifetimes are short (default 7 days) and may be seconds in tests, so the backdating that
tolerates clock skew is at most a tenth of the lifetime.
"""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.identity import cluster_uri, validate_cluster_name
from certs.issue import BACKDATE, Issued, PrivateKey, _key_usage, _serial

DEFAULT_LIFETIME = datetime.timedelta(days=7)


class CSRError(ValueError):
    """The CSR cannot be signed (unreadable, bad self-signature, unsupported key)."""


def agent_csr(key: PrivateKey, cluster: str) -> bytes:
    """A PEM CSR for ``key``; the name is only a hint, the hub decides the certificate's name."""
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cluster)]))
           .sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM)


def sign_agent_csr(ca: Issued, csr_pem: bytes, cluster: str, *,
                   lifetime: datetime.timedelta = DEFAULT_LIFETIME,
                   now: datetime.datetime | None = None) -> x509.Certificate:
    """An agent client certificate for ``cluster`` and the CSR's public key, nothing else of it."""
    validate_cluster_name(cluster)
    if lifetime <= datetime.timedelta(0):
        raise ValueError("certificate lifetime must be positive")
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError:
        raise CSRError("unreadable certificate signing request") from None
    if not csr.is_signature_valid:
        raise CSRError("the CSR's signature does not verify (proof of key possession)")
    public_key = csr.public_key()
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        if public_key.curve.name not in ("secp256r1", "secp384r1"):
            raise CSRError(f"unsupported EC curve {public_key.curve.name}")
    elif isinstance(public_key, rsa.RSAPublicKey):
        if public_key.key_size < 2048:
            raise CSRError("RSA keys must have at least 2048 bits")
    else:
        raise CSRError("unsupported key type (EC P-256/P-384 or RSA >= 2048)")
    now = now or datetime.datetime.now(datetime.UTC)
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .not_valid_before(now - min(BACKDATE, lifetime / 10))
        .not_valid_after(now + lifetime)
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cluster)]))
        .issuer_name(ca.cert.subject)
        .public_key(public_key)
        .serial_number(_serial())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(key_encipherment=isinstance(public_key, rsa.RSAPublicKey)),
                       critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(
            [x509.UniformResourceIdentifier(cluster_uri(cluster))]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                       critical=False)
    )
    return builder.sign(ca.key, hashes.SHA256())
