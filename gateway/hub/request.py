"""One request's way through the gateway, whatever protocol its client speaks (DESIGN §2).

Each front door reads requests its own way -- :mod:`gateway.hub.frontdoor` one after another
from an HTTP/1.1 connection, :mod:`gateway.hub.frontdoor_h2` one per HTTP/2 stream -- and hands
each head to a :class:`Request`, which takes it the rest of the way:

1. **admission** (:func:`gateway.hub.admission.chain.start_admission`): at once when the hub's
   answers are cached and a seat is free, else when its future completes (cancelled if the
   client leaves first; what it was granted is then given back). A refusal is answered with a
   ``Status``;
2. **the tunnel stream**: the rewritten head and whatever body the door already holds ride in
   the OPEN (0-RTT); a session that cannot take it is a ``503``. A request that arrived whole is
   kept for one replay on another session (:attr:`gateway.hub.exchange.Exchange.replay`);
3. **the response**, relayed by :class:`gateway.hub.exchange.Exchange`, whose client this is. A
   short request's head is awaited for at most ``response_header_timeout`` (504 after); a watch,
   ``logs -f`` or upgrade (``Admitted.kind``, :mod:`gateway.wire.requestclass`) is not, is
   audited as a stream from its head on, drops what only admission needed (it may stay open for
   hours) and, when the gateway is draining, ends at its first chunk boundary;
4. **the end**, however it comes -- the response finished, the gateway answered, the client
   left (:meth:`Request.abandon`): the in-flight slot, stream slot or seat is released exactly
   once, the tunnel stream closed in the metrics once, one audit line written.

What is the door's own stays with the door (:class:`Door`): reading the head and the
body, writing a response in its protocol, flow control, its timers, and whether its connection
lives on after a request. The request's client is the connection's (its peer, or what a
trusted balancer's PROXY header said), or behind a trusted TLS-terminating proxy its
``X-Forwarded-For`` (:mod:`gateway.hub.admission.forwarded`): what admission, the
failed-authentication limit and the audit trail see.

The phases of a request (:class:`Phase`) and the moves between them are one table,
:data:`TRANSITIONS`; only this module moves a request, and a move the table does not list is a
bug (:class:`LifecycleError`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from mypy_extensions import mypyc_attr

from gateway.hub.admission.auth import UserInfo
from gateway.hub.admission.chain import (
    AdmissionContext,
    Admitted,
    HeaderVerdict,
    Refusal,
    new_request_id,
    start_admission,
)
from gateway.hub.admission.forwarded import client_address, source_ips
from gateway.hub.audittrail import AuditTrail
from gateway.hub.exchange import SHUTTING_DOWN, Exchange
from gateway.ops.audit import LineMemo
from gateway.ops.metrics import OTHER_CLUSTER, GatewayMetrics
from gateway.wire.http1 import HTTPError, RequestHead
from gateway.wire.identity import AUDIT_ID
from gateway.wire.requestclass import SHORT, front_door_class
from tunnel.connection import StreamOpener

log = logging.getLogger("hubproxy.gateway")

WWW_AUTHENTICATE = (b"WWW-Authenticate", b'Bearer realm="hubproxy"')


class Phase(enum.Enum):
    ADMITTING = "admitting"  # head read, admission under way; body bytes wait at the door
    BODY = "body"  # tunnel stream open; the request body is relayed as it comes
    WAITING = "waiting"  # the whole request sent; its response pending or streaming
    UPGRADE = "upgrade"  # an upgrade request sent; waiting for the 101
    RAW = "raw"  # after the 101: raw bytes both ways
    DONE = "done"  # finished, answered by the gateway, or abandoned by the client

    # Members are singletons compared by identity: hash them as objects do, in C. Enum's own
    # __hash__ is Python code, and every move looks a phase up twice (TRANSITIONS and its set).
    __hash__ = object.__hash__


ADMITTING, BODY, WAITING = Phase.ADMITTING, Phase.BODY, Phase.WAITING
UPGRADE, RAW, DONE = Phase.UPGRADE, Phase.RAW, Phase.DONE

# Every move a request can make. A response may end a request in any phase (an early answer
# while the body still flows, a refusal, a client that leaves).
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    ADMITTING: frozenset({BODY, UPGRADE, DONE}),
    BODY: frozenset({WAITING, DONE}),
    WAITING: frozenset({DONE}),
    UPGRADE: frozenset({RAW, DONE}),
    RAW: frozenset({DONE}),
    DONE: frozenset(),
}


@mypyc_attr(native_class=False)
class LifecycleError(RuntimeError):
    """A move :data:`TRANSITIONS` does not allow: a bug in the gateway."""


class FrontDoorHost(AdmissionContext, Protocol):
    """What a request and its front door need from the gateway process
    (``gateway.hub.app.Gateway``)."""

    connections: set[Any]  # the open FrontDoorConnection objects
    draining: bool
    inflight: int
    known_clusters: set[str]  # clusters that get their own metric series (else OTHER_CLUSTER)
    audit_trail: AuditTrail

    @property
    def leaving(self) -> bool:
        """Shutdown has begun, though requests may still be served for a while."""

    @property
    def metrics(self) -> GatewayMetrics: ...

    def request_released(self) -> None:
        """The last request in flight was released (``inflight`` is 0): a shutdown may be
        waiting for it."""


class Door(Protocol):
    """What a :class:`Request` needs from the front door it came through: an HTTP/1.1
    connection, or one stream of an HTTP/2 connection."""

    protocol: str  # "h1" or "h2", for the audit line and the metrics
    # False: the door writes the response head as the bytes it came in (HTTP/1.1), so the
    # exchange only needs its framing (gateway.hub.relayhead); True: it needs the fields.
    reads_response_fields: bool
    # True: a response that arrives whole is relayed without a head object
    # (Exchange._relay_whole): HTTP/1.1 writes its bytes as they came, HTTP/2 takes its status
    # (ResponseTranslator.expect_whole). False: the door reads the head the exchange parsed.
    relays_whole: bool
    # The client's transport may keep a reference to what it is given (not TLS): the exchange
    # copies the tunnel's memoryviews before writing them (see Exchange).
    keeps_views: bool

    @property
    def client_ip(self) -> str:
        """The connection's client: its peer, or what a trusted balancer's PROXY header said."""

    @property
    def peer_ip(self) -> str:
        """The connection's own peer."""

    @property
    def header_verdict(self) -> HeaderVerdict:
        """What admission decided about the connection's last header list (one per client
        connection: its requests repeat their headers)."""

    @property
    def audit_memo(self) -> LineMemo | None:
        """The client connection's :class:`gateway.ops.audit.LineMemo` (its requests' audit
        lines repeat most of their fields); None: nothing to keep."""

    @property
    def closed(self) -> bool:
        """The client connection is gone: nothing can be written any more."""

    @property
    def transport(self) -> Any:
        """Where the Exchange writes the response (HTTP/1.1 bytes, as the agent relays them)."""

    def pause_reading(self, reason: str) -> None: ...

    def resume_reading(self, reason: str) -> None: ...

    def arm(self, delay: float, callback: Callable[[], None]) -> None:
        """Replace the request's timer with ``callback`` after ``delay`` (none if <= 0)."""

    def body_so_far(self, admitted: Admitted) -> tuple[bytes, bytes | None]:
        """The body bytes that arrived during admission, framed as the tunnel stream carries
        them (they ride in the OPEN), and, when the whole request has arrived, the rest of it
        for a replay (b"" if nothing; None while more may come). Raises HTTPError for a body
        that breaks its framing."""

    def opened(self, request: Request) -> None:
        """The tunnel stream is open (phase BODY or UPGRADE): relay the body, or wait."""

    def response_started(self, request: Request, exchange: Exchange) -> bool:
        """The response head arrived; True: the connection closes after this response."""

    def upgraded(self, request: Request) -> None:
        """A 101 arrived: client bytes may flow to the exchange."""

    def finished(self, request: Request, phase: Phase, keep_alive: bool) -> None:
        """The exchange ended in ``phase`` (already recorded and released)."""

    def answer(self, request: Request, phase: Phase, status: int, message: str, *,
               retry_after: int | None, extra_headers: tuple[tuple[bytes, bytes], ...],
               close: bool) -> int:
        """Write a ``Status`` response for the request, which was in ``phase``; carry on (or
        close the connection, always if ``close``); the bytes written."""


