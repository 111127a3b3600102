"""Agents installed as an Open Cluster Management add-on: `hubproxy gateway --agent-identity ocm`
names each agent from the subject OCM's CustomSigner registration gives it, and only that.

Real processes: a gateway and two agents over mTLS 1.3, kubesim as hub and managed cluster,
curl as the client. The OCM certificate is made as OCM's signer makes it: the agent's subject
from its CSR (no SAN), signed by the tunnel CA that the AddOnTemplate names as signing CA.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import warnings
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs import layout
from certs.files import cert_pem, key_pem, load_issued
from tests.gateway.hub.hubsim import (
    DEMO_USER,
    agent_kubeconfig_file,
    hub_and_cluster,
    start_gateway,
)
from tests.support import ProcessGroup, free_port

OCM_USER = "system:open-cluster-management:cluster:{cluster}:addon:hubproxy:agent:{agent}"


def ocm_signed(pki: Path, cluster: str, out: Path) -> Path:
    """tls.crt/tls.key as the klusterlet writes them into `hubproxy-<signer>-client-cert`."""
    ca = load_issued(pki / "tunnel-ca" / "ca.crt", pki / "tunnel-ca" / "ca.key")
    key = ec.generate_private_key(ec.SECP256R1())
    with warnings.catch_warnings():  # OCM's CN is longer than X.509's bound; Go allows it
        warnings.simplefilter("ignore", UserWarning)
        subject = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME,
                               f"system:open-cluster-management:cluster:{cluster}:addon:hubproxy",
                               _validate=False),
            x509.NameAttribute(NameOID.COMMON_NAME,
                               OCM_USER.format(cluster=cluster, agent="k8x2q"), _validate=False),
        ])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca.key, hashes.SHA256()))
    out.mkdir(parents=True)
    (out / "tls.key").write_bytes(key_pem(key))
    (out / "tls.crt").write_bytes(cert_pem(cert))
    return out


async def test_ocm_named_agent_serves_and_a_uri_named_one_is_refused(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    layout.init(pki, layout.InitOptions(clusters=["c1"]))
    ocm_dir = ocm_signed(pki, "c1", tmp_path / "managed" / "hubproxy.dev-tunnel")
    front, tunnel, health = free_port(), free_port(), free_port()
    group = ProcessGroup()
    async with hub_and_cluster(tmp_path) as sims:
        try:
            gateway = await start_gateway(group, pki, sims, front=front, tunnel=tunnel,
                                          health=health, extra=("--agent-identity", "ocm"))
            kubeconfig = agent_kubeconfig_file(sims, tmp_path)
            common = ["--hub", f"127.0.0.1:{tunnel}", "--cluster", "c1",
                      "--hub-ca", str(pki / "tunnel-ca" / "ca.crt"), "--kubeconfig",
                      str(kubeconfig), "--allow-loopback-targets", "--drain-timeout", "2"]
            # The OCM-installed agent: certificate files where the AddOnTemplate mounts them.
            group.hubproxy("agent", *common, "--agent-identity", "ocm",
                           "--tls-dir", str(ocm_dir), "--health-listen", "off")
            await asyncio.to_thread(gateway.wait_for_line, "cluster c1 connected", 30)

            url = f"https://127.0.0.1:{front}/c1/apis/authentication.k8s.io/v1/selfsubjectreviews"
            curl = await asyncio.create_subprocess_exec(
                "curl", "-sS", "--cacert", str(pki / "front-ca" / "ca.crt"), "-X", "POST",
                "-H", f"Authorization: Bearer {sims.user_token}",
                "-H", "Content-Type: application/json",
                "-d", '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}',
                url, stdout=asyncio.subprocess.PIPE)
            body, _ = await asyncio.wait_for(curl.communicate(), 20)
            assert json.loads(body)["status"]["userInfo"]["username"] == DEMO_USER

            # A certificate of the same CA that names its cluster the other way is refused.
            group.hubproxy("agent", *common, "--tls-dir", str(pki / "agents" / "c1"),
                           "--health-listen", "off")
            line = await asyncio.to_thread(gateway.wait_for_line, "refused", 30)
            assert "not an OCM add-on agent" in line
        finally:
            group.stop_all()
