"""A raw HTTP/2 client for tests (the ``h2`` library over a real TLS socket): what aiohttp
cannot do (it speaks no HTTP/2), and frames no well-behaved client sends."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings


@dataclass
class Response:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: int | None = None  # RST_STREAM error code from the server
    event: asyncio.Event = field(default_factory=asyncio.Event)


class H2Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 *, auto_ack: bool = True) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False, validate_inbound_headers=False))
        self.responses: dict[int, Response] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = asyncio.Event()
        self.auto_ack = auto_ack  # give flow-control credit back as DATA arrives
        self.events: list[Any] = []
        self.remote_settings = asyncio.Event()
        self._reader_task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, port: int, ca_file: str, *, auto_ack: bool = True,
                      settings: dict[int, int] | None = None) -> H2Client:
        ctx = ssl.create_default_context(cafile=ca_file)
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                       server_hostname="localhost")
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        client = cls(reader, writer, auto_ack=auto_ack)
        if settings:
            client.conn.local_settings = h2.settings.Settings(client=True,
                                                              initial_values=settings)
        client.conn.initiate_connection()
        client.flush()
        client._reader_task = asyncio.ensure_future(client._read())
        async with asyncio.timeout(5):
            await client.remote_settings.wait()
        return client

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def _read(self) -> None:
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                for event in self.conn.receive_data(data):
                    self._event(event)
                self.flush()
        except Exception:
            pass
        finally:
            self.closed.set()
            for response in self.responses.values():
                response.event.set()

    def _event(self, event: Any) -> None:
        self.events.append(event)
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self.remote_settings.set()
        elif isinstance(event, h2.events.ResponseReceived):
            r = self.responses.setdefault(event.stream_id, Response())
            headers = {k.decode(): v.decode() for k, v in event.headers}
            r.status = int(headers.pop(":status"))
            r.headers = headers
            r.event.set()
        elif isinstance(event, h2.events.DataReceived):
            r = self.responses.setdefault(event.stream_id, Response())
            r.body += event.data
            if self.auto_ack:
                self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                    event.stream_id)
            r.event.set()
        elif isinstance(event, h2.events.StreamEnded):
            r = self.responses.setdefault(event.stream_id, Response())
            r.ended = True
            r.event.set()
        elif isinstance(event, h2.events.StreamReset):
            r = self.responses.setdefault(event.stream_id, Response())
            r.reset = int(event.error_code)
            r.event.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event
            for r in self.responses.values():
                r.event.set()

    def start(self, path: str, *, method: str = "GET", token: str | None = None,
              extra: list[tuple[str, str]] | None = None, end_stream: bool = True) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", method), (":scheme", "https"), (":authority", "localhost"),
                   (":path", path)]
        if token:
            headers.append(("authorization", f"Bearer {token}"))
        headers += extra or []
        self.responses[sid] = Response()
        self.conn.send_headers(sid, [(k.encode(), v.encode()) for k, v in headers],
                               end_stream=end_stream)
        self.flush()
        return sid

    async def wait(self, sid: int, predicate: Any = None, timeout: float = 5.0) -> Response:
        r = self.responses[sid]
        predicate = predicate or (lambda r: r.ended or r.reset is not None)
        async with asyncio.timeout(timeout):
            while not predicate(r):
                if self.closed.is_set() or self.goaway is not None:
                    break
                r.event.clear()
                await r.event.wait()
        return r

    async def request(self, path: str, *, method: str = "GET", token: str | None = None,
                      extra: list[tuple[str, str]] | None = None, body: bytes | None = None,
                      timeout: float = 5.0) -> Response:
        sid = self.start(path, method=method, token=token, extra=extra,
                         end_stream=body is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=True)
            self.flush()
        return await self.wait(sid, timeout=timeout)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close_connection()
            self.flush()
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reader_task


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class RawH2:
    """Frames by hand (hyperframe + hpack), for what h2's client state machine would refuse to
    send. Collects every frame the server sends; ``goaway`` is the server's GOAWAY frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import hpack

        self.reader = reader
        self.writer = writer
        self.encoder = hpack.Encoder()
        self.frames: list[Any] = []
        self.goaway: Any = None
        self.closed = asyncio.Event()
        self.changed = asyncio.Event()
        self._task = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, port: int, ca_file: str) -> RawH2:
        from hyperframe.frame import SettingsFrame

        ctx = ssl.create_default_context(cafile=ca_file)
        ctx.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                       server_hostname="localhost")
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        writer.write(PREFACE + SettingsFrame(0).serialize())
        return cls(reader, writer)

    async def _read(self) -> None:
        from hyperframe.frame import Frame, GoAwayFrame, SettingsFrame

        buf = b""
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                buf += data
                while len(buf) >= 9:
                    frame, length = Frame.parse_frame_header(memoryview(buf[:9]))
                    if len(buf) < 9 + length:
                        break
                    frame.parse_body(memoryview(buf[9:9 + length]))
                    buf = buf[9 + length:]
                    self.frames.append(frame)
                    if isinstance(frame, GoAwayFrame):
                        self.goaway = frame
                    if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                        ack = SettingsFrame(0)
                        ack.flags.add("ACK")
                        self.send(ack.serialize())
                self.changed.set()
        except Exception:
            pass
        finally:
            self.closed.set()
            self.changed.set()

    def send(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    def headers_block(self, path: str, token: str | None = None,
                      extra: list[tuple[str, str]] | None = None) -> bytes:
        headers = [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"),
                   (":path", path)]
        if token:
            headers.append(("authorization", f"Bearer {token}"))
        return self.encoder.encode(headers + (extra or []))

    def headers(self, sid: int, block: bytes, *, end_stream: bool = True,
                end_headers: bool = True) -> None:
        from hyperframe.frame import HeadersFrame

        f = HeadersFrame(sid)
        f.data = block
        if end_stream:
            f.flags.add("END_STREAM")
        if end_headers:
            f.flags.add("END_HEADERS")
        self.send(f.serialize())

    async def wait_closed(self, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            await self.closed.wait()

    async def wait_for(self, predicate: Any, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                if self.closed.is_set():
                    return
                self.changed.clear()
                await self.changed.wait()

    def frames_of(self, kind: type, sid: int | None = None) -> list[Any]:
        return [f for f in self.frames if isinstance(f, kind)
                and (sid is None or f.stream_id == sid)]

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