class _Gone:
    """The door of a request that is over (see :meth:`Request._let_go`): closed, and a late
    pause or resume from the tunnel (a window that opens after the response ended) does
    nothing. Nothing else may be asked of it: that would be a bug."""

    protocol = ""
    client_ip = ""
    peer_ip = ""
    audit_memo = None  # shared by every request that is over: never a memo
    closed = True
    reads_response_fields = True
    keeps_views = True
    relays_whole = False
    transport = None
    header_verdict = HeaderVerdict()  # never used: a request that is over admits nothing

    def pause_reading(self, reason: str) -> None:
        pass

    def resume_reading(self, reason: str) -> None:
        pass

    def arm(self, delay: float, callback: Callable[[], None]) -> None:
        pass

    def body_so_far(self, admitted: Admitted) -> tuple[bytes, bytes | None]:
        raise LifecycleError("a request that is over has no body to send")

    def opened(self, request: Request) -> None:
        raise LifecycleError("a request that is over opened a stream")

    def response_started(self, request: Request, exchange: Exchange) -> bool:
        raise LifecycleError("a request that is over got a response")

    def upgraded(self, request: Request) -> None:
        raise LifecycleError("a request that is over was upgraded")

    def finished(self, request: Request, phase: Phase, keep_alive: bool) -> None:
        raise LifecycleError("a request that is over finished again")

    def answer(self, request: Request, phase: Phase, status: int, message: str, *,
               retry_after: int | None, extra_headers: tuple[tuple[bytes, bytes], ...],
               close: bool) -> int:
        raise LifecycleError("a request that is over was answered again")


