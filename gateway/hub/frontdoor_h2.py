"""The front door over HTTP/2: one asyncio Protocol per client connection that chose ``h2``.

:class:`gateway.hub.frontdoor.FrontDoor` hands a connection over here when TLS negotiated
ALPN ``h2``. Framing, HPACK and flow-control bookkeeping are
:class:`gateway.wire.h2server.ServerConnection`'s (sans-IO; why not the ``h2`` library: see
there); this module wires it to the requests' lifecycle:

* Each HTTP/2 stream (:class:`H2Stream`) is one :class:`gateway.hub.request.Request`, the same
  lifecycle as an HTTP/1.1 request: its HEADERS become a :class:`gateway.wire.http1.RequestHead`
  (:func:`gateway.wire.http2.request_head_from_h2`), admitted, it opens one tunnel stream
  carrying HTTP/1.1 bytes (the agent is unchanged), relayed by the same
  :class:`gateway.hub.exchange.Exchange`. The stream is the Exchange's transport and turns the
  HTTP/1.1 response back into HEADERS and DATA
  (:class:`gateway.wire.http2.ResponseTranslator`). Refusals are ``Status`` responses on the
  stream; the connection and its other streams carry on.
* Flow control follows the tunnel: request DATA is acknowledged (WINDOW_UPDATE for the stream)
  only once the tunnel stream took it without pausing, so a client never has more than one
  stream window (64 KiB) of a request in the gateway. The connection window is the stream
  window times the stream limit, so streams whose tunnel is slow can never use it up and stall
  the others. Response bytes are sent as the client's windows allow; what does not fit pauses
  that tunnel stream alone (the tunnel then holds back the agent's credit).
* Bounds (DESIGN §6 rule 7, the known HTTP/2 attacks), enforced by the connection frame by
  frame (see :mod:`gateway.wire.h2server`): ``SETTINGS_MAX_CONCURRENT_STREAMS``
  (``max_streams``; a stream past it is refused alone), ``SETTINGS_MAX_HEADER_LIST_SIZE``
  and the decoder's limit equal to the HTTP/1.1 head limit (HPACK bombs), 64 CONTINUATION
  frames per header block (CVE-2024-27316), a budget of stream resets (rapid reset,
  CVE-2023-44487), a budget of frames that cost us an answer (PING, SETTINGS) and one of
  frames that only cost parsing (WINDOW_UPDATE, PRIORITY, unknown types): past a budget the
  connection ends with GOAWAY ENHANCE_YOUR_CALM. A client that does not read
  cannot grow our write buffer past ``4 x write_high_water`` (then it is aborted). A body that
  does not match its ``Content-Length`` (DATA past it, END_STREAM short of it, or none at all)
  is reset (PROTOCOL_ERROR) by the connection before the offending bytes are handed on, and a
  request whose stream is gone before its turn is never admitted. A body without a
  ``Content-Length`` is counted against ``max_request_body`` (413).
* Drain: the gateway sends GOAWAY (last stream id) when it starts shutting down; streams in
  flight finish, later ones are refused (REFUSED_STREAM), and the connection closes when the
  last one ends.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, Final

from gateway.hub.admission.chain import Admitted, HeaderVerdict
from gateway.hub.exchange import Exchange
from gateway.hub.request import ADMITTING, BODY, DONE, FrontDoorHost, Phase, Request
from gateway.hub.wakeup import TIMER_SLACK, Wakeup
from gateway.ops.audit import LineMemo
from gateway.wire import h2server
from gateway.wire.h2server import (
    CANCEL,
    ENHANCE_YOUR_CALM,
    INTERNAL_ERROR,
    NO_ERROR,
    H2ConnectionError,
    ServerConnection,
    StreamClosedError,
)
from gateway.wire.hpackfields import FieldEncoder
from gateway.wire.http1 import HTTPError, RequestHead
from gateway.wire.http2 import (
    LAST_CHUNK,
    FieldsMemo,
    H2RequestError,
    ResponseStart,
    ResponseTranslator,
    chunk,
    request_head_from_h2,
)
from gateway.wire.status import error_response
from tunnel.connection import WRITE_EVERY_REQUESTS

log = logging.getLogger("hubproxy.gateway")

STREAM_WINDOW = 65535  # per-stream receive window (the HTTP/2 default)
# New requests a connection admits per event-loop turn (_work_backlog): as many as the tunnel
# writes at once, so that one turn's admissions leave in one tunnel write.
REQUESTS_PER_TURN: Final = WRITE_EVERY_REQUESTS
FLUSH_AT = 64 * 1024  # DATA bytes queued that are written at once, not at the turn's end


class H2FrontDoor(asyncio.Protocol):
    """One HTTP/2 client connection. See the module docstring."""

    protocol = "h2"

    def __init__(self, gw: FrontDoorHost, client_ip: str, peer_ip: str | None = None) -> None:
        self.gw = gw
        self.limits = gw.config.limits
        self.client_ip = client_ip  # the connection's client (a PROXY header's, if trusted)
        self.peer_ip = peer_ip or client_ip  # the connection's own peer
        self.transport: Any = None
        self.max_streams = self.limits.max_h2_streams
        # Inbound heads are checked against RFC 9113 §8.2-8.3 by
        # gateway.wire.http2.request_head_from_h2, cookies joined there too. Outbound fields
        # come from gateway.wire.http2.response_fields (lower-case names, no
        # connection-specific fields, values already checked by the HTTP/1.1 response parser).
        # Connection window = every stream's window: streams held back by a slow tunnel can
        # never use up the connection's window and stall the rest. The header-list limit is
        # the HTTP/1.1 head limit (an HPACK bomb expands past it: refused while decoding).
        self.conn = ServerConnection(max_concurrent_streams=self.max_streams,
                                     max_header_list_size=self.limits.head.max_head_bytes,
                                     initial_window_size=STREAM_WINDOW,
                                     connection_window=STREAM_WINDOW * self.max_streams,
                                     encoder=FieldEncoder())
        self.requests: dict[int, H2Stream] = {}
        self.streams_total = 0  # streams this connection opened (metrics: streams/connection)
        self.closed = False
        self._goaway_sent = False
        self._write_paused = False
        self._flush_pending = False  # a flush_soon() is scheduled for this loop turn
        # Events parsed but not handled yet (see _work_backlog): bounded by the stream limit
        # (requests), the flow-control windows (DATA) and the frame budgets (the rest).
        self._backlog: collections.deque[h2server.Event] = collections.deque()
        self._backlog_scheduled = False
        self.queued = 0  # DATA payload bytes queued since the last write
        self.header_verdict = HeaderVerdict()  # admission's, on this connection's last headers
        self.fields_memo = FieldsMemo()  # RFC 9113 §8.2's, on this connection's last fields
        self.audit_memo = LineMemo()  # its requests' audit lines repeat most of their fields
        # The connection's one loop timer (see wake_at) and when it fires; the connection's
        # idle deadline (None: busy, or no idle timeout).
        self.wakeup = Wakeup(self._timer_fired)
        self._idle_at: float | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.gw.connections.add(self)
        self.gw.metrics.h2_connections_total += 1
        transport.set_write_buffer_limits(high=self.limits.write_high_water)
        self.conn.initiate()
        self.flush_now()
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            events = self.conn.receive_data(data)
        except H2ConnectionError as exc:
            # GOAWAY with the error code is queued: ENHANCE_YOUR_CALM for floods past a frame
            # budget, oversized header lists and CONTINUATION floods; PROTOCOL_ERROR,
            # FLOW_CONTROL_ERROR, ... for broken rules.
            if exc.code == ENHANCE_YOUR_CALM:
                log.info("h2 connection from %s closed: %s", self.client_ip, exc)
                self.gw.metrics.h2_calmed += 1
            else:
                log.info("h2 connection from %s: protocol error %d: %s", self.client_ip,
                         exc.code, exc)
                self.gw.metrics.h2_protocol_errors += 1
            self.flush_now()
            self.close(goaway=False)
            return
        self._backlog.extend(events)
        if not self._backlog_scheduled:
            self._work_backlog()

    def _work_backlog(self) -> None:
        """The connection's events in order, at most ``REQUESTS_PER_TURN`` new requests per
        loop turn; the rest wait for the next turn (one is scheduled).

        An HTTP/2 client's burst (sixteen requests in one read, or a controller's hundreds of
        watches) was admitted in one callback: everything else on the event loop, the
        responses coming back from the tunnel included, waited until the whole burst was
        through, and the burst then moved through gateway, agent and upstream in lockstep.
        Taking a few per turn interleaves admission with the rest, as separate HTTP/1.1
        connections naturally are, and one connection cannot hold the loop for long. Side by
        side (``h2load -c1 -m16``): 5,500 req/s when the whole burst went at once, 7,400 with
        four per turn, 6,800 with eight, 6,200 with two. Since the tunnel writes every 8
        complete requests at once, the tunnel splits the convoy and eight per turn beat four:
        1.14x the req/s at ``-m16`` and 1.19x at ``-m64``, for 0.85x the gateway's and the
        agent's CPU per request (alternating runs); sixteen gained only at ``-m64`` and holds
        the loop twice as long."""
        self._backlog_scheduled = False
        backlog = self._backlog
        started = 0
        while backlog:
            if self.closed:
                backlog.clear()
                return
            event = backlog[0]
            if isinstance(event, h2server.RequestReceived):
                if started == REQUESTS_PER_TURN:
                    self._backlog_scheduled = True
                    asyncio.get_running_loop().call_soon(self._work_backlog)
                    break
                started += 1
            backlog.popleft()
            self._event(event)
        self.flush_soon()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        for request in list(self.requests.values()):
            request.abandon()
        self.requests.clear()
        self.gw.connections.discard(self)
        self.gw.metrics.h2_streams_per_connection(self.streams_total)

    def pause_writing(self) -> None:
        self._write_paused = True
        for request in self.requests.values():
            request.pause_tunnel("client")

    def resume_writing(self) -> None:
        self._write_paused = False
        for request in list(self.requests.values()):
            request.resume_tunnel("client")
            request.send_pending()
        self.flush_now()

    # --- events ------------------------------------------------------------------------------

    def _event(self, event: h2server.Event) -> None:
        if isinstance(event, h2server.RequestReceived):
            self._request(event)
        elif isinstance(event, h2server.DataReceived):
            request = self.requests.get(event.stream_id)
            if request is None:  # answered already: keep the connection window open
                self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                    event.stream_id)
            else:
                request.body(event.data, event.flow_controlled_length)
        elif isinstance(event, h2server.StreamEnded):  # TrailersReceived too: not forwarded
            request = self.requests.get(event.stream_id)
            if request is not None:
                request.body_ended()
        elif isinstance(event, h2server.StreamReset):
            request = self.requests.pop(event.stream_id, None)
            if request is not None:
                request.abandon()
                self._maybe_idle()
        elif isinstance(event, h2server.WindowUpdated):
            if event.stream_id:
                request = self.requests.get(event.stream_id)
                if request is not None:
                    request.send_pending()
            else:
                for request in list(self.requests.values()):
                    request.send_pending()
        elif isinstance(event, h2server.SettingsChanged):
            for request in list(self.requests.values()):
                request.send_pending()
        elif isinstance(event, h2server.ConnectionTerminated):
            self.close(goaway=False)
        # PingReceived (answered by the connection), FrameIgnored: nothing to do. Their
        # floods, and rapid resets, are bounded by the connection's frame budgets.

    def _request(self, event: h2server.RequestReceived) -> None:
        sid = event.stream_id
        if sid not in self.conn.streams:
            # Reset (by the client, or by the connection for a malformed body) in a read that
            # came before this request's turn: nothing of it may be forwarded.
            return
        self.streams_total += 1
        self._idle_at = None  # busy: the timer, if pending, finds nothing to do for it
        ended = event.stream_ended
        stream = H2Stream(self, sid)
        self.requests[sid] = stream
        try:
            head = request_head_from_h2(event.headers, self.limits.head, end_stream=ended,
                                        memo=self.fields_memo)
        except H2RequestError as exc:
            stream.request.refuse(exc.status, str(exc))
            return
        stream.start(head, ended)

    # --- output ------------------------------------------------------------------------------

    def flush_soon(self) -> None:
        """Write what h2 has queued at the end of this event-loop turn: the responses of all
        the streams answered in one turn (one tunnel read often carries several) and the
        frames of one client read go out as one TLS write, not one each. Past
        ``FLUSH_AT`` bytes of DATA at once: bodies must reach the transport as they come, so that
        its pause_writing holds the tunnel back before the buffer grows. Nothing queued:
        no turn is scheduled (whatever queues frames later calls this again), so a read that
        only started requests, or a stream that ended after its response left, costs none."""
        if self.queued >= FLUSH_AT:
            self.flush_now()
        elif not self._flush_pending and self.conn.has_data_to_send:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush_turn)

    def _flush_turn(self) -> None:
        self._flush_pending = False
        self.flush_now()

    def flush_now(self) -> None:
        self.queued = 0
        data = self.conn.data_to_send()
        if data and not self.closed:
            self.transport.write(data)
            if self.transport.get_write_buffer_size() > 4 * self.limits.write_high_water:
                # Not reading what we must answer (PING/SETTINGS ACKs, responses past our
                # windows cannot happen): the buffer may not grow without bound.
                log.info("h2 connection from %s aborted: it does not read", self.client_ip)
                self.closed = True
                self.transport.abort()

    def finished(self, request: H2Stream) -> None:
        if self.requests.get(request.stream_id) is request:
            del self.requests[request.stream_id]
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        if self.requests or self.closed:
            return
        if self.gw.draining:
            self.close()
        else:
            self._arm_idle()

    # --- timers: the connection's idle deadline and each stream's, on one loop timer --------
    #
    # Each deadline is a number (a stream's ``due``, the connection's ``_idle_at``), and the
    # connection's Wakeup (gateway.hub.wakeup) fires by the earliest: then it runs what is due
    # (rechecking each deadline: it may have been cleared or moved later meanwhile) and asks
    # again for the earliest one left. Steady traffic makes no loop timer per request.

    def wake_at(self, deadline: float) -> None:
        """Have the connection's timer fire by ``deadline`` (loop time)."""
        self.wakeup.at(deadline)

    def _timer_fired(self) -> None:
        if self.closed:
            return
        now = self.wakeup.now() + TIMER_SLACK
        earliest = self._idle_at
        if earliest is not None and earliest <= now:
            self._idle_at = earliest = None
            if not self.requests:
                self.close()
                return
        # What a stream runs may close the connection: that abandons every stream, which
        # clears its deadline, so the rest of this loop finds nothing due.
        for stream in list(self.requests.values()):
            due = stream.due
            if due is None:
                continue
            if due <= now:
                stream.deadline_passed()
                due = stream.due  # set again by what it ran
                if due is None:
                    continue
            if earliest is None or due < earliest:
                earliest = due
        if earliest is not None and not self.closed:
            self.wake_at(earliest)

    def _arm_idle(self) -> None:
        if self.limits.idle_timeout > 0:
            self._idle_at = self.wakeup.now() + self.limits.idle_timeout
            self.wake_at(self._idle_at)

    def _disarm(self) -> None:
        """The connection is closing: no timer may keep it alive."""
        self._idle_at = None
        self.wakeup.cancel()

    def start_drain(self) -> None:
        """The gateway is shutting down: GOAWAY now (no new streams), close when idle."""
        if self.closed or self._goaway_sent:
            return
        self._goaway_sent = True
        self.conn.close_connection(NO_ERROR)  # the streams in flight still finish
        self.flush_now()
        self._maybe_idle()

    def close(self, *, goaway: bool = True) -> None:
        """Close after flushing what was written (GOAWAY first unless one went already)."""
        if self.closed:
            return
        if goaway and not self._goaway_sent:
            self._goaway_sent = True
            self.conn.close_connection()
        # Always: after start_drain's GOAWAY, the last frames of the streams that finished
        # (a watch's END_STREAM) may still wait in the connection's buffer.
        self.flush_now()
        self.closed = True
        self._disarm()
        for request in list(self.requests.values()):
            request.abandon()
        self.requests.clear()
        self.transport.close()

    @property
    def idle(self) -> bool:
        return not self.requests

    @property
    def open_requests(self) -> int:
        return len(self.requests)

    def exchanges(self) -> Iterator[Exchange]:
        for stream in list(self.requests.values()):
            exchange = stream.request.exchange
            if exchange is not None:
                yield exchange

    @property
    def write_paused(self) -> bool:
        return self._write_paused


