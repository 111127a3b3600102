"""Pod streaming subresources of kubesim: log, exec, attach, portforward.

kubesim's server authenticates, impersonates, authorizes and finds the pod, then calls
`serve_pod_subresource(request, subresource, pod)`. Which wire protocol is spoken is decided
here from the request alone:
  log                     plain chunked text/plain
  exec, attach            `Upgrade: websocket` → channel protocol v5/v4/...;
                          `Upgrade: SPDY/3.1` → SPDY streams (X-Stream-Protocol-Version v4...)
  portforward             WebSocket offering `SPDY/3.1+portforward.k8s.io` → tunnelled SPDY;
                          other WebSocket → channel protocol (?ports=...);
                          `Upgrade: SPDY/3.1` → SPDY (X-Stream-Protocol-Version portforward.k8s.io)
Anything else gets the apiserver's 400 "Upgrade request required". kubesim is a test stand-in,
not a production component.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kubesim.streams.exec import parse_exec_request, serve_exec_spdy, serve_exec_websocket
from kubesim.streams.logs import serve_log
from kubesim.streams.portforward import (
    is_tunnel_request,
    serve_portforward_channels,
    serve_portforward_spdy,
    serve_portforward_tunnel,
)
from kubesim.streams.status import error_response

SUBRESOURCES = frozenset({"log", "exec", "attach", "portforward"})

__all__ = ["SUBRESOURCES", "serve_pod_subresource"]


def _upgrade(request: web.Request) -> str:
    connection = request.headers.get("Connection", "").lower()
    if "upgrade" not in [token.strip() for token in connection.split(",")]:
        return ""
    return request.headers.get("Upgrade", "").strip().lower()


async def serve_pod_subresource(
    request: web.Request, subresource: str, pod: dict[str, Any]
) -> web.StreamResponse:
    if subresource == "log":
        if request.method not in ("GET", "HEAD"):
            return error_response(
                405,
                "the server does not allow this method on the requested resource",
                "MethodNotAllowed",
            )
        return await serve_log(request, pod)
    if subresource not in SUBRESOURCES:
        return error_response(404, "the server could not find the requested resource", "NotFound")
    upgrade = _upgrade(request)
    if subresource in ("exec", "attach"):
        opts = parse_exec_request(request, pod, attach=subresource == "attach")
        if isinstance(opts, web.Response):
            return opts
        if upgrade == "websocket":
            return await serve_exec_websocket(request, pod, opts)
        if upgrade == "spdy/3.1":
            return await serve_exec_spdy(request, pod, opts)
    else:
        if upgrade == "websocket":
            if is_tunnel_request(request):
                return await serve_portforward_tunnel(request, pod)
            return await serve_portforward_channels(request, pod)
        if upgrade == "spdy/3.1":
            return await serve_portforward_spdy(request, pod)
    return error_response(400, "Upgrade request required")
