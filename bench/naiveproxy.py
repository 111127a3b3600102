"""A naive single-hop aiohttp reverse proxy: the Python baseline issue 5's small-GET goal names.

    python -m bench.naiveproxy --listen HOST:PORT --cert FILE --key FILE
                               --upstream URL --upstream-ca FILE

"Naive" means the code anyone would write first with aiohttp: a ``web`` handler that sends each
request on through one keep-alive ``ClientSession`` and streams the answer back with a
``StreamResponse``. It is not crippled: it runs on uvloop, reuses upstream connections and streams
bodies without buffering them, so the comparison is with aiohttp done plainly, not done badly.
TLS on both sides, as the gateway has. No authentication (the bench upstream needs none).
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys

from aiohttp import ClientSession, TCPConnector, web
from yarl import URL

from bench.proxycli import proxy_arguments, run_until_interrupted

# Hop-by-hop fields (RFC 9110 7.6.1) plus the ones aiohttp computes itself.
DROPPED = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer",
                     "transfer-encoding", "upgrade", "host", "content-length"})


SESSION = web.AppKey("session", ClientSession)


def forwarded_headers(headers: object) -> dict[str, str]:
    return {k: v for k, v in headers.items()  # type: ignore[attr-defined]
            if k.lower() not in DROPPED}


def make_app(upstream: str, upstream_ca: str) -> web.Application:
    app = web.Application()

    async def open_session(app: web.Application) -> None:
        ctx = ssl.create_default_context(cafile=upstream_ca)
        app[SESSION] = ClientSession(connector=TCPConnector(ssl=ctx, limit=0),
                                       auto_decompress=False)

    async def close_session(app: web.Application) -> None:
        await app[SESSION].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        session = request.app[SESSION]
        body = request.content if request.can_read_body else None
        # raw_path: the path and query as sent (path_qs would decode %2F and the like).
        async with session.request(request.method, URL(upstream + request.raw_path, encoded=True),
                                   headers=forwarded_headers(request.headers), data=body,
                                   allow_redirects=False) as answer:
            response = web.StreamResponse(status=answer.status, reason=answer.reason,
                                          headers=forwarded_headers(answer.headers))
            if answer.content_length is not None:
                response.content_length = answer.content_length
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


async def serve(args: argparse.Namespace) -> None:
    host, _, port = args.listen.rpartition(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    runner = web.AppRunner(make_app(args.upstream.rstrip("/"), args.upstream_ca),
                           access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, int(port), ssl_context=ctx).start()
    print(f"naiveproxy ready on {args.listen}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = proxy_arguments("python -m bench.naiveproxy", __doc__.split("\n\n")[0], argv)
    return run_until_interrupted(serve(args))


if __name__ == "__main__":
    sys.exit(main())
