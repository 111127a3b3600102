"""`GET .../pods/{name}/log`: the built-in container's log, optionally followed.

Like the kubelet: text/plain, chunked, one write (and so one flush) per line; `follow=true`
keeps producing lines until the client goes away; `limitBytes` cuts the stream at exactly that
many bytes (even mid-line); `previous=true` fails because no container has ever restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from kubesim.streams import container as builtin
from kubesim.streams.status import error_response


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("true", "1")


def _int_param(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw in (None, ""):
        return None
    value = int(raw)  # ValueError handled by the caller
    if value < 0:
        raise ValueError(name)
    return value


def choose_container(pod: dict[str, Any], requested: str | None) -> str | web.Response:
    """The container a subresource request means, or the apiserver's 400 for a bad choice."""
    names = builtin.container_names(pod)
    name = builtin.pod_name(pod)
    if requested:
        if requested in names:
            return requested
        return error_response(400, f"container {requested} is not valid for pod {name}")
    if len(names) == 1:
        return names[0]
    if not names:
        return error_response(400, f"pod {name} has no containers")
    return error_response(
        400,
        f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]",
    )


async def serve_log(request: web.Request, pod: dict[str, Any]) -> web.StreamResponse:
    chosen = choose_container(pod, request.query.get("container"))
    if isinstance(chosen, web.Response):
        return chosen
    container = chosen
    try:
        tail = _int_param(request, "tailLines")
        limit = _int_param(request, "limitBytes")
    except ValueError:
        return error_response(400, "tailLines and limitBytes must be non-negative integers")
    if limit == 0:
        return error_response(400, "limitBytes must be greater than zero")
    if _flag(request, "previous"):
        return error_response(
            400,
            f'previous terminated container "{container}" in pod '
            f'"{builtin.pod_name(pod)}" not found',
        )
    follow = _flag(request, "follow")
    timestamps = _flag(request, "timestamps")

    backlog = builtin.annotation_int(pod, "log-lines", builtin.DEFAULT_LOG_LINES)
    interval = (
        builtin.annotation_int(pod, "log-interval-ms", builtin.DEFAULT_LOG_INTERVAL_MS) / 1000.0
    )
    follow_limit = builtin.annotation_int(pod, "log-follow-limit", 0)
    first = 1 if tail is None else max(1, backlog - tail + 1)

    response = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    remaining = limit

    async def emit(n: int, moment: datetime) -> bool:
        """Write line n; False once limitBytes is used up."""
        nonlocal remaining
        line = builtin.log_line(pod, container, n) + "\n"
        if timestamps:
            line = builtin.rfc3339_nano(moment) + " " + line
        data = line.encode()
        if remaining is not None:
            data = data[:remaining]
            remaining -= len(data)
        await response.write(data)
        return remaining is None or remaining > 0

    with contextlib.suppress(ConnectionError):
        for n in range(first, backlog + 1):
            if not await emit(n, builtin.backlog_time(pod, n)):
                return response
        if follow:
            n = backlog
            while follow_limit == 0 or n < backlog + follow_limit:
                await asyncio.sleep(interval)
                if request.transport is None or request.transport.is_closing():
                    break
                n += 1
                if not await emit(n, datetime.now(UTC)):
                    break
        await response.write_eof()
    return response
