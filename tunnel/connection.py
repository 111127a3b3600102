"""asyncio adapter: ``TunnelSession`` (a BufferedProtocol per TLS connection) and ``TunnelStream``.

Thin over the sans-IO ``session_state.Session``: received bytes land in one growable buffer
(``get_buffer``/``buffer_updated``), many frames are parsed per read, DATA is handed to
``StreamProtocol.data_received`` as a memoryview slice (consumers must not keep it). Output is
coalesced: every call that produces frames schedules one flush per loop iteration, which writes
control frames first and then up to ``flush_limit`` DATA bytes round-robin with one
``transport.writelines``, small frames joined into one TLS record (``tunnel.tlswrites``). But
every ``WRITE_EVERY_REQUESTS`` complete requests (an OPEN with FIN, or ``write_eof``, on streams
this side opened) are written at once, before the turn ends: the peer starts on them while this
side makes the rest. Without that, a burst of concurrent requests crossed the gateway, the agent
and back as one batch, each process idle while another worked on it (2 CPUs ~35% idle at 16
concurrent requests). Answers keep the turn's one write: they end work rather than start it. No
task per frame, and no timer per session: liveness is one timer per event loop for all its
sessions (``tunnel.liveness``). An idle session owns no receive buffer
(``tunnel.readbuf``).

Stream ids: the session without ``on_open`` (the hub) opens odd ids; a session with ``on_open``
(the agent) would open even ids. Agents never open streams toward the hub today.

Back-pressure: ``StreamProtocol.pause_writing`` when a stream's unsent buffer exceeds
``write_high_water`` (its window is exhausted), ``resume_writing`` at ``write_low_water``; the
TLS transport's own pause_writing stops DATA production for the session (control frames still go).
``TunnelStream.pause_reading`` keeps the bytes in the tunnel (at most one window, since credit
is not returned) and delivers them on ``resume_reading``.

Extensions beyond contracts.md:
- ``ALPN = "hubproxy-tunnel/1"`` (the listener/dialer set it on their SSL contexts).
- ``TunnelSession(config=None, on_open=None, name="")`` (both keyword, both optional);
  ``.config``, ``.name``, ``.close_reason`` (why it closed, e.g. "peer dead"), ``.ping()``,
  ``.rtt``, ``.pings_sent``, ``.receive_buffer_size``, ``.agent_version``/``.agent_instance``
  (from the agent's SETTINGS), ``.on_settings`` (callbacks after each peer SETTINGS),
  ``.bytes_received``/``.bytes_sent`` (TLS payload bytes, frames included), ``.streams_opened``,
  ``.close(reason="closed")``, ``.get_extra_info(name)`` (of the TLS transport).
- ``TunnelStream.accepted``, ``.open_data_follows`` (during ``connection_made``: the OPEN's data
  or FIN is delivered right after it), ``.is_reading()``, ``.get_extra_info(name)``, ``.close()``
  (= write_eof), ``.abort()`` (= reset CANCEL).
- ``open_stream`` raises ``ValueError`` for metadata over the peer's MAX_METADATA_SIZE (a
  programming error); on a closed/draining session it still returns a stream and reports
  ``SessionClosed`` / ``OpenRefused(SHUTTING_DOWN)`` via ``connection_lost`` on the next loop turn.
- Stream ends: ``connection_lost(None)`` once both directions finished (our FIN sent, the peer's
  FIN delivered); ``StreamReset`` after a reset (either side), ``OpenRefused`` after OPEN_FAIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import NamedTuple, Protocol

from tunnel import session_state as ss
from tunnel.errors import (
    GoAwayCode,
    OpenErrorCode,
    OpenRefused,
    ProtocolError,
    ResetCode,
    SessionClosed,
    StreamError,
    StreamReset,
)
from tunnel.liveness import LoopKeepalive, loop_keepalive, tick_for
from tunnel.readbuf import ReceiveBuffer
from tunnel.session_state import SessionConfig
from tunnel.targets import Target
from tunnel.tlswrites import tls_pieces

__all__ = ["OpenRequest", "SessionConfig", "StreamHandle", "StreamOpener", "StreamProtocol",
           "TunnelSession", "TunnelStream"]

log = logging.getLogger("hubproxy.tunnel")

ALPN = "hubproxy-tunnel/1"


class StreamProtocol(Protocol):
    def connection_made(self, stream: TunnelStream) -> None: ...
    def data_received(self, data: bytes | memoryview) -> None: ...
    def eof_received(self) -> None: ...
    def connection_lost(self, exc: StreamError | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


class StreamHandle(Protocol):
    """A stream as the code above the tunnel uses it: :class:`TunnelStream` or a stand-in
    (an interface, so compiled callers take either; see pyproject's [tool.hubproxy.compiled])."""

    def write(self, data: bytes | bytearray | memoryview) -> None: ...
    def write_eof(self) -> None: ...
    def reset(self, code: ResetCode = ResetCode.CANCEL) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class StreamOpener(Protocol):
    """A session as the code above the tunnel uses it: :class:`TunnelSession` or a stand-in."""

    draining: bool

    def open_stream(self, target: Target, metadata: bytes, protocol: StreamProtocol,
                    initial_data: bytes = b"", *, fin: bool = False) -> StreamHandle: ...


class OpenRequest(NamedTuple):
    """A peer's OPEN, as ``on_open`` sees it. A named tuple, not a frozen dataclass: one is
    made per stream, and a frozen dataclass's constructor sets each field through
    object.__setattr__ (three times as long)."""

    stream_id: int
    target: Target
    metadata: bytes


class TunnelStream:
    """Transport-like handle of one stream."""

    __slots__ = ("_eof_pending", "_lost", "_paused", "_pending", "_session", "accepted",
                 "metadata", "open_data_follows", "protocol", "stream_id", "target")

    def __init__(self, session: TunnelSession, stream_id: int, target: Target, metadata: bytes,
                 protocol: StreamProtocol, accepted: bool) -> None:
        self._session = session
        self.stream_id = stream_id
        self.target = target
        self.metadata = metadata
        self.protocol = protocol
        self.accepted = accepted
        self._paused = False
        self._pending: deque[bytes] | None = None  # delivered later (paused), lazily created
        self._eof_pending = False
        self._lost = False
        # True only while ``protocol.connection_made`` runs for a peer's OPEN that carries data
        # or its FIN: they reach the protocol as soon as that call returns (unless it paused
        # reading), so it need not wait a loop turn to see whether they came.
        self.open_data_follows = False

    def __repr__(self) -> str:
        return f"<TunnelStream {self.stream_id} {self.target!r}>"

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._lost:
            return
        core = self._session._core
        size = core.send_data(self.stream_id, data)
        st = core.streams.get(self.stream_id)
        if st is not None and size > core.config.write_high_water and not st.write_paused:
            st.write_paused = True
            self.protocol.pause_writing()
        self._session._schedule_flush()

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        for chunk in chunks:
            self.write(chunk)

    def write_eof(self) -> None:
        if self._lost:
            return
        session = self._session
        core = session._core
        st = core.streams.get(self.stream_id)
        if st is None or st.fin_queued:
            return
        core.send_eof(self.stream_id)
        session._schedule_flush()
        if not st.remote_open and self.alone:
            # The stream's last frame, and no other stream can add to the turn's write: it
            # goes now, not after the rest of the turn (an agent's response complete: its
            # pool bookkeeping, the upstream's acknowledgements). The scheduled flush still
            # runs, to deliver the stream's end; it finds nothing more to write.
            session._write_now()
        elif core.is_local(self.stream_id):
            session._request_complete()

    @property
    def alone(self) -> bool:
        """This is its session's only stream: no other stream's frames can join a write made
        now (at c=1, the common case; with a burst of OPENs in one read, no stream of it is).
        For writing a complete message at once, here and on an upstream, rather than at the
        end of the loop turn, where everything of the turn shares one write."""
        return len(self._session._core.streams) == 1

    def can_write_eof(self) -> bool:
        return True

    def reset(self, code: ResetCode = ResetCode.CANCEL) -> None:
        if self._lost:
            return
        self._session._core.reset(self.stream_id, code)
        self._session._schedule_flush()
        self._session._lose(self, StreamReset(code, "reset locally"))

    def close(self) -> None:
        """Half-close our direction (like write_eof); the stream ends when the peer finishes."""
        self.write_eof()

    def abort(self) -> None:
        self.reset(ResetCode.CANCEL)

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        if not self._paused:
            return
        self._paused = False
        if self._pending or self._eof_pending:
            asyncio.get_running_loop().call_soon(self._deliver_pending)

    def is_reading(self) -> bool:
        return not self._paused

    def _deliver_pending(self) -> None:
        pending = self._pending
        core = self._session._core
        while pending and not self._paused and not self._lost:
            chunk = pending.popleft()
            self.protocol.data_received(chunk)
            core.consumed(self.stream_id, len(chunk))
        if not pending:
            self._pending = None
            if self._eof_pending and not self._paused and not self._lost:
                self._eof_pending = False
                self.protocol.eof_received()
                self._session._finish_if_closed(self)
        self._session._schedule_flush()

    def get_write_buffer_size(self) -> int:
        st = self._session._core.streams.get(self.stream_id)
        return st.send_buffered if st is not None else 0

    def is_closing(self) -> bool:
        st = self._session._core.streams.get(self.stream_id)
        return self._lost or st is None or st.fin_queued

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._session.get_extra_info(name, default)

    def accept(self) -> None:
        if self._lost or self.accepted:
            return
        self.accepted = True
        session = self._session
        core = session._core
        core.accept(self.stream_id)
        if core.has_data():
            # The OPEN_ACK itself waits for the stream's first frame (Session.accept): an
            # accept with nothing queued yet -- a request still on its way to the upstream --
            # needs no flush, and the first write of the answer schedules one.
            session._schedule_flush()
        if core.events:  # only when the accept closed the stream (both sides had finished)
            session._dispatch()

    def refuse(self, code: OpenErrorCode, message: str = "") -> None:
        if self._lost or self.accepted:
            return
        self._session._core.refuse(self.stream_id, code, message)
        self._session._schedule_flush()
        self._session._lose(self, OpenRefused(code, message))


# Complete requests written at once, not with the rest of the loop turn (module docstring).
# Measured through gateway and agent, alternating runs of small GETs against one write per
# turn: every 8 requests gave 1.20x the requests per second at 16 concurrent and 1.32x at 64,
# for 0.92-0.95x the gateway's CPU per request and 0.95-1.02x the agent's; every 4 gained about
# as much for 1.03x and 1.07-1.16x the CPU; counting answers too (the agent's) gained no more
# for 5-8% more agent CPU. (Every request at once, the first of a turn only included, had cost
# 15-18% more CPU per request: the peer read and turned twice as often.)
WRITE_EVERY_REQUESTS = 8


class TunnelSession(asyncio.BufferedProtocol):
    """One multiplexed session over one TLS connection (either side)."""

    # Slots: a hub holds one per agent, thousands of them (issue 22).
    __slots__ = ("_closed_fut", "_core", "_flush_scheduled", "_idle_fut", "_keepalive", "_loop",
                 "_parsing", "_requests_unwritten", "_rx", "_settings_fut", "_streams",
                 "_transport", "_transport_paused", "bytes_received", "bytes_sent",
                 "close_reason", "closed", "config", "connection_error", "draining",
                 "goaway_message", "keepalive_slot", "name", "on_closed", "on_open",
                 "on_peer_draining", "on_settings", "streams_opened")

    def __init__(self, *, config: SessionConfig | None = None,
                 on_open: Callable[[OpenRequest], StreamProtocol | None] | None = None,
                 name: str = "") -> None:
        self.config = config or SessionConfig()
        self.on_open = on_open
        self.name = name
        self._core = ss.Session(self.config, opens_odd=on_open is None)
        self._streams: dict[int, TunnelStream] = {}
        self._transport: asyncio.Transport | None = None
        # Set with the transport in connection_made; used only where a transport exists.
        self._loop: asyncio.AbstractEventLoop
        self._rx = ReceiveBuffer(self.config.max_frame_size)
        self._parsing = False  # in buffer_updated: a nested read (a closing flush) is dropped
        self._flush_scheduled = False
        self._requests_unwritten = 0  # complete requests queued since the last write
        self._settings_fut: asyncio.Future[None] | None = None
        self._transport_paused = False
        self._keepalive: LoopKeepalive | None = None
        self.keepalive_slot = -1  # where the loop's keepalive wheel has this session filed
        self._closed_fut: asyncio.Future[None] | None = None
        self._idle_fut: asyncio.Future[None] | None = None
        self.on_closed: list[Callable[[TunnelSession], None]] = []
        # Called once when the peer announces it is leaving (DRAIN or GOAWAY): streams that
        # never end on their own (watches) can then be ended cleanly by their owner.
        self.on_peer_draining: list[Callable[[TunnelSession], None]] = []
        # Called after each SETTINGS from the peer is applied (the hub's instances may change).
        self.on_settings: list[Callable[[TunnelSession], None]] = []
        self.closed = False
        self.draining = False
        self.close_reason: str = ""
        # What the peer said or did when it ended the session (the agent explains a refusal).
        self.goaway_message: str | None = None  # text of a GOAWAY with an error code
        self.connection_error: BaseException | None = None  # what ended the connection
        # For the operator's view (one add per read / flush / open, never per frame).
        self.bytes_received = 0
        self.bytes_sent = 0
        self.streams_opened = 0

    # Public API ------------------------------------------------------------------------------

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    @property
    def rtt(self) -> float | None:
        return self._core.rtt

    @property
    def pings_sent(self) -> int:
        """PINGs this side has sent (keepalive and RTT probes)."""
        return self._core.pings_sent

    @property
    def receive_buffer_size(self) -> int:
        """Bytes this session holds for reading (0 while idle: ``tunnel.readbuf``)."""
        return self._rx.held

    def get_extra_info(self, name: str, default: object = None) -> object:
        if self._transport is None:
            return default
        return self._transport.get_extra_info(name, default)

    def open_stream(self, target: Target, metadata: bytes, protocol: StreamProtocol,
                    initial_data: bytes = b"", *, fin: bool = False) -> TunnelStream:
        """Open a stream (0-RTT: ``initial_data`` rides in the OPEN). ``protocol.connection_made``
        is called before this returns; refusal arrives as ``connection_lost(OpenRefused)``.
        ``fin``: ``initial_data`` is all this side sends; the OPEN carries the FIN, so the peer
        learns the request is complete from the same frame (a later ``write_eof`` is a no-op)."""
        core = self._core
        unusable = self.closed or self._transport is None
        if unusable or self.draining or core.goaway_received is not None:
            stream = TunnelStream(self, 0, target, metadata, protocol, False)
            protocol.connection_made(stream)
            exc: StreamError = (SessionClosed("session closed") if unusable else
                                OpenRefused(OpenErrorCode.SHUTTING_DOWN, "session draining"))
            stream._lost = True
            asyncio.get_running_loop().call_soon(protocol.connection_lost, exc)
            return stream
        sid = core.open_stream(target, metadata, initial_data, fin)
        self.streams_opened += 1
        stream = TunnelStream(self, sid, target, metadata, protocol, True)
        self._streams[sid] = stream
        protocol.connection_made(stream)
        st = core.streams.get(sid)
        if st is not None and st.send_buffered > self.config.write_high_water:
            st.write_paused = True
            protocol.pause_writing()
        # Written with the loop turn's other frames (one write, so one read and one turn for
        # the peer), not at once, up to WRITE_EVERY_REQUESTS complete ones.
        self._schedule_flush()
        if fin:
            self._request_complete()
        return stream

    def _request_complete(self) -> None:
        """A request is complete in the queue: every WRITE_EVERY_REQUESTS, write now."""
        self._requests_unwritten += 1
        if self._requests_unwritten >= WRITE_EVERY_REQUESTS:
            self._write_now()

    @property
    def hub_instance(self) -> int:
        """The hub process this session reached (0 until its SETTINGS say, or if they don't)."""
        return self._core.peer_hub_instance

    @property
    def hub_instances(self) -> int:
        """How many hub processes share the address this session dialled."""
        return self._core.peer_hub_instances

    @property
    def hub_peers(self) -> tuple[int, ...]:
        """The live hub instances the hub last announced (HUB_PEER); () if it announces none."""
        return self._core.peer_hub_peers

    def announce_hub_peers(self, peers: tuple[int, ...]) -> None:
        """Hub side: send the live instances to the agent (a SETTINGS, see PROTOCOL.md §5)."""
        if self.closed:
            return
        self._core.announce_hub_peers(peers)
        self._schedule_flush()

    @property
    def peer_settings_received(self) -> bool:
        return self._core.peer_settings_received

    @property
    def agent_version(self) -> int:
        """The agent's packed release from its SETTINGS (0: not said, e.g. an older agent)."""
        return self._core.peer_agent_version

    @property
    def agent_instance(self) -> int:
        """The agent process's random id from its SETTINGS (0: not said)."""
        return self._core.peer_agent_instance

    async def wait_peer_settings(self, timeout: float) -> bool:
        """Until the peer's first SETTINGS arrived (True) or ``timeout`` (False)."""
        if self._core.peer_settings_received:
            return True
        if self._settings_fut is None:
            self._settings_fut = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._settings_fut), timeout)
        except TimeoutError:
            return False
        return True

    def ping(self) -> None:
        self._core.ping()
        self._schedule_flush()

    def goaway(self, reason: str = "") -> None:
        self.draining = True
        self._core.goaway(GoAwayCode.NO_ERROR, reason)
        self._schedule_flush()

    async def drain(self, deadline: float) -> None:
        """DRAIN + GOAWAY, wait up to ``deadline`` seconds for streams, reset the rest, close."""
        self.draining = True
        if not self.closed:
            self._core.drain()
            self._schedule_flush()
        if self._streams and not self.closed:
            # Another drain may be waiting already (the agent's SIGTERM while its dialer
            # retires the same session): share its future, or that one would never be set.
            if self._idle_fut is None or self._idle_fut.done():
                self._idle_fut = asyncio.get_running_loop().create_future()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._idle_fut), deadline)
        for stream in list(self._streams.values()):
            stream.reset(ResetCode.SESSION_CLOSED)
        self.close("drained")
        await self.wait_closed()

    def close(self, reason: str = "closed") -> None:
        if self.closed:
            return
        if self._transport is not None and not self._transport.is_closing():
            self._core.goaway(GoAwayCode.NO_ERROR, reason)
            self._transport.writelines(self._core.data_to_send(0))
            self._transport.close()
            # A peer that does not read would keep close() waiting forever.
            self._loop.call_later(2.0, self._transport.abort)
        self._shutdown(SessionClosed(reason))

    async def wait_closed(self) -> None:
        if self._closed_fut is None:
            self._closed_fut = asyncio.get_running_loop().create_future()
            if self.closed and self._transport is None:
                self._closed_fut.set_result(None)
        await asyncio.shield(self._closed_fut)

    # asyncio protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        if self._closed_fut is None:
            self._closed_fut = self._loop.create_future()
        core = self._core
        now = core.last_received = core.clock()
        core.ping()  # first RTT sample
        self._schedule_flush()
        cfg = self.config
        self._keepalive = loop_keepalive(self._loop, tick_for(cfg.ping_after, cfg.dead_after))
        due = core.keepalive(now)
        assert due is not None
        self._keepalive.add(self, due)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._drops_input():
            # asyncio's SSL transport reads once more while it closes, from inside our own
            # buffer_updated: those bytes are dropped (as they were before: a closed session
            # parses nothing).
            return _discard_view()
        return self._rx.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self._drops_input():
            return
        self.bytes_received += nbytes
        rx = self._rx
        view = rx.received(nbytes)
        core = self._core
        parsed = 0
        self._parsing = True
        try:
            end = len(view)
            while parsed < end and not self.closed:
                # A bounded number of OPENs per pass: they get answered (accept) before
                # the next pass counts pending opens.
                consumed = core.receive(view[parsed:], max_opens=64)
                parsed += consumed
                self._dispatch()
                if not consumed:
                    break
        except ProtocolError as exc:
            rx.release()
            self._parsing = False
            log.warning("tunnel session %s: protocol error: %s", self.name, exc)
            self._protocol_failure(exc)
            return
        except BaseException:
            rx.release()  # (a consumer's bug: the transport ends the connection)
            raise
        finally:
            self._parsing = False
        if self.closed:
            rx.release()
            return
        rx.consumed(parsed, view, nbytes)
        self._send_queued()

    def _drops_input(self) -> bool:
        return self._parsing or self.closed

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection_error = exc
        self._shutdown(SessionClosed(f"connection lost: {exc}" if exc else "connection closed"))
        self._transport = None
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)

    def pause_writing(self) -> None:
        self._transport_paused = True

    def resume_writing(self) -> None:
        self._transport_paused = False
        self._schedule_flush()

    # Internals -------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        for ev in self._core.take_events():
            if type(ev) is ss.DataReceived:
                self._on_data(ev.stream_id, ev.data, ev.fin)
            elif type(ev) is ss.StreamOpened:
                self._on_stream_opened(ev)
            elif type(ev) is ss.StreamClosed:
                stream = self._streams.get(ev.stream_id)
                if stream is not None:
                    self._finish_if_closed(stream)
            elif type(ev) is ss.StreamResetReceived:
                stream = self._streams.get(ev.stream_id)
                if stream is not None:
                    self._lose(stream, StreamReset(_reset_code(ev.code), "reset by peer"))
            elif type(ev) is ss.OpenFailed:
                stream = self._streams.get(ev.stream_id)
                if stream is not None:
                    self._lose(stream, OpenRefused(_open_code(ev.code), ev.message))
            elif type(ev) is ss.GoAwayReceived or type(ev) is ss.DrainReceived:
                announced = not self.draining
                self.draining = True
                if type(ev) is ss.GoAwayReceived and ev.code != GoAwayCode.NO_ERROR:
                    self.goaway_message = ev.message
                if announced:
                    self._peer_draining()
            elif type(ev) is ss.SettingsReceived:
                if self._settings_fut is not None and not self._settings_fut.done():
                    self._settings_fut.set_result(None)
                self._callbacks(self.on_settings, "on_settings")

    def _on_data(self, sid: int, data: bytes | memoryview, fin: bool) -> None:
        stream = self._streams.get(sid)
        if stream is None:
            return
        if data:
            if stream._paused or stream._pending:
                if stream._pending is None:
                    stream._pending = deque()
                stream._pending.append(bytes(data))
            else:
                stream.protocol.data_received(data)
                self._core.consumed(sid, len(data))
        if fin:
            if stream._pending:
                stream._eof_pending = True
            elif not stream._lost:
                stream.protocol.eof_received()

    def _on_stream_opened(self, ev: ss.StreamOpened) -> None:
        req = OpenRequest(ev.stream_id, ev.target, ev.metadata)
        protocol = None
        if self.on_open is not None and not self.draining:
            try:
                protocol = self.on_open(req)
            except Exception:
                log.exception("tunnel session %s: on_open failed", self.name)
                self._core.refuse(ev.stream_id, OpenErrorCode.INTERNAL, "internal error")
                return
        if protocol is None:
            code = OpenErrorCode.SHUTTING_DOWN if self.draining else OpenErrorCode.DENIED
            self._core.refuse(ev.stream_id, code, "streams not accepted here"
                              if self.on_open is None else "refused")
            return
        stream = TunnelStream(self, ev.stream_id, ev.target, ev.metadata, protocol, False)
        self._streams[ev.stream_id] = stream
        stream.open_data_follows = bool(ev.data) or ev.fin
        protocol.connection_made(stream)
        stream.open_data_follows = False
        self._on_data(ev.stream_id, ev.data, ev.fin)

    def _finish_if_closed(self, stream: TunnelStream) -> None:
        if stream._lost or stream.stream_id in self._core.streams:
            return
        if stream._pending or stream._eof_pending:
            return  # delivered on resume_reading, then finished
        self._lose(stream, None)

    def _lose(self, stream: TunnelStream, exc: StreamError | None) -> None:
        if stream._lost:
            return
        stream._lost = True
        stream._pending = None
        self._streams.pop(stream.stream_id, None)
        try:
            stream.protocol.connection_lost(exc)
        except Exception:
            log.exception("tunnel session %s: connection_lost raised", self.name)
        if not self._streams and self._idle_fut is not None and not self._idle_fut.done():
            self._idle_fut.set_result(None)

    def _send_queued(self) -> None:
        """Frames were queued: only control frames (an idle session's PING or PONG, window
        updates) go out now, in one write, rather than a loop turn later (a third of an idle
        exchange's cost); DATA waits for the turn's flush, which then takes everything."""
        core = self._core
        if self._flush_scheduled or core.has_stream_data():
            self._schedule_flush()
        elif core.has_data() and self._transport is not None and not self._transport.is_closing():
            self._write_pending()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._transport is not None and not self.closed:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _write_now(self) -> bool:
        """Write what is queued now, if the transport takes writes (False: it does not)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return False
        self._write_pending()
        return True

    def _write_pending(self) -> None:
        """Write what the core has queued (control frames only while the transport is paused)."""
        assert self._transport is not None
        self._requests_unwritten = 0
        chunks = self._core.data_to_send(0 if self._transport_paused else None)
        if chunks:
            self.bytes_sent += sum(map(len, chunks))
            self._transport.writelines(tls_pieces(chunks))

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._write_now():
            return
        core = self._core
        for sid in core.take_writable():
            stream = self._streams.get(sid)
            st = core.streams.get(sid)
            if st is not None:
                st.write_paused = False
            if stream is not None and not stream._lost:
                stream.protocol.resume_writing()
        self._dispatch()
        if not self._transport_paused and core.has_data():
            self._schedule_flush()

    def keepalive_due(self, now: float, verdicts_from: float) -> float | None:
        """The loop's keepalive looks at this session (``tunnel.liveness.Watched``)."""
        if self.closed:
            return None
        core = self._core
        pinged = core.last_ping
        assert self._keepalive is not None
        due = core.keepalive(now, early=self._keepalive.wheel.tick)
        if due is None:
            if now < verdicts_from:
                return verdicts_from  # our own loop was blocked: read before judging
            silent = now - core.last_received
            log.warning("tunnel session %s: silent %.1fs, declaring it dead", self.name, silent)
            self.close_reason = "peer dead"
            if self._transport is not None:
                self._transport.abort()
            self._shutdown(SessionClosed(f"peer silent for {silent:.1f}s"))
            return None
        if core.last_ping != pinged:
            self._send_queued()
        return due

    def _protocol_failure(self, exc: ProtocolError) -> None:
        self._core.fail(exc)
        if self._transport is not None:
            with contextlib.suppress(Exception):
                self._transport.writelines(self._core.data_to_send(0))
            self._transport.close()
            self._loop.call_later(2.0, self._transport.abort)
        self._shutdown(SessionClosed(f"protocol error: {exc}"))

    def _shutdown(self, exc: SessionClosed) -> None:
        if self.closed:
            return
        self.closed = True
        self.draining = True
        if not self.close_reason:
            self.close_reason = str(exc)
        if self._keepalive is not None:
            self._keepalive.remove(self)
        if not self._parsing:
            self._rx.release()
        self._core.close_all()
        for stream in list(self._streams.values()):
            self._lose(stream, exc)
        if self._idle_fut is not None and not self._idle_fut.done():
            self._idle_fut.set_result(None)
        for cb in list(self.on_closed):
            try:
                cb(self)
            except Exception:
                log.exception("tunnel session %s: on_closed callback failed", self.name)

    def _peer_draining(self) -> None:
        self._callbacks(self.on_peer_draining, "on_peer_draining")

    def _callbacks(self, callbacks: list[Callable[[TunnelSession], None]], what: str) -> None:
        for cb in list(callbacks):
            try:
                cb(self)
            except Exception:
                log.exception("tunnel session %s: %s callback failed", self.name, what)


_DISCARD = bytearray(4096)


def _discard_view() -> memoryview:
    """Where bytes a session will not parse are read (never empty: see ``tunnel.readbuf``)."""
    return memoryview(_DISCARD)


def _reset_code(code: int) -> ResetCode:
    # A code this version does not know must not take the session down (as in HTTP/2).
    try:
        return ResetCode(code)
    except ValueError:
        return ResetCode.INTERNAL


def _open_code(code: int) -> OpenErrorCode:
    try:
        return OpenErrorCode(code)
    except ValueError:
        return OpenErrorCode.INTERNAL
