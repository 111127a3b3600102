"""Forwarding one request through the tunnel: what crosses (``admit``) and the relay (``Exchange``).

:func:`admit` is the request path of DESIGN §2 in one visible order, each step a pure module:
route (``gateway.routing``) -> upgrade policy -> bearer (``gateway.bearer``) -> header hygiene
(``gateway.headers``) -> TokenReview (``gateway.auth``) -> hub authorization
(``gateway.authorize``) -> identity mapping (``gateway.identity``) -> pick the cluster's session.
Every refusal is a :class:`Refusal` carrying the status the front door answers with a Kubernetes
``Status``; messages never contain tokens or internal addresses.

Ordering on purpose: the token is checked before the cluster is looked up, so an anonymous
caller cannot enumerate which clusters are connected.

:class:`Exchange` is the :class:`tunnel.connection.StreamProtocol` of one request: it receives
the response from the agent, parses only its head (status for the audit line, ``101``
detection, framing to know whether the client connection can be reused) and relays every byte
verbatim to the client. The agent half-closes the stream at the end of the response. Upgrades
are spliced only after a real ``101``; any other answer to an upgrade request is relayed and
the client connection closed. Back-pressure runs both ways without buffering: the client's
transport pausing pauses the stream, the stream's send window pausing pauses the client.

Cluster lookup (404 vs 503): the registry only knows connected clusters, so the gateway
remembers every cluster that connected since it started. Not connected but seen before -> 503
(``Retry-After``); never seen -> 404, except during ``unknown_cluster_grace`` after start (agents
of a restarted gateway are still reconnecting), when it is 503 too.

``--token-passthrough``: when the hub *cleanly* rejects an ``Authorization: Bearer`` token (not
on hub errors, never for the WebSocket-subprotocol form), the request goes out with the caller's
own ``Authorization`` header and a passthrough identity (``Identity.passthrough``: no user, no
groups); the agent then adds neither identity nor its own credential. Hub authorization (SAR)
is skipped for such requests: there is no hub identity to ask about.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.auth import AuthUnavailable, Unauthenticated
from gateway.authorize import NotAuthorized
from gateway.bearer import BearerError, extract_token
from gateway.headers import HeaderRefused, rewrite_request_headers
from gateway.http1 import (
    NO_BODY,
    BodyTracker,
    Headers,
    HTTPError,
    Limits,
    RequestHead,
    ResponseHead,
    find_head_end,
    framing_for_response,
    parse_response_head,
    serialize_request_head,
)
from gateway.identity import Identity, IdentityError, map_identity
from gateway.routing import ClusterRoute, RouteError, route
from tunnel.errors import OpenErrorCode, OpenRefused, SessionClosed, StreamError
from tunnel.targets import KubeAPITarget, ServiceTarget, Target

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.frontdoor import FrontDoor

# Upgrades only for Kubernetes streaming endpoints and the protocols kubectl speaks.
ALLOWED_UPGRADES = frozenset({b"websocket", b"spdy/3.1"})
STREAMING_SUBRESOURCES = frozenset({b"exec", b"attach", b"portforward"})
RESPONSE_LIMITS = Limits(max_head_bytes=256 * 1024, max_request_line=64 * 1024,
                         max_field_line=64 * 1024, max_headers=512)

# OPEN refusals from the agent -> what the client sees (contracts.md).
OPEN_STATUS: dict[OpenErrorCode, tuple[int, str]] = {
    OpenErrorCode.DENIED: (403, "the cluster's agent refused the target"),
    OpenErrorCode.NO_IDENTITY: (403, "the cluster's agent refused a request without identity"),
    OpenErrorCode.UNREACHABLE: (502, "the cluster's agent could not reach the target"),
    OpenErrorCode.TIMEOUT: (504, "the cluster's agent timed out reaching the target"),
    OpenErrorCode.OVERLOAD: (429, "the cluster's agent is overloaded, retry later"),
    OpenErrorCode.SHUTTING_DOWN: (503, "the cluster's agent is shutting down, retry"),
    OpenErrorCode.PROTOCOL: (502, "the cluster's agent rejected the request"),
    OpenErrorCode.INTERNAL: (502, "the cluster's agent failed"),
}


class Refusal(Exception):
    """The gateway answers this request itself with a ``Status`` of ``status``."""

    def __init__(self, status: int, message: str, *, retry_after: int | None = None,
                 extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.extra_headers = extra_headers


@dataclass(slots=True)
class Admitted:
    """A request allowed through: where it goes and the exact bytes that start it."""

    cluster: str
    session: Any  # tunnel.connection.TunnelSession
    target: Target
    metadata: bytes
    head: bytes  # rewritten request head for the agent (initial_data of the OPEN)
    user: str  # hub user name for the audit line ("" with passthrough)
    upgrade: bool


def new_request_id() -> str:
    return os.urandom(8).hex()


def is_streaming_endpoint(cluster_route: ClusterRoute) -> bool:
    """exec/attach/portforward of a pod, or the service form (the Service speaks for itself)."""
    if cluster_route.service is not None:
        return True
    path = cluster_route.upstream_target.partition(b"?")[0]
    parts = path.split(b"/")
    # /api/v1/namespaces/<ns>/pods/<name>/<sub>
    return (
        len(parts) == 8
        and parts[1:4] == [b"api", b"v1", b"namespaces"]
        and parts[5] == b"pods"
        and parts[7] in STREAMING_SUBRESOURCES
    )


def check_upgrade(head: RequestHead, cluster_route: ClusterRoute) -> bool:
    """True for an acceptable upgrade request; Refusal for one we do not splice."""
    if head.upgrade is None:
        return False  # Upgrade without Connection: upgrade is not a request to upgrade
    protocol = head.upgrade.strip().lower()
    if protocol not in ALLOWED_UPGRADES:
        raise Refusal(400, "upgrade is allowed only to websocket or SPDY/3.1")
    if not is_streaming_endpoint(cluster_route):
        raise Refusal(400, "upgrade is allowed only for exec, attach, portforward and services")
    if head.chunked or head.content_length:
        raise Refusal(400, "an upgrade request cannot carry a body")
    return True


def cluster_unavailable(gw: Gateway, cluster: str) -> Refusal:
    if cluster in gw.known_clusters or gw.in_startup_grace():
        return Refusal(503, f'cluster "{cluster}" is not connected', retry_after=5)
    return Refusal(404, f'cluster "{cluster}" is not known to this gateway')


@dataclass(slots=True)
class Prepared:
    """What admission learns from the request alone, before asking the hub anything."""

    route: ClusterRoute
    upgrade: bool
    bearer: Any  # gateway.bearer.ExtractedBearer
    token: str
    headers: Headers


def prepare(head: RequestHead, client_ip: str) -> Prepared:
    """Route, upgrade check, bearer and header rules: pure; raises :class:`Refusal`."""
    try:
        cluster_route = route(head.target)
    except RouteError as exc:
        raise Refusal(exc.status, str(exc)) from None
    upgrade = check_upgrade(head, cluster_route)
    try:
        bearer = extract_token(head.headers)
    except BearerError as exc:
        raise Refusal(401, str(exc)) from None
    try:
        headers = rewrite_request_headers(
            bearer.headers, client_ip=client_ip, host=head.host or b"unknown"
        )
    except HeaderRefused as exc:
        raise Refusal(exc.status, str(exc)) from None
    if bearer.token is None:
        raise Refusal(401, "a bearer token is required")
    return Prepared(cluster_route, upgrade, bearer, bearer.token, headers)


def admit_cached(gw: Gateway, head: RequestHead, prepared: Prepared, request_id: str
                 ) -> Admitted | None:
    """Admission without awaiting, when the token's review and the user's authorization are both
    cached (the common case): saves a task and two loop turns per request. None means "not
    cached": run :func:`admit`. The decision is the same either way."""
    cached = getattr(gw.authenticator, "cached", None)
    allowed = getattr(gw.authorizer, "allowed_cached", None)
    if cached is None or allowed is None:
        return None
    user = cached(prepared.token)
    if user is None or not allowed(user, prepared.route.cluster):
        return None
    gw.metrics.auth_lookups += 1
    return _admitted(gw, head, prepared, user, False, request_id)


