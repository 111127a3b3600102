"""Sans-IO session state machine: streams, windows, half-close, settings, pings, GOAWAY.

Like h11: bytes in (``receive``) -> events out; calls in (``open_stream``, ``send_data``...) ->
bytes out (``data_to_send``). No I/O, no clock except the injected ``clock``.

Guarantees:
- Everything received is bounded: frames are length-checked before buffering (``frames``), OPEN
  metadata/initial data are capped, peer-opened streams and pending opens are limited (excess
  OPENs get OPEN_FAIL OVERLOAD), and PING/SETTINGS/RESET/refused-OPEN rates are limited
  (``FloodError``).
- Per-stream receive credit returns only through ``consumed`` (the adapter calls it when the
  consumer took the bytes); the connection window is returned on receipt, so a stalled stream
  never blocks the others. Credit goes back in batches (at half a window).
- Stream windows auto-tune: when a window's worth was consumed within ~2 RTTs the window
  doubles, up to ``max_stream_window``, while the session and process budgets allow.
- Sending: control frames first, then DATA round-robin with a quantum among streams that have
  both data and window.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tunnel import frames as f
from tunnel.errors import (
    BadStreamId,
    FloodError,
    GoAwayCode,
    OpenErrorCode,
    StreamStateError,
    WindowExceeded,
    WindowOverflow,
)
from tunnel.targets import Target

# Liveness defaults (PROTOCOL.md §8). The agent pings an idle session; the hub's keepalive is
# longer, so while the agent is alive its PINGs keep the hub from pinging and the hub only
# answers: one PING and one PONG per idle session per AGENT_PING_AFTER, not a pair from each
# side (issue 22). The hub still pings an agent that does not (an older or slower one) or has
# gone quiet, and either side declares its peer dead after DEAD_AFTER of silence.
AGENT_PING_AFTER = 3.0
HUB_PING_AFTER = 5.0
DEAD_AFTER = 8.0


class MemoryBudget:
    """Bytes reserved for grown receive windows (beyond the initial window)."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reserve(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def release(self, n: int) -> None:
        self.used = max(0, self.used - n)


# Window growth of every session of a process together (PROTOCOL.md §6). The programs
# size it with --tunnel-memory-budget and hand their own MemoryBudget to every session.
DEFAULT_PROCESS_MEMORY_BUDGET = 1 << 30
PROCESS_BUDGET = MemoryBudget(DEFAULT_PROCESS_MEMORY_BUDGET)


@dataclass
class SessionConfig:
    initial_window: int = f.DEFAULT_INITIAL_WINDOW     # receive window per new stream (advertised)
    max_stream_window: int = 16 * 1024 * 1024          # auto-tuning ceiling per stream
    max_frame_size: int = 256 * 1024                   # largest payload we accept (advertised)
    max_concurrent_streams: int = f.DEFAULT_MAX_CONCURRENT_STREAMS  # peer-opened, advertised
    max_pending_opens: int = 1000                      # peer OPENs we have not answered yet
    max_metadata_size: int = f.DEFAULT_MAX_METADATA_SIZE
    # Liveness (PROTOCOL.md §8): a frozen peer is declared dead within dead_after plus one
    # keepalive tick (tunnel.liveness, at most 0.25 s), under the 10 s operators ask for. The
    # default is the agent's; the hub's is HUB_PING_AFTER (see there).
    ping_after: float = AGENT_PING_AFTER               # PING after this long without a frame
    dead_after: float = DEAD_AFTER                     # session dead after this long without one
    rtt_interval: float = 10.0                         # RTT probe period while streams are open
    session_memory_budget: int = 256 * 1024 * 1024     # window growth budget per session
    # Shared by the process's sessions: one object, not a size (default: PROCESS_BUDGET).
    process_budget: MemoryBudget = field(default=PROCESS_BUDGET, compare=False, repr=False)
    write_high_water: int = 256 * 1024                 # stream send buffer -> pause_writing
    write_low_water: int = 64 * 1024                   # ... -> resume_writing
    quantum: int = 256 * 1024                          # round-robin quantum per stream
    flush_limit: int = 1024 * 1024                     # DATA bytes per flush (then yield)
    max_pings_per_second: int = 50
    max_settings_per_second: int = 10
    max_resets_per_second: int = 2000
    max_refused_per_second: int = 2000
    # Hub side only (0 / 1: not sent): this hub process's id and how many share its address.
    hub_instance: int = 0
    hub_instances: int = 1
    # Hub side, with instance discovery: the live instances (HUB_PEER). The gateway replaces it
    # as instances come and go, so each new session announces the latest set.
    hub_peers: tuple[int, ...] = ()
    # Agent side only (0: not sent): the agent's packed release and its process's random id.
    agent_version: int = 0
    agent_instance: int = 0


