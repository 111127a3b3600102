"""A fast HTTPS stand-in for a kube-apiserver, so the benchmark measures the proxies, not it.

    python -m bench.upstream --listen 127.0.0.1:PORT --cert tls.crt --key tls.key [--workers N]

uvloop + a raw ``asyncio.Protocol`` with pre-built responses; ``--workers`` processes share the
port with ``SO_REUSEPORT``. It prints ``upstream ready on PORT`` once every worker listens.
Answers (HTTP/1.1 keep-alive, pipelining-safe; request bodies are not expected and ignored,
identity and impersonation headers are ignored):

- ``GET /api/v1/namespaces/default/pods/bench`` -- a ~1 KiB Pod as JSON (Content-Length);
- ``GET /api/v1/namespaces/default/pods/bench/log?bytes=N`` -- N bytes of log text, chunked in
  1 MiB chunks, written with back-pressure (``pause_writing``);
- ``GET /api/v1/namespaces/default/pods?watch=1&events=N[&hold=1]`` -- N watch events, one JSON
  event per chunk (each its own write, like an apiserver that flushes every event); with
  ``hold=1`` the response stays open after the events (idle watches) until the client leaves;
- ``GET /bench.json`` -- the same 1 KiB body (what nginx serves statically for comparison);
- anything else -- 404 Status JSON.

Not a Kubernetes implementation: just enough bytes on the wire to look like one.
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
from urllib.parse import parse_qs

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


class Upstream(asyncio.Protocol):
    """One client connection: parse request heads, answer from pre-built bytes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.body: Iterator[bytes] | None = None  # the streaming response in progress
        self.holding = False  # an idle watch: nothing more will be written
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # Large writes must pause us early rather than buffer megabytes per connection.
        self.transport.set_write_buffer_limits(high=4 * MiB, low=1 * MiB)

    def data_received(self, data: bytes) -> None:
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

    def resume_writing(self) -> None:
        self.paused = False
        if self.body is not None:
            self.pump()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.body = None


def _int_param(query: bytes, name: str, default: int) -> int:
    values = parse_qs(query.decode("latin-1")).get(name)
    try:
        return int(values[0]) if values else default
    except ValueError:
        return default


def server_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _worker(host: str, port: int, cert: str, key: str, ready: multiprocessing.Queue) -> None:
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
        server = await loop.create_server(Upstream, sock=sock, ssl=server_context(cert, key),
                                          backlog=4096)
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
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    ready: multiprocessing.Queue = multiprocessing.Queue()
    # fork: workers share nothing but the port (SO_REUSEPORT spreads connections over them).
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_worker, args=(host, int(port), args.cert, args.key, ready),
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
