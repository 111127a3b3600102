"""A fast HTTPS stand-in for a kube-apiserver, so the benchmark measures the proxies, not it.

    python -m bench.upstream --listen 127.0.0.1:PORT --cert tls.crt --key tls.key [--workers N]

uvloop + a raw ``asyncio.Protocol`` with pre-built responses; ``--workers`` processes share the
port with ``SO_REUSEPORT``. It prints ``upstream ready on PORT`` once every worker listens.
ALPN offers ``h2`` and ``http/1.1`` as kube-apiserver does (``--alpn`` narrows it). Over HTTP/1.1:
keep-alive, pipelining-safe; over HTTP/2 (the front door's sans-IO server core,
``gateway.wire.h2server``, frames written once per read): every request is a stream, responses
sent as the client's windows allow. Request bodies
are not expected and ignored, identity and impersonation headers are ignored. The answers:

- ``GET /api/v1/namespaces/default/pods/bench`` -- a ~1 KiB Pod as JSON (Content-Length);
- ``GET /api/v1/namespaces/default/pods/bench/log?bytes=N`` -- N bytes of log text, chunked in
  1 MiB chunks, written with back-pressure (``pause_writing``);
- ``GET /api/v1/namespaces/default/pods?watch=1&events=N[&hold=1]`` -- N watch events, one JSON
  event per chunk (each its own write, like an apiserver that flushes every event); with
  ``hold=1`` the response stays open after the events (idle watches) until the client leaves;
- ``GET /bench.json`` -- the same 1 KiB body (what nginx serves statically for comparison);
- anything else -- 404 Status JSON.

Not a Kubernetes implementation: just enough bytes on the wire to look like one.

With ``--stats-dir DIR``, each worker writes ``DIR/<pid>.json`` on SIGUSR1: its open and total
connections per protocol (``h1``/``h2``) and open h2 streams, so a benchmark can say what a
client such as the agent negotiated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from gateway.wire.h2server import (
    ConnectionTerminated,
    DataReceived,
    FrameBudget,
    H2ConnectionError,
    RequestReceived,
    ServerConnection,
    StreamReset,
    WindowUpdated,
)

MiB = 1024 * 1024
LOG_CHUNK = MiB
MAX_HEAD = 64 * 1024
POD_PATH = b"/api/v1/namespaces/default/pods/bench"
LOG_PATH = POD_PATH + b"/log"
WATCH_PATH = b"/api/v1/namespaces/default/pods"
DEFAULT_LOG_BYTES = 256 * MiB


def pod_json(size: int = 1024) -> bytes:
    """A Pod object padded (in an annotation) to exactly ``size`` bytes of JSON."""
    pod = {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "bench", "namespace": "default", "uid": "5f3d-bench",
                     "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"app": "bench"}, "annotations": {"pad": ""}},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                 "nodeName": "node-1"},
        "status": {"phase": "Running", "podIP": "10.0.0.1"},
    }
    base = len(json.dumps(pod, separators=(",", ":")).encode())
    pod["metadata"]["annotations"]["pad"] = "x" * max(0, size - base)
    return json.dumps(pod, separators=(",", ":")).encode()


POD = pod_json()
EVENT = json.dumps({"type": "MODIFIED", "object": json.loads(pod_json(512))},
                   separators=(",", ":")).encode() + b"\n"


def _head(status: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    lines = [b"HTTP/1.1 " + status, *(k + b": " + v for k, v in headers)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


JSON = (b"Content-Type", b"application/json")
POD_RESPONSE = _head(b"200 OK", [JSON, (b"Content-Length", str(len(POD)).encode())]) + POD
NOT_FOUND_BODY = (b'{"kind":"Status","apiVersion":"v1","status":"Failure",'
                  b'"reason":"NotFound","code":404}')
NOT_FOUND = _head(b"404 Not Found", [JSON, (b"Content-Length",
                                            str(len(NOT_FOUND_BODY)).encode())]) + NOT_FOUND_BODY
CHUNKED_HEAD = _head(b"200 OK", [JSON, (b"Transfer-Encoding", b"chunked")])
LOG_HEAD = _head(b"200 OK", [(b"Content-Type", b"text/plain"),
                             (b"Transfer-Encoding", b"chunked")])
_LINE = b"2026-01-01T00:00:00.000000000Z bench log line: the quick brown fox jumps over it\n"
LOG_PAYLOAD = (_LINE * (LOG_CHUNK // len(_LINE) + 1))[:LOG_CHUNK]
LOG_FULL_CHUNK = b"%x\r\n" % LOG_CHUNK + LOG_PAYLOAD + b"\r\n"
EVENT_CHUNK = b"%x\r\n" % len(EVENT) + EVENT + b"\r\n"
LAST_CHUNK = b"0\r\n\r\n"


def log_chunks(total: int) -> Iterator[bytes]:
    """The chunked body of ``total`` log bytes (pre-built 1 MiB chunks, then the remainder)."""
    full, rest = divmod(total, LOG_CHUNK)
    for _ in range(full):
        yield LOG_FULL_CHUNK
    if rest:
        yield b"%x\r\n" % rest + LOG_PAYLOAD[:rest] + b"\r\n"
    yield LAST_CHUNK


def watch_chunks(events: int, hold: bool) -> Iterator[bytes]:
    for _ in range(events):
        yield EVENT_CHUNK
    if not hold:
        yield LAST_CHUNK


# Connections per protocol in this worker (written to --stats-dir on SIGUSR1).
STATS: dict[str, int] = {"h1_open": 0, "h1_total": 0, "h2_open": 0, "h2_total": 0,
                         "h2_streams_open": 0, "h2_streams_total": 0}
H2_MAX_STREAMS = 100  # what kube-apiserver announces (--http2-max-streams-per-connection)


class Upstream(asyncio.Protocol):
    """One client connection: parse request heads, answer from pre-built bytes; a connection
    that negotiated ``h2`` is handed to :class:`H2Upstream`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.body: Iterator[bytes] | None = None  # the streaming response in progress
        self.holding = False  # an idle watch: nothing more will be written
        self.paused = False
        self.h2: H2Upstream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # Large writes must pause us early rather than buffer megabytes per connection.
        self.transport.set_write_buffer_limits(high=4 * MiB, low=1 * MiB)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            self.h2 = H2Upstream(self.transport)
            STATS["h2_open"] += 1
            STATS["h2_total"] += 1
        else:
            STATS["h1_open"] += 1
            STATS["h1_total"] += 1

    def data_received(self, data: bytes) -> None:
        if self.h2 is not None:
            self.h2.data_received(data)
            return
        self.buffer = self.buffer + data if self.buffer else data
        if len(self.buffer) > MAX_HEAD and b"\r\n\r\n" not in self.buffer:
            self.transport.close()
            return
        self.serve()

    def serve(self) -> None:
        """Answer every complete request head in the buffer (pipelining), unless streaming."""
        out = []
        while self.body is None and not self.holding:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head, self.buffer = self.buffer[:end], self.buffer[end + 4:]
            line = head.split(b"\r\n", 1)[0]
            parts = line.split(b" ")
            target = parts[1] if len(parts) == 3 else b""
            path, _, query = target.partition(b"?")
            if path == POD_PATH or path == b"/bench.json":
                out.append(POD_RESPONSE)
            elif path == LOG_PATH:
                n = _int_param(query, "bytes", DEFAULT_LOG_BYTES)
                out.append(LOG_HEAD)
                self.body = log_chunks(n)
            elif path == WATCH_PATH and b"watch=" in query:
                events = _int_param(query, "events", 100)
                hold = _int_param(query, "hold", 0) > 0
                out.append(CHUNKED_HEAD)
                self.body = watch_chunks(events, hold)
                self.holding = hold
            else:
                out.append(NOT_FOUND)
        if out:
            self.transport.writelines(out) if len(out) > 1 else self.transport.write(out[0])
        if self.body is not None:
            self.pump()

    def pump(self) -> None:
        body = self.body
        write = self.transport.write
        while body is not None and not self.paused:
            chunk = next(body, None)
            if chunk is None:
                self.body = None
                if not self.holding:
                    self.serve()  # pipelined requests waiting behind the stream
                return
            write(chunk)

    def pause_writing(self) -> None:
        self.paused = True
        if self.h2 is not None:
            self.h2.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.h2 is not None:
            self.h2.resume_writing()
        elif self.body is not None:
            self.pump()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.body = None
        if self.h2 is not None:
            STATS["h2_open"] -= 1
            self.h2.connection_lost()
        else:
            STATS["h1_open"] -= 1


