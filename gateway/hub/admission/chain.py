"""The admission chain: what crosses the gateway, in one visible order (DESIGN §2).

Each filter is a module of its own and does one thing; this module only runs them in order and
turns each refusal into a :class:`Refusal` carrying the status the front door answers with as a
Kubernetes ``Status``. Messages never contain tokens or internal addresses.

1. :func:`gateway.hub.admission.routing.route` -- ``/<cluster>/<rest>``, strict path rules (400);
2. :func:`gateway.hub.admission.body.check_body_size` -- a declared body over the limit (413);
3. :func:`gateway.hub.admission.upgrade.check_upgrade` -- only Kubernetes streams upgrade (400);
4. :func:`gateway.hub.admission.bearer.extract_token` -- one unambiguous bearer token (401/400);
5. :func:`gateway.hub.admission.headers.rewrite_request_headers` -- what crosses (403/400);
6. authentication on the hub (:class:`gateway.hub.admission.auth.Authenticator`, 401/503),
   unless the client's address failed too often (:class:`hubload.FailedAuthLimiter`, 429);
7. authorization on the hub (:class:`gateway.hub.admission.authorize.Authorizer`, 403/503);
8. identity mapping (:class:`gateway.hub.admission.identity.IdentityCache`, 403);
9. the cluster's session (404 unknown, 503 not connected);
10. the identity's cap on long-running requests on that cluster
    (:class:`gateway.hub.admission.streams.StreamQuota`, 429; which requests are long-running:
    :func:`gateway.wire.requestclass.request_class`, asked once and kept in
    :attr:`Admitted.kind`): the slot travels in :class:`Admitted` and the exchange releases
    it when it ends. With ``revalidate_streams`` a long-running request also carries what it
    was admitted on (:class:`gateway.hub.admission.recheck.Recheck`), for
    ``gateway.hub.revalidation`` to ask the hub again while it stays open;
11. a short request's seat (:class:`gateway.hub.admission.seats.Seats`: fair queuing between
    identities, in the spirit of kube-apiserver's API Priority and Fairness; 429 with
    ``Retry-After`` when its queue is full or it waited too long). The seat travels in
    :class:`Admitted` like a stream slot.

Steps 1-5 need nothing but the request (:func:`prepare`, pure); a client connection keeps
what steps 4-5 decided on its last header list (:class:`HeaderVerdict`) for a next request
that repeats it exactly. :func:`admit_cached` runs 6-10
without awaiting when the hub's answers are cached (the common case), :func:`admit` otherwise;
the decision is the same either way. :func:`start_admission` is how both front doors (HTTP/1.1
and HTTP/2) start a request: the gateway-wide checks (draining 503, ``max_inflight`` 429), then
1-11, synchronously when nothing needs to wait.

The hub is not a free oracle (:mod:`gateway.hub.admission.hubload`): a token whose review is
not cached costs a hub request, so an address whose authentications keep failing gets 429
before the hub is asked (a token already cached as valid still passes), and the hub reviews in
flight are bounded (503 when no slot frees in time).

Ordering on purpose: the token is checked before the cluster is looked up, so an anonymous
caller cannot enumerate which clusters are connected.

Cluster lookup (404 vs 503) for a cluster that is not connected: where the hub has a cluster
inventory (``gateway.hub.inventory``: OCM ManagedClusters or ClusterProfiles), it decides --
listed -> 503 (``Retry-After``), not listed -> 404, at once. Without one (or before it is first
listed) the gateway remembers every cluster that connected since it started: seen before ->
503; never seen -> 404, except during ``unknown_cluster_grace`` after start (agents of a
restarted gateway are still reconnecting), when it is 503 too.

``--token-passthrough``: when the hub *cleanly* rejects an ``Authorization: Bearer`` token (not
on hub errors, never for the WebSocket-subprotocol form, never for a hub token of another
audience), the request goes out with the caller's own ``Authorization`` header and a passthrough
identity (``Identity.passthrough``: no user, no groups); the agent then adds neither identity nor
its own credential. Hub authorization (SAR) is skipped for such requests: there is no hub
identity to ask about.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from mypy_extensions import mypyc_attr

from gateway.hub.admission.auth import Authenticator, AuthUnavailable, Unauthenticated, UserInfo
from gateway.hub.admission.authorize import Authorizer, NotAuthorized
from gateway.hub.admission.bearer import BearerError, BearerToken, extract_token
from gateway.hub.admission.body import DEFAULT_MAX_REQUEST_BODY, BodyTooLarge, check_body_size
from gateway.hub.admission.headers import HeaderRefused, rewrite_request_headers
from gateway.hub.admission.hubload import FailedAuthLimiter, TooManyFailures
from gateway.hub.admission.identity import IdentityCache
from gateway.hub.admission.recheck import Recheck
from gateway.hub.admission.routing import ClusterRoute, RouteError, route
from gateway.hub.admission.seats import Seat, SeatRefused, Seats
from gateway.hub.admission.streams import StreamQuota, StreamSlot, TooManyStreams
from gateway.hub.admission.upgrade import UpgradeRefused, check_upgrade
from gateway.hub.config import GatewayConfig
from gateway.wire.http1 import Headers, RequestHead, check_request_head, serialize_request_head
from gateway.wire.identity import Identity, IdentityError
from gateway.wire.requestclass import SHORT, front_door_class
from tunnel.connection import StreamOpener
from tunnel.targets import KubeAPITarget, ServiceTarget, Target

log = logging.getLogger("hubproxy.gateway")


@mypyc_attr(native_class=False)
class Refusal(Exception):
    """The gateway answers this request itself with a ``Status`` of ``status``."""

    def __init__(self, status: int, message: str, *, retry_after: int | None = None,
                 extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.extra_headers = extra_headers
        # The hub user, when the refusal came after authentication (for the audit trail).
        self.user_info: UserInfo | None = None

    def of(self, user: UserInfo | None) -> Refusal:
        """This refusal, as one of ``user``'s requests."""
        self.user_info = user
        return self


