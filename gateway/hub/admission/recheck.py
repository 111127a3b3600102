"""Is a long-running request's caller still allowed? (revocation reaches open streams)

A watch, ``logs -f`` or exec/attach/port-forward is admitted once, then may stay open for hours.
:func:`recheck` asks again what admission asked (the token's TokenReview, then the hub
SubjectAccessReview for the cluster) through the same caches: while the cached answers are
fresh it costs nothing; once they expire (``--token-cache-ttl``) the hub is asked again, and
identical questions from many streams are coalesced into one.

Only a clean "no" revokes: the token is rejected (401), it now names another user (401) or the
same user with other groups, in any order (401: the managed cluster would go on seeing the
groups the stream was opened with, which the hub no longer vouches for; the client opens it
again and is admitted with the current ones), or the hub denies the cluster (403). A hub that
cannot answer (:class:`AuthUnavailable`: down, slow, out of review slots) never closes a
stream: the answer is :data:`UNKNOWN` and the next round asks again. Token-passthrough
requests carry no hub identity and are not rechecked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.hub.admission.auth import Authenticator, AuthUnavailable, Unauthenticated, UserInfo
from gateway.hub.admission.authorize import Authorizer, NotAuthorized

ALLOWED: Literal["allowed"] = "allowed"
UNKNOWN: Literal["unknown"] = "unknown"


@dataclass(frozen=True, slots=True)
class Recheck:
    """What a long-running request was admitted on, kept to ask again."""

    token: str
    user: UserInfo
    cluster: str
    exec_like: bool = False  # exec/attach: a WebSocket close may carry a Status first


@dataclass(frozen=True, slots=True)
class Revoked:
    """The hub cleanly said no: end the stream, telling the client ``status``/``message``."""

    status: int
    reason: str  # the Kubernetes Status reason (Unauthorized, Forbidden)
    message: str


Verdict = Literal["allowed", "unknown"] | Revoked


async def recheck(authenticator: Authenticator, authorizer: Authorizer,
                  admitted_on: Recheck) -> Verdict:
    """Ask again; see the module docstring."""
    try:
        user = await authenticator.authenticate(admitted_on.token)
    except Unauthenticated:
        return Revoked(401, "Unauthorized", "the bearer token is no longer valid on the hub")
    except AuthUnavailable:
        return UNKNOWN
    if (user.username, user.uid) != (admitted_on.user.username, admitted_on.user.uid):
        return Revoked(401, "Unauthorized", "the bearer token now names another hub user")
    if set(user.groups) != set(admitted_on.user.groups):  # the order carries no meaning
        return Revoked(401, "Unauthorized", "the hub user's groups changed since this stream "
                                            "was opened: open it again to act with the "
                                            "current ones")
    try:
        await authorizer.authorize(user, admitted_on.cluster)
    except NotAuthorized:
        return Revoked(403, "Forbidden",
                       f'access to cluster "{admitted_on.cluster}" was revoked on the hub')
    except AuthUnavailable:
        return UNKNOWN
    return ALLOWED