async def admit(gw: Gateway, head: RequestHead, client_ip: str, request_id: str,
                prepared: Prepared | None = None) -> Admitted:
    """Decide whether and how a request crosses; raises :class:`Refusal`."""
    if prepared is None:
        prepared = prepare(head, client_ip)
    bearer = prepared.bearer
    config = gw.config
    passthrough = False
    user: Any = None
    try:
        user = await gw.authenticate(prepared.token)
    except Unauthenticated as exc:
        # A token the hub accepted for another audience is still a hub token: it must never
        # leave the hub, so only a plain "not a valid token" answer passes through.
        # (gateway.auth has no typed reason; its audience message is the one to exclude.)
        if not (config.token_passthrough and bearer.source == "authorization"
                and "audience" not in str(exc)):
            raise Refusal(401, str(exc) or "invalid bearer token") from None
        passthrough = True
    except AuthUnavailable:
        raise Refusal(503, "hub authentication is unavailable, retry later",
                      retry_after=5) from None
    if not passthrough:
        try:
            await gw.authorizer.authorize(user, prepared.route.cluster)
        except NotAuthorized as exc:
            raise Refusal(403, str(exc)) from None
        except AuthUnavailable:
            raise Refusal(503, "hub authorization is unavailable, retry later",
                          retry_after=5) from None
    return _admitted(gw, head, prepared, user, passthrough, request_id)


