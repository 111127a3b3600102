"""The front door: one asyncio Protocol per client connection on :9092 (DESIGN §2.1).

One request at a time per connection (HTTP/1.1 keep-alive, pipelining-safe): bytes of a later
pipelined request stay in this connection's buffer until the current response has ended. The
buffer is bounded (``max_buffer``); past it the connection stops reading, so TCP pushes back on
the client instead of memory growing.

Per request: the head is found and parsed strictly (``gateway.wire.http1``;
400/414/431/417/501/505 as ``Status``), then the admission chain decides
(``gateway.hub.admission.chain``): synchronously when the token's review and the authorization
are cached (``admit_cached``), else in one task per request (``admit``); never anything per
chunk. A tunnel stream is opened with the rewritten head as its 0-RTT data, and the request body
is relayed verbatim as it arrives (Content-Length or chunked bytes; the tracker only finds where
it ends). The
:class:`gateway.hub.exchange.Exchange` relays the response.

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
request's ``X-Forwarded-For`` (``gateway.hub.admission.forwarded``): what admission, the
failed-authentication limit and the audit trail see.

Timeouts: ``header_timeout`` from the first byte of a request head to its end (408, close),
``idle_timeout`` between requests (close) and while a request body stalls (408),
``response_header_timeout`` (default 60 s, kube-apiserver's own request timeout) from the end
of a short request to its response head (504). Watches, ``logs -f`` and upgrades are exempt
(``gateway.wire.requestclass``), and there is no total timeout: they last.

A client that goes away resets its stream, which cancels the request on the managed cluster.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.hub.admission.auth import UserInfo
from gateway.hub.admission.chain import Admitted, Refusal, new_request_id, start_admission
from gateway.hub.admission.forwarded import client_address, source_ips
from gateway.hub.exchange import SHUTTING_DOWN, Exchange
from gateway.hub.frontdoor_h2 import FrontDoorHost, H2FrontDoor
from gateway.wire.http1 import (
    NO_BODY,
    BodyTracker,
    HTTPError,
    RequestHead,
    find_head_end,
    framing_for_request,
    parse_request_head,
)
from gateway.wire.identity import AUDIT_ID
from gateway.wire.requestclass import SHORT, front_door_class
from gateway.wire.status import error_response
from tunnel.connection import TunnelSession

log = logging.getLogger("hubproxy.gateway")

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# Connection phases.
IDLE = "idle"  # waiting for (the rest of) a request head
ADMITTING = "admitting"  # authenticating/authorizing; body bytes are buffered
BODY = "body"  # relaying the request body to the stream
WAITING = "waiting"  # request sent, response pending or streaming; later bytes buffered
UPGRADE = "upgrade"  # upgrade request sent, waiting for 101; client bytes buffered
RAW = "raw"  # after 101: raw bytes both ways
CLOSED = "closed"


class FrontDoor(asyncio.Protocol):
    """See the module docstring."""

    protocol = "h1"

    def __init__(self, gw: FrontDoorHost, client_ip: str | None = None) -> None:
        self.gw = gw
        self.limits = gw.config.limits
        self.transport: Any = None
        # The connection's client: its peer, or what a trusted balancer's PROXY header said
        # (gateway.hub.proxyaccept). ``client`` is the current request's (X-Forwarded-For from
        # a trusted proxy, gateway.hub.admission.forwarded).
        self.client_ip = client_ip or "unknown"
        self.peer_ip = "unknown"
        self.client = self.client_ip
        self.phase = IDLE
        self.buf = bytearray()
        self.exchange: Exchange | None = None
        self.head: RequestHead | None = None
        self.request_id = ""
        self.req_tracker: BodyTracker = NO_BODY
        self.keep_alive = True
        self._paused: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Future[Admitted] | None = None
        self._started = 0.0
        self._searched = 0
        self._body_seen = -1
        self._write_paused = False  # the client's transport is over its high-water mark
        self._counted = False  # this request holds an in-flight slot
        self._long_running = False  # watch, follow or upgrade: no response-header timeout

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer_ip = str(peer[0])
            if self.client_ip == "unknown":
                self.client_ip = self.client = self.peer_ip
        gw = self.gw
        if len(gw.connections) >= self.limits.max_connections or gw.draining:
            gw.metrics.connections_refused += 1
            self.phase = CLOSED
            transport.abort()
            return
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            # The client chose HTTP/2: hand the connection to its own protocol.
            self.phase = CLOSED
            door = H2FrontDoor(gw, self.client_ip, self.peer_ip)
            transport.set_protocol(door)
            door.connection_made(transport)
            return
        gw.connections.add(self)
        transport.set_write_buffer_limits(high=self.limits.write_high_water)
        self._arm(self.limits.idle_timeout, self._idle_timeout)

    def data_received(self, data: bytes) -> None:
        phase = self.phase
        if phase == BODY and not self.buf:
            self._relay_body(data)  # hot path: straight through, no buffering
        elif phase == RAW:
            assert self.exchange is not None
            self.exchange.send(data)
        elif phase != CLOSED:
            self.buf += data
            self._process()

    def eof_received(self) -> bool | None:
        exchange = self.exchange
        if self.phase == RAW and exchange is not None:
            exchange.send_eof()  # half-close carried to the upstream
        return None  # TLS cannot stay half-open; asyncio closes the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.phase = CLOSED
        self._disarm()
        if self._task is not None:
            self._task.cancel()
        self._abandon_exchange()
        self._release()
        self.gw.connections.discard(self)
        self.buf = bytearray()

    def pause_writing(self) -> None:
        # The client reads slower than the cluster sends: stop taking data from the stream.
        self._write_paused = True
        if self.exchange is not None and self.exchange.stream is not None:
            self.exchange.stream.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.exchange is not None and self.exchange.stream is not None:
            self.exchange.stream.resume_reading()

    # --- reading control ---------------------------------------------------------------------

    def pause_reading(self, reason: str) -> None:
        if not self._paused and self.phase != CLOSED:
            self.transport.pause_reading()
        self._paused.add(reason)

    def resume_reading(self, reason: str) -> None:
        if reason in self._paused:
            self._paused.discard(reason)
            if not self._paused and self.phase != CLOSED:
                self.transport.resume_reading()

    def _check_buffer(self) -> None:
        if len(self.buf) > self.limits.max_buffer:
            self.pause_reading("buffer")

    # --- timers ------------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._disarm()
        if delay > 0:
            self._timer = asyncio.get_running_loop().call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle_timeout(self) -> None:
        if self.phase == IDLE and not self.buf:
            self.close()

    def _header_timeout(self) -> None:
        if self.phase == IDLE:
            self._refuse(408, "timed out reading the request head", close=True)

    def _body_timeout(self) -> None:
        """A request body that stops arriving for ``idle_timeout`` (checked by polling the byte
        count, so the hot path re-arms no timer per chunk)."""
        exchange = self.exchange
        if self.phase != BODY or exchange is None:
            return
        if exchange.bytes_in == self._body_seen:
            exchange.client_gone()  # cancel upstream: the request will never complete
            self.exchange = None
            self.gw.metrics.stream_closed()
            self._refuse(408, "timed out reading the request body", close=True)
            return
        self._body_seen = exchange.bytes_in
        self._arm(self.limits.idle_timeout, self._body_timeout)

    def _response_timeout(self) -> None:
        if self.exchange is not None:
            self.exchange.timed_out()

    # --- request state machine ---------------------------------------------------------------

    def _process(self) -> None:
        """Make progress on buffered bytes (a new head, or body bytes after admission)."""
        if self.phase == IDLE:
            self._read_head()
        elif self.phase == BODY:
            data = bytes(self.buf)
            self.buf.clear()
            self._relay_body(data)
            self.resume_reading("buffer")  # what waited during admission is on its way
        else:
            self._check_buffer()

    def _read_head(self) -> None:
        limits = self.limits.head
        buf = self.buf
        if not self._searched:
            self._arm(self.limits.header_timeout, self._header_timeout)
        try:
            end = find_head_end(buf, self._searched, max_head_bytes=limits.max_head_bytes,
                                max_request_line=limits.max_request_line)
            if end < 0:
                self._searched = len(buf)
                return
            head = parse_request_head(bytes(buf[:end]), limits)
            tracker = framing_for_request(head, self.limits.max_request_body)
        except HTTPError as exc:
            self._refuse(exc.status, str(exc), close=True)
            return
        del buf[:end]
        self._searched = 0
        self._disarm()
        self.head = head
        self.req_tracker = tracker
        self.keep_alive = head.keep_alive
        self.request_id = new_request_id()
        self._started = time.monotonic()
        self.phase = ADMITTING
        self._check_buffer()
        self.client = client_address(self.client_ip, head, self.gw.config.forwarded_for_from)
        try:
            started = start_admission(self.gw, head, self.client, self.request_id)
        except Refusal as exc:
            self._refuse(exc.status, exc.message, retry_after=exc.retry_after,
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
        if self.phase == CLOSED:
            if task.exception() is None:
                task.result().release()  # admitted, but the client left
            return
        exc = task.exception()
        if isinstance(exc, Refusal):
            self._refuse(exc.status, exc.message, retry_after=exc.retry_after,
                         extra_headers=exc.extra_headers, user_info=exc.user_info)
            return
        if exc is not None:
            log.error("request %s: admission failed: %s", self.request_id, type(exc).__name__,
                      exc_info=exc)
            self._refuse(500, "internal error in the gateway")
            return
        self._open(task.result())

    def _open(self, admitted: Admitted) -> None:
        head = self.head
        assert head is not None
        exchange = Exchange(self, head.method, admitted, self.request_id)
        self.exchange = exchange
        tracker = self.req_tracker
        # 0-RTT: the head and whatever body bytes are already here ride in the OPEN frame.
        initial = admitted.head
        early = 0
        if self.buf and not admitted.upgrade and not tracker.complete:
            try:
                early = tracker.feed(self.buf)
            except HTTPError as exc:
                self.exchange = None
                exchange.client_gone()  # never opened; gives back its stream slot
                self._refuse(exc.status, str(exc), close=True)
                return
            if early:
                initial = initial + bytes(self.buf[:early])
                del self.buf[:early]
        exchange.bytes_in = early
        if tracker.complete and not admitted.upgrade:
            exchange.replay = initial  # all of the request rides in the OPEN
        self.gw.metrics.stream_opened()
        try:
            admitted.session.open_stream(admitted.target, admitted.metadata, exchange,
                                         initial_data=initial)
        except Exception as exc:  # session closing or at its stream limit
            log.info("request %s: cannot open a stream to %s: %s", self.request_id,
                     admitted.cluster, type(exc).__name__)
            self.gw.metrics.stream_closed()
            self.exchange = None
            exchange.client_gone()  # never opened; gives back its stream slot
            self._refuse(503, f'cluster "{admitted.cluster}" cannot take requests now, retry',
                         retry_after=1)
            return
        if exchange.done or self.phase == CLOSED:  # refused synchronously
            return
        if self._write_paused:  # the previous response is still draining to the client
            exchange.stream.pause_reading()
        # Watches, logs -f and upgrades are long-running, as in kube-apiserver: no
        # response-header timeout (an exec's 101 waits for the kubelet, a watch may be held).
        self._long_running = front_door_class(head.target, admitted.upgrade) != SHORT
        if admitted.upgrade:
            self.phase = UPGRADE
            self._check_buffer()
            return
        if tracker.complete:
            self._request_sent()
        else:
            self.phase = BODY
            self._body_seen = -1
            self._arm(self.limits.idle_timeout, self._body_timeout)
            if head.expect_continue and not self.buf:
                self.transport.write(CONTINUE)
            if self.buf:
                self._process()
            self.resume_reading("buffer")

    def _relay_body(self, data: bytes | bytearray | memoryview) -> None:
        exchange = self.exchange
        assert exchange is not None
        tracker = self.req_tracker
        try:
            n = tracker.feed(data)
        except HTTPError as exc:
            # Malformed chunked framing, or a chunked body over --max-request-body (413): the
            # stream must not carry it. Reset it (the upstream request is cancelled), then tell
            # the client -- with a Status if no response byte went out yet, else by closing.
            if exchange.head_sent:
                self.close()  # records the request through _abandon_exchange
                return
            exchange.client_gone()
            self.exchange = None
            self.gw.metrics.stream_closed()
            self._refuse(exc.status, str(exc), close=True, admitted=exchange.admitted)
            return
        if n:
            exchange.send(data if n == len(data) else memoryview(data)[:n])
        if tracker.complete:
            if n < len(data):
                self.buf += memoryview(data)[n:]  # the next pipelined request
            self._request_sent()

    def _request_sent(self) -> None:
        exchange = self.exchange
        assert exchange is not None
        exchange.send_eof()
        if exchange.done:
            return
        self.phase = WAITING
        if not exchange.head_sent and not self._long_running:
            self._arm(self.limits.response_header_timeout, self._response_timeout)
        self._check_buffer()

    # --- called by the Exchange --------------------------------------------------------------

    def response_started(self, exchange: Exchange) -> bool:
        self._disarm()
        if exchange.admitted.upgrade and exchange.status == 101:
            return False
        target = self.head.target if self.head is not None else b""
        if b"watch=" in target or b"follow=" in target:
            exchange.streaming = True
            self.gw.audit_stream_start(self, exchange)
            self._slim(exchange)
            if self.gw.draining:  # started while the gateway shuts down: end it at once
                exchange.end_once_started(SHUTTING_DOWN)
        if self.gw.leaving:
            # Shutting down (--shutdown-delay): this connection's next request would race the
            # close of its idle connection when the delay ends (an HTTP/1.1 client cannot tell
            # that from a failure), so it closes after this response, and the client reconnects
            # through the load balancer to an instance that stays.
            self.keep_alive = False
            return True
        return False

    def upgraded(self, exchange: Exchange) -> None:
        """A real 101: splice. Client bytes that waited for it go first."""
        self.phase = RAW
        exchange.streaming = True
        self.gw.audit_stream_start(self, exchange)
        self._slim(exchange)
        if self.buf:
            data = bytes(self.buf)
            self.buf.clear()
            exchange.send(data)
        self.resume_reading("buffer")

    def _slim(self, exchange: Exchange) -> None:
        """A watch, ``logs -f`` or upgrade may stay open for hours: drop what only admission and
        the response head needed (header lists, the forwarded head, the identity metadata).
        Method, target and the parsed flags stay for the audit line and the connection's end."""
        if self.head is not None:
            self.head.headers, self.head.names = [], []
        exchange.admitted.head = exchange.admitted.metadata = b""

    def request_complete(self) -> bool:
        return self.phase != BODY

    def exchange_finished(self, exchange: Exchange, *, keep_alive: bool) -> None:
        """The response ended (or broke after its head was sent)."""
        if self.exchange is not exchange:
            return
        self.exchange = None
        self.gw.metrics.stream_closed()
        self._record(exchange.status, exchange.bytes_in, exchange.bytes_out,
                     admitted=exchange.admitted, stream=exchange.streaming)
        self._release()
        if self.phase == CLOSED:
            return
        if not (keep_alive and self.keep_alive) or self.phase in (BODY, RAW, UPGRADE) \
                or self.gw.draining:
            self.close()
            return
        self._next_request()

    def exchange_failed(self, exchange: Exchange, status: int, message: str,
                        retry_after: int | None) -> None:
        """No response byte was sent: answer with a Status instead."""
        if self.exchange is not exchange:
            return
        self.exchange = None
        self.gw.metrics.stream_closed()
        if self.phase == CLOSED:
            self._release()
            return
        self._refuse(status, message, retry_after=retry_after, admitted=exchange.admitted)

    def another_session(self, cluster: str) -> TunnelSession | None:
        return self.gw.registry.pick(cluster)

    # --- answering ---------------------------------------------------------------------------

    def _refuse(self, status: int, message: str, *, close: bool = False,
                retry_after: int | None = None, extra_headers: Any = (),
                admitted: Admitted | None = None, user_info: UserInfo | None = None) -> None:
        """Answer the current request with a Status; keep the connection only if it is clean."""
        if self.phase == CLOSED:
            return
        head = self.head
        tracker = self.req_tracker
        if not close:
            if (self.phase in (BODY, RAW, UPGRADE) or self.gw.leaving or not self.keep_alive
                    or (head is not None and head.upgrade is not None)):
                close = True
            elif self.phase == ADMITTING and not tracker.complete:
                # Skip a body that is already complete in the buffer; otherwise close rather
                # than read (or wait for) a body nobody will use.
                try:
                    n = tracker.feed(self.buf)
                except HTTPError:
                    n, close = 0, True
                if tracker.complete:
                    del self.buf[:n]
                else:
                    close = True
        if not self.request_id:  # refused before its head was whole: its own id all the same
            self.request_id = new_request_id()
        # Status messages are fixed wording (never a token): safe to say why at debug.
        log.debug("request %s answered by the gateway: %d %s", self.request_id, status, message)
        extra_headers = (*extra_headers, (AUDIT_ID, self.request_id.encode("ascii")))
        if status == 401:
            extra_headers = (*extra_headers, (b"WWW-Authenticate", b'Bearer realm="hubproxy"'))
        response = error_response(
            status, message, close=close, retry_after=retry_after, extra_headers=extra_headers,
            head_only=head is not None and head.method == b"HEAD",
        )
        self.transport.write(response)
        self._record(status, 0, len(response), admitted=admitted, message=message,
                     user_info=user_info)
        self._release()
        if close:
            self.close()
        else:
            self._next_request()

    def _next_request(self) -> None:
        self.phase = IDLE
        self.head = None
        self.request_id = ""  # the next one gets its own
        self.client = self.client_ip
        self.req_tracker = NO_BODY
        self.resume_reading("buffer")
        self.resume_reading("stream")
        self._arm(self.limits.idle_timeout, self._idle_timeout)
        if self.buf:
            # Later, not now: a buffer of pipelined requests that are all refused at once would
            # otherwise recurse once per request.
            asyncio.get_running_loop().call_soon(self._resume_pipeline)

    def _resume_pipeline(self) -> None:
        if self.phase == IDLE and self.buf:
            self._read_head()

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self.gw.inflight -= 1
            self.gw.request_released()

    def _record(self, status: int, bytes_in: int, bytes_out: int, *,
                admitted: Admitted | None = None, stream: bool = False,
                message: str | None = None, user_info: UserInfo | None = None) -> None:
        self.gw.request_done(
            request_id=self.request_id or new_request_id(),
            head=self.head,
            status=status,
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            duration=time.monotonic() - self._started if self._started else 0.0,
            admitted=admitted,
            stream=stream,
            source_ips=self.source_ips,
            message=message,
            started=self._started,
            user_info=user_info,
        )

    @property
    def source_ips(self) -> tuple[str, ...]:
        """The request's client, then the proxies it came through."""
        return source_ips(self.client, self.client_ip, self.peer_ip)

    @property
    def started(self) -> float:
        """When the current request's head arrived (monotonic)."""
        return self._started

    def _abandon_exchange(self) -> None:
        """The client side is gone or broken: cancel the stream, account for the request."""
        exchange = self.exchange
        if exchange is None:
            return
        self.exchange = None
        exchange.client_gone()
        self.gw.metrics.stream_closed()
        self._record(exchange.status or 499, exchange.bytes_in, exchange.bytes_out,
                     admitted=exchange.admitted, stream=exchange.streaming)

    def close(self) -> None:
        """Close after flushing what was written (never aborts a half-sent response)."""
        if self.phase == CLOSED:
            return
        self.phase = CLOSED
        self._disarm()
        if self._task is not None:
            self._task.cancel()
        self._abandon_exchange()
        self.transport.close()

    @property
    def idle(self) -> bool:
        return self.phase == IDLE and not self.buf and self.exchange is None
