"""Certificates for ``python -m bench fleet``, cached on disk so reruns are fast.

One ``hubproxy certs init`` layout (:mod:`certs.layout`: front CA, gateway, tunnel CA, tunnel
server) under ``~/.cache/hubproxy/bench-fleet/<LAYOUT_VERSION>/`` (``$XDG_CACHE_HOME`` is
honoured), and one agent certificate per simulated cluster, ``agents/<cluster>/``, issued from
that tunnel CA the first time a run needs it and kept: a run of 10,000 clusters after one of
3,000 issues only the 7,000 missing ones (EC P-256, about 2 ms each). Everything is reissued
when the gateway's or the CA's certificates have fewer than ``MIN_DAYS_LEFT`` days left.

Cluster names are :func:`cluster_name` of an index: ``fleet-00042``, 11 characters, so that a
gateway's instance Lease can still list 10,000 of them (a comma-separated annotation, capped at
128 KiB by ``gateway.hub.instances.leases``).
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from pathlib import Path

from certs import layout
from certs.files import CERT_MODE, KEY_MODE, cert_pem, key_pem, load_issued, write_file
from certs.issue import issue_agent

LAYOUT_VERSION = "v1"  # bump when the layout or the naming changes
DAYS = 60
MIN_DAYS_LEFT = 2


def cluster_name(index: int) -> str:
    return f"fleet-{index:05d}"


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hubproxy" / "bench-fleet" / LAYOUT_VERSION


def _days_left(cert_file: Path) -> float:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError):
        return -1.0
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return left.total_seconds() / 86400


def ensure(count: int, root: Path | None = None) -> tuple[Path, int]:
    """The layout root holding agent certificates for clusters ``0 .. count-1``, and how many
    were issued now (0 when the cache had them all)."""
    root = root or cache_root()
    base = layout.Layout(root)
    fresh = all(_days_left(d / name) > MIN_DAYS_LEFT for d, name in (
        (base.gateway, "tls.crt"), (base.tunnel_server, "tls.crt"),
        (base.tunnel_ca, "ca.crt"), (base.front_ca, "ca.crt")))
    if not fresh:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        layout.init(root, layout.InitOptions(days=DAYS, ca_days=DAYS))
    ca = load_issued(base.tunnel_ca / "ca.crt", base.tunnel_ca / "ca.key")
    ca_pem = cert_pem(ca.cert)
    issued = 0
    agents = root / "agents"
    agents.mkdir(exist_ok=True)
    for index in range(count):
        name = cluster_name(index)
        target = agents / name
        if (target / "tls.crt").exists():
            continue
        agent = issue_agent(ca, name, days=DAYS)
        # Written beside, then renamed: an interrupted run leaves no half-written directory.
        partial = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=agents))
        write_file(partial / "tls.key", key_pem(agent.key), KEY_MODE, force=True)
        write_file(partial / "tls.crt", cert_pem(agent.cert), CERT_MODE, force=True)
        write_file(partial / "ca.crt", ca_pem, CERT_MODE, force=True)
        partial.rename(target)
        issued += 1
    return root, issued