def _admitted(gw: Gateway, head: RequestHead, prepared: Prepared, user: Any, passthrough: bool,
              request_id: str) -> Admitted:
    """The rest of admission once the hub has spoken (authenticated and authorized)."""
    config = gw.config
    cluster_route = prepared.route
    cluster = cluster_route.cluster
    headers = prepared.headers
    user_name = ""
    if passthrough:
        metadata = Identity(user="", groups=(), uid="", request_id=request_id,
                            passthrough=True).to_metadata()
        # The caller's own managed-cluster token, untouched (the hub said it is not a hub token).
        headers.append((b"Authorization", b"Bearer " + prepared.token.encode("ascii")))
    else:
        user_name = user.username
        try:
            metadata = gw.identities.metadata(user, config.identity_prefix, request_id)
        except IdentityError as exc:
            raise Refusal(403, f"the hub identity cannot be forwarded: {exc}") from None

    session = gw.registry.pick(cluster)
    if session is None:
        raise cluster_unavailable(gw, cluster)

    service = cluster_route.service
    target: Target = (
        KubeAPITarget() if service is None
        else ServiceTarget(service.namespace, service.name, service.port, service.scheme)
    )
    # The gateway answers Expect: 100-continue itself (see FrontDoor), so it does not travel.
    headers = [(n, v) for n, v in headers if n.lower() != b"expect"]
    try:
        head_bytes = serialize_request_head(
            head.method, cluster_route.upstream_target, headers, head.version
        )
    except ValueError:
        raise Refusal(400, "request cannot be forwarded") from None
    return Admitted(cluster, session, target, metadata, head_bytes, user_name,
                    prepared.upgrade)


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
        self._entries: dict[int, tuple[Any, bytes]] = {}

    def metadata(self, user: Any, prefix: str, request_id: str) -> bytes:
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


# Exchange states (response side).
_HEAD, _BODY, _RAW, _DONE = range(4)


