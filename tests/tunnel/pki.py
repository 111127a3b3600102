"""A throwaway PKI for tunnel edge tests, issued with our own certs package."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from certs.files import cert_pem, write_pair
from certs.issue import Issued, create_ca, issue_agent, issue_server
from certs.tls import TLS1_2, TLS1_3, client_context, server_context
from tunnel.connection import ALPN


@dataclass
class PKI:
    root: Path
    tunnel_ca: Issued
    other_ca: Issued

    def hub_context(self, *, min_version=TLS1_3, alpn: bool = True) -> ssl.SSLContext:
        d = self.root / "tunnel-server"
        return server_context(d / "tls.crt", d / "tls.key", self.root / "tunnel-ca.crt",
                              min_version=min_version, alpn_protocols=[ALPN] if alpn else None)

    def agent_dir(self, cluster: str, *, ca: Issued | None = None, name: str | None = None) -> Path:
        d = self.root / "agents" / (name or cluster)
        if not (d / "tls.crt").exists():
            d.mkdir(parents=True)
            write_pair(d, issue_agent(ca or self.tunnel_ca, cluster, days=1), self.tunnel_ca.cert,
                       force=False)
        return d

    def agent_context(self, cluster: str, *, ca: Issued | None = None, name: str | None = None,
                      max_tls12: bool = False, alpn: bool = True) -> ssl.SSLContext:
        d = self.agent_dir(cluster, ca=ca, name=name)
        ctx = client_context(d / "ca.crt", d / "tls.crt", d / "tls.key",
                             min_version=TLS1_2, alpn_protocols=[ALPN] if alpn else None)
        if max_tls12:
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    def bare_client_context(self) -> ssl.SSLContext:
        return client_context(self.root / "tunnel-ca.crt", alpn_protocols=[ALPN])


def make_pki(root: Path) -> PKI:
    tunnel_ca = create_ca("test tunnel CA", days=1)
    other_ca = create_ca("some other CA", days=1)
    (root / "tunnel-ca.crt").write_bytes(cert_pem(tunnel_ca.cert))
    server_dir = root / "tunnel-server"
    server_dir.mkdir(parents=True)
    write_pair(server_dir, issue_server(tunnel_ca, "hub", ["localhost", "127.0.0.1"], days=1),
               tunnel_ca.cert, force=False)
    return PKI(root, tunnel_ca, other_ca)
