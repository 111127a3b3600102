"""One HTTP/1.1 exchange carried by one tunnel stream, relayed to an upstream by the agent.

The stream brings the request head (0-RTT, in the OPEN), then the body exactly as the client
framed it, then EOF. The exchange:

1. checks the target (``route()``: the agent's allow-list, typed refusals) and waits for the
   complete head (bounded size and time);
2. rewrites the head: ``Host`` becomes the upstream's, every ``Authorization``,
   ``Proxy-Authorization``, ``Impersonate-*`` and ``X-Remote-*`` header and the WebSocket bearer
   subprotocol are dropped, then the route's credential and identity headers are appended
   (identity last) — the stream's bytes never decide who the request runs as. An exchange
   with an ``audit_id`` (the apiserver's) replaces any ``Audit-ID`` with it, and adds it to
   the identity as the request-id extra;
3. takes a keep-alive connection from the pool (dial failures become typed refusals:
   UNREACHABLE, TIMEOUT, OVERLOAD), accepts the stream, and relays the request body up to the
   end its framing declares (bytes past it are a protocol violation: reset, connection dropped).
   For a route that allows HTTP/2 (the apiserver) and a request that is not an upgrade, the
   "connection" is a stream of a shared HTTP/2 connection (``gateway.agent.h2pool``), which
   translates both ways, so everything below holds for both protocols;
4. relays the response byte for byte; at its end writes EOF on the stream and returns the
   connection to the pool only if request and response were both complete and keep-alive.
   A ``101`` turns both directions into raw bytes (never pooled) with half-close carried.

A reset stream (the client went away) aborts the upstream connection, which cancels the
request on the apiserver (watches and ``logs -f`` stop). Back-pressure is passed both ways:
stream ``pause_writing`` pauses reading the upstream socket; the upstream socket's
``pause_writing`` pauses reading the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gateway.agent.h2pool import H2Stream, StreamRefused
from gateway.agent.pool import (
    PoolExhausted,
    Upstream,
    UpstreamKey,
    UpstreamPool,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.wire.hpackfields import NamedField, encode_field, encode_fields
from gateway.wire.http1 import (
    BodyTracker,
    CloseDelimitedBody,
    Headers,
    HTTPError,
    Limits,
    RequestHead,
    ResponseHead,
    check_fields,
    check_value,
    find_head_end,
    framing_for_request,
    framing_for_response,
    parse_request_head,
    parse_response_head,
)
from gateway.wire.http2 import CONNECTION_SPECIFIC
from gateway.wire.identity import (
    AUDIT_ID,
    IDENTITY_NAME_STARTS,
    REQUEST_ID_HEADER,
    is_identity_header,
)
from gateway.wire.repeatedhead import RepeatedHead
from gateway.wire.status import error_response
from gateway.wire.websocket import BEARER_PROTOCOL_PREFIX
from tunnel.errors import OpenErrorCode, OpenRefused, ResetCode, StreamError

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 256 * 1024  # the gateway enforces a tighter limit; this is our own bound
MAX_RESPONSE_HEAD = 256 * 1024
# The gateway's rewritten head may carry a few more fields than the client sent.
HEAD_LIMITS = Limits(max_head_bytes=MAX_REQUEST_HEAD, max_request_line=64 * 1024,
                     max_field_line=64 * 1024, max_headers=512)
MAX_EARLY_BYTES = 256 * 1024  # bytes buffered before the upstream is ready / before a 101
HEAD_TIMEOUT = 30.0
UPGRADE_LINGER = 30.0  # after the upstream of an upgrade closed, wait this long for the peer

_CONNECTION_TOKENS = frozenset((b"upgrade", b"keep-alive", b"close"))
_HOST = frozenset((b"host",))
_HOST_AND_AUDIT_ID = frozenset((b"host", AUDIT_ID.lower()))
_AUDIT_ID_NAME = AUDIT_ID.lower()
_REQUEST_ID_NAME = REQUEST_ID_HEADER.lower()
_TE_TRAILERS = encode_field(b"te", b"trailers")
_AUDIT_ID_FIELD = NamedField(_AUDIT_ID_NAME)
_REQUEST_ID_FIELD = NamedField(_REQUEST_ID_NAME)


@dataclass(slots=True)
class Route:
    """Where an exchange goes and what the agent adds to it: the same for every request of
    one hub user to one upstream (the agent keeps it with the user's identity); what differs
    per request, the Audit-ID, is the exchange's (``HttpExchange.audit_id``)."""

    key: UpstreamKey
    ssl_context: Callable[[], ssl.SSLContext | None]
    authority: bytes  # Host header value sent upstream
    label: str  # for logs, e.g. "kube-apiserver" or "service ns/name:port"
    credential: Callable[[], bytes | None] = lambda: None  # Authorization value, or None
    identity_headers: Headers = field(default_factory=list)
    passthrough: bool = False  # keep the caller's own Authorization, add nothing
    # HTTP/2 upstream: "h1", "auto" (h2 if the server chooses it in ALPN) or "h2" (required),
    # with a context whose ALPN offers h2. Upgrades always use HTTP/1.1.
    protocol: str = "h1"
    h2_ssl_context: Callable[[], ssl.SSLContext] | None = None
    # The Host value is the same for every request of the route: checked by its first
    # rewrite_request, not by each (see there).
    authority_checked: bool = False
    # What rewrite_request_block sends for every request of the route, encoded and checked
    # once: :scheme and :authority, the identity headers, the credential (with its value: it
    # rotates). The agent's own fields and the verified identity's, nothing a client chose.
    h2_authority: bytes = b""
    h2_identity: bytes = b""
    h2_credential: tuple[bytes, bytes] | None = None


def rewrite_request_fields(head: RequestHead, route: Route,
                           audit_id: bytes = b"") -> tuple[Headers, list[bytes]]:
    """The header fields sent upstream (see module docstring, step 2), and their lower-cased
    names (those of the head's own fields come from its parse, not lowered again).

    ``audit_id``: the gateway's request id, sent as Audit-ID (replacing the stream's):
    kube-apiserver uses it as its audit event's ID and echoes it back as Audit-Id; with
    identity headers, also as the request-id extra (REQUEST_ID_HEADER). b"": leave Audit-ID
    alone."""
    headers, names, _ = _rewritten_fields(head, route, audit_id)
    return headers, names


def _rewritten_fields(head: RequestHead, route: Route,
                      audit_id: bytes) -> tuple[Headers, list[bytes], int]:
    """:func:`rewrite_request_fields`, and how many of the fields (Host first) the head
    provided: those after them are the ones the agent added."""
    replaced = _HOST_AND_AUDIT_ID if audit_id else _HOST
    headers: Headers = [(b"Host", route.authority)]
    names = [b"host"]
    # gateway.wire.identity says which headers bear an identity (incl. "_" aliases); the names
    # come lower-cased from the parse.
    for (name, value), lowered in zip(head.headers, head.names, strict=True):
        if lowered in replaced or is_identity_header(lowered):
            continue
        if lowered == b"connection":
            # Only the tokens HTTP/1.1 needs; a Connection header can never nominate (and so
            # ask a proxy to drop) the identity headers the agent adds.
            tokens = [t.strip() for t in value.split(b",")]
            allowed = [t for t in tokens if t.lower() in _CONNECTION_TOKENS]
            if allowed:
                headers.append((name, b", ".join(allowed)))
                names.append(lowered)
            continue
        if lowered == b"sec-websocket-protocol":
            kept_protocols = _kept_protocols(value)
            if kept_protocols:
                headers.append((name, kept_protocols))
                names.append(lowered)
            continue
        headers.append((name, value))
        names.append(lowered)
    kept = len(headers)
    if audit_id:
        headers.append((AUDIT_ID, audit_id))
    if route.passthrough:  # the caller's own Authorization (the loop dropped it)
        headers += [(n, v) for n, v in head.headers if n.lower() == b"authorization"][:1]
    else:
        credential = route.credential()
        if credential is not None:
            headers.append((b"Authorization", credential))
        identity = route.identity_headers
        if identity:  # identity last: the user's (cached across requests), then this request's
            headers += identity
            if audit_id:
                headers.append((REQUEST_ID_HEADER, audit_id))
    # What the loop did not name: Audit-ID, the credential and the identity, added above.
    names += [name.lower() for name, _ in headers[len(names):]]
    return headers, names, kept


def rewrite_request(head: RequestHead, route: Route, audit_id: bytes = b"") -> RequestHead:
    """The request sent upstream: the fields of :func:`rewrite_request_fields` with the method,
    target and framing of ``head``, every byte checked as its HTTP/1.1 serialisation checks
    them (ValueError), whichever protocol carries it: an HTTP/1.1 connection serialises it
    (``Upstream.send_head``), an HTTP/2 stream sends it as fields and never needs the bytes.

    ``head`` must come from :func:`gateway.wire.http1.parse_request_head`, which refused any
    method, target, name or value these checks would refuse: what the rewrite keeps of it (or
    narrows, the Connection and WebSocket protocol lists) is not checked again. What the agent
    adds is: the route's Host value once per route (it never changes), the Audit-ID, the
    credential (it rotates) and the identity every time."""
    fields, names, kept = _rewritten_fields(head, route, audit_id)
    if not route.authority_checked:
        check_fields(fields[:1])
        route.authority_checked = True
    check_fields(fields[kept:])
    return RequestHead(head.method, head.target, head.version, fields, names,
                       head.content_length, head.chunked, head.keep_alive, head.expect_continue,
                       head.connection & _CONNECTION_TOKENS, head.upgrade)


def rewrite_request_block(head: RequestHead, route: Route, audit_id: bytes = b"") -> bytes:
    """The HTTP/2 request of :func:`rewrite_request`'s head
    (``gateway.wire.h2upstream.request_fields`` of it), HPACK-encoded
    (``gateway.wire.hpackfields.encode_fields``) in one pass over ``head``'s fields: the same
    fields in the same order, the same checks of what the agent adds (ValueError). The
    route's own fields (:authority, the identity, the credential) are encoded and checked once
    per route; nothing of the head's fields is kept. Upgrades and CONNECT stay on HTTP/1.1
    (ValueError)."""
    if head.upgrade is not None or head.method == b"CONNECT":
        raise ValueError("upgrades and CONNECT stay on HTTP/1.1")
    if not route.h2_authority:
        check_fields([(b"Host", route.authority)])
        route.h2_authority = encode_fields([(b":scheme", b"https"),
                                            (b":authority", route.authority)])
    parts = [encode_field(b":method", head.method), route.h2_authority,
             encode_field(b":path", head.target)]
    replaced = _HOST_AND_AUDIT_ID if audit_id else _HOST
    # rewrite_request keeps only these Connection tokens, request_fields drops what they name.
    nominated = head.connection & _CONNECTION_TOKENS if head.connection else head.connection
    for (_, value), lowered in zip(head.headers, head.names, strict=True):
        if lowered in replaced or lowered in nominated or (
                lowered[:3] in IDENTITY_NAME_STARTS and is_identity_header(lowered)):
            continue
        if lowered in CONNECTION_SPECIFIC:  # Connection among them: its rewrite goes too
            if lowered == b"te" and value.strip().lower() == b"trailers":
                parts.append(_TE_TRAILERS)
            continue
        if lowered == b"sec-websocket-protocol":
            value = _kept_protocols(value)
            if not value:
                continue
        parts.append(encode_field(lowered, value))
    if audit_id:
        check_value(audit_id)
        parts.append(_AUDIT_ID_FIELD(audit_id))
    if route.passthrough:  # the caller's own Authorization (the loop dropped it)
        for (_, value), lowered in zip(head.headers, head.names, strict=True):
            if lowered == b"authorization":
                parts.append(encode_field(lowered, value))
                break
    else:
        credential = route.credential()
        if credential is not None:
            kept = route.h2_credential
            if kept is None or credential != kept[0]:
                check_value(credential)
                kept = route.h2_credential = (credential,
                                              encode_field(b"authorization", credential))
            parts.append(kept[1])
        identity = route.identity_headers
        if identity:  # identity last: the user's (kept with the route), then this request's
            if not route.h2_identity:
                check_fields(identity)
                route.h2_identity = encode_fields([(n.lower(), v) for n, v in identity])
            parts.append(route.h2_identity)
            if audit_id:
                parts.append(_REQUEST_ID_FIELD(audit_id))
    return b"".join(parts)


def _kept_protocols(value: bytes) -> bytes:
    """A Sec-WebSocket-Protocol value without the bearer-token subprotocols (b"": none left)."""
    protocols = [p.strip() for p in value.split(b",")]
    return b", ".join([p for p in protocols if p and not p.startswith(BEARER_PROTOCOL_PREFIX)])


RouteFactory = Callable[[], Awaitable[Route]]


class HttpExchange:
    """StreamProtocol (tunnel side) and UpstreamUser (pool side) of one exchange."""

    # states
    SETUP: ClassVar[str] = "setup"
    OPEN: ClassVar[str] = "open"
    UPGRADED: ClassVar[str] = "upgraded"
    DONE: ClassVar[str] = "done"

    # An idle watch keeps its exchange for hours: no per-instance __dict__.
    __slots__ = ("_closed", "_conn_reusable", "_conn_reused", "_discard_input", "_early",
                 "_early_size", "_head_buf", "_head_ready", "_heads", "_known_route", "_linger",
                 "_req_done", "_req_tracker", "_resp_buf", "_resp_done", "_resp_started",
                 "_resp_tracker", "_retryable", "_route_factory", "_stream_eof",
                 "_stream_pauses", "_task", "audit_id", "bytes_down", "bytes_up", "conn",
                 "head_timeout", "on_done", "outcome", "pool", "request",
                 "response", "response_at", "route", "started", "state", "status", "stream")

    def __init__(
        self,
        route: RouteFactory | None,
        pool: UpstreamPool,
        *,
        audit_id: bytes = b"",
        head_timeout: float = HEAD_TIMEOUT,
        on_done: Callable[[HttpExchange], None] | None = None,
        known_route: Route | None = None,
        heads: RepeatedHead | None = None,
    ) -> None:
        """``route``: how to find the route (None: it is ``known_route``). ``audit_id``: this
        request's Audit-ID (:func:`rewrite_request_fields`), the gateway's request id.
        ``heads``: the agent's last parsed head, so that a head with the same fields is read
        by its request line (:mod:`gateway.wire.repeatedhead`); None: every head in full."""
        assert route is not None or known_route is not None
        self._route_factory = route
        # A route known without any lookup (the apiserver) allows the synchronous fast path.
        self._known_route = known_route
        self.pool = pool
        self._heads = heads
        self.audit_id = audit_id
        self.head_timeout = head_timeout
        self.on_done = on_done
        self.stream: Any = None
        self.state = self.SETUP
        self.route: Route | None = None
        self.conn: Upstream | None = None
        self.request: RequestHead | None = None
        self.response: ResponseHead | None = None
        self.status = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.started = time.monotonic()
        self.response_at = 0.0  # when the upstream's (final) response head arrived
        self.outcome = ""
        self._head_buf = bytearray()
        # Made only when the setup task must wait for the head (or learn why there is none):
        # the head normally rides in the OPEN, and an idle watch should not keep a future.
        self._head_ready: asyncio.Future[None] | None = None
        self._early: list[bytes] = []  # request bytes waiting for the upstream (or a 101)
        self._early_size = 0
        self._retryable = False  # a body-less request, not answered yet: one retry allowed
        self._req_tracker: BodyTracker | None = None
        self._req_done = False
        self._stream_eof = False
        self._discard_input = False
        self._resp_buf = bytearray()
        self._resp_tracker: BodyTracker | None = None
        self._resp_started = False  # a response byte went to the stream
        self._resp_done = False
        self._conn_reusable = True
        self._conn_reused = False  # the connection came from the pool (may be stale)
        # Why the stream's reading is paused; a tuple, so an idle watch holds the shared ().
        self._stream_pauses: tuple[str, ...] = ()
        self._task: asyncio.Task[None] | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._closed = False

    # ------------------------------------------------------------------ StreamProtocol ----
    def connection_made(self, stream: Any) -> None:
        self.stream = stream
        # The head normally rides in the OPEN and arrives right after this call; the setup
        # task starts only if it cannot be finished synchronously by then (see _setup_now):
        # at once when the stream says the OPEN's bytes follow this call (the common case: no
        # loop turn, no callback), else on the next loop turn, when they would have come.
        if not getattr(stream, "open_data_follows", False):
            asyncio.get_running_loop().call_soon(self._start_setup_task)

    def _start_setup_task(self) -> None:
        if self._task is None and self.state == self.SETUP and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._setup())

    def data_received(self, data: bytes | memoryview) -> None:
        if self._discard_input or self.state == self.DONE:
            return
        if self.state == self.SETUP:
            if self.request is None:
                self._take_head_bytes(bytes(data))
            else:
                self._buffer_early(bytes(data))
            if self._task is None:
                self._start_setup_task()  # unless the request went upstream synchronously
            return
        if self.state == self.UPGRADED:
            self._to_upstream(data)
            return
        self._request_body(data)

    def eof_received(self) -> None:
        self._stream_eof = True
        if self.state == self.SETUP:
            if self.request is None:
                self._head_failed(HTTPError("stream ended before the request head"))
            if self._task is None:
                self._start_setup_task()
            return
        if self.state == self.UPGRADED:
            if self.conn is not None:
                self.conn.write_eof()
            return
        if self.state == self.OPEN and not self._req_done and not self._discard_input:
            self._fail("request body truncated by the gateway", ResetCode.PROTOCOL)

    def connection_lost(self, exc: StreamError | None) -> None:
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._head_ready is not None and not self._head_ready.done():
            self._head_ready.cancel()
        if self._linger is not None:
            self._linger.cancel()
        if self.conn is not None:
            # The client went away (reset) or the session died: abort the upstream request.
            self.pool.discard(self.conn)
            self.conn = None
            if not self.outcome:
                self.outcome = "cancelled" if exc is not None else "closed"
        self._finish()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.pause_reading()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.resume_reading()

    # ------------------------------------------------------------------ setup -------------
    def _take_head_bytes(self, data: bytes) -> None:
        # The head normally rides whole in the OPEN: then it is parsed as it came, no copy.
        start = len(self._head_buf)
        buffered: bytes | bytearray = data
        if start:
            self._head_buf += data
            buffered = self._head_buf
        try:
            end = find_head_end(buffered, start, max_head_bytes=MAX_REQUEST_HEAD)
            if end < 0:
                if not start:
                    self._head_buf += data
                return
            if start or end < len(data):
                head, rest = bytes(buffered[:end]), bytes(buffered[end:])
                self._head_buf = bytearray()
            else:
                head, rest = data, b""
            heads = self._heads
            self.request = (parse_request_head(head, HEAD_LIMITS) if heads is None
                            else heads.parse(head, HEAD_LIMITS))
            self._req_tracker = framing_for_request(self.request)
        except HTTPError as exc:
            self.request = None
            self._discard_input = True  # the setup task refuses the stream
            self._head_failed(exc)
            return
        if rest:
            self._buffer_early(rest)
        if self._head_ready is not None and not self._head_ready.done():
            self._head_ready.set_result(None)
        if self._task is None:
            self._setup_now()  # the common case: the request goes upstream now
        if self.state == self.SETUP:
            # Until the upstream is ready, hold whatever follows and stop the stream's flow.
            self._pause_stream("setup")

    def _head_failed(self, exc: Exception) -> None:
        """No usable head: the setup task (started soon, or waiting) raises ``exc``."""
        if self._head_ready is None:
            self._head_ready = asyncio.get_running_loop().create_future()
        if not self._head_ready.done():
            self._head_ready.set_exception(exc)

    def _setup_now(self) -> None:
        """The setup of :meth:`_setup` without a task, when the route is known and the pool has
        an idle connection (the common case for apiserver requests)."""
        route = self._known_route
        if route is None or self.request is None or self._closed or self.state != self.SETUP:
            return
        conn = self.pool.acquire_idle(route.key, self, self._protocol(route))
        if conn is None:
            return  # a dial is needed: the setup task does it
        try:
            rewritten = self._outgoing(conn, route)
        except Exception:
            # Never for a head that parsed and the agent's own valid fields: the setup task
            # meets the same problem and refuses the stream, typed.
            self.pool.discard(conn)
            return
        self.route = route
        self.conn = conn
        self._conn_reused = conn.requests > 0
        self.stream.accept()
        self._start_request(rewritten)

    def _buffer_early(self, data: bytes) -> None:
        self._early.append(data)
        self._early_size += len(data)
        # The stream window bounds this too; MAX_EARLY_BYTES is a second, local bound.
        if self._early_size > MAX_EARLY_BYTES:
            self._fail("too many bytes before the upstream answered", ResetCode.FLOW_CONTROL)

    async def _setup(self) -> None:
        try:
            factory = self._route_factory
            route = self._known_route if factory is None else await factory()
            assert route is not None  # (__init__: one of them is given)
            self.route = route
            async with asyncio.timeout(self.head_timeout):
                if self.request is None:
                    if self._head_ready is None:
                        self._head_ready = asyncio.get_running_loop().create_future()
                    await self._head_ready
            self._head_ready = None
            assert self.request is not None
            rewritten = rewrite_request(self.request, route, self.audit_id)
            conn = await self._acquire(route)
        except OpenRefused as exc:
            self._refuse(exc.code, exc.message)
            return
        except HTTPError as exc:
            self._refuse(OpenErrorCode.PROTOCOL, f"bad request head: {exc}")
            return
        except TimeoutError:
            self._refuse(OpenErrorCode.TIMEOUT, "no complete request head in time")
            return
        except PoolExhausted as exc:
            self._refuse(OpenErrorCode.OVERLOAD, str(exc))
            return
        except UpstreamTimeout as exc:
            self._refuse(OpenErrorCode.TIMEOUT, f"{self.route.label if self.route else ''}: {exc}")
            return
        except UpstreamUnreachable as exc:
            self._refuse(OpenErrorCode.UNREACHABLE,
                         f"{self.route.label if self.route else 'upstream'} unreachable: {exc}")
            return
        except Exception:  # a bug or an unloadable CA must still end the stream, typed
            log.exception("stream %s: setup failed", self._sid())
            self._refuse(OpenErrorCode.INTERNAL, "agent error")
            return
        if self._closed:
            self.pool.discard(conn)
            return
        self.conn = conn
        self._conn_reused = conn.requests > 0
        self.stream.accept()
        self._start_request(self._outgoing(conn, route, rewritten))

    def _outgoing(self, conn: Upstream, route: Route,
                  rewritten: RequestHead | None = None) -> RequestHead | bytes:
        """What goes upstream on ``conn``: for an HTTP/2 stream the request's fields encoded
        (:func:`rewrite_request_block`), else :func:`rewrite_request`'s head (``rewritten``,
        if made already). Raises ValueError (see there)."""
        assert self.request is not None
        if type(conn) is H2Stream:
            try:
                return rewrite_request_block(self.request, route, self.audit_id)
            except ValueError:
                if rewritten is None:
                    raise
                # (A CONNECT: the stream refuses the head and the client gets a 502, as ever.)
        return rewritten or rewrite_request(self.request, route, self.audit_id)

    def _protocol(self, route: Route) -> str:
        """HTTP/1.1 for upgrades (WebSocket, SPDY) and routes without HTTP/2; else the route's
        (``auto``: every request over HTTP/2 when the server offers it, as client-go does; a
        short request on a stream costs the agent no more CPU than on a pooled HTTP/1.1
        connection since it has its own HTTP/2 core, ``bench agentproto``)."""
        if route.h2_ssl_context is None or self.request is None or self.request.upgrade:
            return "h1"
        return route.protocol

    async def _acquire(self, route: Route, *, fresh: bool = False) -> Upstream:
        protocol = self._protocol(route)
        h2_context = route.h2_ssl_context() if route.h2_ssl_context and protocol != "h1" \
            else None
        return await self.pool.acquire(route.key, route.ssl_context(), self, fresh=fresh,
                                       protocol=protocol, h2_context=h2_context)

    def _refuse(self, code: OpenErrorCode, message: str) -> None:
        self.outcome = f"refused {code.name}"
        if not self._closed:
            log.info("stream %s refused %s: %s", self._sid(), code.name, message)
            self.stream.refuse(code, message)
        self.state = self.DONE

    def _start_request(self, outgoing: RequestHead | bytes, *, retry: bool = False) -> None:
        """Send the head (:meth:`_outgoing`'s), then the body bytes held so far."""
        conn = self.conn
        assert conn is not None and self.request is not None
        self.state = self.OPEN
        if retry:
            self._req_tracker = framing_for_request(self.request)
        assert self._req_tracker is not None
        self._req_done = self._req_tracker.complete
        # Body-less: can be retried on a fresh connection, once (a server that refuses the
        # retry too gets no third try: that would be a loop of new connections).
        self._retryable = self._req_done and not self.request.upgrade and not retry
        if type(outgoing) is bytes:
            assert type(conn) is H2Stream
            conn.send_request(self.request, outgoing,
                              at_once=self.stream.alone)
        else:
            assert isinstance(outgoing, RequestHead)
            conn.send_head(outgoing)
        early, self._early, self._early_size = self._early, [], 0
        for chunk in early:
            if self.state != self.OPEN:
                break
            self._request_body(chunk)
        if self.state == self.OPEN and self._stream_eof and not self._req_done:
            self._fail("request body truncated by the gateway", ResetCode.PROTOCOL)
            return
        if not retry:
            self._resume_stream("setup")

    def _request_body(self, data: bytes | memoryview) -> None:
        assert self._req_tracker is not None
        if self._req_done:
            if self.request is not None and self.request.upgrade and not self._resp_done:
                self._buffer_early(bytes(data))  # client spoke before the 101: hold it
                return
            self._fail("bytes after the end of the request body", ResetCode.PROTOCOL)
            return
        try:
            n = self._req_tracker.feed(data)
        except HTTPError as exc:
            self._fail(f"bad request body framing: {exc}", ResetCode.PROTOCOL)
            return
        self._to_upstream(data if n == len(data) else data[:n])
        if self._req_tracker.complete:
            self._req_done = True
            if n < len(data):
                self._fail("bytes after the end of the request body", ResetCode.PROTOCOL)

    def _to_upstream(self, data: bytes | memoryview) -> None:
        if self.conn is not None and data:
            self.bytes_up += len(data)
            self.conn.write(data)

    # ------------------------------------------------------------------ UpstreamUser ------
    def upstream_data(self, data: bytes | memoryview) -> None:
        if self.state == self.UPGRADED:
            self._to_stream(data)
            return
        if self.state != self.OPEN:
            return
        if self.response is None or self._resp_tracker is None:
            self._response_head(data)
            return
        self._response_body(data)

    def _response_head(self, data: bytes | memoryview) -> None:
        assert self.request is not None
        self._resp_buf += data
        while True:
            try:
                end = find_head_end(self._resp_buf, max_head_bytes=MAX_RESPONSE_HEAD)
                if end < 0:
                    return
                response = parse_response_head(bytes(self._resp_buf[:end]), HEAD_LIMITS)
            except HTTPError as exc:
                self._upstream_failed(f"bad response: {exc}")
                return
            if response.is_interim:
                # Interim response (100 Continue, 103): relay it and read the next head.
                self._to_stream(bytes(self._resp_buf[:end]))
                del self._resp_buf[:end]
                continue
            break
        buffered, self._resp_buf = bytes(self._resp_buf), bytearray()
        self._took_response(response)
        if response.is_switching:
            if not self.request.upgrade:
                self._upstream_failed("101 to a request that did not ask to upgrade")
                return
            self._upgrade(buffered)
            return
        try:
            self._resp_tracker = framing_for_response(response, self.request.method)
        except HTTPError as exc:
            self._upstream_failed(f"bad response: {exc}")
            return
        if not response.keep_alive or isinstance(self._resp_tracker, CloseDelimitedBody):
            self._conn_reusable = False
        self._to_stream(buffered[:end])
        if len(buffered) > end:
            self._response_body(memoryview(buffered)[end:])
        elif self._resp_tracker.complete:
            self._response_complete()

    def _took_response(self, response: ResponseHead) -> None:
        assert self.request is not None
        self.response = response
        self.response_at = time.monotonic()
        self.status = response.status
        # A watch or logs -f may stay open for hours: keep only the parsed flags of both heads.
        # The request was kept for one retry, which is only possible before this point.
        self._retryable = False
        self.request.headers, self.request.names = [], []
        response.headers, response.names = [], []

    # An HTTP/2 stream (gateway.agent.h2pool) checks the response head and frames it and the
    # body as HTTP/1.1 itself, and knows where the body ends (END_STREAM, or its length): what
    # it hands over goes to the tunnel stream as it is, nothing parsed again.
    def upstream_head(self, head_bytes: bytes, response: ResponseHead) -> None:
        """The final response head of an HTTP/2 stream, as HTTP/1.1 bytes and parsed (the
        bytes empty when they come with the first ``upstream_body``)."""
        if self.state == self.OPEN and self.response is None:
            self._took_response(response)
            self._to_stream(head_bytes)

    def upstream_body(self, data: bytes | memoryview) -> None:
        """Response body bytes of an HTTP/2 stream, framed for the tunnel stream."""
        if self.state == self.OPEN and self.response is not None:
            self._to_stream(data)

    def upstream_last(self, data: bytes | memoryview) -> None:
        """The last bytes of an HTTP/2 stream's response, framed (maybe none), and its end."""
        if self.state == self.OPEN and self.response is not None:
            self._to_stream(data)
            self._response_complete()

    def _response_body(self, data: bytes | memoryview) -> None:
        assert self._resp_tracker is not None
        try:
            n = self._resp_tracker.feed(data)
        except HTTPError as exc:
            self._upstream_failed(f"bad response body framing: {exc}")
            return
        self._to_stream(data if n == len(data) else data[:n])
        if self._resp_tracker.complete:
            if n < len(data):
                self._conn_reusable = False  # the server said more than one response
            self._response_complete()

    def _response_complete(self) -> None:
        self._resp_done = True
        self.outcome = self.outcome or "complete"
        # Settle the connection first: write_eof may end the stream (connection_lost) at once.
        conn, self.conn = self.conn, None
        if conn is not None:
            if self._req_done and self._conn_reusable and self.request is not None \
                    and not self.request.upgrade:
                self.pool.release(conn)
            else:
                self.pool.discard(conn)
        if not self._req_done:
            # The server answered before the body ended (e.g. 413): drop the rest of it.
            self._discard_input = True
        self.state = self.DONE
        self._early.clear()
        self._resume_stream("upstream-writing")
        self.stream.write_eof()

    def _upgrade(self, buffered: bytes) -> None:
        self.state = self.UPGRADED
        self._conn_reusable = False
        self.outcome = "upgraded"
        self._to_stream(buffered)
        early, self._early, self._early_size = self._early, [], 0
        for chunk in early:
            self._to_upstream(chunk)
        if self._stream_eof and self.conn is not None:
            self.conn.write_eof()

    def upstream_eof(self) -> None:
        if self.state == self.UPGRADED:
            self.stream.write_eof()
            return
        if self.state == self.OPEN and isinstance(self._resp_tracker, CloseDelimitedBody):
            self._resp_tracker.feed_eof()
            self._response_complete()

    def upstream_lost(self, exc: Exception | None) -> None:
        self.conn = None
        if self.state == self.UPGRADED:
            if not self._closed:
                with contextlib.suppress(Exception):
                    self.stream.write_eof()
                # The peer normally closes its side promptly; don't hold the stream forever.
                self._linger = asyncio.get_running_loop().call_later(
                    UPGRADE_LINGER, self._reset_stream, ResetCode.CANCEL
                )
            return
        if self.state == self.OPEN:
            if isinstance(exc, StreamRefused):
                self._upstream_failed(f"upstream did not take the request: {exc}", refused=True)
                return
            self._upstream_failed("upstream closed the connection before the response ended")

    def upstream_pause_writing(self) -> None:
        self._pause_stream("upstream-writing")

    def upstream_resume_writing(self) -> None:
        self._resume_stream("upstream-writing")

    # ------------------------------------------------------------------ failures ----------
    def _upstream_failed(self, reason: str, *, refused: bool = False) -> None:
        """``refused``: the upstream says it never processed the request (HTTP/2)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            self.pool.discard(conn)
        if self._closed or self.state == self.DONE:
            return
        if not self._resp_started:
            if (self._conn_reused or refused) and self._retryable \
                    and not self._resp_buf:
                # A pooled connection the server had just closed, or a request it did not
                # take: retry once, fresh.
                self._retry()
                return
            log.warning("stream %s: %s (%s)", self._sid(), reason, self.route.label
                        if self.route else "upstream")
            self.outcome = "upstream failed"
            head_only = self.request is not None and self.request.method == b"HEAD"
            if refused:  # nothing happened upstream: the client may simply send it again
                self._to_stream(error_response(
                    503, "the apiserver closed its connection before taking the request; "
                    "retry", close=True, retry_after=1, head_only=head_only))
            else:
                self._to_stream(error_response(
                    502, "the agent lost the connection to its upstream", close=True,
                    head_only=head_only))
            self.stream.write_eof()
            self.state = self.DONE
            self._discard_input = True
            self._resume_stream("setup")
            self._resume_stream("upstream-writing")
            return
        self._fail(reason, ResetCode.INTERNAL)

    def _retry(self) -> None:
        assert self.route is not None and self._retryable
        self._retryable = False
        self._resp_buf.clear()
        self.state = self.SETUP

        async def again() -> None:
            assert self.route is not None
            try:
                conn = await self._acquire(self.route, fresh=True)
            except Exception as exc:  # any dial failure ends as a 502
                self.state = self.OPEN
                self._upstream_failed(f"retry failed: {type(exc).__name__}")
                return
            if self._closed:
                self.pool.discard(conn)
                return
            self.conn = conn
            self._conn_reused = False
            try:
                outgoing = self._outgoing(conn, self.route)
            except ValueError as exc:  # it went out once: it cannot fail now
                self.state = self.OPEN
                self._upstream_failed(f"retry failed: {exc}")
                return
            self._start_request(outgoing, retry=True)

        self._task = asyncio.get_running_loop().create_task(again())

    def _fail(self, reason: str, code: ResetCode) -> None:
        log.warning("stream %s reset: %s", self._sid(), reason)
        self.outcome = f"reset: {reason}"
        conn, self.conn = self.conn, None
        if conn is not None:
            self.pool.discard(conn)
        if self.state == self.SETUP and self.request is not None and self._task is not None \
                and not self._task.done():
            self._task.cancel()
        self.state = self.DONE
        self._reset_stream(code)

    def _reset_stream(self, code: ResetCode) -> None:
        if not self._closed and self.stream is not None:
            self.stream.reset(code)

    # ------------------------------------------------------------------ helpers -----------
    def _to_stream(self, data: bytes | memoryview) -> None:
        if data and not self._closed:
            self._resp_started = True
            self.bytes_down += len(data)
            self.stream.write(data)

    def _pause_stream(self, reason: str) -> None:
        if not self._stream_pauses and self.stream is not None and not self._closed:
            self.stream.pause_reading()
        if reason not in self._stream_pauses:
            self._stream_pauses = (*self._stream_pauses, reason)

    def _resume_stream(self, reason: str) -> None:
        if reason in self._stream_pauses:
            pauses = self._stream_pauses
            self._stream_pauses = () if len(pauses) == 1 else tuple(
                r for r in pauses if r != reason)
            if not self._stream_pauses and self.stream is not None and not self._closed:
                self.stream.resume_reading()

    @property
    def request_id(self) -> str:
        """The gateway's request id ("" for a Service exchange), for logs."""
        return self.audit_id.decode("utf-8", "replace")

    def _sid(self) -> str:
        sid = getattr(self.stream, "stream_id", "?")
        return f"{sid}" + (f" req={self.request_id}" if self.request_id else "")

    def _finish(self) -> None:
        if self.state != self.DONE:
            self.state = self.DONE
        if self.on_done is not None:
            callback, self.on_done = self.on_done, None
            callback(self)