# Why a stream's tunnel stream is not read (bits): the client connection's write buffer is
# full, or the client's flow-control windows are.
_PAUSE_BITS = {"client": 1, "window": 2}
_NO_EARLY: list[bytes] = []  # shared, never appended to: a stream's early body list is made
# when its first body bytes arrive during admission


class H2Stream:
    """One HTTP/2 stream: the :class:`gateway.hub.request.Door` of its request.

    It is also the Exchange's transport: ``write`` receives the HTTP/1.1 response bytes and
    sends them as HEADERS and DATA.

    Slotted and lean: an idle watch keeps one of these for hours, thousands per process (the
    10,000-watch goal), so nothing is kept that the rest of the stream does not need (the
    request's header fields go once its tunnel stream is open)."""

    protocol = "h2"
    # The Exchange reads a plain response head for its framing only (gateway.hub.relayhead);
    # the translator takes its fields from its bytes (gateway.wire.http2.relayed_fields).
    reads_response_fields = False
    # A whole plain response is relayed without a head object: response_started primes the
    # translator with its status (ResponseTranslator.expect_whole), else with the parsed head.
    relays_whole = True
    # The Exchange may hand ``write`` views of a tunnel read: write copies only what the
    # client's windows hold back (the translator's pieces are borrowed until it returns).
    keeps_views = False

    __slots__ = (
        "_data_ended",
        "_finished",
        "_on_deadline",
        "_stream_write_paused",
        "_tunnel_paused",
        "body_bytes",
        "client_ended",
        "door",
        "due",
        "early",
        "pending",
        "request",
        "response_ended",
        "stream_id",
        "translator",
        "unacked",
    )

    def __init__(self, door: H2FrontDoor, stream_id: int) -> None:
        self.door = door
        self.stream_id = stream_id
        self.request = Request(door.gw, self)
        self.translator: ResponseTranslator | None = None
        self.early = _NO_EARLY  # body bytes that arrived during admission (unacked)
        self.unacked = 0  # flow-controlled bytes received and not yet acknowledged
        self.body_bytes = 0
        self.client_ended = False
        self.response_ended = False
        # Response payload waiting for the client's windows: owned bytes, or a view of the
        # rest of one (send_pending).
        self.pending: list[bytes | memoryview] = []
        self._finished = False  # the exchange is over; end the stream once pending is sent
        self._data_ended = False  # the last DATA frame carried END_STREAM
        self._tunnel_paused = 0  # _PAUSE_BITS: why the tunnel stream is not read
        self._stream_write_paused = False  # the tunnel's send window is full
        # The stream's deadline (loop time; None: none) and what runs then, on the
        # connection's timer (H2FrontDoor.wake_at).
        self.due: float | None = None
        self._on_deadline: Callable[[], None] | None = None

    def start(self, head: RequestHead, ended: bool) -> None:
        self.client_ended = ended
        self.request.start(head)

    @property
    def closed(self) -> bool:
        return self.door.closed

    @property
    def client_ip(self) -> str:
        return self.door.client_ip

    @property
    def peer_ip(self) -> str:
        return self.door.peer_ip

    @property
    def header_verdict(self) -> HeaderVerdict:
        return self.door.header_verdict

    @property
    def audit_memo(self) -> LineMemo:
        return self.door.audit_memo

    # --- the request's door (gateway.hub.request.Door) ---------------------------------------

    def body_so_far(self, admitted: Admitted) -> tuple[bytes, bytes | None]:
        early = b"".join(self.early)
        self.early = _NO_EARLY
        head = self.request.head
        chunked = head is not None and head.chunked
        if chunked:
            early = chunk(early)
        if not self.client_ended:
            return early, None
        return early, LAST_CHUNK if chunked else b""  # the last chunk leaves in body_ended

    def opened(self, request: Request) -> None:
        self.translator = ResponseTranslator(request.head.method if request.head else b"GET")
        # The fields now live in the OPEN's bytes (admitted.head); from here only the method,
        # target and framing flags are read. An idle watch need not keep the rest (nor the
        # bearer token) for its lifetime.
        if request.head is not None:
            request.head.headers, request.head.names = [], []
        if self.door.write_paused:
            self.pause_tunnel("client")
        self._acknowledge()
        if self.client_ended:
            self.body_ended()
        else:
            self.arm(self.door.limits.idle_timeout, self._body_timeout)
        self.door.flush_soon()  # the early body's WINDOW_UPDATE (admitted in a later turn)

    def response_started(self, request: Request, exchange: Exchange) -> bool:
        self._disarm()
        if request.long_running:  # as the header verdict: the connection may stay for hours
            self.door.fields_memo.forget()
        translator = self.translator
        if translator is not None:
            response = exchange.response  # parsed once, not again; None: relayed whole
            if response is None:
                translator.expect_whole(exchange.status)
            else:
                translator.expect(response)
        return False

    def upgraded(self, request: Request) -> None:  # pragma: no cover - never over h2
        raise AssertionError("no upgrades over HTTP/2")

    def finished(self, request: Request, phase: Phase, keep_alive: bool) -> None:
        self._disarm()
        translator = self.translator
        if translator is not None and not translator.complete:  # a close-delimited body ends
            with contextlib.suppress(HTTPError):  # truncated: reset below
                translator.feed_eof()
        if translator is None or not translator.complete:
            self._reset(INTERNAL_ERROR)  # truncated: never end it cleanly
            return
        self._finished = True
        self.send_pending()
        self.door.flush_soon()

    def answer(self, request: Request, phase: Phase, status: int, message: str, *,
               retry_after: int | None, extra_headers: tuple[tuple[bytes, bytes], ...],
               close: bool) -> int:
        """A ``Status`` on this stream; the connection and its other streams carry on."""
        self._disarm()
        method = request.head.method if request.head is not None else b"GET"
        response = error_response(status, message, retry_after=retry_after,
                                  extra_headers=extra_headers, head_only=method == b"HEAD")
        self.translator = ResponseTranslator(method)
        self.write(response)
        self._finished = True
        self._acknowledge_all()
        self.send_pending()
        self.door.flush_soon()
        return len(response)

    # --- client -> tunnel --------------------------------------------------------------------

    def body(self, data: bytes, flow_length: int) -> None:
        self.unacked += flow_length
        request = self.request
        phase = request.phase
        exchange = request.exchange
        if phase is DONE or (exchange is None and phase is not ADMITTING):
            self._acknowledge_all()  # answered already: nobody wants the rest
            return
        head = request.head
        assert head is not None
        self.body_bytes += len(data)  # never past a Content-Length: the connection resets first
        if head.chunked and self.body_bytes > self.door.limits.max_request_body:
            limit = self.door.limits.max_request_body
            self._fail_body(413, f"the request body is larger than the gateway's limit of "
                                 f"{limit} bytes")
            return
        if exchange is None:  # admitting
            if self.early is _NO_EARLY:
                self.early = []
            self.early.append(data)  # bounded by the stream window: not acknowledged yet
            return
        if data:
            exchange.send(chunk(data) if head.chunked else data)
        self._acknowledge()

    def _acknowledge(self) -> None:
        """Give the client its stream window back for what the tunnel has taken."""
        if self.unacked and not self._stream_write_paused \
                and self.request.phase is not ADMITTING:
            n, self.unacked = self.unacked, 0
            self.door.conn.acknowledge_received_data(n, self.stream_id)

    def body_ended(self) -> None:
        self.client_ended = True  # with the whole Content-Length, if any (the connection checks)
        request = self.request
        head = request.head
        exchange = request.exchange
        if request.phase is not BODY or exchange is None or exchange.done:
            return
        if head is not None and head.chunked:
            exchange.send(LAST_CHUNK)
        request.body_sent()

    def _body_timeout(self) -> None:
        request = self.request
        if request.phase is BODY and not self.client_ended:
            if request.exchange is not None and request.exchange.head_sent:
                return  # answered while the body still flows: the client's to finish
            self._fail_body(408, "timed out reading the request body")
            self.door.flush_soon()

    def _fail_body(self, status: int, message: str) -> None:
        if not self.request.fail_body(status, message):
            self._reset(CANCEL)

    # --- the Exchange's transport ------------------------------------------------------------

    @property
    def transport(self) -> H2Stream:
        return self

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default  # no "sslcontext": not TLS (and keeps_views says so to the Exchange)

    def pause_reading(self, reason: str) -> None:
        self._stream_write_paused = True  # the tunnel's send window is full: stop acking

    def resume_reading(self, reason: str) -> None:
        self._stream_write_paused = False
        self._acknowledge()
        self.door.flush_soon()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """HTTP/1.1 response bytes from the Exchange -> HEADERS and DATA."""
        translator = self.translator
        if translator is None or self.response_ended:
            return
        try:
            items = translator.feed(data)
        except HTTPError:
            self._reset(INTERNAL_ERROR)
            return
        conn = self.door.conn
        pending = self.pending
        borrowed = 0  # pieces appended now: they may be views of ``data``
        for item in items:
            if isinstance(item, ResponseStart):
                conn.send_headers(self.stream_id, item.fields)
            else:
                pending.append(item)
                borrowed += 1
        self.send_pending()  # send_data copies what it sends
        if pending and borrowed:
            # What the windows held back outlives ``data``: own it (only the last pieces
            # can be this write's; send_pending takes from the front).
            for i in range(max(len(pending) - borrowed, 0), len(pending)):
                piece = pending[i]
                if type(piece) is not bytes:
                    pending[i] = bytes(piece)
        door = self.door
        if self._data_ended and len(door.requests) == 1:
            # The whole response of the connection's only stream: nothing else can join this
            # write in this turn, so it leaves now (one loop turn less at c=1).
            door.flush_now()
        else:
            door.flush_soon()

    def send_pending(self) -> None:
        """Send what the client's windows allow; pause the tunnel stream for the rest."""
        if self.response_ended or self.door.closed:
            return
        conn = self.door.conn
        pending = self.pending
        sid = self.stream_id
        try:
            while pending:
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                if room <= 0:
                    break
                piece = pending[0]
                if len(piece) <= room:
                    pending.pop(0)
                    # The body's last bytes carry END_STREAM (one frame less per response).
                    last = not pending and self.translator is not None \
                        and self.translator.complete
                    conn.send_data(sid, piece, end_stream=last)
                    self._data_ended = last
                    self.door.queued += len(piece)
                else:
                    # Split through a view: slicing the bytes would copy the rest of the
                    # piece once per frame (a 64 KiB tunnel read in 16 KiB frames: 96 KiB
                    # copied for nothing); send_data copies each frame's bytes once.
                    view = piece if isinstance(piece, memoryview) else memoryview(piece)
                    pending[0] = view[room:]
                    conn.send_data(sid, view[:room])
                    self.door.queued += room
        except StreamClosedError:
            self.abandon()
            return
        if pending:
            self.pause_tunnel("window")
            return
        self.resume_tunnel("window")
        if self._finished:
            self._end_stream()

    def pause_tunnel(self, reason: str) -> None:
        exchange = self.request.exchange
        if not self._tunnel_paused and exchange is not None and exchange.stream is not None:
            exchange.stream.pause_reading()
        self._tunnel_paused |= _PAUSE_BITS[reason]

    def resume_tunnel(self, reason: str) -> None:
        bit = _PAUSE_BITS[reason]
        if self._tunnel_paused & bit:
            self._tunnel_paused &= ~bit
            exchange = self.request.exchange
            if not self._tunnel_paused and exchange is not None \
                    and exchange.stream is not None:
                exchange.stream.resume_reading()

    # --- ending ------------------------------------------------------------------------------

    def _acknowledge_all(self) -> None:
        self.early = _NO_EARLY
        if self.unacked and not self.door.closed:
            n, self.unacked = self.unacked, 0
            with contextlib.suppress(StreamClosedError):
                self.door.conn.acknowledge_received_data(n, self.stream_id)

    def _end_stream(self) -> None:
        if self.response_ended:
            return
        self.response_ended = True
        conn = self.door.conn
        try:
            if not self._data_ended:
                conn.end_stream(self.stream_id)
            if not self.client_ended:
                # Answered before the body ended (a refusal, an early response): no more of
                # it is wanted (RFC 9113 §8.1).
                conn.reset_stream(self.stream_id, NO_ERROR)
        except StreamClosedError:
            pass
        self.door.finished(self)

    def _reset(self, code: int) -> None:
        if not self.response_ended:
            self.response_ended = True
            with contextlib.suppress(StreamClosedError):
                self.door.conn.reset_stream(self.stream_id, code)
        self.abandon()
        self.door.finished(self)
        self.door.flush_soon()

    def abandon(self) -> None:
        """The client reset the stream or the connection went: the request is abandoned."""
        self.response_ended = True
        self._disarm()
        self.request.abandon()

    def arm(self, delay: float, callback: Callable[[], None]) -> None:
        if delay <= 0:
            self._disarm()
            return
        self.due = self.door.wakeup.now() + delay
        self._on_deadline = callback
        self.door.wake_at(self.due)

    def _disarm(self) -> None:
        self.due = self._on_deadline = None

    def deadline_passed(self) -> None:
        """The connection's timer found this stream's deadline due: run what was armed."""
        callback = self._on_deadline
        self.due = self._on_deadline = None
        if callback is not None:
            callback()
