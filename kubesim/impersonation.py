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

A denial is 403 with the apiserver's message. Groups, extras or a uid without a user is an
error the real filter reports as a plain-text 500 (`responsewriters.InternalError`); kubesim
does the same. The impersonated user gets `system:authenticated` (or `system:unauthenticated`
for `system:anonymous`) unless already present; a service account impersonated without
groups gets its fixed service-account groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


class ImpersonationHeaderError(Exception):
    """Malformed combination of headers; answered with a plain-text 500 like kube-apiserver."""


@dataclass(frozen=True)
class _Request:
    kind: str  # ServiceAccount, User, Group, UserExtra, UID
    name: str
    namespace: str = ""
    field: str = ""

    def go_repr(self) -> str:
        # Roughly how Go prints the ObjectReference in the real error message.
        api = "authentication.k8s.io/v1" if self.kind in ("UserExtra", "UID") else ""
        return f"{{{self.kind} {self.namespace} {self.name}  {api}   {self.field}}}"


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
        reqs = " ".join(r.go_repr() for r in out)
        raise ImpersonationHeaderError(f"requested [{reqs}] without impersonating a user")
    return out


def impersonate(
    requestor: UserInfo,
    headers: list[tuple[str, str]],
    authorize: Callable[[Attributes], tuple[bool, str]],
) -> UserInfo | None:
    """The user to act as, None if no impersonation was asked for; raises StatusError (403)."""
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
            raise forbidden_error(attrs, reason)

    if username != ANONYMOUS:
        if ALL_AUTHENTICATED not in groups and ALL_UNAUTHENTICATED not in groups:
            groups.append(ALL_AUTHENTICATED)
    elif ALL_UNAUTHENTICATED not in groups:
        groups.append(ALL_UNAUTHENTICATED)
    return UserInfo(username, uid, tuple(groups), {k: tuple(v) for k, v in extra.items()})


__all__ = ["ImpersonationHeaderError", "has_impersonation", "impersonate", "status"]
