"""``python -m bench hpackdecode``: µs per header block, our HPACK decoder
(:mod:`gateway.wire.hpackdecode`) against ``hpack``'s, on the blocks the front door sees.

* ``go``: a Go-client-like connection: ``hpack.Encoder`` blocks of the same request fields
  with a new ``:path`` each time (the first block inserts, later ones are mostly indexed);
* ``nghttp2``: h2load's requests: a never-indexed Huffman-coded bearer token (40-60
  characters) each time, the rest indexed; ``nghttp2-new-token``: the same with a different
  token each time (no decoded value to reuse: the Huffman decoder's own cost);
* ``kube-first``: a kubectl-like first block of 12 fields, into an empty table.

``hpack`` runs as the product ran it: ``raw=True``, its debug logging muted as
:mod:`gateway.ops.diagnostics` does. Each figure is the best of ``--repeat`` runs of
``--blocks`` blocks (a new decoder per run: the table state is the connection's).
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from collections.abc import Callable

import hpack

from gateway.wire.hpackdecode import Decoder

LIMIT = 65536
TOKEN_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."
Fields = list[tuple[bytes, bytes]]


def go_blocks(count: int) -> list[bytes]:
    encoder = hpack.Encoder()
    return [encoder.encode([
        (b":authority", b"10.96.0.1:9092"), (b":method", b"GET"),
        (b":path", f"/cluster-{n % 7}/api/v1/namespaces/team-{n % 13}/pods/p{n}".encode()),
        (b":scheme", b"https"), (b"accept", b"application/json, */*"),
        (b"authorization", b"Bearer eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.hubtoken"),
        (b"user-agent", b"kubectl/v1.36.0 (linux/amd64) kubernetes/abcdef0"),
        (b"accept-encoding", b"gzip")], huffman=True) for n in range(count)]


def nghttp2_blocks(count: int, new_token: bool = False) -> list[bytes]:
    rng = random.Random(7)
    encoder = hpack.Encoder()
    blocks, token = [], ""
    for n in range(count):
        if new_token or not n:
            token = "Bearer " + "".join(rng.choices(TOKEN_ALPHABET, k=rng.randint(40, 60)))
        blocks.append(encoder.encode([
            (b":method", b"GET"), (b":path", b"/kind-1/api/v1/namespaces/default/pods"),
            (b":scheme", b"https"), (b":authority", b"127.0.0.1:9092"),
            (b"user-agent", b"h2load nghttp2/1.64.0"),
            hpack.NeverIndexedHeaderTuple(b"authorization", token.encode())]))
    return blocks


def nghttp2_new_token_blocks(count: int) -> list[bytes]:
    return nghttp2_blocks(count, new_token=True)


def kube_first_blocks(count: int) -> list[bytes]:
    fields = [
        (b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"gw.hub.example:9092"),
        (b":path", b"/prod-eu-1/apis/apps/v1/namespaces/payments/deployments?limit=500"),
        (b"accept", b"application/json;as=Table;v=v1;g=meta.k8s.io,application/json"),
        (b"user-agent", b"kubectl/v1.36.0 (linux/amd64) kubernetes/abcdef0"),
        (b"authorization", b"Bearer eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.payload.sig"),
        (b"kubectl-command", b"kubectl get"), (b"kubectl-session", b"3f1c2a9e-7d41-4b8a"),
        (b"accept-encoding", b"gzip"), (b"x-request-id", b"9b2f7c1e-55aa-4e0b-8c3d"),
        (b"content-type", b"application/json")]
    return [hpack.Encoder().encode(fields) for _ in range(count)]


def run(decode_with: Callable[[], Callable[[bytes], object]], blocks: list[bytes],
        repeat: int) -> float:
    """Best µs per block over ``repeat`` runs, each with a fresh decoder."""
    best = float("inf")
    for _ in range(repeat):
        decode = decode_with()
        start = time.perf_counter()
        for block in blocks:
            decode(block)
        best = min(best, time.perf_counter() - start)
    return best / len(blocks) * 1e6


def theirs() -> Callable[[bytes], object]:
    decoder = hpack.Decoder(max_header_list_size=LIMIT)
    return lambda block: decoder.decode(block, raw=True)


def ours() -> Callable[[bytes], object]:
    return Decoder(LIMIT).decode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench hpackdecode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=2000, help="blocks per run (2000)")
    parser.add_argument("--repeat", type=int, default=7, help="runs; the best counts (7)")
    args = parser.parse_args(argv)
    for name in ("hpack.hpack", "hpack.table"):  # as gateway.ops.diagnostics does
        logging.getLogger(name).debug = lambda *a, **k: None  # type: ignore[method-assign]
    print(f"{'blocks':18} {'hpack µs':>9} {'ours µs':>9} {'speedup':>8}")
    for name, make in (("go", go_blocks), ("nghttp2", nghttp2_blocks),
                       ("nghttp2-new-token", nghttp2_new_token_blocks),
                       ("kube-first", kube_first_blocks)):
        blocks = make(args.blocks)
        check = hpack.Decoder(max_header_list_size=LIMIT)
        decoder = Decoder(LIMIT)
        for block in blocks:  # the same fields, or the comparison means nothing
            assert decoder.decode(block) == [tuple(f) for f in check.decode(block, raw=True)]
        slow, fast = run(theirs, blocks, args.repeat), run(ours, blocks, args.repeat)
        print(f"{name:18} {slow:9.2f} {fast:9.2f} {slow / fast:7.1f}x")
    return 0
