"""Typed stream targets and their OPEN encoding (see PROTOCOL.md, "Targets").

Encoding (all integers big-endian)::

    kind u8 = 0  KubeAPITarget   (nothing follows)
    kind u8 = 1  ServiceTarget   scheme u8 (0 http, 1 https) | port u16 |
                                 ns_len u8 | ns | name_len u8 | name
    kind u8 = 2  TCPTarget       port u16 | host_len u8 | host (ASCII)

Names are DNS-1123 labels (service name, namespace); hosts are ASCII without whitespace,
ports 1..65535. Decoding refuses anything else with ``BadTargetEncoding``.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from tunnel.errors import BadTargetEncoding, TruncatedPayload

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_HOST = re.compile(r"[A-Za-z0-9._:\[\]%-]{1,255}\Z")
_SCHEMES = ("http", "https")


@dataclass(frozen=True, slots=True)
class KubeAPITarget:
    """The agent's own kube-apiserver."""


KUBE_API = KubeAPITarget()  # frozen and without fields: one for every OPEN that names it


@dataclass(frozen=True, slots=True)
class ServiceTarget:
    namespace: str
    name: str
    port: int
    scheme: str = "http"

    def __post_init__(self) -> None:
        if not _LABEL.match(self.namespace) or not _LABEL.match(self.name):
            raise ValueError(f"bad service {self.namespace!r}/{self.name!r}: not DNS-1123 labels")
        if not 0 < self.port < 65536:
            raise ValueError(f"bad port {self.port}")
        if self.scheme not in _SCHEMES:
            raise ValueError(f"bad scheme {self.scheme!r}")


@dataclass(frozen=True, slots=True)
class TCPTarget:
    host: str
    port: int

    def __post_init__(self) -> None:
        if not _HOST.match(self.host):
            raise ValueError(f"bad host {self.host!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"bad port {self.port}")


Target = KubeAPITarget | ServiceTarget | TCPTarget

KIND_KUBE_API, KIND_SERVICE, KIND_TCP = 0, 1, 2


def encode_target(target: Target) -> bytes:
    if isinstance(target, KubeAPITarget):
        return b"\x00"
    if isinstance(target, ServiceTarget):
        ns, name = target.namespace.encode(), target.name.encode()
        return (struct.pack("!BBHB", KIND_SERVICE, _SCHEMES.index(target.scheme), target.port,
                            len(ns)) + ns + bytes((len(name),)) + name)
    if isinstance(target, TCPTarget):
        host = target.host.encode("ascii")
        return struct.pack("!BHB", KIND_TCP, target.port, len(host)) + host
    raise TypeError(f"not a target: {target!r}")


def decode_target(buf: bytes | memoryview, offset: int = 0) -> tuple[Target, int]:
    """Decode a target at ``offset``; returns it and the offset just after it."""
    end = len(buf)
    if offset >= end:
        raise TruncatedPayload("OPEN ends before the target kind")
    kind = buf[offset]
    offset += 1
    try:
        if kind == KIND_KUBE_API:
            return KUBE_API, offset
        if kind == KIND_SERVICE:
            if offset + 4 > end:
                raise TruncatedPayload("service target truncated")
            scheme, port, ns_len = struct.unpack_from("!BHB", buf, offset)
            offset += 4
            if scheme >= len(_SCHEMES):
                raise BadTargetEncoding(f"unknown scheme {scheme}")
            ns, offset = _take(buf, offset, ns_len)
            if offset >= end:
                raise TruncatedPayload("service target truncated")
            name_len = buf[offset]
            name, offset = _take(buf, offset + 1, name_len)
            return ServiceTarget(ns.decode("ascii"), name.decode("ascii"), port,
                                 _SCHEMES[scheme]), offset
        if kind == KIND_TCP:
            if offset + 3 > end:
                raise TruncatedPayload("tcp target truncated")
            port, host_len = struct.unpack_from("!HB", buf, offset)
            host, offset = _take(buf, offset + 3, host_len)
            return TCPTarget(host.decode("ascii"), port), offset
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadTargetEncoding(str(exc)) from None
    raise BadTargetEncoding(f"unknown target kind {kind}")


def _take(buf: bytes | memoryview, offset: int, n: int) -> tuple[bytes, int]:
    if offset + n > len(buf):
        raise TruncatedPayload("target field truncated")
    return bytes(buf[offset:offset + n]), offset + n
