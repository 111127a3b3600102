"""Impersonation, following kube-apiserver's WithImpersonation filter step by step.

Headers: `Impersonate-User`, `Impersonate-Group` (repeatable), `Impersonate-Uid`,
`Impersonate-Extra-<key>` (key lower-cased, then percent-decoded). Every requested value is
authorized separately with verb `impersonate`:

| header                | resource (group)                           | name / namespace           |
|-----------------------|--------------------------------------------|----------------------------|
| user `system:serviceaccount:ns:sa` | `serviceaccounts` ("")        | `sa` in `ns`               |
| any other user        | `users` ("")                               | the user                   |
| group                 | `groups` ("")                              | the group                  |
| extra `<key>`         | `userextras/<key>` (authentication.k8s.io) | the value                  |
| uid                   | `uids` (authentication.k8s.io)             | the uid                    |

A denial is 403 with the apiserver's message. Groups, extras or a uid without a user is a
400 BadRequest Status, as kube-apiserver 1.36 answers it (older releases sent a plain-text 500).
The impersonated user gets `system:authenticated` (or `system:unauthenticated` for
`system:anonymous`) unless already present; a service account impersonated without groups gets
its fixed service-account groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from urllib.parse import unquote

from kubesim import status
from kubesim.auth import (
    ALL_AUTHENTICATED,
    ALL_UNAUTHENTICATED,
    ANONYMOUS,
    UserInfo,
    service_account_groups,
    split_service_account,
)
from kubesim.rbac import Attributes, forbidden_error

USER = "impersonate-user"
GROUP = "impersonate-group"
UID = "impersonate-uid"
EXTRA_PREFIX = "impersonate-extra-"


@dataclass(frozen=True)
class _Request:
    kind: str  # ServiceAccount, User, Group, UserExtra, UID
    name: str
    namespace: str = ""
    field: str = ""


def has_impersonation(headers: Iterable[str]) -> bool:
    return any(h.lower().startswith("impersonate-") for h in headers)


def _requests(headers: list[tuple[str, str]]) -> list[_Request]:
    def values(name: str) -> list[str]:
        return [v for k, v in headers if k.lower() == name]

    out: list[_Request] = []
    users = values(USER)
    user = users[0] if users else ""
    if user:
        sa = split_service_account(user)
        out.append(_Request("ServiceAccount", sa[1], sa[0]) if sa else _Request("User", user))
    groups = values(GROUP)
    out.extend(_Request("Group", g) for g in groups)
    extras = [(k, v) for k, v in headers if k.lower().startswith(EXTRA_PREFIX)]
    for k, v in extras:
        out.append(_Request("UserExtra", v, field=unquote(k.lower()[len(EXTRA_PREFIX) :])))
    uids = values(UID)
    if uids and uids[0]:
        out.append(_Request("UID", uids[0]))
    if (groups or extras or (uids and uids[0])) and not user:
        raise status.StatusError(400, "BadRequest", _without_user_message(
            uids[0] if uids else "", groups,
            [(unquote(k.lower()[len(EXTRA_PREFIX):]), v) for k, v in extras]), None)
    return out


def _go_strings(values: Iterable[str]) -> str:
    return "[]string{" + ", ".join(f'"{v}"' for v in values) + "}"


def _without_user_message(uid: str, groups: list[str], extras: list[tuple[str, str]]) -> str:
    """The 1.36 message: the requested user.DefaultInfo as Go's %#v prints it."""
    merged: dict[str, list[str]] = {}
    for key, value in extras:
        merged.setdefault(key, []).append(value)
    extra = ("map[string][]string(nil)" if not merged else "map[string][]string{"
             + ", ".join(f'"{k}":{_go_strings(v)}' for k, v in merged.items()) + "}")
    group_repr = _go_strings(groups) if groups else "[]string(nil)"
    info = f'&user.DefaultInfo{{Name:"", UID:"{uid}", Groups:{group_repr}, Extra:{extra}}}'
    return f"requested {info} without impersonating a user name"


def impersonate(
    requestor: UserInfo,
    headers: list[tuple[str, str]],
    authorize: Callable[[Attributes], tuple[bool, str]],
    target: Attributes | None = None,
) -> UserInfo | None:
    """The user to act as, None if no impersonation was asked for; raises StatusError (403).

    ``target`` is what the request itself asks to do, as the requestor. Kubernetes 1.36 tries
    constrained impersonation (KEP-5284) when the legacy ``impersonate`` checks deny, and its
    403 then names that check on the request (``impersonate-on:<mode>:<verb>``), not the
    legacy ``users``/``serviceaccounts`` resource. kubesim grants only the legacy verbs but
    words the refusal as 1.36 does.
    """
    requests = _requests(headers)
    if not requests:
        return None
    groups_specified = any(k.lower() == GROUP for k, _ in headers)
    username, uid = "", ""
    groups: list[str] = []
    extra: dict[str, list[str]] = {}
    for req in requests:
        if req.kind == "ServiceAccount":
            attrs = Attributes(
                requestor,
                "impersonate",
                True,
                namespace=req.namespace,
                api_version="v1",
                resource="serviceaccounts",
                name=req.name,
            )
            username = f"system:serviceaccount:{req.namespace}:{req.name}"
            if not groups_specified:
                groups = list(service_account_groups(req.namespace))
        elif req.kind == "User":
            attrs = Attributes(
                requestor, "impersonate", True, api_version="v1", resource="users", name=req.name
            )
            username = req.name
        elif req.kind == "Group":
            attrs = Attributes(
                requestor, "impersonate", True, api_version="v1", resource="groups", name=req.name
            )
            groups.append(req.name)
        elif req.kind == "UserExtra":
            attrs = Attributes(
                requestor,
                "impersonate",
                True,
                api_group="authentication.k8s.io",
                api_version="v1",
                resource="userextras",
                subresource=req.field,
                name=req.name,
            )
            extra.setdefault(req.field, []).append(req.name)
        else:
            attrs = Attributes(
                requestor,
                "impersonate",
                True,
                api_group="authentication.k8s.io",
                api_version="v1",
                resource="uids",
                name=req.name,
            )
            uid = req.name
        allowed, reason = authorize(attrs)
        if not allowed:
            if target is None:
                raise forbidden_error(attrs, reason)
            mode = "serviceaccount" if requests[0].kind == "ServiceAccount" else "user-info"
            raise forbidden_error(replace(target, verb=f"impersonate-on:{mode}:{target.verb}"))

    if username != ANONYMOUS:
        if ALL_AUTHENTICATED not in groups and ALL_UNAUTHENTICATED not in groups:
            groups.append(ALL_AUTHENTICATED)
    elif ALL_UNAUTHENTICATED not in groups:
        groups.append(ALL_UNAUTHENTICATED)
    return UserInfo(username, uid, tuple(groups), {k: tuple(v) for k, v in extra.items()})


__all__ = ["has_impersonation", "impersonate", "status"]
