"""Stand-ins for modules other helpers are still writing (tunnel.errors, tunnel.targets,
gateway.identity), shaped exactly like /work/contracts.md. Installed only when the real module
cannot be imported, so the real ones win as soon as they land."""

from __future__ import annotations

import enum
import importlib
import json
import sys
import types
from dataclasses import dataclass, field
from urllib.parse import quote


def _errors() -> types.ModuleType:
    mod = types.ModuleType("tunnel.errors")

    class OpenErrorCode(enum.IntEnum):
        DENIED = 1
        UNREACHABLE = 2
        TIMEOUT = 3
        OVERLOAD = 4
        NO_IDENTITY = 5
        PROTOCOL = 6
        SHUTTING_DOWN = 7
        INTERNAL = 8

    class ResetCode(enum.IntEnum):
        CANCEL = 1
        PROTOCOL = 2
        FLOW_CONTROL = 3
        INTERNAL = 4
        SESSION_CLOSED = 5
        TIMEOUT = 6

    class TunnelError(Exception):
        pass

    class StreamError(TunnelError):
        pass

    class OpenRefused(StreamError):
        def __init__(self, code: OpenErrorCode, message: str = "") -> None:
            super().__init__(f"{code.name}: {message}")
            self.code, self.message = code, message

    class StreamReset(StreamError):
        def __init__(self, code: ResetCode) -> None:
            super().__init__(str(code))
            self.code = code

    class SessionClosed(StreamError):
        pass

    for obj in (OpenErrorCode, ResetCode, TunnelError, StreamError, OpenRefused, StreamReset,
                SessionClosed):
        setattr(mod, obj.__name__, obj)
    return mod


def _targets() -> types.ModuleType:
    mod = types.ModuleType("tunnel.targets")

    @dataclass(frozen=True)
    class KubeAPITarget:
        pass

    @dataclass(frozen=True)
    class ServiceTarget:
        namespace: str
        name: str
        port: int
        scheme: str = "http"

    @dataclass(frozen=True)
    class TCPTarget:
        host: str
        port: int

    for obj in (KubeAPITarget, ServiceTarget, TCPTarget):
        setattr(mod, obj.__name__, obj)
    return mod


def _identity() -> types.ModuleType:
    mod = types.ModuleType("gateway.identity")

    @dataclass(frozen=True)
    class Identity:
        user: str
        groups: tuple[str, ...] = ()
        uid: str = ""
        extra: dict[str, tuple[str, ...]] = field(default_factory=dict)
        request_id: str = ""

        def to_metadata(self) -> bytes:
            return json.dumps({"user": self.user, "groups": list(self.groups), "uid": self.uid,
                               "extra": {k: list(v) for k, v in self.extra.items()},
                               "request_id": self.request_id}).encode()

        @classmethod
        def from_metadata(cls, data: bytes) -> Identity:
            try:
                doc = json.loads(data)
            except (ValueError, UnicodeDecodeError) as exc:
                raise ValueError("bad identity") from exc
            if not isinstance(doc, dict) or not doc.get("user"):
                raise ValueError("no user")
            return cls(doc["user"], tuple(doc.get("groups", ())), doc.get("uid", ""),
                       {k: tuple(v) for k, v in doc.get("extra", {}).items()},
                       doc.get("request_id", ""))

    def impersonation_headers(identity: Identity) -> list[tuple[bytes, bytes]]:
        out = [(b"Impersonate-User", identity.user.encode())]
        out += [(b"Impersonate-Group", g.encode()) for g in identity.groups]
        if identity.uid:
            out.append((b"Impersonate-Uid", identity.uid.encode()))
        for key, values in identity.extra.items():
            out += [(b"Impersonate-Extra-" + quote(key, safe="").encode(), v.encode())
                    for v in values]
        return out

    mod.Identity = Identity
    mod.impersonation_headers = impersonation_headers
    return mod


def install() -> list[str]:
    installed = []
    for name, build in (("tunnel.errors", _errors), ("tunnel.targets", _targets),
                        ("gateway.identity", _identity)):
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules[name] = build()
            installed.append(name)
    return installed
