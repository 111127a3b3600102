"""The on-disk layout of ``hubproxy certs init DIR`` and the operations that fill it.

::

    DIR/front-ca/{ca.crt,ca.key}                trust root for users, kubeconfigs (:9092)
    DIR/gateway/{tls.crt,tls.key,ca.crt}        :9092 serving cert; ca.crt = front CA
    DIR/tunnel-ca/{ca.crt,ca.key}               trust root of the tunnel (:8091), both ways
    DIR/tunnel-server/{tls.crt,tls.key,ca.crt}  :8091 serving cert; ca.crt = tunnel CA
                                                (the hub verifies agents against it)
    DIR/agents/<cluster>/{tls.crt,tls.key,ca.crt}
                                                agent client cert; ca.crt = tunnel CA
                                                (the agent verifies the hub against it)

Each leaf directory is exactly a Kubernetes ``kubernetes.io/tls`` Secret (plus ``ca.crt``, as
cert-manager writes it): ``ca.crt`` is always the CA the *peer* of that directory's owner is
verified against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from certs.files import (
    CERT_MODE,
    KEY_MODE,
    cert_pem,
    check_writable,
    key_pem,
    load_issued,
    write_file,
    write_pair,
)
from certs.identity import validate_cluster_name
from certs.issue import Issued, KeyType, create_ca, issue_agent, issue_server

DEFAULT_GATEWAY_SANS = ("localhost", "127.0.0.1")
DEFAULT_TUNNEL_SANS = ("localhost", "127.0.0.1")
DEFAULT_DAYS = 365
DEFAULT_CA_DAYS = 3650

FRONT_CA_CN = "hubproxy front CA"
TUNNEL_CA_CN = "hubproxy tunnel CA"
GATEWAY_CN = "hubproxy-gateway"
TUNNEL_SERVER_CN = "hubproxy-tunnel-server"


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def front_ca(self) -> Path:
        return self.root / "front-ca"

    @property
    def gateway(self) -> Path:
        return self.root / "gateway"

    @property
    def tunnel_ca(self) -> Path:
        return self.root / "tunnel-ca"

    @property
    def tunnel_server(self) -> Path:
        return self.root / "tunnel-server"

    def agent(self, cluster: str) -> Path:
        return self.root / "agents" / validate_cluster_name(cluster)


@dataclass
class InitOptions:
    clusters: list[str] = field(default_factory=list)
    gateway_sans: list[str] = field(default_factory=lambda: list(DEFAULT_GATEWAY_SANS))
    tunnel_sans: list[str] = field(default_factory=lambda: list(DEFAULT_TUNNEL_SANS))
    days: int = DEFAULT_DAYS
    ca_days: int = DEFAULT_CA_DAYS
    key_type: KeyType = "ec"
    force: bool = False


def _leaf_files(directory: Path) -> list[Path]:
    return [directory / "tls.crt", directory / "tls.key", directory / "ca.crt"]


def _ca_files(directory: Path) -> list[Path]:
    return [directory / "ca.crt", directory / "ca.key"]


def init(root: Path, options: InitOptions) -> list[Path]:
    """Create both CAs, the two serving certificates and one agent certificate per cluster.

    Validates every input and checks every target before writing anything, so a refused run
    (bad name, existing file without ``force``) leaves ``root`` as it was. Returns the
    directories written.
    """
    layout = Layout(root)
    clusters = list(dict.fromkeys(validate_cluster_name(c) for c in options.clusters))
    targets = [
        *_ca_files(layout.front_ca),
        *_leaf_files(layout.gateway),
        *_ca_files(layout.tunnel_ca),
        *_leaf_files(layout.tunnel_server),
        *(p for c in clusters for p in _leaf_files(layout.agent(c))),
    ]
    check_writable(targets, force=options.force)

    days, key_type = options.days, options.key_type
    front = create_ca(FRONT_CA_CN, days=options.ca_days, key_type=key_type)
    tunnel = create_ca(TUNNEL_CA_CN, days=options.ca_days, key_type=key_type)
    gateway = issue_server(front, GATEWAY_CN, options.gateway_sans, days=days, key_type=key_type)
    server = issue_server(
        tunnel, TUNNEL_SERVER_CN, options.tunnel_sans, days=days, key_type=key_type
    )
    agents = {c: issue_agent(tunnel, c, days=days, key_type=key_type) for c in clusters}

    force = options.force
    _write_ca(layout.front_ca, front, force=force)
    write_pair(layout.gateway, gateway, front.cert, force=force)
    _write_ca(layout.tunnel_ca, tunnel, force=force)
    write_pair(layout.tunnel_server, server, tunnel.cert, force=force)
    for cluster, issued in agents.items():
        write_pair(layout.agent(cluster), issued, tunnel.cert, force=force)
    return [
        layout.front_ca,
        layout.gateway,
        layout.tunnel_ca,
        layout.tunnel_server,
        *(layout.agent(c) for c in clusters),
    ]


def issue_agent_into(
    root: Path, cluster: str, *, days: int = DEFAULT_DAYS, key_type: KeyType = "ec",
    force: bool = False,
) -> Path:
    """Issue ``DIR/agents/<cluster>/`` from the existing tunnel CA in ``DIR/tunnel-ca``."""
    layout = Layout(root)
    target = layout.agent(cluster)
    ca_dir = layout.tunnel_ca
    if not (ca_dir / "ca.key").exists():
        raise FileNotFoundError(
            f"no tunnel CA in {ca_dir} (run 'hubproxy certs init {root}' first)"
        )
    check_writable(_leaf_files(target), force=force)
    tunnel = load_issued(ca_dir / "ca.crt", ca_dir / "ca.key")
    write_pair(target, issue_agent(tunnel, cluster, days=days, key_type=key_type), tunnel.cert,
               force=force)
    return target


def _write_ca(directory: Path, ca: Issued, *, force: bool) -> None:
    check_writable(_ca_files(directory), force=force)
    write_file(directory / "ca.key", key_pem(ca.key), KEY_MODE, force=force)
    write_file(directory / "ca.crt", cert_pem(ca.cert), CERT_MODE, force=force)
