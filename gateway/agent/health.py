"""The agent's probe endpoints: ``/healthz`` (the process serves) and ``/readyz``, and its
``/metrics`` (``gateway.agent.metrics``).

``/readyz`` is 200 only while the agent holds a session to the hub AND its kube-apiserver
answered a TLS handshake recently; otherwise 503 with a short reason (no addresses, no
secrets). Served with aiohttp on a separate port from anything user-facing.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

Readiness = Callable[[], tuple[bool, str]]


async def start_health_server(host: str, port: int, readiness: Readiness,
                              metrics: Callable[[], bytes] | None = None) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ready, reason = readiness()
        return web.Response(text=(reason or "ok") + "\n", status=200 if ready else 503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)
    if metrics is not None:
        async def render(_: web.Request) -> web.Response:
            response = web.Response(body=metrics())
            response.content_type = "text/plain"
            response.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
            return response

        app.router.add_get("/metrics", render)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port actually bound (useful with port 0)."""
    for site in runner.sites:
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            return int(server.sockets[0].getsockname()[1])
    raise RuntimeError("health server is not listening")
