"""A small HTTP/2 server over TLS for the agent's tests (the ``h2`` library, server side).

ALPN offers ``h2`` and ``http/1.1`` (or what the test asks for); over HTTP/1.1 it answers every
request ``404`` with body ``h1`` (enough to see which protocol carried an upgrade). Over HTTP/2
it records what it received and serves a few paths:

* ``/small``: 200 with a Content-Length;
* ``/watch``: 200 without a length, one line at once, then holds the stream open;
* ``/big?n=N``: N bytes without a length, sent as the client's windows allow;
* ``/echo``: 200 with the request body (once the request has ended);
* ``/reset``: RST_STREAM (INTERNAL_ERROR) instead of an answer;
* ``/refuse``: RST_STREAM (REFUSED_STREAM); ``/refuse-first``: that once per connection, then
  ``again``;
* ``/split``: 200 with a Content-Length, END_STREAM 0.1 s after the body (Go does that);
  ``/split-late``: the same, END_STREAM after 10 s;
* ``/events?n=N``: 200 without a length, N small events as N DATA frames in one write;
* ``/short``: 200 with Content-Length 10, then 5 bytes and END_STREAM;
* ``/late``: no answer on the first connection, ``late`` on the others.

Everything it saw is in :class:`H2Server` (connections, heads, bodies, resets and window
updates per stream) for the tests to assert on.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings

# /malformed-<name>: response fields a conforming server never sends (see send_unchecked).
MALFORMED: dict[bytes, list[tuple[bytes, bytes]]] = {
    b"crlf-value": [(b":status", b"200"), (b"x-a", b"1\r\nset-cookie: injected=1")],
    b"lf-value": [(b":status", b"200"), (b"x-a", b"1\nset-cookie: injected=1")],
    b"nul-value": [(b":status", b"200"), (b"x-a", b"1\x00")],
    b"crlf-name": [(b":status", b"200"), (b"set-cookie: injected=1\r\nx-a", b"1")],
    b"upper-name": [(b":status", b"200"), (b"X-Upper", b"1")],
    b"space-name": [(b":status", b"200"), (b"x a", b"1")],
    b"connection": [(b":status", b"200"), (b"connection", b"close")],
    b"transfer-encoding": [(b":status", b"200"), (b"transfer-encoding", b"chunked")],
    b"no-status": [(b"content-type", b"text/plain")],
    b"status-late": [(b"content-type", b"text/plain"), (b":status", b"200")],
    b"two-status": [(b":status", b"200"), (b":status", b"204")],
    b"request-pseudo": [(b":status", b"200"), (b":path", b"/")],
    b"status-2-digits": [(b":status", b"20")],
}


@dataclass
class H2Server:
    host: str
    port: int
    max_streams: int | None = None
    connections: list[ServerConnection] = field(default_factory=list)
    h1_requests: list[bytes] = field(default_factory=list)
    heads: dict[tuple[int, int], dict[bytes, bytes]] = field(default_factory=dict)
    # the request fields as hpack decoded them (NeverIndexedHeaderTuple says how they came)
    fields: dict[tuple[int, int], list[Any]] = field(default_factory=dict)
    bodies: dict[tuple[int, int], bytearray] = field(default_factory=lambda: defaultdict(bytearray))
    resets: list[tuple[int, int, int]] = field(default_factory=list)  # (conn, stream, code)
    window_updates: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    ping_acks: list[bytes] = field(default_factory=list)
    server: asyncio.base_events.Server | None = None

    @property
    def h2_connections(self) -> list[ServerConnection]:
        return [c for c in self.connections if c.alpn == "h2"]


class ServerConnection(asyncio.Protocol):
    def __init__(self, server: H2Server) -> None:
        self.server = server
        self.index = len(server.connections)
        server.connections.append(self)
        self.alpn: str | None = None
        self.transport: Any = None
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.pending: dict[int, bytearray] = {}  # /big: bytes still to send per stream
        self.buffer = b""
        self.refused = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.alpn = transport.get_extra_info("ssl_object").selected_alpn_protocol()
        if self.alpn != "h2":
            return
        if self.server.max_streams is not None:
            self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.server.max_streams})
        self.conn.initiate_connection()
        self.flush()

    def data_received(self, data: bytes) -> None:
        if self.alpn != "h2":
            self.buffer += data
            if b"\r\n\r\n" in self.buffer:
                self.server.h1_requests.append(self.buffer.split(b"\r\n\r\n")[0])
                self.buffer = b""
                self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nh1")
            return
        for event in self.conn.receive_data(data):
            self.event(event)
        self.flush()

    def event(self, event: Any) -> None:
        key = (self.index, getattr(event, "stream_id", 0))
        if isinstance(event, h2.events.RequestReceived):
            head = dict(event.headers)
            self.server.heads[key] = head
            self.server.fields[key] = list(event.headers)
            path = head[b":path"]
            sid = event.stream_id
            if path == b"/small":
                self.respond(sid, [(b"content-length", b"5")], b"small", end=True)
            elif path == b"/watch":
                self.respond(sid, [(b"content-type", b"application/json")], b'{"n":0}\n')
            elif path.startswith(b"/big"):
                size = int(path.partition(b"n=")[2])
                self.respond(sid, [], b"")
                self.pending[sid] = bytearray(b"b" * size)
                self.send_pending(sid)
            elif path in (b"/split", b"/split-late"):  # END_STREAM in a frame of its own later
                self.respond(sid, [(b"content-length", b"5")], b"split")
                asyncio.get_running_loop().call_later(0.1 if path == b"/split" else 10,
                                                      self.end, sid)
            elif path.startswith(b"/events"):
                self.respond(sid, [], b"")
                for i in range(int(path.partition(b"n=")[2])):
                    self.conn.send_data(sid, b'{"n":%d}\n' % i)
            elif path == b"/short":
                self.respond(sid, [(b"content-length", b"10")], b"short", end=True)
            elif path == b"/late":  # not answered on the first connection (see GOAWAY)
                if self.index:
                    self.respond(sid, [(b"content-length", b"4")], b"late", end=True)
            elif path.startswith(b"/malformed-"):  # response fields h2 would refuse to send
                self.send_unchecked(sid, MALFORMED[path.removeprefix(b"/malformed-")])
            elif path == b"/reset":
                self.conn.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
            elif path == b"/refuse" or (path == b"/refuse-first" and not self.refused):
                self.refused += 1
                self.conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            elif path == b"/refuse-first":
                self.respond(sid, [(b"content-length", b"5")], b"again", end=True)
        elif isinstance(event, h2.events.DataReceived):
            self.server.bodies[key] += event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            if self.server.heads.get(key, {}).get(b":path") == b"/echo":
                body = self.server.bodies[key]
                self.respond(event.stream_id, [(b"content-length", b"%d" % len(body))], b"")
                self.pending[event.stream_id] = bytearray(body)  # as the window allows
                self.send_pending(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self.server.resets.append((self.index, event.stream_id, int(event.error_code)))
            self.pending.pop(event.stream_id, None)
        elif isinstance(event, h2.events.PingAckReceived):
            self.server.ping_acks.append(event.ping_data)
        elif isinstance(event, h2.events.WindowUpdated):
            self.server.window_updates[key] += event.delta
            for sid in list(self.pending):
                self.send_pending(sid)

    def respond(self, sid: int, fields: list[tuple[bytes, bytes]], body: bytes,
                end: bool = False) -> None:
        self.conn.send_headers(sid, [(b":status", b"200"), *fields])
        if body:
            self.conn.send_data(sid, body, end_stream=end)
        elif end:
            self.conn.end_stream(sid)

    def send_unchecked(self, sid: int, fields: list[tuple[bytes, bytes]]) -> None:
        """A response HEADERS block exactly as given (h2's own checks of what it sends off)."""
        config = self.conn.config
        config.validate_outbound_headers = config.normalize_outbound_headers = False
        try:
            self.conn.send_headers(sid, fields)
            self.conn.send_data(sid, b"body", end_stream=True)
        finally:
            config.validate_outbound_headers = config.normalize_outbound_headers = True

    def send_pending(self, sid: int) -> None:
        rest = self.pending[sid]
        while rest:
            window = min(self.conn.local_flow_control_window(sid),
                         self.conn.max_outbound_frame_size)
            if window <= 0:
                return
            self.conn.send_data(sid, bytes(rest[:window]))
            del rest[:window]
        self.conn.end_stream(sid)
        del self.pending[sid]

    def goaway(self, last_stream_id: int) -> None:
        # A graceful GOAWAY: the streams up to last_stream_id still finish (h2 would refuse
        # to send their frames once it has sent a GOAWAY, so its state stays open).
        state = self.conn.state_machine.state
        self.conn.close_connection(last_stream_id=last_stream_id)
        self.conn.state_machine.state = state
        self.flush()

    def end(self, sid: int) -> None:
        self.conn.end_stream(sid)
        self.flush()

    def ping(self, data: bytes) -> None:
        self.conn.ping(data)
        self.flush()

    def unsent(self, sid: int) -> int:
        return len(self.pending.get(sid, b""))

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.transport.write(data)


async def start(cert: Any, *, alpn: tuple[str, ...] = ("h2", "http/1.1"),
                max_streams: int | None = None) -> H2Server:
    """``cert`` is a trustme LeafCert for 127.0.0.1."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    context.set_alpn_protocols(list(alpn))
    server = H2Server("127.0.0.1", 0, max_streams)
    loop = asyncio.get_running_loop()
    server.server = await loop.create_server(lambda: ServerConnection(server), "127.0.0.1", 0,
                                             ssl=context)
    server.port = server.server.sockets[0].getsockname()[1]
    return server
