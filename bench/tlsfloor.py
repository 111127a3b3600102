"""What one idle TLS connection costs a bare uvloop server: the floor under the gateway's figure.

    python -m bench.tlsfloor --count N --cert FILE --key FILE

The server (this process: uvloop, the ``certs`` package's server context, a protocol that keeps
nothing but its transport) accepts ``count`` connections from a client child process; each
client sends one small request and gets one small answer, as an idle watch does, then stays
open. Prints one JSON line: RSS before and after, bytes per connection, and how many of those
bytes OpenSSL's own per-connection state takes (measured apart, in memory).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import sys

from bench.procstats import rss_mib
from gateway.ops.rlimits import raise_open_file_limit

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


class Idle(asyncio.Protocol):
    """Answers the first request, then holds the connection and nothing else."""

    def __init__(self, held: list[asyncio.BaseTransport]) -> None:
        self.held = held

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.held.append(transport)

    def data_received(self, data: bytes) -> None:
        self.transport.write(ANSWER)  # type: ignore[attr-defined]


async def clients(port: int, count: int, cafile: str) -> None:
    ctx = ssl.create_default_context(cafile=cafile)
    gate = asyncio.Semaphore(200)
    writers = []

    async def one() -> None:
        async with gate:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                           server_hostname="localhost")
            writer.write(b"GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n")
            await reader.readexactly(len(ANSWER))
            writers.append(writer)

    await asyncio.gather(*(one() for _ in range(count)))
    print("OPEN", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def serve(count: int, cert: str, key: str, cafile: str) -> dict[str, float]:
    from certs.tls import server_context

    held: list[asyncio.BaseTransport] = []
    server = await asyncio.get_running_loop().create_server(
        lambda: Idle(held), "127.0.0.1", 0, ssl=server_context(cert, key, None))
    port = server.sockets[0].getsockname()[1]
    await asyncio.sleep(0.2)
    before = rss_mib(os.getpid())
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.tlsfloor", "--client", str(port), "--count", str(count),
        "--cafile", cafile, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert child.stdout is not None and child.stdin is not None
    line = await asyncio.wait_for(child.stdout.readline(), 300)
    if line.strip() != b"OPEN":
        raise RuntimeError("the client did not open its connections")
    await asyncio.sleep(1.0)
    after = rss_mib(os.getpid())
    child.stdin.write(b"done\n")
    await child.stdin.drain()
    await child.wait()
    server.close()
    return {"connections": len(held), "rss_before_mib": before, "rss_after_mib": after,
            "bytes_per_connection": (after - before) * 1024 * 1024 / max(1, len(held)),
            "openssl_bytes_per_connection": openssl_bytes_per_connection(cert, key, cafile)}


def openssl_bytes_per_connection(cert: str, key: str, cafile: str,
                                 count: int = 500) -> float | None:
    """Heap bytes OpenSSL keeps per server connection after a handshake and one exchange.

    In memory (``MemoryBIO`` pairs, no sockets, no event loop) and counted with glibc's
    ``mallinfo2``, so only OpenSSL's and ``ssl``'s allocations are in it: the part of the floor
    that no event loop or proxy code can remove. None where ``mallinfo2`` is missing.
    """
    import ctypes
    import gc

    from certs.tls import server_context

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = MallInfo2

    def in_use() -> int:
        info = mallinfo2()
        return int(info.uordblks + info.hblkhd)

    server_ctx = server_context(cert, key, None)
    client_ctx = ssl.create_default_context(cafile=cafile)

    def connect() -> tuple[ssl.SSLObject, ssl.SSLObject, list[ssl.MemoryBIO]]:
        bios = [ssl.MemoryBIO() for _ in range(4)]  # server in/out, client in/out
        server = server_ctx.wrap_bio(bios[0], bios[1], server_side=True)
        client = client_ctx.wrap_bio(bios[2], bios[3], server_hostname="localhost")

        def pump() -> None:
            bios[0].write(bios[3].read())
            bios[2].write(bios[1].read())

        for _ in range(8):  # the handshake, then the tickets
            for side in (client, server):
                with contextlib.suppress(ssl.SSLWantReadError):
                    side.do_handshake()
            pump()
        client.write(ANSWER)
        pump()
        server.read(len(ANSWER))
        server.write(ANSWER)
        pump()
        client.read(len(ANSWER))
        return server, client, bios

    connect()  # one-time allocations (ciphers, providers) out of the figure
    gc.collect()
    before = in_use()
    pairs = [connect() for _ in range(count)]
    servers = [(server, bios[:2]) for server, _, bios in pairs]
    del pairs  # the client halves go; the servers stay
    gc.collect()
    after = in_use()
    del servers
    return (after - before) / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tlsfloor")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--cafile", required=True)
    parser.add_argument("--client", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    raise_open_file_limit()
    import uvloop

    if args.client:
        uvloop.run(clients(args.client, args.count, args.cafile))
        return 0
    print(json.dumps(uvloop.run(serve(args.count, args.cert, args.key, args.cafile))),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
