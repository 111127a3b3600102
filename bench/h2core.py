"""``python -m bench h2core``: µs per small request for the front door's HTTP/2 connection
alone (no sockets): receiving one request's HEADERS and sending its response (HEADERS + one
DATA frame with END_STREAM), our :class:`gateway.wire.h2server.ServerConnection` against the
``h2`` library it replaced, configured as the front door had it (validation off, our encoder,
hpack's debug logging muted).

The request blocks are h2load's (an nghttp2 encoder: fields indexed after the first request,
the bearer token a never-indexed literal every time); a WINDOW_UPDATE every 50 requests keeps
the connection's send window open. Each figure is the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import hpack
from hyperframe.frame import HeadersFrame, SettingsFrame, WindowUpdateFrame

from gateway.ops.diagnostics import MUTED_DEBUG_LOGGERS
from gateway.wire.h2server import PREFACE, ServerConnection
from gateway.wire.hpackfields import FieldEncoder

TOKEN = "bench-6e9cc00ee9fa033015d9ede9c417b1b8"
BODY = b"x" * 1024
RESPONSE = [(b":status", b"200"), (b"content-type", b"application/json"),
            (b"content-length", b"1024")]
WINDOW = WindowUpdateFrame(0, window_increment=2**20).serialize()


def request_frames(count: int) -> list[bytes]:
    encoder = hpack.Encoder()
    frames = []
    for i in range(count):
        frame = HeadersFrame(1 + 2 * i)
        frame.flags.add("END_STREAM")
        frame.flags.add("END_HEADERS")
        frame.data = encoder.encode([
            (":method", "GET"), (":scheme", "https"), (":authority", "127.0.0.1:9092"),
            (":path", "/bench/api/v1/namespaces/default/pods/bench"),
            ("user-agent", "h2load nghttp2/1.52.0"),
            hpack.NeverIndexedHeaderTuple("authorization", f"Bearer {TOKEN}")])
        frames.append(frame.serialize())
    return frames


def ours() -> Any:
    conn = ServerConnection(max_concurrent_streams=250, max_header_list_size=65536,
                            connection_window=65535 * 250)
    conn.initiate()
    return conn


def theirs() -> Any:
    config = h2.config.H2Configuration(
        client_side=False, header_encoding=None, validate_inbound_headers=False,
        normalize_inbound_headers=False, validate_outbound_headers=False,
        normalize_outbound_headers=False)
    conn = h2.connection.H2Connection(config=config)
    conn.encoder = FieldEncoder()
    conn.initiate_connection()
    conn.increment_flow_control_window(65535 * 249)
    return conn


def timed(conn: Any, frames: list[bytes]) -> float:
    """Seconds to answer ``frames`` on ``conn`` (either kind: the calls are the same)."""
    conn.receive_data(PREFACE + SettingsFrame(0).serialize())
    conn.data_to_send()
    start = time.perf_counter()
    for i, data in enumerate(frames):
        sid = conn.receive_data(data)[0].stream_id
        conn.send_headers(sid, RESPONSE)
        conn.send_data(sid, BODY, end_stream=True)
        conn.data_to_send()
        if i % 50 == 49:
            conn.receive_data(WINDOW)
    return time.perf_counter() - start


def best(make: Callable[[], Any], count: int, repeat: int) -> float:
    return min(timed(make(), request_frames(count)) for _ in range(repeat)) / count * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench h2core", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000, help="per run (default 5000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs, best kept (default 5)")
    args = parser.parse_args(argv)
    for name in MUTED_DEBUG_LOGGERS:  # as the product runs: hpack's debug calls are no-ops
        logging.getLogger(name).debug = lambda *a, **k: None  # type: ignore[method-assign]
    mine = best(ours, args.requests, args.repeat)
    h2s = best(theirs, args.requests, args.repeat)
    print(f"h2 library  {h2s:6.1f} us per request (receive HEADERS, send HEADERS + DATA)")
    print(f"h2server    {mine:6.1f} us per request ({h2s / mine:.1f}x less)")
    return 0
