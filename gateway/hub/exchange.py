"""The relay of one admitted request through its tunnel stream (``Exchange``).

:class:`Exchange` is the :class:`tunnel.connection.StreamProtocol` of one request: it receives
the response from the agent, parses only its head (status for the audit line, ``101``
detection, framing to know whether the client connection can be reused) and relays every byte
verbatim to the client. The agent half-closes the stream at the end of the response. Upgrades
are spliced only after a real ``101``; any other answer to an upgrade request is relayed and
the client connection closed. Back-pressure runs both ways without buffering: the client's
transport pausing pauses the stream, the stream's send window pausing pauses the client.

What the request may be, and where it goes, was decided before (``gateway.hub.admission``); the
client side is the :class:`ClientConnection` (``gateway.hub.request.Request``, which hands
what is protocol-specific to its front door).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from gateway.hub.admission.chain import Admitted
from gateway.hub.admission.recheck import Recheck, Revoked
from gateway.hub.relayhead import relayed_head, whole_response
from gateway.wire import spdy
from gateway.wire.http1 import (
    NO_BODY,
    BodyTracker,
    ChunkedBody,
    HTTPError,
    Limits,
    ResponseHead,
    find_head_end,
    framing_for_response,
    parse_response_head,
)
from gateway.wire.websocket import (
    CLOSE_POLICY_VIOLATION,
    STATUS_CHANNEL_PROTOCOLS,
    FrameBoundary,
    close_frame,
    exec_goodbye,
    status_json,
)
from tunnel.connection import StreamHandle, StreamOpener
from tunnel.errors import OpenErrorCode, OpenRefused, SessionClosed, StreamError
from tunnel.targets import KubeAPITarget


class ClientConnection(Protocol):
    """What an :class:`Exchange` needs from the client's connection."""

    @property
    def transport(self) -> asyncio.WriteTransport: ...

    def pause_reading(self, reason: str) -> None: ...

    def resume_reading(self, reason: str) -> None: ...

    def response_started(self, exchange: Exchange) -> bool | None:
        """The response head arrived; True: the connection closes after this response, so the
        head must say ``Connection: close`` (HTTP/1.1 during a shutdown)."""

    def upgraded(self, exchange: Exchange) -> None: ...

    def exchange_finished(self, exchange: Exchange, *, keep_alive: bool) -> None: ...

    def exchange_failed(self, exchange: Exchange, status: int, message: str,
                        retry_after: int | None) -> None: ...

    def another_session(self, cluster: str) -> StreamOpener | None:
        """A usable session of ``cluster`` to send a refused OPEN again, or None."""


RESPONSE_LIMITS = Limits(max_head_bytes=256 * 1024, max_request_line=64 * 1024,
                         max_field_line=64 * 1024, max_headers=512)

# OPEN refusals from the agent -> what the client sees (DESIGN §2, errors).
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


# An OPEN refused by a draining session is sent again at most this many times.
MAX_REOPENS = 2

# Exchange states (response side).
_HEAD, _BODY, _RAW, _DONE = range(4)

# A revoked stream in the middle of a chunk or frame ends at the next boundary, or is closed
# at the connection after this long (a stalled upstream must not keep it open).
ENDING_GRACE = 5.0
LAST_CHUNK = b"0\r\n\r\n"
SHUTTING_DOWN = Revoked(503, "ServiceUnavailable",
                        "this gateway instance is shutting down; connect again to reach another")

# The agent session carrying a watch announced it is leaving (agent SIGTERM, a duplicate or a
# rotated session): the watch ends cleanly and the client re-watches through another session.
AGENT_LEAVING = Revoked(503, "ServiceUnavailable",
                        "the cluster's agent session is closing; connect again")


def with_connection_close(head: bytes) -> bytes:
    """A response head (ending in an empty line) that also says ``Connection: close``."""
    return head[:-2] + b"Connection: close\r\n\r\n"


