"""``python -m bench h2client``: the agent's HTTP/2 connection to its apiserver alone (no
sockets), our :class:`gateway.wire.h2client.ClientConnection` against the ``h2`` library it
replaced, configured as the agent had it (validation off, our HPACK encoder, hpack's debug
logging muted). Two workloads, each the best of ``--repeat`` runs:

- ``short request``: send one request's HEADERS (the agent's fields: its bearer credential and
  the impersonation headers), receive its response (a HEADERS block from a Go-like encoder,
  which indexes what it can, and 1 KiB of DATA with END_STREAM) and acknowledge the DATA;
- ``watch event``: one stream, reads of 100 DATA frames of one ~300-byte event each (an
  apiserver flushes each event), acknowledged per read: µs per event.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
from hyperframe.frame import DataFrame, HeadersFrame, SettingsFrame, WindowUpdateFrame

from gateway.ops.diagnostics import MUTED_DEBUG_LOGGERS
from gateway.wire.h2client import ClientConnection, DataReceived
from gateway.wire.hpackfields import FieldEncoder

REQUEST = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"10.96.0.1:443"),
           (b":path", b"/api/v1/namespaces/default/pods/bench"),
           (b"user-agent", b"kubectl/v1.32.0 (linux/amd64) kubernetes/abcdef"),
           (b"accept", b"application/json"),
           (b"x-forwarded-for", b"10.0.0.7"), (b"x-forwarded-proto", b"https"),
           (b"authorization", b"Bearer " + b"a" * 900),
           (b"impersonate-user", b"cluster:hub:system:serviceaccount:team:controller"),
           (b"impersonate-group", b"cluster:hub:system:serviceaccounts"),
           (b"impersonate-group", b"cluster:hub:system:authenticated")]
BODY = b"x" * 1024
EVENT = b'{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"name":"bench"' + \
    b',"namespace":"default","resourceVersion":"123456"},"status":{"phase":"Running"' + \
    b',"podIP":"10.1.2.3"}}}\n' + b" " * 128
EVENTS_PER_READ = 100


def response_frames(count: int, first_stream: int = 1) -> list[bytes]:
    """The server's answers, stream by stream: HEADERS (a Go-like encoder with a dynamic
    table) and one DATA frame with END_STREAM."""
    encoder = hpack.Encoder()
    out = []
    for i in range(count):
        sid = first_stream + 2 * i
        headers = HeadersFrame(sid, flags=["END_HEADERS"])
        headers.data = encoder.encode([
            (":status", "200"), ("audit-id", f"6c5f2a7e-0b5d-4f63-9e1a-{i:012d}"),
            ("cache-control", "no-cache, private"), ("content-type", "application/json"),
            ("x-kubernetes-pf-flowschema-uid", "3c3b4b5e-2b0e-4c6a-8f1e-6b7f4c6d2a11"),
            ("x-kubernetes-pf-prioritylevel-uid", "9a2c1b3d-4e5f-4a6b-8c7d-1e2f3a4b5c6d"),
            ("content-length", "1024"), ("date", "Wed, 25 Nov 2026 10:00:00 GMT")])
        out.append(headers.serialize()
                   + DataFrame(sid, data=BODY, flags=["END_STREAM"]).serialize())
    return out


SETTINGS = SettingsFrame(0, settings={3: 100}).serialize()
WINDOW = WindowUpdateFrame(0, window_increment=2**20).serialize()


def ours() -> Any:
    conn = ClientConnection(max_header_list_size=256 * 1024, connection_window=1 << 30)
    conn.initiate()
    conn.receive_data(SETTINGS)
    conn.data_to_send()
    return conn


def theirs() -> Any:
    """h2, as gateway/agent/h2pool.py configured it before it had its own core."""
    config = h2.config.H2Configuration(
        client_side=True, header_encoding=None, validate_outbound_headers=False,
        normalize_outbound_headers=False, validate_inbound_headers=False,
        normalize_inbound_headers=False)
    conn = h2.connection.H2Connection(config=config)
    conn.encoder = FieldEncoder()
    conn.local_settings = h2.settings.Settings(client=True, initial_values={
        h2.settings.SettingCodes.ENABLE_PUSH: 0,
        h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 256 * 1024})
    conn.initiate_connection()
    conn.increment_flow_control_window((1 << 30) - 65535)
    conn.receive_data(SETTINGS)
    conn.data_to_send()
    return conn


def is_data(event: Any) -> bool:
    return isinstance(event, (DataReceived, h2.events.DataReceived))


def short_requests(conn: Any, count: int) -> float:
    """Seconds for ``count`` requests on ``conn`` (either kind: the calls are alike)."""
    answers = response_frames(count)
    ours_ = isinstance(conn, ClientConnection)
    start = time.perf_counter()
    for answer in answers:
        if ours_:
            sid = conn.send_headers(REQUEST, True)
        else:
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, REQUEST, end_stream=True)
        conn.data_to_send()
        for event in conn.receive_data(answer):
            if is_data(event):
                conn.acknowledge_received_data(event.flow_controlled_length, sid)
        conn.data_to_send()
    return time.perf_counter() - start


def watch_events(conn: Any, reads: int) -> float:
    """Seconds for ``reads`` reads of ``EVENTS_PER_READ`` events on one stream."""
    ours_ = isinstance(conn, ClientConnection)
    if ours_:
        sid = conn.send_headers(REQUEST, False)
    else:
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, REQUEST)
    conn.receive_data(HeadersFrame(sid, data=hpack.Encoder().encode([(":status", "200")]),
                                   flags=["END_HEADERS"]).serialize())
    read = DataFrame(sid, data=EVENT).serialize() * EVENTS_PER_READ
    start = time.perf_counter()
    for _ in range(reads):
        for event in conn.receive_data(read):
            if is_data(event):
                conn.acknowledge_received_data(event.flow_controlled_length, sid)
        conn.data_to_send()
    return time.perf_counter() - start


def best(run: Callable[[Any, int], float], make: Callable[[], Any], count: int,
         repeat: int) -> float:
    return min(run(make(), count) for _ in range(repeat)) / count * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench h2client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000, help="per run (default 5000)")
    parser.add_argument("--reads", type=int, default=200,
                        help=f"reads of {EVENTS_PER_READ} watch events per run (default 200)")
    parser.add_argument("--repeat", type=int, default=5, help="runs, best kept (default 5)")
    args = parser.parse_args(argv)
    for name in MUTED_DEBUG_LOGGERS:  # as the product runs: hpack's debug calls are no-ops
        logging.getLogger(name).debug = lambda *a, **k: None  # type: ignore[method-assign]
    for label, run, count, per in (
            ("short request", short_requests, args.requests, 1),
            ("watch event", watch_events, args.reads, EVENTS_PER_READ)):
        h2s = best(run, theirs, count, args.repeat) / per
        mine = best(run, ours, count, args.repeat) / per
        print(f"{label:<14} h2 library {h2s:6.2f} us, h2client {mine:6.2f} us "
              f"({h2s / mine:.1f}x less)")
    return 0