class ClusterSessions(Protocol):
    """The registry of connected agents, as admission sees it."""

    def pick(self, cluster: str) -> StreamOpener | None:
        """The least-loaded session of a connected cluster, or None."""


class AuthLookups(Protocol):
    auth_lookups: int


class AdmissionContext(Protocol):
    """What admission needs from the gateway process (``gateway.hub.app.Gateway``)."""

    config: GatewayConfig
    authenticator: Authenticator
    authorizer: Authorizer
    identities: IdentityCache
    known_clusters: set[str]
    auth_failures: FailedAuthLimiter
    stream_quota: StreamQuota
    seats: Seats | None  # None: fair queuing off (--max-executing-requests 0)
    draining: bool
    inflight: int  # requests between head and response end (--max-inflight)

    @property
    def registry(self) -> ClusterSessions: ...  # read-only here: any registry that can pick

    @property
    def metrics(self) -> AuthLookups: ...

    def in_startup_grace(self) -> bool: ...

    def cluster_listed(self, cluster: str) -> bool | None:
        """Whether the hub's cluster inventory knows ``cluster``; None without one."""
        ...


@dataclass(slots=True)
class Admitted:
    """A request allowed through: where it goes and the exact bytes that start it."""

    cluster: str
    session: StreamOpener
    target: Target
    metadata: bytes
    head: bytes  # rewritten request head for the agent (initial_data of the OPEN)
    user: str  # hub user name for the audit line ("" with passthrough)
    upgrade: bool
    # gateway.wire.requestclass: short, watch or stream; asked once, here, for everything
    # that treats long-running requests differently.
    kind: str = SHORT
    # A long-running request's place under its identity's cap; released when the exchange ends.
    stream_slot: StreamSlot | None = None
    # A long-running request with a hub identity, when --revalidate-streams: what to ask the
    # hub again while it stays open (gateway.hub.revalidation).
    recheck: Recheck | None = None
    # A short request's fairness flow (its identity) when fair queuing is on, else "".
    flow: str = ""
    # Its seat once the fair queuing gave it one; released when the exchange ends.
    seat: Seat | None = None
    # For the audit trail (gateway.hub.audittrail): the hub user as the hub described it (None
    # with passthrough), and the client's User-Agent (the head's fields are dropped once the
    # request is forwarded). Admission refused the request if its token was in there.
    user_info: UserInfo | None = None
    user_agent: bytes = b""

    def release(self) -> None:
        """Give back what the request holds (its stream slot or its seat); idempotent."""
        if self.stream_slot is not None:
            self.stream_slot.release()
        if self.seat is not None:
            self.seat.release()


