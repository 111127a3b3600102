"""The front door: one asyncio Protocol per client connection on :9092 (DESIGN §2.1).

A connection whose TLS handshake chose ALPN ``h2`` is handed to the HTTP/2 door it was given
(:class:`gateway.hub.frontdoor_h2.H2FrontDoor`); this module is HTTP/1.1.

One request at a time per connection (HTTP/1.1 keep-alive, pipelining-safe): bytes of a later
pipelined request stay in this connection's buffer until the current response has ended. The
buffer is bounded (``max_buffer``); past it the connection stops reading, so TCP pushes back on
the client instead of memory growing.

Per request: the head is found and parsed strictly (``gateway.wire.http1``;
400/414/431/417/501/505 as ``Status``; a head repeating the last one's fields has only its
request line read, ``gateway.wire.repeatedhead``) and handed to a
:class:`gateway.hub.request.Request`,
which admits it, opens its tunnel stream and sees it to its end. What stays here is HTTP/1.1's
own: the request body is relayed verbatim as it arrives (Content-Length or chunked bytes; the
tracker only finds where it ends), ``100 Continue``, upgrades, ``Status`` answers and whether
the connection lives on.

Request bodies are bounded by ``max_request_body`` (``--max-request-body``, 3 MiB like
kube-apiserver): a ``Content-Length`` over it is refused with 413 by admission, before anything
is forwarded and before any ``100 Continue``; a chunked body is counted as it streams (the
tracker refuses the chunk that would pass the limit), the stream is reset, and the client gets
413 if no response byte was sent yet, else the connection is closed.

``Expect: 100-continue``: the gateway answers ``100 Continue`` itself once the request has been
admitted (token verified, access authorized, header rules passed, cluster connected) and its
stream opened, and does not forward ``Expect``. A refused request gets its final status at once
and the connection is closed if body bytes may still be in flight, so a client never waits for
a 100 that cannot come, and never sends a large body that nobody reads.

The client is the connection's peer, or, behind a trusted balancer, the address its PROXY
header gave (``gateway.hub.proxyaccept``) or, behind a trusted TLS-terminating proxy, the
request's ``X-Forwarded-For`` (``gateway.hub.request``).

Timeouts: ``header_timeout`` from the first byte of a request head to its end (408, close),
``idle_timeout`` between requests (close) and while a request body stalls (408),
``response_header_timeout`` (the request's; see ``gateway.hub.request``). There is no total
timeout: watches, ``logs -f`` and upgrades last.

A client that goes away resets its stream, which cancels the request on the managed cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

from gateway.hub.admission.chain import Admitted, HeaderVerdict
from gateway.hub.exchange import Exchange
from gateway.hub.request import BODY, RAW, UPGRADE, FrontDoorHost, Phase, Request
from gateway.hub.wakeup import Wakeup
from gateway.ops.audit import LineMemo
from gateway.wire.http1 import (
    NO_BODY,
    BodyTracker,
    HTTPError,
    RequestHead,
    find_head_end,
    framing_for_request,
)
from gateway.wire.repeatedhead import RepeatedHead
from gateway.wire.requestclass import SHORT
from gateway.wire.status import error_response

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# The HTTP/2 door for a connection that chose ALPN h2: (gateway, client_ip, peer_ip).
H2Door = Callable[[FrontDoorHost, str, str], asyncio.Protocol]


class FrontDoor(asyncio.Protocol):
    """One HTTP/1.1 client connection, the :class:`gateway.hub.request.Door` of its
    current request. See the module docstring."""

    protocol = "h1"
    reads_response_fields = False  # the head is relayed as it came
    relays_whole = True  # ... and needs no head object (gateway.hub.request.Door)

    def __init__(self, gw: FrontDoorHost, client_ip: str | None = None, *,
                 h2: H2Door | None = None) -> None:
        self.gw = gw
        self.h2 = h2  # the door for a connection that chose ALPN h2
        self.limits = gw.config.limits
        self.transport: Any = None
        self.keeps_views = True  # see connection_made
        # The connection's client: its peer, or what a trusted balancer's PROXY header said
        # (gateway.hub.proxyaccept).
        self.client_ip = client_ip or "unknown"
        self.peer_ip = "unknown"
        self.closed = False
        self.request: Request | None = None  # None: between requests
        self.buf = bytearray()
        self.tracker: BodyTracker = NO_BODY  # the current request body's framing
        self.keep_alive = True
        self._paused: set[str] = set()
        self._wakeup = Wakeup(self._timer_fired)  # see arm()
        self._deadline = 0.0
        self._on_deadline: Callable[[], None] | None = None
        self._searched = 0
        self._body_seen = -1
        self._write_paused = False  # the client's transport is over its high-water mark
        self.header_verdict = HeaderVerdict()  # admission's, on this connection's last headers
        self.audit_memo = LineMemo()  # its requests' audit lines repeat most of their fields
        self.heads = RepeatedHead()  # the last head parsed, for a next one with the same fields

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        # Non-TLS transports (uvloop TCP) may keep a reference to what they are given.
        self.keeps_views = transport.get_extra_info("sslcontext") is None
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer_ip = str(peer[0])
            if self.client_ip == "unknown":
                self.client_ip = self.peer_ip
        gw = self.gw
        if len(gw.connections) >= self.limits.max_connections or gw.draining:
            gw.metrics.connections_refused += 1
            self.closed = True
            transport.abort()
            return
        ssl_object = transport.get_extra_info("ssl_object")
        if self.h2 is not None and ssl_object is not None \
                and ssl_object.selected_alpn_protocol() == "h2":
            # The client chose HTTP/2: hand the connection to its own protocol.
            self.closed = True
            door = self.h2(gw, self.client_ip, self.peer_ip)
            transport.set_protocol(door)
            door.connection_made(transport)
            return
        gw.connections.add(self)
        transport.set_write_buffer_limits(high=self.limits.write_high_water)
        self.arm(self.limits.idle_timeout, self._idle_timeout)

    def data_received(self, data: bytes) -> None:
        request = self.request
        if request is not None:
            phase = request.phase
            if phase is BODY and not self.buf:
                self._relay_body(request, data)  # hot path: straight through, no buffering
                return
            if phase is RAW and request.exchange is not None:
                request.exchange.send(data)
                return
        if not self.closed:
            if request is None and not self.buf:
                self._read_head(data)  # a read that starts a head: not copied to the buffer
            else:
                self.buf += data
                self._process()

    def eof_received(self) -> bool | None:
        request = self.request
        if request is not None and request.phase is RAW and request.exchange is not None:
            request.exchange.send_eof()  # half-close carried to the upstream
        return None  # TLS cannot stay half-open; asyncio closes the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        if self.request is not None:
            self.request.abandon()
        self.gw.connections.discard(self)
        self.buf = bytearray()

    def pause_writing(self) -> None:
        # The client reads slower than the cluster sends: stop taking data from the stream.
        self._write_paused = True
        exchange = self.exchange
        if exchange is not None and exchange.stream is not None:
            exchange.stream.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        exchange = self.exchange
        if exchange is not None and exchange.stream is not None:
            exchange.stream.resume_reading()

    # --- reading control ---------------------------------------------------------------------

    def pause_reading(self, reason: str) -> None:
        if not self._paused and not self.closed:
            self.transport.pause_reading()
        self._paused.add(reason)

    def resume_reading(self, reason: str) -> None:
        if reason in self._paused:
            self._paused.discard(reason)
            if not self._paused and not self.closed:
                self.transport.resume_reading()

    def _check_buffer(self) -> None:
        if len(self.buf) > self.limits.max_buffer:
            self.pause_reading("buffer")

    # --- timers (one per connection: idle, head, body, response head) ------------------------
    #
    # One deadline at a time, on the connection's one loop timer (gateway.hub.wakeup): request
    # after request on a keep-alive connection (idle, then the response head's, then idle
    # again) moves no timer.

    def arm(self, delay: float, callback: Callable[[], None]) -> None:
        """Replace the pending deadline with ``callback`` after ``delay`` (none if <= 0)."""
        if delay <= 0:
            self._on_deadline = None
            return
        wakeup = self._wakeup
        self._deadline = deadline = wakeup.now() + delay
        self._on_deadline = callback
        wakeup.at(deadline)

    def _disarm(self) -> None:
        self._on_deadline = None  # the timer, if pending, finds nothing to do

    def _stop_timer(self) -> None:
        """The connection is closing: no timer may keep it alive."""
        self._on_deadline = None
        self._wakeup.cancel()

    def _timer_fired(self) -> None:
        callback = self._on_deadline
        if callback is None:
            return
        if not self._wakeup.due(self._deadline):  # the deadline moved later meanwhile
            self._wakeup.at(self._deadline)
            return
        self._on_deadline = None
        callback()

    def _idle_timeout(self) -> None:
        if self.request is None and not self.buf:
            self.close()

    def _header_timeout(self) -> None:
        if self.request is None:
            self._refuse_head(408, "timed out reading the request head")

    def _body_timeout(self) -> None:
        """A request body that stops arriving for ``idle_timeout`` (checked by polling the byte
        count, so the hot path re-arms no timer per chunk)."""
        request = self.request
        exchange = request.exchange if request is not None else None
        if request is None or request.phase is not BODY or exchange is None:
            return
        if exchange.bytes_in == self._body_seen:
            if not request.fail_body(408, "timed out reading the request body"):
                self.close()  # answered already: the response cannot be finished cleanly
            return
        self._body_seen = exchange.bytes_in
        self.arm(self.limits.idle_timeout, self._body_timeout)

    # --- reading requests --------------------------------------------------------------------

    def _process(self) -> None:
        """Make progress on buffered bytes (a new head, or body bytes after admission)."""
        request = self.request
        if request is None:
            self._read_head()
        elif request.phase is BODY:
            data = bytes(self.buf)
            self.buf.clear()
            self._relay_body(request, data)
            self.resume_reading("buffer")  # what waited during admission is on its way
        else:
            self._check_buffer()

    def _read_head(self, data: bytes | None = None) -> None:
        """Find, parse and start the next request's head: in ``data``, a read that came with
        nothing buffered (the common case: the head is parsed from the read itself, and only
        what follows it is buffered), else in the buffer."""
        limits = self.limits.head
        buf = self.buf
        try:
            end = find_head_end(buf if data is None else data, self._searched,
                                max_head_bytes=limits.max_head_bytes,
                                max_request_line=limits.max_request_line)
            if end < 0:
                if data is not None:
                    buf += data
                if not self._searched:  # its first bytes: the head's time starts now
                    self.arm(self.limits.header_timeout, self._header_timeout)
                self._searched = len(buf)
                return
            # A read that is one whole head is parsed as it is (bytes: slicing all is no copy).
            raw = bytes(buf[:end]) if data is None else data[:end]
            head = self.heads.parse(raw, limits)
            tracker = framing_for_request(head, self.limits.max_request_body)
        except HTTPError as exc:
            self._refuse_head(exc.status, str(exc))
            return
        if data is None:
            del buf[:end]
        elif end < len(data):
            buf += memoryview(data)[end:]  # its body, or the next pipelined request
        self._searched = 0
        self._disarm()
        self.tracker = tracker
        self.keep_alive = head.keep_alive
        request = self.request = Request(self.gw, self)
        if buf:  # a pipelined request, or body bytes: bounded while this one is admitted
            self._check_buffer()
        request.start(head)

    def _refuse_head(self, status: int, message: str) -> None:
        """No request to speak of (its head is broken or late): answer and close."""
        Request(self.gw, self).refuse(status, message, close=True)

    def _relay_body(self, request: Request, data: bytes | bytearray | memoryview) -> None:
        exchange = request.exchange
        assert exchange is not None
        tracker = self.tracker
        try:
            n = tracker.feed(data)
        except HTTPError as exc:
            # Malformed chunked framing, or a chunked body over --max-request-body (413): the
            # stream must not carry it.
            if not request.fail_body(exc.status, str(exc)):
                self.close()  # answered already: the connection cannot carry on
            return
        if n:
            exchange.send(data if n == len(data) else memoryview(data)[:n])
        if tracker.complete:
            if n < len(data):
                self.buf += memoryview(data)[n:]  # the next pipelined request
            request.body_sent()
            self._check_buffer()

    # --- the request's door (gateway.hub.request.Door) ---------------------------------------

    def body_so_far(self, admitted: Admitted) -> tuple[bytes, bytes | None]:
        tracker = self.tracker
        if admitted.upgrade:
            return b"", None  # client bytes wait for the 101
        if tracker.complete:
            return b"", b""  # no body
        if not self.buf:
            return b"", None
        early = tracker.feed(self.buf)
        data = bytes(self.buf[:early])
        del self.buf[:early]
        # Asked of self.tracker, not of tracker: the checks above narrowed tracker.complete to
        # False for mypy, and mypyc compiles what mypy infers; feed() may have completed it.
        return data, b"" if self.tracker.complete else None

    def opened(self, request: Request) -> None:
        exchange = request.exchange
        if self._write_paused and exchange is not None and exchange.stream is not None:
            exchange.stream.pause_reading()  # the previous response still drains to the client
        if request.phase is UPGRADE:
            self._check_buffer()
            return
        if self.tracker.complete:
            request.body_sent()
            if self.buf:
                self._check_buffer()
            return
        self._body_seen = -1
        self.arm(self.limits.idle_timeout, self._body_timeout)
        head = request.head
        if head is not None and head.expect_continue and not self.buf:
            self.transport.write(CONTINUE)
        if self.buf:
            self._process()
        self.resume_reading("buffer")

    def response_started(self, request: Request, exchange: Exchange) -> bool:
        self._on_deadline = None  # _disarm: no response head timeout any more
        admitted = exchange.admitted
        if admitted.kind != SHORT:
            self.heads.forget()  # the connection may now stay open for hours
        if admitted.upgrade and exchange.status == 101:
            return False
        if self.gw.leaving:
            # Shutting down (--shutdown-delay): this connection's next request would race the
            # close of its idle connection when the delay ends (an HTTP/1.1 client cannot tell
            # that from a failure), so it closes after this response, and the client reconnects
            # through the load balancer to an instance that stays.
            self.keep_alive = False
            return True
        return False

    def upgraded(self, request: Request) -> None:
        """Client bytes that waited for the 101 go first."""
        exchange = request.exchange
        assert exchange is not None
        if self.buf:
            data = bytes(self.buf)
            self.buf.clear()
            exchange.send(data)
        self.resume_reading("buffer")

    def finished(self, request: Request, phase: Phase, keep_alive: bool) -> None:
        if self.closed:
            return
        if not (keep_alive and self.keep_alive) or phase in (BODY, RAW, UPGRADE) \
                or self.gw.draining:
            self.close()
            return
        self._next_request()

    def answer(self, request: Request, phase: Phase, status: int, message: str, *,
               retry_after: int | None, extra_headers: tuple[tuple[bytes, bytes], ...],
               close: bool) -> int:
        """Keep the connection only if it is clean."""
        head = request.head
        if not close:
            tracker = self.tracker
            if (phase in (BODY, RAW, UPGRADE) or self.gw.leaving or not self.keep_alive
                    or (head is not None and head.upgrade is not None)):
                close = True
            elif not tracker.complete:
                # Skip a body that is already complete in the buffer; otherwise close rather
                # than read (or wait for) a body nobody will use.
                close = not self._skip_body(tracker)
        response = error_response(
            status, message, close=close, retry_after=retry_after, extra_headers=extra_headers,
            head_only=head is not None and head.method == b"HEAD",
        )
        self.transport.write(response)
        if close:
            self.close()
        else:
            self._next_request()
        return len(response)

    def _skip_body(self, tracker: BodyTracker) -> bool:
        """Drop a refused request's body if all of it is in the buffer (True), else False."""
        try:
            n = tracker.feed(self.buf)
        except HTTPError:
            return False
        if tracker.complete:
            del self.buf[:n]
            return True
        return False

    # --- the connection ----------------------------------------------------------------------

    def _next_request(self) -> None:
        self.request = None
        self.tracker = NO_BODY
        if self._paused:  # rarely: reading resumes only if the last request paused it
            self.resume_reading("buffer")
            self.resume_reading("stream")
        self.arm(self.limits.idle_timeout, self._idle_timeout)
        if self.buf:
            # Later, not now: a buffer of pipelined requests that are all refused at once would
            # otherwise recurse once per request.
            asyncio.get_running_loop().call_soon(self._resume_pipeline)

    def _resume_pipeline(self) -> None:
        if self.request is None and self.buf and not self.closed:
            self._read_head()

    def close(self) -> None:
        """Close after flushing what was written (never aborts a half-sent response)."""
        if self.closed:
            return
        self.closed = True
        self._stop_timer()
        if self.request is not None:
            self.request.abandon()
        self.transport.close()

    def start_drain(self) -> None:
        """The gateway is shutting down: an idle connection closes now, a busy one after its
        current response (``finished`` sees the gateway draining)."""
        if self.idle:
            self.close()

    @property
    def idle(self) -> bool:
        return self.request is None and not self.buf

    @property
    def exchange(self) -> Exchange | None:
        """The current request's exchange, if it has one."""
        return self.request.exchange if self.request is not None else None

    @property
    def head(self) -> RequestHead | None:
        """The current request's head (None between requests)."""
        return self.request.head if self.request is not None else None

    @property
    def open_requests(self) -> int:
        return 0 if self.exchange is None else 1

    def exchanges(self) -> Iterator[Exchange]:
        exchange = self.exchange
        if exchange is not None:
            yield exchange
