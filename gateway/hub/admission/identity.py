"""Hub user -> the identity a managed cluster sees (DESIGN §2.4, §6 rule 3).

:func:`map_identity` turns a hub ``TokenReview`` user into a
:class:`gateway.wire.identity.Identity`:

* the user and every group get ``prefix`` (default ``cluster:hub:``), so
  ``system:serviceaccount:ns:sa`` becomes ``cluster:hub:system:serviceaccount:ns:sa`` and no hub
  identity can land on a managed cluster's reserved names (``system:masters``,
  ``system:serviceaccounts:*``, ``system:nodes``...). The prefix itself must be non-empty, end
  with ``:`` and not start with ``system:``.
* ``system:authenticated`` and ``system:unauthenticated`` are dropped: the managed apiserver adds
  ``system:authenticated`` to every impersonated user itself.
* extras: only keys in ``extra_allow`` cross, re-keyed under our own domain (a hub extra must
  never be mistaken for one the managed cluster's own authenticators set). The default maps the
  service-account token extras ``authentication.kubernetes.io/<name>`` (pod-name, pod-uid,
  node-name, node-uid, credential-id) to ``hubproxy.dev/hub-<name>``.
* every value is checked by the wire rules; a violation raises
  :class:`gateway.wire.identity.IdentityError` (the gateway answers 403).

:class:`IdentityCache` maps each hub user once, not once per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.hub.admission.auth import UserInfo
from gateway.wire.identity import (
    DEFAULT_PREFIX,
    Identity,
    IdentityError,
    check_value,
    validate_identity,
    validate_prefix,
)

DROPPED_GROUPS = frozenset({"system:authenticated", "system:unauthenticated"})

DEFAULT_EXTRA_ALLOW: Mapping[str, str] = {
    f"authentication.kubernetes.io/{name}": f"hubproxy.dev/hub-{name}"
    for name in ("pod-name", "pod-uid", "node-name", "node-uid", "credential-id")
}


def map_identity(
    user_info: Mapping[str, Any] | UserInfo,
    *,
    prefix: str = DEFAULT_PREFIX,
    request_id: str = "",
    extra_allow: Mapping[str, str] = DEFAULT_EXTRA_ALLOW,
) -> Identity:
    """Map a hub ``UserInfo`` (``username``, ``uid``, ``groups``, ``extra``) to an Identity.

    ``extra_allow`` maps a hub extra key to the key it is forwarded under; other extras are
    dropped. ``user_info`` is a :class:`UserInfo` or its Kubernetes API shape (a mapping).
    Raises :class:`IdentityError` when any value breaks a rule.
    """
    validate_prefix(prefix)
    if isinstance(user_info, UserInfo):
        user_info = user_info.as_dict()
    username = user_info.get("username") or ""
    if not isinstance(username, str) or not username:
        raise IdentityError("hub user has no username")
    check_value(username, "user")
    groups_in = user_info.get("groups") or ()
    if isinstance(groups_in, str):
        raise IdentityError("hub groups must be a list")
    groups: list[str] = []
    seen: set[str] = set()
    for group in groups_in:
        if not isinstance(group, str):
            raise IdentityError("hub group is not a string")
        check_value(group, "group")
        if group in DROPPED_GROUPS or group in seen:
            continue
        seen.add(group)
        groups.append(prefix + group)
    uid = user_info.get("uid") or ""
    if not isinstance(uid, str):
        raise IdentityError("hub uid is not a string")
    extra: dict[str, tuple[str, ...]] = {}
    for key, values in (user_info.get("extra") or {}).items():
        forwarded = extra_allow.get(key)
        if forwarded is None:
            continue
        if isinstance(values, str) or not all(isinstance(v, str) for v in values or ()):
            raise IdentityError("hub extra values must be a list of strings")
        if values:
            extra[forwarded] = tuple(values)
    identity = Identity(
        user=prefix + username,
        groups=tuple(groups),
        uid=uid,
        extra=extra,
        request_id=request_id,
    )
    validate_identity(identity)
    return identity


class IdentityCache:
    """OPEN metadata per hub user, mapped and validated once (not per request).

    The authenticator's cache hands out the same ``UserInfo`` object for a token until its entry
    expires, so entries are keyed by that object (identity, not equality: a new review maps
    afresh). Only the request id differs between requests of one user; it is spliced into the
    metadata's last field (``"rid"``, lower-case hex, needs no escaping). Bounded: cleared when
    full.
    """

    _RID_TAIL = b'"rid":""}'

    def __init__(self, max_entries: int = 10000) -> None:
        self.max_entries = max_entries
        self._entries: dict[int, tuple[UserInfo, bytes]] = {}

    def metadata(self, user: UserInfo, prefix: str, request_id: str) -> bytes:
        entry = self._entries.get(id(user))
        if entry is None or entry[0] is not user:
            template = map_identity(user, prefix=prefix).to_metadata()
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            entry = (user, template)
            self._entries[id(user)] = entry
        template = entry[1]
        if not template.endswith(self._RID_TAIL) or not request_id.isalnum():
            return map_identity(user, prefix=prefix, request_id=request_id).to_metadata()
        return template[:-2] + request_id.encode("ascii") + b'"}'