# HTTP/2 ------------------------------------------------------------------------------------------

H2_JSON = [(b":status", b"200"), (b"content-type", b"application/json")]
H2_POD_HEADERS = [*H2_JSON, (b"content-length", str(len(POD)).encode())]
H2_LOG_HEADERS = [(b":status", b"200"), (b"content-type", b"text/plain")]
H2_NOT_FOUND = [(b":status", b"404"), (b"content-type", b"application/json"),
                (b"content-length", str(len(NOT_FOUND_BODY)).encode())]
H2_WINDOW = 16 * MiB  # receive windows: request bodies are ignored, never let them stall


def log_payload(total: int) -> Iterator[bytes]:
    full, rest = divmod(total, LOG_CHUNK)
    for _ in range(full):
        yield LOG_PAYLOAD
    if rest:
        yield LOG_PAYLOAD[:rest]


class H2Stream:
    """A response body in progress on one stream: payload pieces, then END_STREAM unless
    ``hold`` (an idle watch)."""

    __slots__ = ("body", "hold", "piece")

    def __init__(self, body: Iterator[bytes], hold: bool) -> None:
        self.body: Iterator[bytes] | None = body
        self.hold = hold
        self.piece = memoryview(b"")  # the part of the current piece not yet sent


class H2Upstream:
    """One HTTP/2 client connection: the front door's sans-IO server core
    (:class:`gateway.wire.h2server.ServerConnection`, a few µs per request, as a Go server
    would be; the ``h2`` library cost this stand-in more CPU per request than the proxies it
    measures), writes once per read."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        unlimited = 1e12  # a stand-in for the apiserver: no flood budgets
        self.conn = conn = ServerConnection(
            max_concurrent_streams=H2_MAX_STREAMS, max_header_list_size=MiB,
            initial_window_size=H2_WINDOW, connection_window=H2_WINDOW,
            resets=FrameBudget(unlimited, unlimited), answered=FrameBudget(unlimited, unlimited),
            cheap=FrameBudget(unlimited, unlimited))
        conn.initiate()
        self.streams: dict[int, H2Stream] = {}  # streams with a body still to send
        self.paused = False
        transport.write(conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        try:
            events = conn.receive_data(data)
        except H2ConnectionError:
            self.transport.write(conn.data_to_send())
            self.transport.close()
            return
        for event in events:
            if isinstance(event, RequestReceived):
                self.request(event)
            elif isinstance(event, WindowUpdated):
                self.pump()
            elif isinstance(event, DataReceived):
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, StreamReset):
                if self.streams.pop(event.stream_id, None) is not None:
                    STATS["h2_streams_open"] -= 1
            elif isinstance(event, ConnectionTerminated):
                self.transport.close()
                return
        out = conn.data_to_send()
        if out:
            self.transport.write(out)

    def request(self, event: RequestReceived) -> None:
        conn = self.conn
        sid = event.stream_id
        target = next((v for k, v in event.headers if k == b":path"), b"")
        path, _, query = target.partition(b"?")
        if path == POD_PATH or path == b"/bench.json":
            conn.send_headers(sid, H2_POD_HEADERS)
            conn.send_data(sid, POD, end_stream=True)  # 1 KiB: within any window
            return
        if path == LOG_PATH:
            body = log_payload(_int_param(query, "bytes", DEFAULT_LOG_BYTES))
            conn.send_headers(sid, H2_LOG_HEADERS)
            self.stream(sid, H2Stream(body, False))
        elif path == WATCH_PATH and b"watch=" in query:
            events = _int_param(query, "events", 100)
            conn.send_headers(sid, H2_JSON)
            self.stream(sid, H2Stream(iter([EVENT] * events), _int_param(query, "hold", 0) > 0))
        else:
            conn.send_headers(sid, H2_NOT_FOUND)
            conn.send_data(sid, NOT_FOUND_BODY, end_stream=True)

    def stream(self, sid: int, stream: H2Stream) -> None:
        self.streams[sid] = stream
        STATS["h2_streams_open"] += 1
        STATS["h2_streams_total"] += 1
        self.pump_one(sid, stream)

    def pump(self) -> None:
        for sid, stream in list(self.streams.items()):
            if self.paused:
                return
            self.pump_one(sid, stream)

    def pump_one(self, sid: int, stream: H2Stream) -> None:
        """Send as much of the body as the windows and our write buffer allow; each watch
        event is its own DATA frame, as an apiserver flushes every event."""
        conn = self.conn
        queued = 0
        while not self.paused:
            piece = stream.piece
            if not piece:
                nxt = next(stream.body, None) if stream.body is not None else None
                if nxt is None:
                    stream.body = None
                    if not stream.hold:
                        conn.end_stream(sid)
                        del self.streams[sid]
                        STATS["h2_streams_open"] -= 1
                    return  # held: idle watch, stays open
                piece = memoryview(nxt)
            room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size,
                       len(piece))
            if room <= 0:
                stream.piece = piece
                return
            conn.send_data(sid, piece[:room])
            stream.piece = piece[room:]
            queued += room
            if queued >= 256 * 1024:  # hand big bodies to the transport as they go
                queued = 0
                self.transport.write(conn.data_to_send())

    def resume_writing(self) -> None:
        self.paused = False
        self.pump()
        out = self.conn.data_to_send()
        if out:
            self.transport.write(out)

    def connection_lost(self) -> None:
        STATS["h2_streams_open"] -= len(self.streams)
        self.streams.clear()


def write_stats(stats_dir: str) -> None:
    path = Path(stats_dir) / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(STATS))
    tmp.replace(path)


def read_stats(stats_dir: str | Path, pids: list[int], timeout: float = 5.0) -> dict[str, int]:
    """SIGUSR1 to every worker, then their counts summed (what the upstream saw)."""
    stamp = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    files = [Path(stats_dir) / f"{pid}.json" for pid in pids]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(f.exists() and f.stat().st_mtime >= stamp - 0.01 for f in files):
            break
        time.sleep(0.02)
    total: dict[str, int] = {}
    for f in files:
        for key, value in json.loads(f.read_text()).items():
            total[key] = total.get(key, 0) + value
    return total


def _int_param(query: bytes, name: str, default: int) -> int:
    values = parse_qs(query.decode("latin-1")).get(name)
    try:
        return int(values[0]) if values else default
    except ValueError:
        return default


def server_context(cert: str, key: str, alpn: list[str]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(alpn)
    return ctx


def _worker(host: str, port: int, cert: str, key: str, alpn: list[str], stats_dir: str | None,
            ready: multiprocessing.Queue[Any]) -> None:
    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:  # still correct, just slower
        loop_factory = None

    async def serve() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(4096)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Upstream, sock=sock,
                                          ssl=server_context(cert, key, alpn), backlog=4096)
        if stats_dir:
            loop.add_signal_handler(signal.SIGUSR1, write_stats, stats_dir)
        stop = loop.create_future()
        loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
        loop.add_signal_handler(signal.SIGINT, stop.set_result, None)
        ready.put(os.getpid())
        await stop
        server.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--alpn", default="h2,http/1.1",
                        help="ALPN protocols offered, in order (default: %(default)s, as "
                        "kube-apiserver)")
    parser.add_argument("--stats-dir", help="on SIGUSR1 each worker writes its connection "
                        "counts per protocol to DIR/<pid>.json")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    alpn = [p for p in args.alpn.split(",") if p]
    ready: multiprocessing.Queue[Any] = multiprocessing.Queue()
    # fork: workers share nothing but the port (SO_REUSEPORT spreads connections over them).
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_worker, args=(host, int(port), args.cert, args.key, alpn,
                                                         args.stats_dir, ready),
                           daemon=True) for _ in range(max(1, args.workers))]
    for w in workers:
        w.start()
    pids = [ready.get(timeout=30) for _ in workers]
    print(f"upstream ready on {port} workers {' '.join(map(str, pids))}", flush=True)

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping and all(w.is_alive() for w in workers):
        time.sleep(0.2)
    for w in workers:
        if w.is_alive() and w.pid is not None:
            os.kill(w.pid, signal.SIGTERM)
    for w in workers:
        w.join(5)
        if w.is_alive():
            w.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
