"""Hub bearer-token authentication: TokenReview with a keyed, coalescing cache (DESIGN §2.3).

:class:`TokenAuthenticator` answers ``await authenticate(token) -> UserInfo`` or raises

* :class:`Unauthenticated` (401) -- the hub cleanly said no. Cached for ``ttl`` like a success.
* :class:`AuthUnavailable` (503) -- the hub could not be asked or answered with an error
  (including a 401/403 for the *gateway's own* hub credential: that is our fault, not the
  user's). Never cached: the next request asks again. DESIGN §6 rule 6: fail closed -- except
  that, with ``stale_grace`` (``--hub-outage-grace``), a token the hub itself accepted less
  than ``ttl + stale_grace`` ago is still accepted while the hub cannot be asked (issue 13:
  cached tokens keep working through a hub outage). A clean "no" is never overridden.

A review is accepted only with ``authenticated: true``, an empty ``status.error``, a non-empty
username that is not ``system:anonymous``, no ``system:unauthenticated`` among the groups (an
authenticator that says "authenticated" while naming the anonymous group is contradicting
itself; dropping the group silently would turn an anonymous caller into a named one), and --
when audiences are configured -- a ``status.audiences`` that shares at least one of them (an
empty one means the hub did not check audiences, which is refused).

The cache (DESIGN §6 rule 5): keys are keyed BLAKE2b MACs under a random per-process key of the
audiences and the token, so neither the cache nor a memory dump of its keys yields a token;
entries expire after ``ttl`` seconds and at most ``max_entries`` are kept (least recently used
evicted). Concurrent reviews of the same key are coalesced: one review in flight, the other
callers await its outcome. Tokens longer than ``MAX_TOKEN_BYTES`` are refused without asking.

:class:`KubeTokenReviewer` asks the hub with kubernetes-asyncio's
``AuthenticationV1Api.create_token_review``; :func:`build_hub_api_client` builds its client from
``--hub-kubeconfig`` or the in-cluster service account.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from mypy_extensions import mypyc_attr

from gateway.hub.config import GatewayConfig

log = logging.getLogger(__name__)

ANONYMOUS = "system:anonymous"
UNAUTHENTICATED_GROUP = "system:unauthenticated"
MAX_TOKEN_BYTES = 16 * 1024
DEFAULT_REVIEW_TIMEOUT = 5.0


@mypyc_attr(native_class=False)
class Unauthenticated(Exception):
    """The token was rejected (401). The message is generic and never contains the token.

    ``hub_token``: the hub knows the token but not for our audiences. It is still a hub
    credential, so ``--token-passthrough`` must never forward it.
    """

    status = 401

    def __init__(self, message: str = "invalid bearer token", *, hub_token: bool = False
                 ) -> None:
        super().__init__(message)
        self.hub_token = hub_token


@mypyc_attr(native_class=False)
class AuthUnavailable(Exception):
    """The hub could not authenticate/authorize now (503). Never cached."""

    status = 503


@dataclass(frozen=True)
class UserInfo:
    """A hub-verified user, as the hub's TokenReview returned it (not yet prefixed)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The ``UserInfo`` shape of the Kubernetes API (what ``map_identity`` takes)."""
        return {
            "username": self.username,
            "uid": self.uid,
            "groups": list(self.groups),
            "extra": {k: list(v) for k, v in self.extra.items()},
        }


class Authenticator(Protocol):
    """What admission needs to turn a bearer token into a hub user."""

    def cache_key(self, token: str) -> bytes:
        """The token's key in the review cache: a MAC, never the token, which a client
        connection may keep for its next request that brings the same token."""

    def cached(self, token: str, key: bytes | None = None) -> UserInfo | None:
        """The user of a token reviewed successfully within the TTL; None means "ask".
        ``key``: ``cache_key(token)``, when the caller kept it."""

    async def authenticate(self, token: str) -> UserInfo:
        """The hub user; raises :class:`Unauthenticated` or :class:`AuthUnavailable`."""