@dataclass(slots=True)
class Prepared:
    """What admission learns from the request alone, before asking the hub anything."""

    route: ClusterRoute
    upgrade: bool
    bearer: BearerToken
    token: str
    headers: Headers
    # ``headers`` as they go out, serialised and checked once per header list (see
    # :func:`header_block`); None when they could not be.
    block: bytes | None = None
    # The client connection's HeaderVerdict, which also keeps the token's review-cache key
    # (a MAC, never the token) for the connection's next request; None without one.
    verdict: HeaderVerdict | None = None
    user_agent: bytes = b""  # the head's User-Agent (b"" for none), read once per header list


class _RequestIds:
    """Request ids: 16 hex digits of ``os.urandom``, drawn 256 at a time (one getrandom call
    per 256 requests, not one per request). A forked worker starts on fresh bytes: no two
    processes hand out the same ids."""

    BATCH: ClassVar[int] = 256
    _hex = ""
    _next = 0

    def take(self) -> str:
        at = self._next
        if at >= len(self._hex):
            self._hex, at = os.urandom(8 * self.BATCH).hex(), 0
        self._next = at + 16
        return self._hex[at:at + 16]

    def forget(self) -> None:
        self._hex, self._next = "", 0


_REQUEST_IDS = _RequestIds()
os.register_at_fork(after_in_child=_REQUEST_IDS.forget)


def new_request_id() -> str:
    """A fresh id for a request (the ``Audit-ID`` its cluster sees): 64 random bits."""
    return _REQUEST_IDS.take()


class HeaderVerdict:
    """Steps 4-5 decided for one header list, kept by a client connection for its next
    request: clients send the same headers request after request (the same token, user agent,
    accept types), and what the steps decide is a pure function of the header list, the
    client's address and whether the request goes to a Service. So a request whose three are
    equal to the last one's takes that decision as it is, a list comparison instead of
    parsing the token, checking and rewriting every header again. A list is kept once steps
    4-5 read it, even when its request is then refused for carrying no token or carrying it
    elsewhere: that refusal is decided again, from what was kept, for every request repeating
    the list. Only a request that passed every step leaves its whole preparation
    (``prepared``). The connection drops all of it with its last request if that one stays
    open for hours (:meth:`forget`)."""

    __slots__ = ("auth_key", "bearer", "block", "client_ip", "forwarded", "line", "line_block",
                 "line_head", "line_kind", "prepared", "received", "route", "searchable",
                 "target", "to_service", "token_in_headers", "user_agent")

    def __init__(self) -> None:
        self.received: Headers | None = None  # a copy of the list decided on; None: nothing
        self.client_ip = ""
        self.to_service = False
        self.bearer = _NO_TOKEN
        self.forwarded: Headers = []
        self.block: bytes | None = None  # header_block(forwarded)
        self.token_in_headers = False
        self.user_agent = b""  # the list's User-Agent, for the audit trail
        # The token as the bytes carries_token looks for (b"": too short to search), and its
        # key in the hub review cache once admission asked it (Authenticator.cache_key): one
        # encode and one MAC per connection and token, not per request.
        self.searchable = b""
        self.auth_key: bytes | None = None
        # The last admitted request's target and its route: clients ask for the same path
        # request after request, and a route is a pure function of the target's bytes. Kept
        # per connection, and only for a target that passed every step: never a token.
        self.target = b""
        self.route: ClusterRoute | None = None
        # What prepare() returned for that target with these headers: steps 1-5 are a pure
        # function of the two and of the client's address, so a request repeating all three
        # takes it as it is (kept only once it passed them, like the rest).
        self.prepared: Prepared | None = None
        # The last admitted request's forwarded head and class (see _admitted), for its
        # request line (method, target, version, upgrade) and the fields' block it was made
        # with. Never a passthrough request's: its head carries the caller's own token.
        self.line: tuple[bytes, bytes, bytes, bool] | None = None
        self.line_block: bytes | None = None
        self.line_head = b""
        self.line_kind = SHORT

    def forget(self) -> None:
        self.received, self.bearer, self.forwarded, self.block = None, _NO_TOKEN, [], None
        self.searchable, self.auth_key, self.user_agent = b"", None, b""
        self.target, self.route, self.prepared = b"", None, None
        self.line, self.line_block, self.line_head = None, None, b""


