"""What `hubproxy certs` issues: chains that the real `openssl verify` accepts, and extensions."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from certs import layout
from certs.identity import CLUSTER_URI_PREFIX
from certs.issue import parse_san

OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="needs the openssl binary")

LEAVES = {
    "gateway": "sslserver",
    "tunnel-server": "sslserver",
    "agents/c1": "sslclient",
    "agents/prod.eu-west": "sslclient",
}


def openssl_verify(ca: Path, cert: Path, purpose: str | None = None) -> subprocess.CompletedProcess:
    args = [OPENSSL, "verify", "-x509_strict", "-CAfile", str(ca)]
    if purpose:
        args += ["-purpose", purpose]
    return subprocess.run([*args, str(cert)], capture_output=True, text=True, timeout=30)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


@pytest.mark.parametrize("key_type", ["ec", "rsa"])
def test_openssl_verify_accepts_every_issued_chain(tmp_path: Path, key_type: str) -> None:
    layout.init(tmp_path, layout.InitOptions(clusters=["c1", "prod.eu-west"], key_type=key_type))
    for leaf, purpose in LEAVES.items():
        directory = tmp_path / leaf
        result = openssl_verify(directory / "ca.crt", directory / "tls.crt", purpose)
        assert result.returncode == 0, (leaf, result.stdout, result.stderr)
        assert result.stdout.strip().endswith(": OK")
    for ca in ("front-ca", "tunnel-ca"):
        result = openssl_verify(tmp_path / ca / "ca.crt", tmp_path / ca / "ca.crt")
        assert result.returncode == 0, (ca, result.stderr)
    expected = ec.EllipticCurvePublicKey if key_type == "ec" else rsa.RSAPublicKey
    key = load(tmp_path / "agents/c1/tls.crt").public_key()
    assert isinstance(key, expected)
    if isinstance(key, rsa.RSAPublicKey):
        assert key.key_size == 2048
    else:
        assert key.curve.name == "secp256r1"


def test_front_and_tunnel_are_separate_trust_roots(pki: Path) -> None:
    # The gateway's serving cert must not verify against the tunnel CA and vice versa, and an
    # agent cert must not verify against the front CA that users trust.
    assert openssl_verify(pki / "tunnel-ca/ca.crt", pki / "gateway/tls.crt").returncode != 0
    assert openssl_verify(pki / "front-ca/ca.crt", pki / "tunnel-server/tls.crt").returncode != 0
    assert openssl_verify(pki / "front-ca/ca.crt", pki / "agents/c1/tls.crt").returncode != 0
    assert load(pki / "front-ca/ca.crt") != load(pki / "tunnel-ca/ca.crt")


def test_ca_crt_in_each_leaf_dir_is_the_peer_trust_root(pki: Path) -> None:
    front = (pki / "front-ca/ca.crt").read_bytes()
    tunnel = (pki / "tunnel-ca/ca.crt").read_bytes()
    assert (pki / "gateway/ca.crt").read_bytes() == front
    assert (pki / "tunnel-server/ca.crt").read_bytes() == tunnel
    assert (pki / "agents/c1/ca.crt").read_bytes() == tunnel


def test_agent_certificate_names_the_cluster_and_is_client_only(pki: Path) -> None:
    cert = load(pki / "agents/prod.eu-west/tls.crt")
    cn = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    assert cn == "prod.eu-west"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        CLUSTER_URI_PREFIX + "prod.eu-west"
    ]
    assert san.get_values_for_type(x509.DNSName) == []
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    # An agent certificate must not be usable as a server certificate.
    result = openssl_verify(pki / "tunnel-ca/ca.crt", pki / "agents/c1/tls.crt", "sslserver")
    assert result.returncode != 0


def test_serving_certs_have_server_auth_and_default_sans(pki: Path) -> None:
    for leaf in ("gateway", "tunnel-server"):
        cert = load(pki / leaf / "tls.crt")
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == ["localhost"]
        assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_ca_extensions(pki: Path) -> None:
    for ca in ("front-ca", "tunnel-ca"):
        cert = load(pki / ca / "ca.crt")
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
        assert bc.critical and bc.value.ca and bc.value.path_length == 0
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
        assert usage.key_cert_sign and usage.crl_sign
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        leaf = load(pki / ("gateway" if ca == "front-ca" else "tunnel-server") / "tls.crt")
        aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
        assert aki.key_identifier == ski.digest


def test_gateway_sans_accept_names_and_ips_and_days(tmp_path: Path) -> None:
    layout.init(
        tmp_path,
        layout.InitOptions(gateway_sans=["hubproxy.example.com", "10.0.0.7", "::1"], days=3),
    )
    cert = load(tmp_path / "gateway/tls.crt")
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["hubproxy.example.com"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7", "::1"]
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 3 * 86400 <= lifetime.total_seconds() <= 3 * 86400 + 600
    result = openssl_verify(tmp_path / "gateway/ca.crt", tmp_path / "gateway/tls.crt")
    assert result.returncode == 0, result.stderr
    host = subprocess.run(
        [OPENSSL, "verify", "-CAfile", str(tmp_path / "gateway/ca.crt"), "-verify_ip", "10.0.0.7",
         str(tmp_path / "gateway/tls.crt")], capture_output=True, text=True, timeout=30,
    )
    assert host.returncode == 0, host.stderr


@pytest.mark.parametrize("bad", ["", "a b", "http://x", "user@host", "é.example"])
def test_invalid_san_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_san(bad)
