"""May this hub user reach this cluster? A hub SubjectAccessReview, cached (``--authorize``).

:class:`SarAuthorizer` asks the hub whether the (unprefixed, hub-verified) user -- with its
groups, uid and extra -- may ``get`` ``managedclusters/proxy`` named ``<cluster>`` in API group
``cluster.open-cluster-management.io``: the same permission OCM's cluster-proxy users already
hold. ``await authorize(user, cluster)`` returns on "allowed" and raises

* :class:`NotAuthorized` (403) when the hub says no (cached for ``ttl``, like an allow);
* :class:`gateway.hub.admission.auth.AuthUnavailable` (503) when the hub cannot answer (never
  cached).

Cache keys are a SHA-256 of the user's name, uid, groups, extra and the cluster (computed once
per user object and cluster, not per request); concurrent
identical reviews are coalesced (see :class:`gateway.hub.admission.auth.CoalescingCache`).
:class:`NoAuthorizer` (``--authorize=none``) allows every authenticated user.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gateway.hub.admission.auth import (
    DEFAULT_REVIEW_TIMEOUT,
    CoalescingCache,
    HubCalls,
    UserInfo,
    hub_call_slot,
    hub_error,
)

PROXY_GROUP = "cluster.open-cluster-management.io"
PROXY_RESOURCE = "managedclusters"
PROXY_SUBRESOURCE = "proxy"
PROXY_VERB = "get"

# (user, cluster) -> allowed?; raises AuthUnavailable when the hub cannot answer.
Review = Callable[[UserInfo, str], Awaitable[bool]]


class Authorizer(Protocol):
    """What admission needs to decide whether a hub user may reach a cluster."""

    def allowed_cached(self, user: UserInfo, cluster: str) -> bool:
        """True when an "allowed" answer is cached; False means "ask"."""

    async def authorize(self, user: UserInfo, cluster: str) -> None:
        """Returns when allowed; raises :class:`NotAuthorized` or ``AuthUnavailable``."""


class NotAuthorized(Exception):
    """The hub denied access to the cluster (403)."""

    status = 403


class NoAuthorizer:
    """``--authorize=none``: every authenticated hub user may use every connected cluster."""

    async def authorize(self, user: UserInfo, cluster: str) -> None:
        return None

    def allowed_cached(self, user: UserInfo, cluster: str) -> bool:
        return True


def denial_message(user: UserInfo, cluster: str) -> str:
    return (
        f'user "{user.username}" cannot get resource "{PROXY_RESOURCE}/{PROXY_SUBRESOURCE}" in '
        f'API group "{PROXY_GROUP}" for cluster "{cluster}" on the hub'
    )


class SarAuthorizer:
    """Hub SubjectAccessReview per (user, cluster); see the module docstring."""

    def __init__(
        self,
        api_client: Any,
        ttl: float = 10.0,
        *,
        max_entries: int = 10000,
        clock: Callable[[], float] = time.monotonic,
        timeout: float = DEFAULT_REVIEW_TIMEOUT,
        review: Review | None = None,
        hub_calls: HubCalls | None = None,
        stale_grace: float = 0.0,
    ) -> None:
        self.timeout = timeout
        self.hub_calls = hub_calls
        self._api: Any = None
        if review is None:
            from kubernetes_asyncio import client

            self._api = client.AuthorizationV1Api(api_client)
        self._review: Review = review or self._kube_review
        self.cache: CoalescingCache[bytes, bool] = CoalescingCache(
            ttl=ttl, max_entries=max_entries, cacheable=(NotAuthorized,), clock=clock,
            stale_grace=stale_grace,
        )
        self.reviews = 0
        # (id(user), cluster) -> (user, cache_key): kept with the user object so that its id
        # cannot be reused while the entry lives. Bounded: cleared when full.
        self._keys: dict[tuple[int, str], tuple[UserInfo, bytes]] = {}

    def key(self, user: UserInfo, cluster: str) -> bytes:
        """:meth:`cache_key`, computed once per user object and cluster, not per request:
        the authenticator hands out the same ``UserInfo`` for a token until its entry
        expires (as ``IdentityCache`` relies on)."""
        kept = self._keys.get((id(user), cluster))
        if kept is not None and kept[0] is user:
            return kept[1]
        key = self.cache_key(user, cluster)
        if len(self._keys) >= self.cache.max_entries:
            self._keys.clear()
        self._keys[(id(user), cluster)] = (user, key)
        return key

    @staticmethod
    def cache_key(user: UserInfo, cluster: str) -> bytes:
        material = json.dumps(
            [user.username, user.uid, sorted(user.groups),
             sorted((k, list(v)) for k, v in user.extra.items()), cluster],
            separators=(",", ":"),
        )
        return hashlib.sha256(material.encode("utf-8")).digest()

    def allowed_cached(self, user: UserInfo, cluster: str) -> bool:
        """True when an allow for (user, cluster) is cached; False means "ask" (not "denied")."""
        return self.cache.peek(self.key(user, cluster)) is True

    async def authorize(self, user: UserInfo, cluster: str) -> None:
        await self.cache.get(self.key(user, cluster), lambda: self._decide(user, cluster))

    async def _decide(self, user: UserInfo, cluster: str) -> bool:
        async with hub_call_slot(self.hub_calls):
            self.reviews += 1
            allowed = await self._review(user, cluster)
        if not allowed:
            raise NotAuthorized(denial_message(user, cluster))
        return True

    async def _kube_review(self, user: UserInfo, cluster: str) -> bool:
        from kubernetes_asyncio import client

        body = client.V1SubjectAccessReview(
            api_version="authorization.k8s.io/v1",
            kind="SubjectAccessReview",
            spec=client.V1SubjectAccessReviewSpec(
                user=user.username,
                uid=user.uid or None,
                groups=list(user.groups) or None,
                extra={k: list(v) for k, v in user.extra.items()} or None,
                resource_attributes=client.V1ResourceAttributes(
                    group=PROXY_GROUP,
                    resource=PROXY_RESOURCE,
                    subresource=PROXY_SUBRESOURCE,
                    name=cluster,
                    verb=PROXY_VERB,
                ),
            ),
        )
        try:
            response = await asyncio.wait_for(
                self._api.create_subject_access_review(body), self.timeout
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # ApiException, aiohttp errors, OSError, TimeoutError
            raise hub_error(exc, "SubjectAccessReview") from None
        status = response.status
        return bool(status is not None and status.allowed and not status.denied)