# Queued writes of one stream smaller than this are joined into one DATA frame.
COALESCE_BELOW = 16 * 1024



# Events -------------------------------------------------------------------------------------

class Event:
    """What :meth:`Session.receive` reports. Each is a slotted dataclass: its equality and repr
    come from its fields, in pure Python and compiled alike (mypyc keeps no ``__slots__``)."""

    __slots__ = ()


@dataclass(slots=True)
class SettingsReceived(Event):
    settings: dict[int, int]


@dataclass(slots=True)
class StreamOpened(Event):
    """The peer opened a stream; ``data`` is the 0-RTT initial data (a view: copy to keep)."""

    stream_id: int
    target: Target
    metadata: bytes
    data: memoryview | bytes
    fin: bool


@dataclass(slots=True)
class OpenAccepted(Event):
    stream_id: int


@dataclass(slots=True)
class OpenFailed(Event):
    stream_id: int
    code: int
    message: str


@dataclass(slots=True)
class DataReceived(Event):
    """``data`` is a view into the receive buffer: hand it on or copy it, never keep it."""

    stream_id: int
    data: memoryview | bytes
    fin: bool


@dataclass(slots=True)
class StreamResetReceived(Event):
    stream_id: int
    code: int


@dataclass(slots=True)
class StreamClosed(Event):
    """Both directions finished cleanly; the stream is forgotten."""

    stream_id: int


@dataclass(slots=True)
class PongReceived(Event):
    rtt: float


@dataclass(slots=True)
class GoAwayReceived(Event):
    last_stream_id: int
    code: int
    message: str


@dataclass(slots=True)
class DrainReceived(Event):
    pass


# Streams ------------------------------------------------------------------------------------

class StreamState:
    """Per-stream state. Slots and lazily created buffers keep an idle stream small."""

    __slots__ = ("ack_unsent", "acked", "fin_queued", "id", "last_update", "local_open",
                 "recv_target", "recv_unacked", "recv_window", "remote_open", "reserved",
                 "scheduled", "send_buf", "send_buffered", "send_window", "write_paused")

    def __init__(self, stream_id: int, send_window: int, recv_window: int) -> None:
        self.id = stream_id
        self.local_open = True      # we may still send (FIN not yet sent)
        self.remote_open = True     # the peer may still send (FIN not yet received)
        self.fin_queued = False     # write_eof called; FIN goes out after the buffer
        self.acked = False          # accepted (peer-opened) / OPEN_ACK received (ours)
        self.ack_unsent = False     # accepted, its OPEN_ACK waits for the stream's first frame
        self.send_window = send_window
        self.send_buf: deque[memoryview] | None = None
        self.send_buffered = 0
        self.recv_window = recv_window   # credit the peer has right now
        self.recv_target = recv_window   # current window size (auto-tuned)
        self.recv_unacked = 0            # consumed bytes not yet returned
        self.last_update = 0.0
        self.reserved = 0                # budget held for growth beyond the initial window
        self.scheduled = False
        self.write_paused = False