_NO_TOKEN = BearerToken(None, "", [])


def prepare(head: RequestHead, client_ip: str,
            max_request_body: int = DEFAULT_MAX_REQUEST_BODY,
            last: HeaderVerdict | None = None) -> Prepared:
    """Steps 1-5: route, body size, upgrade check, bearer and header rules. Pure; raises
    :class:`Refusal`. ``last``: the connection's :class:`HeaderVerdict`, used when it was
    decided for the same inputs, else replaced by this request's."""
    if last is not None:
        prepared = last.prepared
        if (prepared is not None and last.target == head.target
                and last.received == head.headers and last.client_ip == client_ip):
            return prepared  # the connection's last request, but for its method and version
    try:
        if last is not None and last.route is not None and last.target == head.target:
            cluster_route = last.route
        else:
            cluster_route = route(head.target)
        check_body_size(head, max_request_body)
        upgrade = check_upgrade(head, cluster_route)
        to_service = cluster_route.service is not None
        if (last is not None and last.received == head.headers
                and last.client_ip == client_ip and last.to_service == to_service):
            bearer, headers, token_in_headers = last.bearer, last.forwarded, last.token_in_headers
            block, searchable, user_agent = last.block, last.searchable, last.user_agent
        else:
            bearer = extract_token(head.headers)
            headers = rewrite_request_headers(
                bearer.headers, client_ip=client_ip, host=head.host or b"unknown",
                to_service=to_service,
            )
            token_in_headers = bearer.token is not None and carries_token(
                bearer.token, b"", headers)
            # The gateway answers Expect: 100-continue itself (see FrontDoor), so it does not
            # travel.
            headers = [(n, v) for n, v in headers if n.lower() != b"expect"]
            block = header_block(headers)
            searchable = searchable_token(bearer.token)
            user_agent = head.get(b"user-agent") or b""
            if last is not None:
                last.prepared = None  # made for other headers: never for these
                last.received, last.client_ip, last.to_service = (
                    list(head.headers), client_ip, to_service)
                last.bearer, last.forwarded, last.token_in_headers, last.block = (
                    bearer, headers, token_in_headers, block)
                last.searchable, last.auth_key = searchable, None  # a new token: a new key
                last.user_agent = user_agent
    except (RouteError, BodyTooLarge, UpgradeRefused, BearerError, HeaderRefused) as exc:
        raise Refusal(exc.status, str(exc)) from None
    if bearer.token is None:
        raise Refusal(401, "a bearer token is required")
    if token_in_headers or (searchable and searchable in head.target):
        raise Refusal(400, "the request carries its bearer token outside the Authorization "
                           "header (in its path, query or another header); it would reach the "
                           "managed cluster, so it is refused: send the token only as "
                           "'Authorization: Bearer'")
    prepared = Prepared(cluster_route, upgrade, bearer, bearer.token, headers, block, last,
                        user_agent)
    if last is not None:
        last.target, last.route, last.prepared = head.target, cluster_route, prepared
    return prepared


_START_LINE = b"GET / HTTP/1.1\r\n"


