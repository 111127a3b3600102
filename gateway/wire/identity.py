"""The identity a managed cluster sees, as it crosses the tunnel (DESIGN §2.4, §2.7, §6 rule 3).

The hub maps a verified hub user to an :class:`Identity` (``gateway.hub.admission.identity``);
the OPEN frame carries it as metadata; the agent decodes it, drops every identity-bearing header
the request carries (:func:`strip_identity_headers`) and adds ``Impersonate-*`` headers
(:func:`impersonation_headers`). Both programs import this module, so both read and write the
same bytes.

Metadata is compact, versioned JSON::

    {"v":1,"user":"...","groups":[...],"uid":"...","extra":{"k":["v"]},"rid":"..."}

plus ``"passthrough":true`` for ``--token-passthrough`` (then user/groups are empty and the agent
forwards the caller's own token without impersonation). :meth:`Identity.from_metadata`
re-validates everything (the agent must not trust the hub blindly) and additionally refuses any
user or group in ``system:`` -- defence in depth for rule 3 on the agent side.

Every value is checked: no control characters, at most ``MAX_VALUE`` characters,
``MAX_GROUPS`` groups, ``MAX_EXTRA_KEYS`` x ``MAX_EXTRA_VALUES`` extras. Violations raise
:class:`IdentityError` (the gateway answers 403) instead of being silently cut. The request id
travels as the extra ``hubproxy.dev/request-id`` (:data:`REQUEST_ID_HEADER`, not stored in
``extra``) and as :data:`AUDIT_ID`: it is one request's, never cached with the identity.

Impersonation by the agent needs RBAC on the managed cluster for the agent's service account:
``impersonate`` on ``users``, ``groups``, ``uids`` and ``userextras/<key>`` for each forwarded
extra key (``userextras/hubproxy.dev/request-id`` among them).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

METADATA_VERSION = 1
MAX_METADATA_BYTES = 32 * 1024
MAX_VALUE = 256
MAX_GROUPS = 64
MAX_EXTRA_KEYS = 16
MAX_EXTRA_VALUES = 16

REQUEST_ID_EXTRA = "hubproxy.dev/request-id"
# The header kube-apiserver takes its audit event's ID from (and echoes back as Audit-Id) when
# the first server that received the request set it: the gateway's request id, by the agent.
AUDIT_ID = b"Audit-ID"
# Any header name starting with this, in any case, asks the apiserver to impersonate.
IMPERSONATE_PREFIX = b"impersonate"

# Bytes that may appear unescaped in an extra key in a header name: Go's token table as
# client-go's headerKeyEscape uses it (k8s.io/client-go/transport/round_trippers.go), minus '%'
# which is always escaped so that url.PathUnescape on the apiserver side round-trips.
_KEY_SAFE = frozenset(
    b"!#$&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)


class IdentityError(ValueError):
    """An identity that cannot be forwarded safely (the message names the rule, not values).

    The gateway answers 403 (``status``): the hub user exists, but cannot be mapped safely.
    """

    status = 403


@dataclass(frozen=True)
class Identity:
    """The identity a managed cluster sees: already prefixed and validated."""

    user: str
    groups: tuple[str, ...]
    uid: str
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict)
    request_id: str = ""
    passthrough: bool = False  # --token-passthrough: the agent adds no identity, no credential

    def to_metadata(self) -> bytes:
        """Compact JSON for the OPEN frame (validated; raises IdentityError)."""
        validate_identity(self)
        obj: dict[str, Any] = {
            "v": METADATA_VERSION,
            "user": self.user,
            "groups": list(self.groups),
            "uid": self.uid,
            "extra": {k: list(v) for k, v in self.extra.items()},
            "rid": self.request_id,
        }
        if self.passthrough:
            obj["passthrough"] = True
        data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(data) > MAX_METADATA_BYTES:
            raise IdentityError("identity metadata too large")
        return data

    @classmethod
    def from_metadata(cls, data: bytes) -> Identity:
        """Decode and re-validate OPEN metadata. Raises IdentityError (a ValueError)."""
        if len(data) > MAX_METADATA_BYTES:
            raise IdentityError("identity metadata too large")
        try:
            obj = json.loads(bytes(data).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise IdentityError("identity metadata is not JSON") from exc
        if not isinstance(obj, dict) or obj.get("v") != METADATA_VERSION:
            raise IdentityError("identity metadata has no supported version")
        unknown = set(obj) - {"v", "user", "groups", "uid", "extra", "rid", "passthrough"}
        if unknown:
            raise IdentityError("identity metadata has unknown fields")
        user, groups, uid = obj.get("user"), obj.get("groups", []), obj.get("uid", "")
        extra, rid, passthrough = obj.get("extra", {}), obj.get("rid", ""), obj.get("passthrough")
        if not isinstance(user, str) or not isinstance(uid, str) or not isinstance(rid, str):
            raise IdentityError("identity metadata has fields of the wrong type")
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise IdentityError("identity groups must be a list of strings")
        if not isinstance(extra, dict) or not all(
            isinstance(v, list) and all(isinstance(s, str) for s in v) for v in extra.values()
        ):
            raise IdentityError("identity extra must map keys to lists of strings")
        if passthrough not in (None, True):
            raise IdentityError("identity passthrough must be true or absent")
        identity = cls(
            user=user,
            groups=tuple(groups),
            uid=uid,
            extra={k: tuple(v) for k, v in extra.items()},
            request_id=rid,
            passthrough=bool(passthrough),
        )
        validate_identity(identity)
        for name in (identity.user, *identity.groups):
            if name.startswith("system:"):
                raise IdentityError("identity names a reserved system: user or group")
        return identity


def check_value(value: str, what: str, *, allow_empty: bool = False) -> None:
    if not value and not allow_empty:
        raise IdentityError(f"{what} is empty")
    if len(value) > MAX_VALUE:
        raise IdentityError(f"{what} longer than {MAX_VALUE} characters")
    # C0 controls, DEL and C1 controls: none of them can travel in a header value safely.
    if not value.isprintable() and any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value):
        raise IdentityError(f"{what} contains a control character")


# Every hub user and group reaches managed clusters under this prefix (--identity-prefix).
DEFAULT_PREFIX = "cluster:hub:"


def validate_prefix(prefix: str) -> str:
    """The identity prefix must be able to keep hub names off reserved ones."""
    if not prefix or not prefix.endswith(":") or prefix.startswith("system:"):
        raise IdentityError("identity prefix must be non-empty, end with ':' and not be system:")
    check_value(prefix, "identity prefix")
    return prefix


def _check_extra_key(key: str) -> None:
    check_value(key, "extra key")
    if key != key.lower():
        # The apiserver lower-cases Impersonate-Extra-* names before decoding: an upper-case key
        # would arrive as a different key.
        raise IdentityError("extra key must be lower-case")


def validate_identity(identity: Identity) -> None:
    if identity.passthrough:
        if identity.user or identity.groups or identity.uid or identity.extra:
            raise IdentityError("a passthrough identity carries no user, groups, uid or extra")
    else:
        check_value(identity.user, "user")
    if len(identity.groups) > MAX_GROUPS:
        raise IdentityError(f"more than {MAX_GROUPS} groups")
    for group in identity.groups:
        check_value(group, "group")
    check_value(identity.uid, "uid", allow_empty=True)
    check_value(identity.request_id, "request id", allow_empty=True)
    if len(identity.extra) > MAX_EXTRA_KEYS:
        raise IdentityError(f"more than {MAX_EXTRA_KEYS} extra keys")
    for key, values in identity.extra.items():
        _check_extra_key(key)
        if key == REQUEST_ID_EXTRA:
            raise IdentityError("extra key is reserved for the request id")
        if len(values) > MAX_EXTRA_VALUES:
            raise IdentityError(f"more than {MAX_EXTRA_VALUES} values for an extra key")
        for value in values:
            check_value(value, "extra value")


def escape_extra_key(key: str) -> bytes:
    """Percent-encode an extra key for ``Impersonate-Extra-<key>`` as client-go does.

    Every byte of the UTF-8 key that is not an HTTP token character, and ``%`` itself, becomes
    ``%XX`` (upper-case hex); kube-apiserver lower-cases the header name and applies
    ``url.PathUnescape``, which gives the key back.
    """
    out = bytearray()
    for b in key.encode("utf-8"):
        if b in _KEY_SAFE:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)


def impersonation_headers(identity: Identity) -> list[tuple[bytes, bytes]]:
    """``Impersonate-*`` headers for ``identity``, in a fixed order.

    ``Impersonate-User``, one ``Impersonate-Group`` per group, ``Impersonate-Uid`` when set, then
    one ``Impersonate-Extra-<escaped key>`` per value (values raw: UTF-8, checked for control
    characters), and finally :data:`REQUEST_ID_HEADER` when there is a request id. A
    passthrough identity has no impersonation headers.
    """
    if identity.passthrough:
        return []
    validate_identity(identity)
    out = [(b"Impersonate-User", identity.user.encode("utf-8"))]
    out.extend((b"Impersonate-Group", g.encode("utf-8")) for g in identity.groups)
    if identity.uid:
        out.append((b"Impersonate-Uid", identity.uid.encode("utf-8")))
    for key, values in identity.extra.items():
        name = b"Impersonate-Extra-" + escape_extra_key(key)
        out.extend((name, v.encode("utf-8")) for v in values)
    if identity.request_id:
        out.append((REQUEST_ID_HEADER, identity.request_id.encode("utf-8")))
    return out


# The request id as kube-apiserver records it in the event's ``impersonatedUser``. The id is
# one request's, never one identity's: a caller that keeps a user's headers across requests
# keeps them without it and adds this per request. (The same id goes as AUDIT_ID, the event's
# ``auditID``, on every route to the apiserver, passthrough too: gateway.agent.exchange.)
REQUEST_ID_HEADER = b"Impersonate-Extra-" + escape_extra_key(REQUEST_ID_EXTRA)


def strip_identity_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """For the agent: drop every identity-bearing header before adding its own.

    Removes ``Authorization``, ``Proxy-Authorization``, any ``Impersonate*`` and ``X-Remote-*``
    header, including their ``_`` aliases (:func:`is_identity_header`).
    """
    return [(name, value) for name, value in headers if not is_identity_header(name.lower())]


_IDENTITY_PREFIXES = (IMPERSONATE_PREFIX, b"x-remote-")
_IDENTITY_NAMES = (b"authorization", b"proxy-authorization")
# The first three bytes of every name is_identity_header is true of, "_" aliases included: a
# caller looking at many names may skip the call for a name that starts otherwise.
IDENTITY_NAME_STARTS = frozenset(
    bytes(start) for name in (*_IDENTITY_NAMES, *_IDENTITY_PREFIXES)
    for start in itertools.product(*[(b, 0x5F) if b == 0x2D else (b,) for b in name[:3]]))


def is_identity_header(lowered_name: bytes) -> bool:
    """Whether a header (its lower-cased name) bears an identity the agent must drop (see
    :func:`strip_identity_headers`), its ``_`` alias included."""
    name = lowered_name.replace(b"_", b"-")
    return name in _IDENTITY_NAMES or name.startswith(_IDENTITY_PREFIXES)
