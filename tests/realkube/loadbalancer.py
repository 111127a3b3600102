"""Debian's HAProxy in front of several gateway processes, the way a Kubernetes Service (or a
cloud load balancer) spreads connections over gateway pods.

Two TCP frontends: the front door, balanced only over backends whose ``/readyz`` answers 200
(a Service of Ready pods), and the tunnel, balanced over every backend that accepts a
connection (``publishNotReadyAddresses``: agents must reach a new instance before it is Ready).
Backends are declared up front; one that is not running is simply down.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tests.support import LOOPBACK, BackgroundProcess, ProcessGroup, free_port, wait_for_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


@dataclass(frozen=True)
class Backend:
    front: int
    tunnel: int
    health: int


def backends(count: int) -> list[Backend]:
    return [Backend(free_port(), free_port(), free_port()) for _ in range(count)]


class Ports(Protocol):
    """Where one gateway process listens (a :class:`Backend`, or ``bench.ha``'s slots)."""

    @property
    def front(self) -> int: ...
    @property
    def tunnel(self) -> int: ...
    @property
    def health(self) -> int: ...


def config(front: int, tunnel: int, servers: Sequence[Ports], *, maxconn: int = 4096,
           check_ms: int = 200) -> str:
    lines = [
        "global", f"  maxconn {maxconn}",
        "defaults", "  mode tcp", "  timeout connect 1s", "  timeout client 1h",
        "  timeout server 1h", "  retries 3", "  option redispatch",
        "frontend front", f"  bind {LOOPBACK}:{front}", "  default_backend front",
        "frontend tunnel", f"  bind {LOOPBACK}:{tunnel}", "  default_backend tunnel",
        "backend front", "  balance roundrobin", "  option httpchk GET /readyz",
        *(f"  server g{i} {LOOPBACK}:{b.front} check port {b.health} inter {check_ms}ms "
          "fall 1 rise 1" for i, b in enumerate(servers)),
        "backend tunnel", "  balance roundrobin",
        *(f"  server g{i} {LOOPBACK}:{b.tunnel} check inter {check_ms}ms fall 1 rise 1"
          for i, b in enumerate(servers)),
    ]
    return "\n".join(lines) + "\n"


def start_haproxy(group: ProcessGroup, root: Path, servers: list[Backend]
                  ) -> tuple[BackgroundProcess, int, int]:
    """HAProxy in the foreground; returns it, its front door port and its tunnel port."""
    front, tunnel = free_port(), free_port()
    path = root / "haproxy.cfg"
    path.write_text(config(front, tunnel, servers))
    process = group.start([HAPROXY, "-db", "-f", str(path)])
    wait_for_port(front, timeout=10)
    wait_for_port(tunnel, timeout=10)
    return process, front, tunnel


def front_proxy_config(listen: int, server: int, *, send_proxy: bool = False,
                       tls: tuple[Path, Path] | None = None) -> str:
    """One HAProxy in front of one gateway's front door.

    TCP mode (the default): bytes pass through, TLS is the gateway's; with ``send_proxy`` each
    connection to the gateway starts with a PROXY v2 header naming the client. With ``tls``
    (the PEM of a serving certificate and key, and the CA that verifies the gateway): HTTP mode,
    TLS terminated and made again towards the gateway, the client appended to
    X-Forwarded-For (``option forwardfor``), as an ingress does.
    """
    lines = ["global", "  maxconn 1024", "defaults", "  timeout connect 2s",
             "  timeout client 30s", "  timeout server 30s"]
    if tls is None:
        lines += ["  mode tcp", "frontend front", f"  bind {LOOPBACK}:{listen}",
                  "  default_backend gateway", "backend gateway",
                  f"  server g0 {LOOPBACK}:{server}" + (" send-proxy-v2" if send_proxy else "")]
    else:
        pem, ca = tls
        lines += ["  mode http", "frontend front", f"  bind {LOOPBACK}:{listen} ssl crt {pem}",
                  "  option forwardfor", "  default_backend gateway", "backend gateway",
                  f"  server g0 {LOOPBACK}:{server} ssl verify required ca-file {ca} "
                  "sni str(localhost)"]
    return "\n".join(lines) + "\n"


def start_front_proxy(group: ProcessGroup, root: Path, server: int, **options: Any
                      ) -> tuple[BackgroundProcess, int]:
    """HAProxy (:func:`front_proxy_config`) in the foreground; returns it and its port."""
    listen = free_port()
    path = root / f"front-proxy-{listen}.cfg"
    path.write_text(front_proxy_config(listen, server, **options))
    process = group.start([HAPROXY, "-db", "-f", str(path)])
    wait_for_port(listen, timeout=10)
    return process, listen