class HubCalls(Protocol):
    """A bound on concurrent hub reviews (``gateway.hub.admission.hubload.HubCallLimit``)."""

    def slot(self) -> AbstractAsyncContextManager[None]:
        """Hold one slot; raises :class:`AuthUnavailable` when none frees in time."""
        ...


def hub_call_slot(hub_calls: HubCalls | None) -> AbstractAsyncContextManager[None]:
    return hub_calls.slot() if hub_calls is not None else contextlib.nullcontext()


class TokenReviewer(Protocol):
    async def review(self, token: str, audiences: tuple[str, ...]) -> Mapping[str, Any]:
        """The TokenReview ``status`` as a dict (``authenticated``, ``user``, ``audiences``,
        ``error``); raises :class:`AuthUnavailable` when the hub cannot answer."""
        ...


# --- the cache shared with gateway.hub.admission.authorize -----------------------------------

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class CoalescingCache(Generic[K, V]):
    """TTL + LRU cache of outcomes (a value or a cacheable exception) with one flight per key.

    ``await get(key, compute)``: a fresh cached outcome is returned/raised; otherwise ``compute``
    runs once however many callers wait for the same key. Its value, or an exception of one of
    ``cacheable`` types, is cached for ``ttl``; any other exception reaches every waiter of that
    flight and is not cached. A waiter that is cancelled does not cancel the flight.

    ``stale_grace`` (stale-if-error): a *success* stays known for that long past its ``ttl``.
    When the fresh ask fails with an exception that is not ``cacheable`` (the hub could not be
    asked), the last success is answered instead, and is trusted for another ``ttl`` before the
    next ask, so a hub outage costs each key one failed ask per ``ttl``, not one per request.
    A cached refusal is never extended, and nothing is served past ``ttl + stale_grace`` from
    the last success the hub gave.
    """

    def __init__(
        self,
        *,
        ttl: float,
        max_entries: int,
        cacheable: tuple[type[BaseException], ...] = (),
        clock: Callable[[], float] = time.monotonic,
        stale_grace: float = 0.0,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be positive")
        self.ttl = ttl
        self.max_entries = max_entries
        self.cacheable = cacheable
        self.clock = clock
        self.stale_grace = max(0.0, stale_grace)
        self.stale_served = 0  # flights answered with a success the hub gave earlier
        # key -> (fresh until, value, cached refusal, usable as stale until)
        self._entries: OrderedDict[K, tuple[float, V | None, BaseException | None, float]] = (
            OrderedDict())
        self._flights: dict[K, asyncio.Task[V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[K]:
        return list(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def _lookup(self, key: K) -> tuple[V | None, BaseException | None] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value, error, stale_until = entry
        now = self.clock()
        if now >= expires:
            if error is not None or now >= stale_until:
                del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value, error

    def _stale(self, key: K) -> tuple[V, float] | None:
        """The success kept past its TTL for ``key`` (and until when), if still within grace."""
        entry = self._entries.get(key)
        if entry is None or entry[2] is not None or self.clock() >= entry[3]:
            return None
        return entry[1], entry[3]  # type: ignore[return-value]

    def _store(self, key: K, value: V | None, error: BaseException | None,
               stale_until: float | None = None) -> None:
        if self.ttl <= 0:
            return
        now = self.clock()
        if stale_until is None:
            stale_until = now + self.ttl + (self.stale_grace if error is None else 0.0)
        self._entries[key] = (min(now + self.ttl, stale_until), value, error, stale_until)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def peek(self, key: K) -> V | None:
        """The fresh cached *success* for ``key``, else None (no I/O: for a synchronous fast path
        that falls back to :meth:`get`)."""
        hit = self._lookup(key)
        if hit is None or hit[1] is not None:
            return None
        return hit[0]

    async def get(self, key: K, compute: Callable[[], Awaitable[V]]) -> V:
        hit = self._lookup(key)
        if hit is not None:
            value, error = hit
            if error is not None:
                # A fresh instance per hit: re-raising one object would grow its traceback.
                raise type(error)(*error.args)
            return value  # type: ignore[return-value]
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(self._run(key, compute))
            self._flights[key] = flight
            flight.add_done_callback(lambda t: self._finished(key, t))
        return await asyncio.shield(flight)

    async def _run(self, key: K, compute: Callable[[], Awaitable[V]]) -> V:
        try:
            value = await compute()
        except self.cacheable as exc:
            self._store(key, None, exc)
            raise
        except Exception:
            stale = self._stale(key)
            if stale is None:
                raise
            value, stale_until = stale
            self.stale_served += 1
            self._store(key, value, None, stale_until)
            return value
        self._store(key, value, None)
        return value

    def _finished(self, key: K, task: asyncio.Task[V]) -> None:
        if self._flights.get(key) is task:
            del self._flights[key]
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning if every waiter left


# --- authentication -----------------------------------------------------------------------------


def _user_from_status(status: Mapping[str, Any], audiences: tuple[str, ...]) -> UserInfo:
    """Apply the acceptance rules to a TokenReview status; raises Unauthenticated."""
    if status.get("authenticated") is not True or status.get("error"):
        raise Unauthenticated("invalid bearer token")
    user = status.get("user") or {}
    username = user.get("username") or ""
    if not isinstance(username, str) or not username or username == ANONYMOUS:
        raise Unauthenticated("invalid bearer token")
    if audiences:
        returned = status.get("audiences") or []
        if not set(returned) & set(audiences):
            raise Unauthenticated("token audience not accepted", hub_token=True)
    groups = user.get("groups") or []
    if UNAUTHENTICATED_GROUP in groups:
        raise Unauthenticated("invalid bearer token")
    extra = user.get("extra") or {}
    return UserInfo(
        username=username,
        uid=user.get("uid") or "",
        groups=tuple(str(g) for g in groups),
        extra={str(k): tuple(str(v) for v in (vs or ())) for k, vs in extra.items()},
    )


class TokenAuthenticator:
    """Authenticate hub bearer tokens; see the module docstring for the contract."""

    def __init__(
        self,
        reviewer: TokenReviewer,
        *,
        ttl: float = GatewayConfig.token_cache_ttl,
        audiences: Iterable[str] = (),
        max_entries: int = 10000,
        clock: Callable[[], float] = time.monotonic,
        hub_calls: HubCalls | None = None,
        stale_grace: float = 0.0,
    ) -> None:
        self.reviewer = reviewer
        self.hub_calls = hub_calls
        self.audiences = tuple(sorted(set(audiences)))
        self._mac_key = secrets.token_bytes(32)  # per process: keys mean nothing elsewhere
        self._last_token: str | None = None  # see cache_key
        self._last_key = b""
        # Audiences are fixed per authenticator, but they are part of the key anyway so that a
        # shared cache could never answer for the wrong audience.
        self._key_prefix = json.dumps(self.audiences).encode() + b"\x00"
        self.cache: CoalescingCache[bytes, UserInfo] = CoalescingCache(
            ttl=ttl, max_entries=max_entries, cacheable=(Unauthenticated,), clock=clock,
            stale_grace=stale_grace,
        )
        self.reviews = 0  # TokenReviews actually sent (for metrics and tests)

    def cache_key(self, token: str) -> bytes:
        # The same token object as the last call's -- what a client connection's next request
        # brings (gateway.hub.admission.chain.HeaderVerdict) -- has the same key: identity,
        # not equality, so a token is never compared, and the one kept cannot be another.
        if token is self._last_token:
            return self._last_key
        key = self._mac(token)
        self._last_token, self._last_key = token, key
        return key

    def _mac(self, token: str) -> bytes:
        # Keyed BLAKE2b is a MAC by design (RFC 7693 §2.9 keyed mode), as sound here as
        # HMAC-SHA256 and one C call instead of HMAC's Python wrapper: this runs per request.
        return hashlib.blake2b(self._key_prefix + token.encode("utf-8"), key=self._mac_key,
                               digest_size=32).digest()

    def cached(self, token: str, key: bytes | None = None) -> UserInfo | None:
        """The user of a token whose review succeeded within the TTL, else None. ``key``:
        :meth:`cache_key` of ``token``, when the caller kept it."""
        if not token or len(token) > MAX_TOKEN_BYTES:
            return None
        return self.cache.peek(self.cache_key(token) if key is None else key)

    async def authenticate(self, token: str) -> UserInfo:
        if not token:
            raise Unauthenticated("no bearer token")
        if len(token) > MAX_TOKEN_BYTES:
            raise Unauthenticated("bearer token too long")
        return await self.cache.get(self.cache_key(token), lambda: self._review(token))

    async def _review(self, token: str) -> UserInfo:
        try:
            async with hub_call_slot(self.hub_calls):
                self.reviews += 1
                status = await self.reviewer.review(token, self.audiences)
        except (AuthUnavailable, Unauthenticated):
            raise
        except Exception as exc:  # a reviewer bug must not become a 401 or leak details
            log.error("TokenReview failed unexpectedly: %s", type(exc).__name__)
            raise AuthUnavailable("hub authentication is unavailable") from None
        return _user_from_status(status, self.audiences)


# --- kube-apiserver access ----------------------------------------------------------------------


async def build_hub_api_client(kubeconfig: str | None) -> Any:
    """A kubernetes-asyncio ``ApiClient`` for the hub: ``kubeconfig`` or in-cluster config."""
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    if kubeconfig:
        # persist_config=False: never write refreshed credentials back into a (possibly
        # read-only, mounted) kubeconfig.
        await config.load_kube_config(
            config_file=kubeconfig, client_configuration=cfg, persist_config=False
        )
    else:
        config.load_incluster_config(client_configuration=cfg)
    return client.ApiClient(configuration=cfg)


def hub_error(exc: BaseException, what: str) -> AuthUnavailable:
    """Log why a hub call failed (never the response body: it may echo the token) and return
    the AuthUnavailable to raise."""
    status = getattr(exc, "status", None)
    if status in (401, 403):
        log.error(
            "the hub refused the gateway's own credential for %s (HTTP %s): check "
            "--hub-kubeconfig / the service account and its RBAC",
            what,
            status,
        )
    elif status is not None:
        log.warning("hub %s failed with HTTP %s", what, status)
    else:
        log.warning("hub %s failed: %s", what, type(exc).__name__)
    return AuthUnavailable("hub authentication is unavailable")


class KubeTokenReviewer:
    """:class:`TokenReviewer` over a kubernetes-asyncio ``ApiClient`` for the hub."""

    def __init__(self, api_client: Any, *, timeout: float = DEFAULT_REVIEW_TIMEOUT) -> None:
        from kubernetes_asyncio import client

        self._client = client
        self.api = client.AuthenticationV1Api(api_client)
        self.timeout = timeout

    async def review(self, token: str, audiences: tuple[str, ...]) -> Mapping[str, Any]:
        client = self._client
        body = client.V1TokenReview(
            api_version="authentication.k8s.io/v1",
            kind="TokenReview",
            spec=client.V1TokenReviewSpec(token=token, audiences=list(audiences) or None),
        )
        try:
            response = await asyncio.wait_for(self.api.create_token_review(body), self.timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # ApiException, aiohttp errors, OSError, TimeoutError
            raise hub_error(exc, "TokenReview") from None
        status = response.status
        if status is None:
            return {}
        user = status.user
        return {
            "authenticated": status.authenticated,
            "error": status.error or "",
            "audiences": list(status.audiences or []),
            "user": {
                "username": user.username if user else "",
                "uid": user.uid if user else "",
                "groups": list(user.groups or []) if user else [],
                "extra": dict(user.extra or {}) if user else {},
            },
        }