class Exchange:
    """The stream side of one request (a ``StreamProtocol``). See the module docstring."""

    __slots__ = (
        "_copy_views",
        "_lost",
        "_resp_buf",
        "_state",
        "admitted",
        "bytes_in",
        "bytes_out",
        "door",
        "eof_sent",
        "head_sent",
        "method",
        "request_id",
        "response",
        "started",
        "status",
        "stream",
        "streaming",
        "tracker",
        "transport",
    )

    def __init__(self, door: FrontDoor, method: bytes, admitted: Admitted, request_id: str
                 ) -> None:
        self.door = door
        self.transport = door.transport
        # Non-TLS transports (uvloop TCP) may keep a reference to what they were given; the
        # tunnel forbids keeping its memoryviews. TLS transports encrypt during write().
        self._copy_views = door.transport.get_extra_info("sslcontext") is None
        self.method = method
        self.admitted = admitted
        self.request_id = request_id
        self.stream: Any = None
        self._lost = False  # the tunnel ended the stream (connection_lost)
        self._state = _HEAD
        self._resp_buf = bytearray()
        self.response: ResponseHead | None = None
        self.tracker: BodyTracker = NO_BODY
        self.head_sent = False  # any response byte reached the client
        self.eof_sent = False  # we half-closed the stream (request complete)
        self.status = 0
        self.streaming = False  # a watch, follow or upgrade: audited as stream_start/_end
        self.bytes_in = 0
        self.bytes_out = 0
        self.started = time.monotonic()

    # --- client -> stream ------------------------------------------------------------------

    def send(self, data: bytes | bytearray | memoryview) -> None:
        if self._state == _DONE:
            return
        self.bytes_in += len(data)
        self.stream.write(data)

    def send_eof(self) -> None:
        if not self.eof_sent and self._state != _DONE:
            self.eof_sent = True
            self.stream.write_eof()

    # --- StreamProtocol ----------------------------------------------------------------------

    def connection_made(self, stream: Any) -> None:
        self.stream = stream

    def data_received(self, data: bytes | memoryview) -> None:
        state = self._state
        if state == _RAW:
            self._to_client(data)
        elif state == _BODY:
            tracker = self.tracker
            try:
                n = tracker.feed(data)
            except HTTPError:  # broken chunked framing from upstream: never pass it on
                self._fail(502, "the cluster sent a malformed response body")
                return
            if n:
                self._to_client(data if n == len(data) else data[:n])
            if n < len(data):
                # Bytes after the end of the response: the agent broke the stream contract.
                self._fail(502, "the cluster sent more than one response")
        elif state == _HEAD:
            self._resp_buf += data
            self._parse_head()

    def eof_received(self) -> None:
        state = self._state
        if state == _RAW:
            self._finish(keep_alive=False)
        elif state == _BODY:
            try:
                self.tracker.feed_eof()
            except HTTPError:
                self._finish(keep_alive=False)  # truncated: the client must not reuse it
                return
            assert self.response is not None
            self._finish(keep_alive=self.response.keep_alive
                         and not self.response_was_close_delimited())
        elif state == _HEAD:
            self._fail(502, "the cluster closed the request without a response")

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._state == _DONE:
            return
        if exc is None:
            self.eof_received()
            if self._state != _DONE:
                self._finish(keep_alive=False)
            return
        if isinstance(exc, OpenRefused):
            status, message = OPEN_STATUS.get(exc.code, (502, "the cluster's agent failed"))
            if exc.code == OpenErrorCode.DENIED and self.admitted.target != KubeAPITarget():
                message = "the cluster's agent does not allow this Service"
            retry = 5 if status in (429, 503) else None
            self._fail(status, message, retry_after=retry)
        elif isinstance(exc, SessionClosed):
            self._fail(503, "the connection to the cluster was lost", retry_after=5)
        elif isinstance(exc, StreamError):
            self._fail(502, "the cluster reset the request")
        else:
            self._fail(502, "the cluster's agent failed")

    def pause_writing(self) -> None:
        self.door.pause_reading("stream")

    def resume_writing(self) -> None:
        self.door.resume_reading("stream")

    # --- response head ----------------------------------------------------------------------

    def response_was_close_delimited(self) -> bool:
        return self.response is not None and self.response.close_delimited

    def _parse_head(self) -> None:
        buf = self._resp_buf
        while self._state == _HEAD:
            try:
                end = find_head_end(buf, max_head_bytes=RESPONSE_LIMITS.max_head_bytes,
                                    max_request_line=RESPONSE_LIMITS.max_request_line)
                if end < 0:
                    return
                raw = bytes(buf[:end])
                head = parse_response_head(raw, RESPONSE_LIMITS)
            except HTTPError:
                self._fail(502, "the cluster sent a malformed response")
                return
            if head.is_interim:  # 100 Continue, 103 Early Hints: relay, the real head follows
                self.transport.write(raw)
                del buf[:end]
                continue
            self.response = head
            self.status = head.status
            upgrade = self.admitted.upgrade
            if head.is_switching:
                if not upgrade:
                    self._fail(502, "the cluster switched protocols without being asked")
                    return
                self._state = _RAW
            else:
                try:
                    self.tracker = framing_for_response(head, self.method)
                except HTTPError:
                    self._fail(502, "the cluster sent a malformed response")
                    return
                self._state = _BODY
            rest = bytes(buf[end:])
            buf.clear()
            self.head_sent = True
            self.door.response_started(self)
            if self.streaming:
                head.headers, head.names = [], []  # only its parsed flags are used from here
            self.bytes_out += len(raw)
            if self._state == _RAW:
                self.transport.write(raw)  # verbatim: the agent relays the apiserver's head
                self.door.upgraded(self)
                if rest:
                    self._to_client(rest)
                return
            try:
                taken = self.tracker.feed(rest) if rest else 0
            except HTTPError:
                self.transport.write(raw)
                self._fail(502, "the cluster sent a malformed response body")
                return
            # Head and the body bytes that came with it leave in one write (one TLS record
            # for a small response instead of two).
            self.bytes_out += taken
            self.transport.write(raw + rest[:taken] if taken else raw)
            if taken < len(rest):
                self._fail(502, "the cluster sent more than one response")
            # The agent's EOF ends the exchange.

    # --- helpers ---------------------------------------------------------------------------

    def _to_client(self, data: bytes | memoryview) -> None:
        self.bytes_out += len(data)
        if self._copy_views and isinstance(data, memoryview):
            data = bytes(data)
        self.transport.write(data)

    def _fail(self, status: int, message: str, *, retry_after: int | None = None) -> None:
        """End the exchange abnormally: a Status if nothing was sent yet, else close."""
        if self._state == _DONE:
            return
        self._state = _DONE
        self._reset_stream()
        self.status = self.status or status
        if self.head_sent:
            self.door.exchange_finished(self, keep_alive=False)
        else:
            self.status = status
            self.door.exchange_failed(self, status, message, retry_after)

    def _finish(self, *, keep_alive: bool) -> None:
        if self._state == _DONE:
            return
        self._state = _DONE
        if not self.eof_sent:  # request body not finished (or an upgrade): nothing more to send
            self._reset_stream()
            keep_alive = False
        self.door.exchange_finished(self, keep_alive=keep_alive)

    def _reset_stream(self) -> None:
        # Not is_closing(): that is already true once our direction is half-closed, and a
        # watch whose client left must still be cancelled.
        if self.stream is not None and not self._lost:
            self._lost = True
            self.stream.reset()

    def client_gone(self) -> None:
        """The client connection closed: cancel the upstream request."""
        if self._state != _DONE:
            self._state = _DONE
            self._reset_stream()

    def timed_out(self) -> None:
        if self._state == _HEAD:
            self._fail(504, "the cluster did not answer in time")

    @property
    def done(self) -> bool:
        return self._state == _DONE

