"""Go's TLS stack (the real kubectl) accepts our chains, with an agent cert as client cert."""

from __future__ import annotations

import asyncio
import base64
import shutil
from pathlib import Path

import pytest
import yaml

from certs import layout
from certs.tls import TLS1_3, server_context

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@pytest.mark.parametrize("key_type", ["ec", "rsa"])
async def test_kubectl_with_agent_client_cert_against_tunnel_server(
    tmp_path: Path, key_type: str
) -> None:
    layout.init(tmp_path / "pki", layout.InitOptions(clusters=["c1"], key_type=key_type))
    server_dir, agent_dir = tmp_path / "pki/tunnel-server", tmp_path / "pki/agents/c1"
    peers: list[dict] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peercert"))
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        body = b'{"major":"1","minor":"32","gitVersion":"v1.32.0"}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d"
                     b"\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    ctx = server_context(server_dir / "tls.crt", server_dir / "tls.key", server_dir / "ca.crt",
                         min_version=TLS1_3)
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {
            "server": f"https://localhost:{port}",
            "certificate-authority-data": b64(agent_dir / "ca.crt")}}],
        "users": [{"name": "t", "user": {
            "client-certificate-data": b64(agent_dir / "tls.crt"),
            "client-key-data": b64(agent_dir / "tls.key")}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
    }))
    try:
        proc = await asyncio.create_subprocess_exec(
            KUBECTL or "kubectl", "--kubeconfig", str(kubeconfig), "version", "-o", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        server.close()
        await server.wait_closed()
    assert proc.returncode == 0, stderr.decode()
    assert b"v1.32.0" in stdout
    assert peers and all(p["subject"] == ((("commonName", "c1"),),) for p in peers)
    assert all(("URI", "hubproxy://cluster/c1") in p["subjectAltName"] for p in peers)
