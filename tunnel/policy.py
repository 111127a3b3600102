"""The agent's own decision on where a stream may go (DESIGN §6 rule 4).

The hub could be compromised, so the agent checks every OPEN itself: its kube-apiserver, the
Services listed as ``namespace/name:port`` and explicitly listed TCP addresses; nothing else.
A name is resolved once, the resolved address is checked, and that very address is what the
caller dials, so a DNS answer cannot change between the check and the dial. Loopback,
link-local, unspecified, multicast and cloud metadata addresses are refused unless the operator
allows them (local demos and tests). Refusals are typed ``OpenRefused`` codes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from dataclasses import dataclass, field

from tunnel.errors import OpenErrorCode, OpenRefused
from tunnel.targets import KubeAPITarget, ServiceTarget, Target, TCPTarget

METADATA_ADDRESSES = frozenset({"169.254.169.254", "fd00:ec2::254", "100.100.100.200"})
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
RESOLVE_TIMEOUT = 5.0


@dataclass(frozen=True)
class ServiceRule:
    namespace: str
    name: str
    port: int

    @classmethod
    def parse(cls, text: str) -> ServiceRule:
        """``namespace/name:port``; names are DNS-1123 labels, the port numeric."""
        ns_name, colon, port = text.rpartition(":")
        namespace, slash, name = ns_name.partition("/")
        if not (colon and slash and port.isdigit()):
            raise ValueError(f"{text!r}: expected NAMESPACE/NAME:PORT")
        if not (_DNS_LABEL.match(namespace) and _DNS_LABEL.match(name)):
            raise ValueError(f"{text!r}: namespace and name must be DNS-1123 labels")
        if not 0 < int(port) < 65536:
            raise ValueError(f"{text!r}: port must be 1-65535")
        return cls(namespace, name, int(port))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}:{self.port}"


@dataclass(frozen=True)
class ResolvedTarget:
    """Where to dial: a checked IP address, never a name."""

    host_ip: str
    port: int
    server_hostname: str | None  # for TLS verification (https Services, the apiserver)
    tls: bool


def forbidden_address(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_loopback
        or ip.is_link_local
        or ip.is_unspecified
        or ip.is_multicast
        or str(ip) in METADATA_ADDRESSES
    )


@dataclass
class TargetPolicy:
    kube_api: tuple[str, int] | None
    allow_services: list[ServiceRule] = field(default_factory=list)
    allow_tcp: list[tuple[str, int]] = field(default_factory=list)
    allow_loopback: bool = False
    service_address_overrides: dict[tuple[str, str, int], tuple[str, int]] = field(
        default_factory=dict
    )
    cluster_domain: str = "cluster.local"
    _kube_resolved: tuple[tuple[str, int], ResolvedTarget] | None = field(
        default=None, init=False, repr=False, compare=False)

    def resolve_now(self, target: Target) -> ResolvedTarget | None:
        """What :meth:`resolve` answers when that needs no lookup (the kube-apiserver, dialled as
        configured); None when it may (Services, TCP targets) or would refuse."""
        if isinstance(target, KubeAPITarget) and self.kube_api is not None:
            # Asked per apiserver request: the same (immutable) answer while kube_api is.
            known = self._kube_resolved
            if known is None or known[0] is not self.kube_api:
                host, port = self.kube_api
                known = (self.kube_api, ResolvedTarget(host, port, host, True))
                self._kube_resolved = known
            return known[1]
        return None

    async def resolve(self, target: Target) -> ResolvedTarget:
        if isinstance(target, KubeAPITarget):
            if self.kube_api is None:
                raise OpenRefused(OpenErrorCode.DENIED, "this agent serves no kube-apiserver")
            host, port = self.kube_api  # the operator's own configuration: dialled as given
            return ResolvedTarget(host, port, host, True)
        if isinstance(target, ServiceTarget):
            key = (target.namespace, target.name, target.port)
            if ServiceRule(*key) not in self.allow_services:
                raise OpenRefused(OpenErrorCode.DENIED, "service is not allow-listed on this agent")
            host, port = self.service_address_overrides.get(key) or (
                f"{target.name}.{target.namespace}.svc.{self.cluster_domain}",
                target.port,
            )
            address = await self.checked_address(host, port)
            return ResolvedTarget(
                address, port, f"{target.name}.{target.namespace}.svc", target.scheme == "https"
            )
        if isinstance(target, TCPTarget):
            if (target.host, target.port) not in self.allow_tcp:
                raise OpenRefused(OpenErrorCode.DENIED, "TCP target is not allow-listed")
            address = await self.checked_address(target.host, target.port)
            return ResolvedTarget(address, target.port, None, False)
        raise OpenRefused(OpenErrorCode.DENIED, "unknown target type")

    async def checked_address(self, host: str, port: int) -> str:
        """Resolve once (TCP only) and return the first address, refusing forbidden ones."""
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP),
                RESOLVE_TIMEOUT,
            )
        except TimeoutError:
            raise OpenRefused(OpenErrorCode.TIMEOUT, "target name did not resolve in time") \
                from None
        except OSError:
            raise OpenRefused(OpenErrorCode.UNREACHABLE, "target name does not resolve") from None
        for _family, _type, _proto, _name, sockaddr in infos:
            address = str(sockaddr[0])
            if forbidden_address(address) and not self.allow_loopback:
                raise OpenRefused(OpenErrorCode.DENIED, "target address is not allowed")
            return address
        raise OpenRefused(OpenErrorCode.UNREACHABLE, "target name has no address")