class Exchange:
    """The stream side of one request (a ``StreamProtocol``). See the module docstring."""

    __slots__ = (
        "_copy_views",
        "_end_once_started",
        "_end_timer",
        "_ending",
        "_fields",
        "_lost",
        "_resp_buf",
        "_state",
        "_whole",
        "admitted",
        "bytes_in",
        "bytes_out",
        "door",
        "eof_sent",
        "head_sent",
        "method",
        "reopens",
        "replay",
        "request_id",
        "response",
        "spdy_in",
        "spdy_out",
        "status",
        "stream",
        "streaming",
        "tracker",
        "transport",
        "ws",
        "ws_protocol",
    )

    def __init__(self, door: ClientConnection, method: bytes, admitted: Admitted,
                 request_id: str, *, fields: bool = True, keeps_views: bool = True,
                 whole: bool = False) -> None:
        """``fields``: the door reads the response head's fields (else it writes the head
        as its bytes, and only its framing is read: ``gateway.hub.relayhead``).
        ``keeps_views``: the client's transport may keep a reference to what it is given
        (non-TLS transports, uvloop TCP: TLS ones encrypt during write()); the tunnel forbids
        keeping its memoryviews, so they are copied first. A fact of the connection, which
        its door knows (asking the transport for every request cost a call into it).
        ``whole``: the door needs no head object (it writes the head's bytes), so a response
        that arrives whole is relayed as it is (:meth:`_relay_whole`)."""
        self.door = door
        self._fields = fields
        self._whole = whole and not fields
        self.transport = door.transport
        self._copy_views = keeps_views
        self.method = method
        self.admitted = admitted
        self.request_id = request_id
        self.stream: StreamHandle | None = None
        self._lost = False  # the tunnel ended the stream (connection_lost)
        self._state = _HEAD
        self._resp_buf: bytearray | None = None  # a response head that came in pieces
        # The head as read; None also once a response was relayed whole (_relay_whole).
        self.response: ResponseHead | None = None
        self.tracker: BodyTracker = NO_BODY
        self.head_sent = False  # any response byte reached the client
        self.eof_sent = False  # we half-closed the stream (request complete)
        self.status = 0
        self.streaming = False  # a watch, follow or upgrade: audited as stream_start/_end
        self.bytes_in = 0
        self.bytes_out = 0
        # The whole request as it rode in the OPEN, kept until the response starts when the
        # client sent all of it before the OPEN (see _reopen); None otherwise.
        self.replay: bytes | None = None
        self.reopens = 0
        # Revocation (gateway.hub.revalidation): why the stream is ending, and its deadline.
        self._ending: Revoked | None = None
        self._end_timer: asyncio.TimerHandle | None = None
        self._end_once_started: Revoked | None = None  # see end_once_started
        # A revalidated WebSocket: where the server's frames begin, and its subprotocol.
        self.ws: FrameBoundary | None = None
        self.ws_protocol = b""  # also the X-Stream-Protocol-Version of a SPDY stream
        # A revalidated SPDY exec/attach: frame boundaries both ways, and the error stream.
        self.spdy_in: spdy.FrameBoundary | None = None
        self.spdy_out: spdy.FrameBoundary | None = None

    # --- client -> stream ------------------------------------------------------------------

    def send(self, data: bytes | bytearray | memoryview) -> None:
        if self._state == _DONE:
            return
        self.bytes_in += len(data)
        if self.spdy_in is not None:
            self.spdy_in.feed(data)  # which stream is the error stream
        if self.stream is not None:  # else the session let go of it: nothing takes bytes
            self.stream.write(data)

    def send_eof(self) -> None:
        if not self.eof_sent and self._state != _DONE:
            self.eof_sent = True
            self._stream_eof()

    def _stream_eof(self) -> None:
        if self.stream is not None:
            self.stream.write_eof()

    # --- StreamProtocol ----------------------------------------------------------------------

    def connection_made(self, stream: StreamHandle) -> None:
        self.stream = stream

    def data_received(self, data: bytes | memoryview) -> None:
        state = self._state
        if state == _RAW:
            if self.ws is not None:
                self._websocket(data)
            elif self.spdy_out is not None:
                self._spdy(data)
            else:
                self._to_client(data)
        elif state == _BODY:
            if self._ending is not None:
                self._body_to_boundary(data)
                return
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
            pending = self._resp_buf
            if pending is None:  # the common case: the whole head in one piece
                if type(data) is not bytes:
                    data = bytes(data)
                if not (self._whole and self._relay_whole(data)):
                    self._parse_head(data)
            else:
                pending += data
                self._parse_head(pending)

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
            response = self.response  # None: relayed whole (_relay_whole), so keep-alive
            self._finish(keep_alive=response is None
                         or (response.keep_alive and not response.close_delimited))
        elif state == _HEAD:
            self._fail(502, "the cluster closed the request without a response")

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        # The session has let go of the stream, and so must we: the stream refers to us, and
        # that cycle would keep this exchange, its request and the request's head alive until
        # the cyclic collector ran (a dozen objects per request for it to find).
        self.stream = None
        if self._state == _DONE:
            return
        if exc is None:
            self.eof_received()
            if self._state != _DONE:
                self._finish(keep_alive=False)
            return
        if isinstance(exc, OpenRefused):
            if exc.code == OpenErrorCode.SHUTTING_DOWN and self._reopen():
                return
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

    def _reopen(self) -> bool:
        """Send the request again on another session of the cluster, once its OPEN was refused
        because the session is draining: such an OPEN never reached the apiserver, so this is
        safe, as HTTP/2 allows for streams a GOAWAY refused. Only when the whole request rode
        in the OPEN (nothing else to replay) and at most ``MAX_REOPENS`` times."""
        if self.replay is None or self.head_sent or self.reopens >= MAX_REOPENS:
            return False
        session = self.door.another_session(self.admitted.cluster)
        if session is None:
            return False
        self.reopens += 1
        self._lost = False
        self.stream = None
        self.admitted.session = session
        session.open_stream(self.admitted.target, self.admitted.metadata, self,
                            initial_data=self.replay)  # connection_made: self.stream again
        if self.eof_sent and not self._lost:
            self._stream_eof()
        return True

    def pause_writing(self) -> None:
        self.door.pause_reading("stream")

    def resume_writing(self) -> None:
        self.door.resume_reading("stream")

    # --- response head ----------------------------------------------------------------------

    def response_was_close_delimited(self) -> bool:
        return self.response is not None and self.response.close_delimited

    def _relay_whole(self, data: bytes) -> bool:
        """Relay ``data`` in one write when it is one whole plain response
        (:func:`gateway.hub.relayhead.whole_response`: the common small answer) and say True;
        else False, and nothing was done. Its body is complete: the tracker stays ``NO_BODY``
        (any byte after it breaks the stream contract) and no head object is kept
        (``response`` None: keep-alive, not close-delimited)."""
        if self.admitted.upgrade:
            return False
        whole = whole_response(data, self.method)
        if whole is None:
            return False
        self.status, end = whole
        self.replay = None  # answered: never sent again
        self._state = _BODY
        self.head_sent = True
        closing = self.door.response_started(self)
        self.bytes_out += len(data)
        self.transport.write(with_connection_close(data[:end]) + data[end:] if closing
                             else data)
        if self.streaming:
            self._end_if_leaving()
        return True

    def _parse_head(self, received: bytes | bytearray) -> None:
        """Relay the response head that ``received`` starts with, and the body bytes after
        it; keep what arrived while the head is incomplete (``_resp_buf``, made only then). A
        head and body that came in one piece leave as that piece, not copied again."""
        while self._state == _HEAD:
            try:
                end = find_head_end(received, max_head_bytes=RESPONSE_LIMITS.max_head_bytes,
                                    max_request_line=RESPONSE_LIMITS.max_request_line)
                if end < 0:
                    if self._resp_buf is None:
                        self._resp_buf = bytearray(received)
                    return
                # Complete: bytes from here on (a head that came in pieces: copied once).
                data = received if isinstance(received, bytes) else bytes(received)
                self._resp_buf = None
                raw = data[:end]  # all of data (the same object) for a head without body
                head = None if self._fields else relayed_head(raw)
                if head is None:
                    head = parse_response_head(raw, RESPONSE_LIMITS)
            except HTTPError:
                self._fail(502, "the cluster sent a malformed response")
                return
            if head.is_interim:  # 100 Continue, 103 Early Hints: relay, the real head follows
                self.transport.write(raw)
                received = data[end:]
                continue
            self.response = head
            self.replay = None  # answered: never sent again
            self.status = head.status
            upgrade = self.admitted.upgrade
            if head.is_switching:
                if not upgrade:
                    self._fail(502, "the cluster switched protocols without being asked")
                    return
                self._state = _RAW
                recheck = self.admitted.recheck
                protocol = (head.get(b"upgrade") or b"").strip().lower()
                if recheck is not None and protocol == b"websocket":
                    self.ws = FrameBoundary()
                    self.ws_protocol = (head.get(b"sec-websocket-protocol") or b"").strip()
                elif recheck is not None and recheck.exec_like and protocol == b"spdy/3.1":
                    self.spdy_in = spdy.FrameBoundary(read_headers=True)
                    self.spdy_out = spdy.FrameBoundary()
                    self.ws_protocol = (head.get(b"x-stream-protocol-version") or b"").strip()
            else:
                try:
                    self.tracker = framing_for_response(head, self.method)
                except HTTPError:
                    self._fail(502, "the cluster sent a malformed response")
                    return
                self._state = _BODY
            rest = data[end:]
            self.head_sent = True
            closing = self.door.response_started(self)
            if self.streaming:
                head.headers, head.names = [], []  # only its parsed flags are used from here
            self.bytes_out += len(raw)
            if self._state == _RAW:
                self.transport.write(raw)  # verbatim: the agent relays the apiserver's head
                self.door.upgraded(self)
                if rest:
                    self.data_received(rest)
                return
            try:
                taken = self.tracker.feed(rest) if rest else 0
            except HTTPError:
                self.transport.write(raw)
                self._fail(502, "the cluster sent a malformed response body")
                return
            if closing:
                raw = with_connection_close(raw)
            # Head and the body bytes that came with it leave in one write (one TLS record
            # for a small response instead of two): as they came when that is all of them.
            self.bytes_out += taken
            if not taken:
                self.transport.write(raw)
            elif taken == len(rest) and not closing:
                self.transport.write(data)
            else:
                self.transport.write(raw + rest[:taken])
            if taken < len(rest):
                self._fail(502, "the cluster sent more than one response")
                return
            if self.streaming and self._state == _BODY:
                self._end_if_leaving()
            # The agent's EOF ends the exchange.

    # --- gateway shutdown ----------------------------------------------------------------

    def end_stream(self) -> None:
        """The gateway instance is going away: end a watch or ``logs -f`` with the last chunk at
        the next chunk boundary (client-go sees the watch end, not an error, and re-watches
        through another instance), an exec/attach with a Status saying so; as a revocation
        does (:meth:`revoke`, the same boundaries and grace), and cancel the upstream request."""
        self.revoke(SHUTTING_DOWN)

    def end_once_started(self, revoked: Revoked) -> None:
        """End this watch or ``logs -f`` as :meth:`revoke` does, but only once its response
        head has reached the client: what a door decides while the head is being relayed
        (``response_started``) must not put the last chunk before the head."""
        self._end_once_started = revoked

    def _end_if_leaving(self) -> None:
        """A watch or follow just started streaming. If the gateway is going away
        (:meth:`end_once_started`), or its agent session announced DRAIN or GOAWAY while the
        head was on its way -- too early for ``end_follow``, which ends only what streams --
        it ends now, at its first chunk boundary, instead of being cut at the agent's drain
        deadline."""
        revoked = self._end_once_started
        if revoked is None and self.admitted.session.draining:
            revoked = AGENT_LEAVING
        if revoked is not None:
            self.revoke(revoked)

    def end_follow(self, revoked: Revoked) -> None:
        """End a watch or ``logs -f`` (a streamed body, not an upgrade) as :meth:`end_stream`
        does; anything else is left to finish."""
        if self.streaming and self._state == _BODY:
            self.revoke(revoked)

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
        self._cancel_end_timer()
        self.admitted.release()
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
        if self._end_timer is not None:
            self._cancel_end_timer()
        self.admitted.release()
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
            self._cancel_end_timer()
            self.admitted.release()
            self._reset_stream()

    def timed_out(self) -> None:
        if self._state == _HEAD:
            self._fail(504, "the cluster did not answer in time")

    @property
    def done(self) -> bool:
        return self._state == _DONE


    # --- revocation (gateway.hub.revalidation) ----------------------------------------------

    def recheck_on(self) -> Recheck | None:
        return self.admitted.recheck

    def revoke(self, revoked: Revoked) -> None:
        """The hub now refuses this request's caller: end it properly (see
        ``gateway.hub.revalidation``), at the next chunk or frame boundary."""
        state = self._state
        if state == _DONE or self._ending is not None:
            return
        if state == _HEAD:
            self._fail(revoked.status, revoked.message)
            return
        self._ending = revoked
        if state == _BODY and isinstance(self.tracker, ChunkedBody):
            if self.tracker.at_boundary:
                self._end_body()
                return
        elif state == _RAW and self.ws is not None:
            if self.ws.at_boundary:
                self._end_websocket()
                return
        elif state == _RAW and self.spdy_out is not None \
                and self.spdy_in is not None and self.spdy_in.error_stream is not None:
            if self.spdy_out.at_boundary:
                self._end_spdy()
                return
        else:  # SPDY port-forward, another upgrade, a body not chunked: nothing to say in-band
            self._fail(revoked.status, revoked.message)
            return
        self._end_timer = asyncio.get_running_loop().call_later(ENDING_GRACE, self._end_now)

    def _body_to_boundary(self, data: bytes | memoryview) -> None:
        tracker = self.tracker
        assert isinstance(tracker, ChunkedBody)
        try:
            n = tracker.feed(data, until_boundary=True)
        except HTTPError:
            self._fail(502, "the cluster sent a malformed response body")
            return
        if n:
            self._to_client(data[:n])
        if tracker.at_boundary:
            self._end_body()

    def _end_body(self) -> None:
        """The terminating chunk: a clean end of the response (client-go then re-lists)."""
        self._to_client(LAST_CHUNK)
        self._reset_stream()  # cancels the watch on the managed cluster
        assert self.response is not None
        self._finish(keep_alive=self.response.keep_alive)

    def _websocket(self, data: bytes | memoryview) -> None:
        ws = self.ws
        assert ws is not None
        if self._ending is None:
            ws.feed(data)
            self._to_client(data)
            return
        n = ws.feed(data, until_boundary=True)
        if n:
            self._to_client(data[:n])
        if ws.at_boundary:
            self._end_websocket()

    def _end_websocket(self) -> None:
        revoked = self._ending
        assert revoked is not None
        recheck = self.admitted.recheck
        if recheck is not None and recheck.exec_like:
            goodbye = exec_goodbye(self.ws_protocol, revoked.status, revoked.reason,
                                   revoked.message)
        else:  # port-forward, a Service's WebSocket: no error channel to speak on
            goodbye = close_frame(CLOSE_POLICY_VIOLATION, revoked.message)
        self._to_client(goodbye)
        self._reset_stream()
        self._finish(keep_alive=False)

    def _spdy(self, data: bytes | memoryview) -> None:
        out = self.spdy_out
        assert out is not None
        if self._ending is None:
            out.feed(data)
            self._to_client(data)
            return
        n = out.feed(data, until_boundary=True)
        if n:
            self._to_client(data[:n])
        if out.at_boundary:
            self._end_spdy()

    def _end_spdy(self) -> None:
        """The Status (v4/v5) or the message (older) on the exec's error stream, then close."""
        revoked = self._ending
        assert revoked is not None and self.spdy_in is not None
        error_stream = self.spdy_in.error_stream
        assert error_stream is not None
        if self.ws_protocol in STATUS_CHANNEL_PROTOCOLS:
            payload = status_json(revoked.status, revoked.reason, revoked.message)
        else:
            payload = revoked.message.encode()
        self._to_client(spdy.data_frame(error_stream, payload))
        self._reset_stream()
        self._finish(keep_alive=False)

    def _end_now(self) -> None:
        self._end_timer = None
        if self._ending is not None:
            self._fail(self._ending.status, self._ending.message)

    def _cancel_end_timer(self) -> None:
        if self._end_timer is not None:
            self._end_timer.cancel()
            self._end_timer = None