def header_block(headers: Headers) -> bytes | None:
    """The header fields of a forwarded head as they follow its request line (through the
    empty line that ends the head), made and checked by the one serialiser,
    :func:`gateway.wire.http1.serialize_request_head`; None when it refuses them. A client
    connection's requests repeat their headers (:class:`HeaderVerdict`): the fields are then
    serialised and checked once, and each request only puts its own request line before them
    (:func:`forwarded_head`)."""
    try:
        return serialize_request_head(b"GET", b"/", headers)[len(_START_LINE):]
    except ValueError:
        return None


def forwarded_head(head: RequestHead, upstream_target: bytes, headers: Headers,
                   block: bytes | None) -> bytes:
    """The request head the agent gets: the request line for ``upstream_target`` and
    ``headers``, whose :func:`header_block` is ``block`` (None: serialise them here). Raises
    ValueError for a head that cannot be forwarded."""
    if block is None:
        return serialize_request_head(head.method, upstream_target, headers, head.version)
    check_request_head(head.method, upstream_target, [])  # the fields were checked in block
    return b"%s %s %s\r\n%s" % (head.method, upstream_target, head.version, block)


MIN_TOKEN_TO_SEARCH = 16  # shorter "tokens" could match by chance; real ones are far longer


def searchable_token(token: str | None) -> bytes:
    """The bytes :func:`carries_token` looks for: b"" for none, or one too short to search."""
    if token is None or len(token) < MIN_TOKEN_TO_SEARCH:
        return b""
    return token.encode()


