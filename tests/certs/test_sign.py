"""certs.sign: the hub signs a CSR's public key for the cluster it decided, nothing else."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from certs.issue import Issued, create_ca, new_key
from certs.sign import CSRError, agent_csr, sign_agent_csr
from tunnel.identity import cluster_from_certificate


@pytest.fixture(scope="module")
def ca() -> Issued:
    return create_ca("tunnel CA", days=1)


def test_the_name_comes_from_the_hub_not_the_csr(ca: Issued) -> None:
    key = new_key()
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "prod")]))
           .add_extension(x509.SubjectAlternativeName(
               [x509.UniformResourceIdentifier("hubproxy://cluster/prod"),
                x509.DNSName("evil.example")]), critical=False)
           .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
           .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    cert = sign_agent_csr(ca, csr, "dev")
    assert cluster_from_certificate(cert.public_bytes(serialization.Encoding.DER)) == "dev"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(sans) == [x509.UniformResourceIdentifier("hubproxy://cluster/dev")]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    cert.verify_directly_issued_by(ca.cert)


def test_lifetime_and_backdating(ca: Issued) -> None:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    short = sign_agent_csr(ca, agent_csr(new_key(), "c"), "c",
                           lifetime=datetime.timedelta(seconds=10), now=now)
    assert short.not_valid_after_utc == now + datetime.timedelta(seconds=10)
    assert short.not_valid_before_utc == now - datetime.timedelta(seconds=1)
    week = sign_agent_csr(ca, agent_csr(new_key(), "c"), "c", now=now)
    assert week.not_valid_after_utc == now + datetime.timedelta(days=7)
    assert week.not_valid_before_utc == now - datetime.timedelta(minutes=5)


def test_unverifiable_or_weak_requests_are_refused(ca: Issued) -> None:
    with pytest.raises(CSRError):
        sign_agent_csr(ca, b"not a csr", "c")
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(CSRError, match="2048"):
        sign_agent_csr(ca, agent_csr(weak, "c"), "c")
    odd = ec.generate_private_key(ec.SECP256K1())
    with pytest.raises(CSRError, match="curve"):
        sign_agent_csr(ca, agent_csr(odd, "c"), "c")
    # A CSR whose signature does not match its key (someone else's public key).
    good = x509.load_pem_x509_csr(agent_csr(new_key(), "c"))
    der = bytearray(good.public_bytes(serialization.Encoding.DER))
    der[-5] ^= 0x01  # inside the signature
    tampered = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CSRError, match="signature"):
        sign_agent_csr(ca, tampered, "c")
