"""Stand-ins for ``tunnel.dialer.AgentDialer`` and ``tunnel.policy.TargetPolicy``.

Written against /work/contracts.md so that ``hubproxy agent`` runs end to end while the
tunnel-edge modules are not in the tree; ``gateway.agent.command`` imports the tunnel package's
own classes first and uses these only on ImportError (logging a warning). Delete this module
once ``tunnel.dialer`` and ``tunnel.policy`` have landed.

The policy keeps the rules that matter (DESIGN §6 rule 4): default deny, allow-listed
``namespace/name:port`` Services only, TCP targets only if listed, each name resolved once and
the checked address dialled, loopback/link-local/metadata/unspecified/multicast addresses
refused unless ``allow_loopback``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tunnel.errors import OpenErrorCode, OpenRefused
from tunnel.targets import KubeAPITarget, ServiceTarget, TCPTarget

log = logging.getLogger(__name__)

METADATA_ADDRESSES = frozenset({"169.254.169.254", "fd00:ec2::254"})


@dataclass(frozen=True)
class ServiceRule:
    namespace: str
    name: str
    port: int

    @classmethod
    def parse(cls, text: str) -> ServiceRule:
        ns_name, sep, port = text.rpartition(":")
        ns, slash, name = ns_name.partition("/")
        if not sep or not slash or not ns or not name or not port.isdigit():
            raise ValueError(f"{text!r}: expected NAMESPACE/NAME:PORT")
        return cls(ns, name, int(port))


@dataclass(frozen=True)
class ResolvedTarget:
    host_ip: str
    port: int
    server_hostname: str | None
    tls: bool


@dataclass
class FallbackPolicy:
    kube_api: tuple[str, int] | None
    allow_services: list[ServiceRule] = field(default_factory=list)
    allow_tcp: list[tuple[str, int]] = field(default_factory=list)
    allow_loopback: bool = False
    service_address_overrides: dict[tuple[str, str, int], tuple[str, int]] = field(
        default_factory=dict)
    cluster_domain: str = "cluster.local"

    async def resolve(self, target: Any) -> ResolvedTarget:
        if isinstance(target, KubeAPITarget):
            if self.kube_api is None:
                raise OpenRefused(OpenErrorCode.DENIED, "no kube-apiserver on this agent")
            host, port = self.kube_api  # operator configuration: trusted as given
            return ResolvedTarget(host, port, host, True)
        if isinstance(target, ServiceTarget):
            key = (target.namespace, target.name, target.port)
            if ServiceRule(*key) not in self.allow_services:
                raise OpenRefused(OpenErrorCode.DENIED, "service not allow-listed on this agent")
            override = self.service_address_overrides.get(key)
            host, port = override or (
                f"{target.name}.{target.namespace}.svc.{self.cluster_domain}", target.port)
            ip = await self._checked_address(host, port)
            return ResolvedTarget(ip, port, f"{target.name}.{target.namespace}.svc",
                                  target.scheme == "https")
        if isinstance(target, TCPTarget):
            if (target.host, target.port) not in self.allow_tcp:
                raise OpenRefused(OpenErrorCode.DENIED, "TCP target not allow-listed")
            ip = await self._checked_address(target.host, target.port)
            return ResolvedTarget(ip, target.port, None, False)
        raise OpenRefused(OpenErrorCode.DENIED, "unknown target type")

    async def _checked_address(self, host: str, port: int) -> str:
        """Resolve once; refuse forbidden addresses; the caller dials exactly this address."""
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), 5.0)
        except (OSError, TimeoutError):
            raise OpenRefused(OpenErrorCode.UNREACHABLE, "target name does not resolve") from None
        for info in infos:
            address = str(info[4][0])
            ip = ipaddress.ip_address(address)
            forbidden = (ip.is_loopback or ip.is_link_local or ip.is_unspecified
                         or ip.is_multicast or address in METADATA_ADDRESSES)
            if forbidden and not self.allow_loopback:
                raise OpenRefused(OpenErrorCode.DENIED, "target address is not allowed")
            return address
        raise OpenRefused(OpenErrorCode.UNREACHABLE, "target name has no address")


class FallbackDialer:
    """Dial the hub, serve one TunnelSession at a time, reconnect with backoff + full jitter."""

    def __init__(self, hub_host: str, hub_port: int,
                 ssl_context_factory: Callable[[], ssl.SSLContext], on_open: Any, config: Any,
                 server_hostname: str | None = None) -> None:
        self.hub_host = hub_host
        self.hub_port = hub_port
        self.ssl_context_factory = ssl_context_factory
        self.on_open = on_open
        self.config = config
        self.server_hostname = server_hostname or hub_host
        self.session: Any = None
        self._stopping = False
        self.base_delay = 0.2
        self.max_delay = 15.0

    @property
    def connected(self) -> bool:
        return self.session is not None and not self.session.closed

    async def run(self) -> None:
        from tunnel.connection import TunnelSession

        loop = asyncio.get_running_loop()
        delay = self.base_delay
        while not self._stopping:
            started = time.monotonic()
            try:
                _, session = await loop.create_connection(
                    lambda: TunnelSession(config=self.config, on_open=self.on_open, name="hub"),
                    self.hub_host, self.hub_port, ssl=self.ssl_context_factory(),
                    server_hostname=self.server_hostname, ssl_handshake_timeout=10.0)
            except (OSError, ssl.SSLError, TimeoutError) as exc:
                log.warning("cannot connect to the hub %s:%d: %s", self.hub_host, self.hub_port,
                            getattr(exc, "reason", None) or type(exc).__name__)
            else:
                self.session = session
                log.info("connected to the hub %s:%d", self.hub_host, self.hub_port)
                await session.wait_closed()
                self.session = None
                log.warning("hub session ended: %s", getattr(session, "close_reason", ""))
                if time.monotonic() - started > 30:
                    delay = self.base_delay  # it was stable: start over
            if self._stopping:
                break
            await asyncio.sleep(random.uniform(0, delay))
            delay = min(delay * 2, self.max_delay)

    async def drain(self, deadline: float) -> None:
        self._stopping = True
        session = self.session
        if session is not None and not session.closed:
            with contextlib.suppress(Exception):
                await session.drain(deadline)
