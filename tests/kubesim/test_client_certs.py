"""Optional x509 client-certificate authentication (CN = user, O = groups)."""

from __future__ import annotations

import datetime
import json
import ssl
from pathlib import Path

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kubesim.testing import run_kubesim


def _client_pki(directory: Path) -> tuple[Path, Path, Path]:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "client-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "carol"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ops"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "client-ca.crt", directory / "client.crt", directory / "client.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


async def test_client_certificate_identifies_the_user(tmp_path: Path) -> None:
    ca, cert, key = _client_pki(tmp_path)
    async with run_kubesim(tmp_path, client_ca_file=str(ca)) as sim:
        ctx = ssl.create_default_context(cafile=sim.ca_file)
        ctx.load_cert_chain(cert, key)
        body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            async with session.post(
                f"{sim.url}/apis/authentication.k8s.io/v1/selfsubjectreviews",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as resp:
                assert resp.status == 201
                review = await resp.json()
            async with session.get(f"{sim.url}/api/v1/namespaces/default/pods") as resp:
                assert resp.status == 403
        assert review["status"]["userInfo"] == {
            "username": "carol",
            "groups": ["ops", "system:authenticated"],
        }
        # without a certificate (and without a token) it is still 401
        plain = ssl.create_default_context(cafile=sim.ca_file)
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=plain)) as session,
            session.get(f"{sim.url}/api/v1/namespaces/default/pods") as resp,
        ):
            assert resp.status == 401