class Session:
    """One side of a session. ``opens_odd``: this side opens odd stream ids (the hub)."""

    __slots__ = ("_conn_recv_unacked", "_control", "_last_local_id", "_last_peer_id",
                 "_local_parity", "_next_id",
                 "_peer_streams", "_pending_in", "_ping_sent", "_ping_seq", "_rates", "_ready",
                 "_writable", "budget", "clock", "config", "conn_recv_window",
                 "conn_send_window", "drain_received", "events", "goaway_received",
                 "goaway_sent", "last_ping", "last_received", "opens_odd", "peer_agent_instance",
                 "peer_agent_version", "peer_hub_instance", "peer_hub_instances",
                 "peer_hub_peers", "peer_initial_window", "peer_max_frame", "peer_max_metadata",
                 "peer_max_streams", "peer_settings_received", "process_budget", "rtt",
                 "streams")

    def __init__(self, config: SessionConfig | None = None, *, opens_odd: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 process_budget: MemoryBudget | None = None) -> None:
        self.config = cfg = config or SessionConfig()
        self.clock = clock
        self.opens_odd = opens_odd
        self._local_parity = 1 if opens_odd else 0  # of the ids this side opens
        self.streams: dict[int, StreamState] = {}
        self._next_id = 1 if opens_odd else 2
        self._last_peer_id = 0
        self._last_local_id = 0
        # Peer's settings (defaults until its SETTINGS arrive).
        self.peer_initial_window = f.DEFAULT_INITIAL_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME_SIZE
        self.peer_max_streams = f.DEFAULT_MAX_CONCURRENT_STREAMS
        self.peer_max_metadata = f.DEFAULT_MAX_METADATA_SIZE
        self.conn_send_window = f.CONNECTION_WINDOW
        self.conn_recv_window = f.CONNECTION_WINDOW
        self._conn_recv_unacked = 0
        self._control: list[bytes | memoryview] = []
        self._ready: deque[StreamState] = deque()
        self._writable: list[int] = []
        self.events: list[Event] = []
        self._pending_in = 0
        self._peer_streams = 0
        self.budget = MemoryBudget(cfg.session_memory_budget)
        self.process_budget = process_budget or cfg.process_budget
        self.last_received = clock()
        self.rtt: float | None = None
        self.last_ping = -math.inf  # when the last PING went out (RTT probes are spaced from it)
        self._ping_sent: dict[bytes, float] = {}
        self._ping_seq = 0
        self._rates: dict[str, list[float]] = {}
        self.goaway_sent = False       # we accept no new streams from the peer
        self.goaway_received: int | None = None  # peer's last stream id
        self.drain_received = False
        settings = {
            f.S_INITIAL_WINDOW: cfg.initial_window,
            f.S_MAX_FRAME_SIZE: cfg.max_frame_size,
            f.S_MAX_CONCURRENT_STREAMS: cfg.max_concurrent_streams,
            f.S_MAX_METADATA_SIZE: cfg.max_metadata_size,
        }
        if cfg.hub_instance:
            settings[f.S_HUB_INSTANCE] = cfg.hub_instance
            settings[f.S_HUB_INSTANCES] = cfg.hub_instances
        if cfg.agent_version:
            settings[f.S_AGENT_VERSION] = cfg.agent_version
        if cfg.agent_instance:
            settings[f.S_AGENT_INSTANCE] = cfg.agent_instance
        self._control.append(f.encode_settings(settings, cfg.hub_peers if cfg.hub_instance
                                               else ()))
        self.peer_settings_received = False
        self.peer_hub_instance = 0  # 0: the hub did not say (a single hub process)
        self.peer_hub_instances = 1
        self.peer_hub_peers: tuple[int, ...] = ()  # (): the hub announces no set (count only)
        self.peer_agent_version = 0  # 0: the agent did not say (an older agent)
        self.peer_agent_instance = 0

    # Receiving ------------------------------------------------------------------------------

    def receive(self, buf: memoryview, max_opens: int | None = None) -> int:
        """Parse complete frames in ``buf``; append events to ``self.events``.

        Stops after ``max_opens`` OPEN frames (so the caller can answer them before the
        pending-opens limit counts them); call again with the rest. Returns the bytes consumed.
        Raises a ``ProtocolError`` subclass on malformed input (the caller should then
        ``fail(exc)`` and close). Event data are views into ``buf``: process the events
        before reusing the buffer.
        """
        consumed = 0
        limit = self.config.max_frame_size
        opens = 0
        for frame, end in f.decode_frames(buf, limit):
            consumed = end
            self._handle(frame)
            if frame.type == f.OPEN and max_opens is not None:
                opens += 1
                if opens >= max_opens:
                    break
        if consumed:
            self.last_received = self.clock()
        return consumed

    def _handle(self, fr: f.Frame) -> None:
        t = fr.type
        if t == f.DATA:
            self._on_data(fr.stream_id, fr.payload, bool(fr.flags & f.FLAG_FIN))
        elif t == f.WINDOW_UPDATE:
            self._on_window_update(fr.stream_id, f.parse_u32(fr.payload))
        elif t == f.OPEN:
            self._on_open(fr)
        elif t == f.OPEN_ACK:
            st = self._own_stream(fr.stream_id)
            if st is not None:
                if st.acked:
                    raise StreamStateError(f"second OPEN_ACK for stream {st.id}")
                st.acked = True
                self.events.append(OpenAccepted(st.id))
        elif t == f.OPEN_FAIL:
            st = self._own_stream(fr.stream_id)
            if st is not None:
                if st.acked:
                    raise StreamStateError(f"OPEN_FAIL after OPEN_ACK on stream {st.id}")
                code, msg = f.parse_open_fail(fr.payload)
                self._forget(st)
                self.events.append(OpenFailed(st.id, code, msg))
        elif t == f.RESET:
            st = self.streams.get(fr.stream_id)
            if st is None or (not st.acked and not self.is_local(st.id)):
                # Only resets that waste our work count as a flood: for streams already gone,
                # or opened by the peer and reset before we accepted them (rapid reset). A
                # reset of an established stream is a client going away; thousands of them at
                # once (an agent draining, a load balancer dropping watchers) are legitimate.
                self._rate("reset", self.config.max_resets_per_second)
            self._check_id_known(fr.stream_id)
            if st is not None:
                if not st.acked and not self.is_local(st.id):
                    self._pending_in -= 1
                self._forget(st)
                self.events.append(StreamResetReceived(st.id, f.parse_u32(fr.payload)))
        elif t == f.PING:
            self._rate("ping", self.config.max_pings_per_second)
            self._control.append(f.encode_pong(fr.payload))
        elif t == f.PONG:
            sent = self._ping_sent.pop(bytes(fr.payload), None)
            if sent is not None:
                self.rtt = max(self.clock() - sent, 1e-6)
                self.events.append(PongReceived(self.rtt))
        elif t == f.SETTINGS:
            if not fr.flags & f.FLAG_ACK:
                self._rate("settings", self.config.max_settings_per_second)
                self._on_settings(*f.parse_settings_and_peers(fr.payload))
        elif t == f.GOAWAY:
            last, code, msg = f.parse_goaway(fr.payload)
            self._on_goaway(last, code, msg)
        elif t == f.DRAIN:
            self.drain_received = True
            self.events.append(DrainReceived())

    def announce_hub_peers(self, peers: tuple[int, ...]) -> None:
        """Hub side: tell the agent the live instances now (HUB_PEER, and HUB_INSTANCES for
        agents that know only the count)."""
        count = max(1, min(len(peers), f.MAX_HUB_INSTANCES))
        self._control.append(f.encode_settings({f.S_HUB_INSTANCES: count},
                                               peers[:f.MAX_HUB_INSTANCES]))

    def _on_settings(self, settings: dict[int, int], peers: tuple[int, ...] = ()) -> None:
        self.peer_initial_window = settings.get(f.S_INITIAL_WINDOW, self.peer_initial_window)
        self.peer_max_frame = settings.get(f.S_MAX_FRAME_SIZE, self.peer_max_frame)
        self.peer_max_streams = settings.get(f.S_MAX_CONCURRENT_STREAMS, self.peer_max_streams)
        self.peer_max_metadata = settings.get(f.S_MAX_METADATA_SIZE, self.peer_max_metadata)
        self.peer_hub_instance = settings.get(f.S_HUB_INSTANCE, self.peer_hub_instance)
        self.peer_hub_instances = settings.get(f.S_HUB_INSTANCES, self.peer_hub_instances)
        self.peer_agent_version = settings.get(f.S_AGENT_VERSION, self.peer_agent_version)
        self.peer_agent_instance = settings.get(f.S_AGENT_INSTANCE, self.peer_agent_instance)
        if peers:
            self.peer_hub_peers = peers
        self.peer_settings_received = True
        self._control.append(f.encode_settings_ack())
        self.events.append(SettingsReceived(settings))

    def _on_open(self, fr: f.Frame) -> None:
        sid = fr.stream_id
        if self.is_local(sid):
            raise BadStreamId(f"peer OPEN with our parity: stream {sid}")
        if sid <= self._last_peer_id:
            raise BadStreamId(f"OPEN stream {sid} <= {self._last_peer_id}: ids never reused")
        self._last_peer_id = sid
        target, metadata, data = f.parse_open(fr.payload, self.config.max_metadata_size)
        n = len(data)
        if n > self.config.initial_window:
            raise WindowExceeded(f"OPEN initial data {n} > stream window")
        self._take_conn_credit(n)
        cfg = self.config
        refuse: tuple[OpenErrorCode, str] | None = None
        if self.goaway_sent:
            refuse = (OpenErrorCode.SHUTTING_DOWN, "session going away")
        elif self._peer_streams >= cfg.max_concurrent_streams:
            refuse = (OpenErrorCode.OVERLOAD, "too many concurrent streams")
        elif self._pending_in >= cfg.max_pending_opens:
            refuse = (OpenErrorCode.OVERLOAD, "too many pending opens")
        if refuse is not None:
            self._rate("refused", cfg.max_refused_per_second)
            self._control.append(f.encode_open_fail(sid, refuse[0], refuse[1]))
            return
        st = StreamState(sid, self.peer_initial_window, cfg.initial_window - n)
        st.last_update = self.clock()
        self.streams[sid] = st
        self._peer_streams += 1
        self._pending_in += 1
        fin = bool(fr.flags & f.FLAG_FIN)
        if fin:
            st.remote_open = False
        self.events.append(StreamOpened(sid, target, metadata, data, fin))

    def _on_data(self, sid: int, data: memoryview, fin: bool) -> None:
        n = len(data)
        self._take_conn_credit(n)
        st = self.streams.get(sid)
        if st is None:
            self._check_id_known(sid)
            return  # stream already reset/closed here: drop (connection credit is returned)
        if not st.remote_open:
            raise StreamStateError(f"DATA on stream {sid} after FIN")
        if n > st.recv_window:
            raise WindowExceeded(f"stream {sid}: {n} bytes > window {st.recv_window}")
        st.recv_window -= n
        if fin:
            st.remote_open = False
        self.events.append(DataReceived(sid, data, fin))
        if fin:
            self._maybe_closed(st)

    def _take_conn_credit(self, n: int) -> None:
        if not n:
            return
        if n > self.conn_recv_window:
            raise WindowExceeded(f"connection: {n} bytes > window {self.conn_recv_window}")
        # Returned on receipt: the connection window only bounds bytes in flight on the wire.
        self._conn_recv_unacked += n
        if self._conn_recv_unacked >= f.CONNECTION_WINDOW // 2:
            self._control.append(f.encode_window_update(0, self._conn_recv_unacked))
            self._conn_recv_unacked = 0
        else:
            self.conn_recv_window -= n
            return
        self.conn_recv_window = f.CONNECTION_WINDOW

    def _on_window_update(self, sid: int, inc: int) -> None:
        if inc == 0:
            raise WindowOverflow(f"WINDOW_UPDATE of 0 on stream {sid}")
        if sid == 0:
            self.conn_send_window += inc
            if self.conn_send_window > f.MAX_WINDOW:
                raise WindowOverflow("connection window beyond 2**31-1")
            return
        st = self.streams.get(sid)
        if st is None:
            self._check_id_known(sid)
            return
        st.send_window += inc
        if st.send_window > f.MAX_WINDOW:
            raise WindowOverflow(f"stream {sid} window beyond 2**31-1")
        self._schedule(st)

    def _on_goaway(self, last: int, code: int, msg: str) -> None:
        self.goaway_received = last
        self.events.append(GoAwayReceived(last, code, msg))
        for st in list(self.streams.values()):
            if self.is_local(st.id) and st.id > last:
                self._forget(st)
                self.events.append(OpenFailed(st.id, OpenErrorCode.SHUTTING_DOWN,
                                              "peer going away"))

    def _own_stream(self, sid: int) -> StreamState | None:
        if not self.is_local(sid):
            raise BadStreamId(f"OPEN answer for peer-parity stream {sid}")
        st = self.streams.get(sid)
        if st is None:
            self._check_id_known(sid)
        return st

    def _check_id_known(self, sid: int) -> None:
        """Frames for streams that existed and were closed are ignored; never-opened ids are not."""
        if sid == 0:
            raise BadStreamId("stream frame on stream 0")
        last = self._last_local_id if self.is_local(sid) else self._last_peer_id
        if sid > last:
            raise BadStreamId(f"frame for stream {sid}, which was never opened")

    def is_local(self, sid: int) -> bool:
        """Stream ``sid`` was opened by this side (its messages to the peer are requests)."""
        return sid & 1 == self._local_parity

    def _rate(self, kind: str, limit: int) -> None:
        now = self.clock()
        slot = self._rates.get(kind)
        if slot is None or now - slot[0] >= 1.0:
            self._rates[kind] = [now, 1.0]
            return
        slot[1] += 1
        if slot[1] > limit:
            raise FloodError(f"more than {limit} {kind} frames per second")

    # Sending --------------------------------------------------------------------------------

    def open_stream(self, target: Target, metadata: bytes, initial_data: bytes = b"",
                    fin: bool = False) -> int:
        """Queue an OPEN; initial data beyond what fits the window/frame is queued as DATA."""
        if len(metadata) > self.peer_max_metadata:
            raise ValueError(f"metadata {len(metadata)} bytes > {self.peer_max_metadata}")
        sid = self._next_id
        if sid > 0x7FFFFFFF:
            raise ValueError("stream ids exhausted; open a new session")
        self._next_id += 2
        self._last_local_id = sid
        st = StreamState(sid, self.peer_initial_window, self.config.initial_window)
        st.last_update = self.clock()
        self.streams[sid] = st
        head = f.encode_open_payload(target, metadata)
        room = max(0, min(self.peer_max_frame - len(head), st.send_window, self.conn_send_window))
        first = initial_data[:room]
        rest = initial_data[room:]
        st.send_window -= len(first)
        self.conn_send_window -= len(first)
        whole_fin = fin and not rest
        payload = head + first
        self._control.append(f.header(f.OPEN, f.FLAG_FIN if whole_fin else 0, sid, len(payload))
                             + payload)
        if whole_fin:
            st.local_open = False
            st.fin_queued = True
        if rest:
            self.send_data(sid, rest)
        if fin and not whole_fin:
            self.send_eof(sid)
        return sid

    def accept(self, sid: int) -> None:
        """Accept a peer's OPEN. Its OPEN_ACK leaves with the stream's first frame (DATA, FIN,
        WINDOW_UPDATE or RESET), in the same write: a short request is then answered with one
        write, not two, and the opener is woken once. Nothing on the opener's side waits for
        the OPEN_ACK itself (the opener may send before it); it keeps the order PROTOCOL.md
        asks for, an answer before any other frame of the stream."""
        st = self.streams.get(sid)
        if st is None or self.is_local(sid) or st.acked:
            return
        st.acked = True
        st.ack_unsent = True
        self._pending_in -= 1
        self._schedule(st)
        self._maybe_closed(st)

    def _send_ack(self, st: StreamState) -> None:
        """The deferred OPEN_ACK, now: the stream is about to send its first frame."""
        st.ack_unsent = False
        self._control.append(f.encode_open_ack(st.id))

    def refuse(self, sid: int, code: int, message: str = "") -> None:
        st = self.streams.get(sid)
        if st is None or self.is_local(sid) or st.acked:
            return
        self._pending_in -= 1
        self._forget(st)
        self._control.append(f.encode_open_fail(sid, code, message))

    def send_data(self, sid: int, data: bytes | bytearray | memoryview) -> int:
        """Queue bytes; returns the stream's unsent buffer size afterwards."""
        st = self.streams.get(sid)
        if st is None or not st.local_open or st.fin_queued:
            return 0
        if not isinstance(data, bytes):
            data = bytes(data)  # the caller may reuse its buffer; bytes are immutable
        if not data:
            return st.send_buffered
        if st.send_buf is None:
            st.send_buf = deque()
        st.send_buf.append(memoryview(data))
        st.send_buffered += len(data)
        self._schedule(st)
        return st.send_buffered

    def send_eof(self, sid: int) -> None:
        st = self.streams.get(sid)
        if st is None or st.fin_queued:
            return
        st.fin_queued = True
        self._schedule(st, force=True)

    def reset(self, sid: int, code: int) -> None:
        st = self.streams.get(sid)
        if st is None:
            return
        if not st.acked and not self.is_local(sid):
            self._pending_in -= 1
        if st.ack_unsent:
            self._send_ack(st)
        self._forget(st)
        self._control.append(f.encode_reset(sid, code))

    def consumed(self, sid: int, n: int) -> None:
        """The consumer took ``n`` bytes of this stream: return credit (batched, auto-tuned)."""
        st = self.streams.get(sid)
        if st is None or not st.remote_open or n <= 0:
            return
        st.recv_unacked += n
        if st.recv_unacked < st.recv_target // 2:
            return
        inc = st.recv_unacked
        now = self.clock()
        cfg = self.config
        rtt = self.rtt
        if (rtt is not None and now - st.last_update < 2 * rtt
                and st.recv_target < cfg.max_stream_window):
            # Half a window went by within two RTTs: the window, not the consumer, is the limit.
            grow = min(st.recv_target, cfg.max_stream_window - st.recv_target)
            if self.budget.reserve(grow):
                if self.process_budget.reserve(grow):
                    st.recv_target += grow
                    st.reserved += grow
                    inc += grow
                else:
                    self.budget.release(grow)
        st.last_update = now
        st.recv_unacked = 0
        st.recv_window += inc
        if st.ack_unsent:
            self._send_ack(st)
        self._control.append(f.encode_window_update(sid, inc))

    def ping(self) -> None:
        self._ping_seq += 1
        opaque = self._ping_seq.to_bytes(8, "big")
        self.last_ping = now = self.clock()
        self._ping_sent[opaque] = now
        if len(self._ping_sent) > 16:  # never answered: forget the oldest
            self._ping_sent.pop(next(iter(self._ping_sent)))
        self._control.append(f.encode_ping(opaque))

    @property
    def ping_outstanding(self) -> bool:
        return bool(self._ping_sent)

    @property
    def pings_sent(self) -> int:
        return self._ping_seq

    def keepalive(self, now: float, early: float = 0.0) -> float | None:
        """Liveness at ``now`` (PROTOCOL.md §8): None if the peer is dead (nothing received for
        ``dead_after``); else queue the PING that is due, if one is, and return when to look
        again. A PING is due after ``ping_after`` of silence (or up to ``early`` before: the
        caller's granularity, so that one look does what a look a tick later would) unless one
        went out since the last frame arrived (one unanswered at a time), and every
        ``rtt_interval`` while streams are open (RTT probes). Receiving does not call this: it
        only moves ``last_received``, which the next look reads; so a look is also due
        ``ping_after`` after an unanswered PING, when its answer has usually come."""
        cfg = self.config
        heard = self.last_received
        if now - heard >= cfg.dead_after:
            return None
        answered = self.last_ping < heard
        keepalive = answered and now - heard >= cfg.ping_after - early
        if keepalive or (self.streams and now - self.last_ping >= cfg.rtt_interval - early):
            self.ping()
            answered = False
        due = heard + cfg.dead_after
        if answered:
            due = min(due, heard + cfg.ping_after)
        elif self.last_ping + cfg.ping_after > now:
            due = min(due, self.last_ping + cfg.ping_after)
        if self.streams:
            due = min(due, self.last_ping + cfg.rtt_interval)
        return due

    def goaway(self, code: int = GoAwayCode.NO_ERROR, message: str = "") -> None:
        if self.goaway_sent:
            return
        self.goaway_sent = True
        self._control.append(f.encode_goaway(self._last_peer_id, code, message))

    def drain(self) -> None:
        self.goaway()
        self._control.append(f.encode_drain())

    def fail(self, exc: Exception) -> None:
        """Queue GOAWAY for a protocol error (the caller then closes)."""
        code = getattr(exc, "code", GoAwayCode.INTERNAL)
        self.goaway_sent = False
        self.goaway(code, str(exc)[:200])

    def _schedule(self, st: StreamState, force: bool = False) -> None:
        if st.scheduled or not st.local_open:
            return
        if not st.acked and not self.is_local(st.id):
            return  # peer-opened: nothing goes out before OPEN_ACK
        if force or (st.send_buffered and st.send_window > 0) or (
                st.fin_queued and not st.send_buffered):
            if st.ack_unsent:
                self._send_ack(st)  # control frames leave first: before this DATA or FIN
            st.scheduled = True
            self._ready.append(st)

    def has_data(self) -> bool:
        return bool(self._control) or self.has_stream_data()

    def has_stream_data(self) -> bool:
        """DATA (or a FIN) is queued and may go now."""
        return bool(self._ready) and self.conn_send_window > 0

    def data_to_send(self, limit: int | None = None) -> list[bytes | memoryview]:
        """Frames to write, control first, then up to ``limit`` DATA bytes round-robin."""
        out: list[bytes | memoryview] = self._control
        self._control = []
        budget = self.config.flush_limit if limit is None else limit
        ready = self._ready
        quantum = self.config.quantum
        max_frame = self.peer_max_frame
        while ready and (budget > 0 or not ready[0].send_buffered):
            if self.conn_send_window <= 0 and ready[0].send_buffered:
                break  # connection window exhausted: wait for WINDOW_UPDATE(0)
            st = ready.popleft()
            st.scheduled = False
            if st.id not in self.streams or not st.local_open:
                continue
            allowance = min(quantum, st.send_window, self.conn_send_window, max(budget, 0))
            sent = 0
            buf = st.send_buf
            while buf and allowance > 0:
                chunk = buf[0]
                n = min(len(chunk), allowance, max_frame)
                if n == len(chunk):
                    buf.popleft()
                    if buf and n < COALESCE_BELOW:
                        # Small writes queued together (a response head, then its body)
                        # leave as one frame: the peer then makes one write, not several.
                        parts = [chunk]
                        room = min(allowance, max_frame, COALESCE_BELOW)
                        while buf and n + len(buf[0]) <= room:
                            parts.append(buf.popleft())
                            n += len(parts[-1])
                        if len(parts) > 1:
                            chunk = memoryview(b"".join(parts))
                else:
                    buf[0] = chunk[n:]
                    chunk = chunk[:n]
                fin = st.fin_queued and not buf
                out.append(f.data_header(st.id, n, fin))
                out.append(chunk)
                allowance -= n
                sent += n
                if fin:
                    st.local_open = False
            if st.local_open and st.fin_queued and not buf:
                out.append(f.data_header(st.id, 0, True))
                st.local_open = False
            if sent:
                st.send_window -= sent
                self.conn_send_window -= sent
                budget -= sent
                was = st.send_buffered
                st.send_buffered -= sent
                if st.write_paused and st.send_buffered <= self.config.write_low_water < was:
                    self._writable.append(st.id)
                if not buf:
                    st.send_buf = None  # lazy: idle streams hold no deque
            if not st.local_open:
                self._maybe_closed(st)
            else:
                self._schedule(st)
        return out

    def take_writable(self) -> list[int]:
        """Streams whose send buffer fell to the low-water mark since the last call."""
        out, self._writable = self._writable, []
        return out

    def _maybe_closed(self, st: StreamState) -> None:
        if st.local_open or st.remote_open or st.id not in self.streams:
            return
        if not st.acked and not self.is_local(st.id):
            return  # the agent still has to answer the OPEN
        self._forget(st)
        self.events.append(StreamClosed(st.id))

    def _forget(self, st: StreamState) -> None:
        if self.streams.pop(st.id, None) is None:
            return
        if not self.is_local(st.id):
            self._peer_streams -= 1
        st.send_buf = None
        st.local_open = False
        if st.reserved:
            self.budget.release(st.reserved)
            self.process_budget.release(st.reserved)
            st.reserved = 0

    def take_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    def close_all(self) -> list[int]:
        """Forget every stream (session ending); returns their ids."""
        ids = list(self.streams)
        for st in list(self.streams.values()):
            self._forget(st)
        self._ready.clear()
        return ids