def carries_token(token: str, target: bytes, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether the hub token also sits where it would be forwarded: the target (a
    ``?access_token=`` or ``?token=`` by mistake) or a header other than the ones stripped.
    Hub tokens never reach managed clusters, whatever the client does with them."""
    raw = searchable_token(token)
    return bool(raw) and (raw in target or any(raw in value for _, value in headers))


def admit_cached(gw: AdmissionContext, head: RequestHead, prepared: Prepared, request_id: str
                 ) -> Admitted | None:
    """Steps 6-10 without awaiting, when the token's review and the user's authorization are
    both cached: saves a task and two loop turns per request. None means "not cached": run
    :func:`admit`."""
    verdict = prepared.verdict
    if verdict is None:
        user = gw.authenticator.cached(prepared.token)
    else:
        key = verdict.auth_key
        if key is None:
            # Set only after prepare() kept this token in the verdict: the key is its token's.
            key = verdict.auth_key = gw.authenticator.cache_key(prepared.token)
        user = gw.authenticator.cached(prepared.token, key)
    if user is None or not gw.authorizer.allowed_cached(user, prepared.route.cluster):
        return None
    gw.metrics.auth_lookups += 1
    try:
        return _admitted(gw, head, prepared, user, request_id)
    except Refusal as exc:
        raise exc.of(user) from None


async def admit(gw: AdmissionContext, head: RequestHead, client_ip: str, request_id: str,
                prepared: Prepared | None = None) -> Admitted:
    """The whole chain; raises :class:`Refusal`."""
    if prepared is None:
        prepared = prepare(head, client_ip, gw.config.limits.max_request_body)
    gw.metrics.auth_lookups += 1
    if gw.authenticator.cached(prepared.token) is None:
        try:
            gw.auth_failures.check(client_ip)
        except TooManyFailures as exc:
            raise Refusal(429, str(exc), retry_after=exc.retry_after) from None
    try:
        user = await gw.authenticator.authenticate(prepared.token)
    except Unauthenticated as exc:
        if (gw.config.token_passthrough and prepared.bearer.source == "authorization"
                and not exc.hub_token):
            # Not counted as a failure: rejected tokens are what passthrough is for.
            return _admitted(gw, head, prepared, None, request_id)
        gw.auth_failures.failed(client_ip)
        raise Refusal(401, str(exc) or "invalid bearer token") from None
    except AuthUnavailable:
        raise Refusal(503, "hub authentication is unavailable, retry later",
                      retry_after=5) from None
    try:
        await gw.authorizer.authorize(user, prepared.route.cluster)
    except NotAuthorized as exc:
        raise Refusal(403, str(exc)).of(user) from None
    except AuthUnavailable:
        raise Refusal(503, "hub authorization is unavailable, retry later",
                      retry_after=5).of(user) from None
    try:
        return _admitted(gw, head, prepared, user, request_id)
    except Refusal as exc:
        raise exc.of(user) from None


def cluster_unavailable(gw: AdmissionContext, cluster: str) -> Refusal:
    # `kubectl get --raw /version` through a context whose server is https://gw/<cluster>
    # drops the server's path: the request arrives as /version, "cluster" version.
    hint = (f"; paths are /<cluster>/{cluster}/..., and kubectl get --raw drops the server's "
            f"/<cluster> prefix: write it, e.g. --raw /<cluster>/{cluster}"
            if cluster in API_ROOTS and cluster not in gw.known_clusters else "")
    listed = gw.cluster_listed(cluster)
    # No inventory (None): clusters seen since start, and the start-up grace.
    known = listed if listed is not None else (
        cluster in gw.known_clusters or gw.in_startup_grace())
    if known:
        # No Retry-After with the hint: client-go would retry a mistake ten times first.
        return Refusal(503, f'cluster "{cluster}" is not connected{hint}',
                       retry_after=None if hint else 5)
    return Refusal(404, f'cluster "{cluster}" is not known to this gateway{hint}')


# First segments of Kubernetes API paths: as a "cluster" they mean the prefix was left out.
API_ROOTS = frozenset({"api", "apis", "version", "openapi", "healthz", "livez", "readyz",
                       "metrics", "logs"})


KUBE_API = KubeAPITarget()  # frozen and without fields: one for every request


def _admitted(gw: AdmissionContext, head: RequestHead, prepared: Prepared,
              user: UserInfo | None, request_id: str) -> Admitted:
    """Steps 8-10 once the hub has spoken; ``user`` None means token passthrough."""
    cluster_route = prepared.route
    cluster = cluster_route.cluster
    headers, block = prepared.headers, prepared.block
    if user is None:
        metadata = Identity(user="", groups=(), uid="", request_id=request_id,
                            passthrough=True).to_metadata()
        # The caller's own managed-cluster token, untouched (the hub said it is not a hub
        # token). A new list: the connection's HeaderVerdict shares the forwarded one.
        headers = [*headers, (b"Authorization", b"Bearer " + prepared.token.encode("ascii"))]
        block = None
    else:
        try:
            metadata = gw.identities.metadata(user, gw.config.identity_prefix, request_id)
        except IdentityError as exc:
            raise Refusal(403, f"the hub identity cannot be forwarded: {exc}") from None

    session = gw.registry.pick(cluster)
    if session is None:
        raise cluster_unavailable(gw, cluster)

    service = cluster_route.service
    target: Target = (
        KUBE_API if service is None
        else ServiceTarget(service.namespace, service.name, service.port, service.scheme)
    )
    # The forwarded head and the request's class are pure functions of these and of the
    # fields' block: a connection's next request that repeats them takes both as they were.
    line = (head.method, head.target, head.version, prepared.upgrade)
    verdict = prepared.verdict
    if (verdict is not None and block is not None and verdict.line == line
            and verdict.line_block is block):
        head_bytes, kind = verdict.line_head, verdict.line_kind
    else:
        try:
            head_bytes = forwarded_head(head, cluster_route.upstream_target, headers, block)
        except ValueError:
            raise Refusal(400, "request cannot be forwarded") from None
        kind = front_door_class(head.target, prepared.upgrade, head.method)
        if verdict is not None and block is not None:  # None: passthrough, its own token
            verdict.line, verdict.line_block = line, block
            verdict.line_head, verdict.line_kind = head_bytes, kind
    slot = None
    recheck = None
    flow = ""
    if kind == SHORT:
        if gw.seats is not None:
            flow = gw.stream_quota.identity(user.username if user else None, prepared.token)
    else:
        quota = gw.stream_quota
        try:
            slot = quota.acquire(quota.identity(user.username if user else None, prepared.token),
                                 cluster)
        except TooManyStreams as exc:
            raise Refusal(429, str(exc), retry_after=5) from None
        if user is not None and gw.config.revalidate_streams:
            path = cluster_route.upstream_target.partition(b"?")[0]
            recheck = Recheck(prepared.token, user, cluster,
                              exec_like=path.endswith((b"/exec", b"/attach")))
    return Admitted(cluster, session, target, metadata, head_bytes,
                    "" if user is None else user.username, prepared.upgrade, kind, slot, recheck,
                    flow, user_info=user, user_agent=prepared.user_agent)


def start_admission(gw: AdmissionContext, head: RequestHead, client_ip: str, request_id: str,
                    last: HeaderVerdict | None = None) -> Admitted | asyncio.Future[Admitted]:
    """Start one request's admission, as both front doors do.

    Returns the :class:`Admitted` request when nothing had to wait (the hub's answers cached, a
    seat free), else a future of it (hub calls, or a wait for a seat; cancel it when the client
    goes away: a waiting request then leaves its queue). The future fails with
    :class:`Refusal` (or, on a bug, anything else: the front door answers 500).

    Raises :class:`Refusal` when refused at once; then the request was not counted in
    ``gw.inflight``. Once this returns, it is counted, and the caller releases it.
    ``last``: the client connection's :class:`HeaderVerdict` (see :func:`prepare`).
    """
    if gw.draining:
        raise Refusal(503, "the gateway is shutting down, retry", retry_after=1)
    limits = gw.config.limits
    if gw.inflight >= limits.max_inflight:
        raise Refusal(429, "the gateway is overloaded, retry later", retry_after=1)
    started: Admitted | asyncio.Future[Admitted]
    try:
        prepared = prepare(head, client_ip, limits.max_request_body, last)
        admitted = admit_cached(gw, head, prepared, request_id)
        if admitted is None:
            started = asyncio.ensure_future(
                _admit_and_seat(gw, head, client_ip, request_id, prepared))
        else:
            seat = _take_seat(gw, admitted)
            started = admitted if seat is None else asyncio.ensure_future(
                _wait_for_seat(gw, admitted, seat))
    except Refusal:
        raise
    except Exception as exc:  # a bug must answer 500, as it does on the task path
        log.error("request %s: admission failed: %s", request_id, type(exc).__name__,
                  exc_info=exc)
        raise Refusal(500, "internal error in the gateway") from None
    gw.inflight += 1
    return started


async def _admit_and_seat(gw: AdmissionContext, head: RequestHead, client_ip: str,
                          request_id: str, prepared: Prepared) -> Admitted:
    admitted = await admit(gw, head, client_ip, request_id, prepared)
    seat = _take_seat(gw, admitted)
    return admitted if seat is None else await _wait_for_seat(gw, admitted, seat)


def _take_seat(gw: AdmissionContext, admitted: Admitted) -> asyncio.Future[Seat] | None:
    """Step 11: seat a short request now (None: nothing to wait for) or return the future of
    its seat; raises :class:`Refusal` (429) when its queue is full."""
    seats = gw.seats
    if seats is None or not admitted.flow:
        return None
    try:
        seat = seats.take(admitted.flow)
    except SeatRefused as exc:
        raise Refusal(429, str(exc), retry_after=exc.retry_after).of(admitted.user_info) \
            from None
    if isinstance(seat, Seat):
        admitted.seat = seat
        return None
    return seat


async def _wait_for_seat(gw: AdmissionContext, admitted: Admitted,
                         waiting: asyncio.Future[Seat]) -> Admitted:
    try:
        seat = await waiting
    except SeatRefused as exc:
        raise Refusal(429, str(exc), retry_after=exc.retry_after).of(admitted.user_info) \
            from None
    except asyncio.CancelledError:
        # Cancelled just after the seat was granted: give it back, or it leaks.
        if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
            waiting.result().release()
        raise
    admitted.seat = seat
    # The session picked before the wait may have gone meanwhile.
    session = gw.registry.pick(admitted.cluster)
    if session is None:
        seat.release()
        raise cluster_unavailable(gw, admitted.cluster).of(admitted.user_info)
    admitted.session = session
    return admitted