GONE: Door = _Gone()


class FrontDoorConnection(Protocol):
    """A client connection of either front door, as the gateway process sees it."""

    protocol: str
    transport: Any

    @property
    def idle(self) -> bool: ...

    @property
    def open_requests(self) -> int: ...

    def exchanges(self) -> Iterator[Exchange]:
        """The exchange of each request in progress on this connection."""

    def start_drain(self) -> None:
        """The gateway is shutting down: take no new request; close once idle."""

    def close(self) -> None: ...


class Request:
    """One request from its head to its end; see the module docstring. It is the
    :class:`gateway.hub.exchange.ClientConnection` of its exchange.

    Slotted and lean: an idle watch keeps one of these for hours."""

    __slots__ = (
        "_counted",
        "_task",
        "admitted",
        "client",
        "door",
        "exchange",
        "gw",
        "head",
        "phase",
        "request_id",
        "started",
    )

    def __init__(self, gw: FrontDoorHost, door: Door) -> None:
        self.gw = gw
        self.door = door
        # The request's client: the connection's, or the X-Forwarded-For of a trusted proxy
        # (gateway.hub.admission.forwarded), known once the head is.
        self.client = door.client_ip
        self.request_id = new_request_id()
        self.started = time.monotonic()
        self.phase = ADMITTING
        self.head: RequestHead | None = None
        self.admitted: Admitted | None = None
        self.exchange: Exchange | None = None
        self._task: asyncio.Future[Admitted] | None = None
        self._counted = False  # holds one of the gateway's in-flight slots

    def _to(self, phase: Phase) -> None:
        if phase not in TRANSITIONS[self.phase]:
            raise LifecycleError(f"request {self.request_id}: {self.phase.value} -> "
                                 f"{phase.value}")
        self.phase = phase

    @property
    def long_running(self) -> bool:
        admitted = self.admitted
        return admitted is not None and admitted.kind != SHORT

    # --- admission -----------------------------------------------------------------------------

    def start(self, head: RequestHead) -> None:
        """Admit the request whose head the door has read."""
        self.head = head
        self.client = client_address(self.door.client_ip, head, self.gw.config.forwarded_for_from)
        try:
            started = start_admission(self.gw, head, self.client, self.request_id,
                                      self.door.header_verdict)
        except Refusal as exc:
            self.refuse(exc.status, exc.message, retry_after=exc.retry_after,
                        extra_headers=exc.extra_headers, user_info=exc.user_info)
            return
        self._counted = True
        if isinstance(started, Admitted):
            self._open(started)
            return
        self._task = started
        started.add_done_callback(self._admitted)

    def _admitted(self, task: asyncio.Future[Admitted]) -> None:
        self._task = None
        if task.cancelled():
            return
        exc = task.exception()
        if self.phase is not ADMITTING or self.door.closed:
            if exc is None:
                task.result().release()  # admitted, but the client left
            return
        if isinstance(exc, Refusal):
            self.refuse(exc.status, exc.message, retry_after=exc.retry_after,
                        extra_headers=exc.extra_headers, user_info=exc.user_info)
        elif exc is not None:
            log.error("request %s: admission failed: %s", self.request_id, type(exc).__name__,
                      exc_info=exc)
            self.refuse(500, "internal error in the gateway")
        else:
            self._open(task.result())

    def _open(self, admitted: Admitted) -> None:
        """Open the tunnel stream; its OPEN carries the head and the body so far."""
        head = self.head
        assert head is not None
        self.admitted = admitted
        try:
            early, rest = self.door.body_so_far(admitted)
        except HTTPError as exc:
            admitted.release()
            self.refuse(exc.status, str(exc), close=True)
            return
        door = self.door
        exchange = Exchange(self, head.method, admitted, self.request_id,
                            fields=door.reads_response_fields, keeps_views=door.keeps_views,
                            whole=door.relays_whole)
        self.exchange = exchange
        initial = admitted.head + early if early else admitted.head
        exchange.bytes_in = len(early)
        if rest is not None and not admitted.upgrade:
            exchange.replay = initial + rest  # all of the request rides in the OPEN
        metrics = self.gw.metrics
        metrics.stream_opened()
        # A request complete in the OPEN carries its FIN there: the agent learns it has the
        # whole request from one frame, and this side makes one write, not two (nor asks the
        # stream for an end it already has when the door says the body is sent).
        fin = exchange.eof_sent = rest == b"" and not admitted.upgrade
        try:
            admitted.session.open_stream(admitted.target, admitted.metadata, exchange,
                                         initial_data=initial, fin=fin)
        except Exception as exc:  # session closing or at its stream limit
            log.info("request %s: cannot open a stream to %s: %s", self.request_id,
                     admitted.cluster, type(exc).__name__)
            metrics.stream_closed()
            self.exchange = None
            exchange.client_gone()  # never opened; gives back its stream slot or seat
            self.refuse(503, f'cluster "{admitted.cluster}" cannot take requests now, retry',
                        retry_after=1)
            return
        if exchange.done or self.phase is DONE:  # refused synchronously
            return
        self._to(UPGRADE if admitted.upgrade else BODY)
        self.door.opened(self)

    # --- the request body (called by the door) -------------------------------------------------

    def body_sent(self) -> None:
        """The door has sent all of the request body: wait for the response, a short request
        for at most ``response_header_timeout``."""
        exchange = self.exchange
        assert exchange is not None
        exchange.send_eof()
        if exchange.done:
            return
        self._to(WAITING)
        short = not exchange.head_sent and exchange.admitted.kind == SHORT
        self.door.arm(self.gw.config.limits.response_header_timeout if short else 0,
                      exchange.timed_out)

    def fail_body(self, status: int, message: str) -> bool:
        """The request body broke (bad framing, too large, stalled): cancel the upstream
        request and answer ``status``. False when a response has started already: then only
        the door can end it (close the connection, reset the stream)."""
        exchange = self.exchange
        if exchange is not None:
            if exchange.head_sent:
                return False
            self.exchange = None
            exchange.client_gone()
            self.gw.metrics.stream_closed()
        elif self._task is not None:
            self._task.cancel()
            self._task = None
        self.refuse(status, message, close=True)
        return True

    # --- the Exchange's client connection -----------------------------------------------------

    @property
    def transport(self) -> Any:
        return self.door.transport

    def pause_reading(self, reason: str) -> None:
        self.door.pause_reading(reason)

    def resume_reading(self, reason: str) -> None:
        self.door.resume_reading(reason)

    def response_started(self, exchange: Exchange) -> bool:
        closing = self.door.response_started(self, exchange)
        admitted = exchange.admitted
        if admitted.kind != SHORT and not admitted.upgrade:  # a watch or logs -f
            self._stream_started(exchange)
            if self.gw.draining:  # started while the gateway shuts down: end it at once
                exchange.end_once_started(SHUTTING_DOWN)
        return closing

    def upgraded(self, exchange: Exchange) -> None:
        """A real 101: from here raw bytes both ways."""
        self._to(RAW)
        self._stream_started(exchange)
        self.door.upgraded(self)

    def _stream_started(self, exchange: Exchange) -> None:
        """A watch, ``logs -f`` or upgrade may stay open for hours: audit its start, and drop
        what only admission and the response head needed (header lists, the forwarded head,
        the identity metadata, the connection's header verdict). Method, target and the parsed
        flags stay for the audit line at its end."""
        exchange.streaming = True
        head = self.head
        if head is not None:
            self.gw.audit_trail.stream_start(
                request_id=self.request_id, head=head, admitted=exchange.admitted,
                status=exchange.status, protocol=self.door.protocol,
                source_ips=self.source_ips, started=self.started)
            head.headers, head.names = [], []
        self.door.header_verdict.forget()  # its connection may now stay open for hours
        exchange.admitted.head = exchange.admitted.metadata = b""

    def exchange_finished(self, exchange: Exchange, *, keep_alive: bool) -> None:
        """The response ended (or broke after its head was sent)."""
        if self.exchange is not exchange:
            return
        self.exchange = None
        self.gw.metrics.stream_closed()
        phase = self.phase
        self._to(DONE)
        self._record(exchange.status, exchange.bytes_in, exchange.bytes_out, exchange.streaming)
        self._release()
        self.door.finished(self, phase, keep_alive)
        self._let_go()

    def exchange_failed(self, exchange: Exchange, status: int, message: str,
                        retry_after: int | None) -> None:
        """No response byte was sent: answer with a Status instead."""
        if self.exchange is not exchange:
            return
        self.exchange = None
        self.gw.metrics.stream_closed()
        self.refuse(status, message, retry_after=retry_after)

    def another_session(self, cluster: str) -> StreamOpener | None:
        return self.gw.registry.pick(cluster)

    # --- the end --------------------------------------------------------------------------------

    def refuse(self, status: int, message: str, *, retry_after: int | None = None,
               extra_headers: tuple[tuple[bytes, bytes], ...] = (), close: bool = False,
               user_info: UserInfo | None = None) -> None:
        """Answer the request with a ``Status`` (``close``: and close the connection);
        ``user_info``: the hub user, when admission refused it after authentication."""
        if self.phase is DONE or self.door.closed:
            self._release()
            self._let_go()
            return
        phase = self.phase
        self._to(DONE)
        # Status messages are fixed wording (never a token): safe to say why at debug.
        log.debug("request %s answered by the gateway: %d %s", self.request_id, status, message)
        # Its id, which the agent sends the managed apiserver as Audit-ID for the requests it
        # forwards: the client can name any request of its, answered there or here.
        extra_headers = (*extra_headers, (AUDIT_ID, self.request_id.encode("ascii")))
        if status == 401:
            extra_headers = (*extra_headers, WWW_AUTHENTICATE)
        sent = self.door.answer(self, phase, status, message, retry_after=retry_after,
                                extra_headers=extra_headers, close=close)
        self._record(status, 0, sent, False, message, user_info)
        self._release()
        self._let_go()

    def abandon(self) -> None:
        """The client left or broke the request: stop admission, cancel the upstream request,
        account for what was relayed. Idempotent."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        exchange = self.exchange
        if exchange is not None:
            self.exchange = None
            exchange.client_gone()
            self.gw.metrics.stream_closed()
            self._record(exchange.status or 499, exchange.bytes_in, exchange.bytes_out,
                         exchange.streaming)
        if self.phase is not DONE:
            self._to(DONE)
        self._release()
        self._let_go()

    def _record(self, status: int, bytes_in: int, bytes_out: int, stream: bool = False,
                message: str | None = None, user_info: UserInfo | None = None) -> None:
        """The request ended, however (its door not let go yet): its metrics and its audit
        trail, in one pass, here where what they read is (the request's end makes no trip
        through the gateway object and back). ``stream``: audited as a stream's end;
        ``message``: the Status the gateway answered with, if it did; ``user_info``: the hub
        user of a request refused after authentication."""
        head, admitted, started, gw = self.head, self.admitted, self.started, self.gw
        duration = time.monotonic() - started
        if admitted is not None:
            kind = admitted.kind
            cluster = admitted.cluster
            label = cluster if cluster in gw.known_clusters else OTHER_CLUSTER
        else:
            # Refused before admission said (kind: for the latency histograms).
            kind = SHORT if head is None else front_door_class(head.target, method=head.method)
            label = OTHER_CLUSTER
        metrics = gw.metrics
        metrics.request(label, status, bytes_in, bytes_out, duration, kind)
        door = self.door
        protocol = door.protocol
        if protocol == "h2":
            metrics.requests_h2 += 1
        else:
            metrics.requests_h1 += 1
        gw.audit_trail.request_done(
            self.request_id, head, admitted, status, bytes_in, bytes_out, duration, stream,
            protocol, self.source_ips, message, started, user_info,
            # Only an admitted request's line is kept: a refused one's path may hold a token.
            door.audit_memo if admitted is not None else None)

    def _let_go(self) -> None:
        """The request is over and its door is done with it: drop the reference to its door.
        An HTTP/2 stream and its request refer to each other, and that cycle would leave
        both (and what they hold) to the cyclic collector instead of freeing them at once."""
        self.door = GONE

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            gw = self.gw
            gw.inflight -= 1
            if gw.inflight <= 0:
                gw.request_released()

    @property
    def source_ips(self) -> tuple[str, ...]:
        """The request's client, then the proxies it came through."""
        door = self.door
        return source_ips(self.client, door.client_ip, door.peer_ip)
