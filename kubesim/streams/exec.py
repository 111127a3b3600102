"""`pods/{name}/exec` and `pods/{name}/attach` over WebSocket and over SPDY/3.1.

WebSocket (`GET`, kubectl ≥1.30 default): subprotocols v5/v4/v3/v2/`channel.k8s.io` (and the
base64 text variants); every message is `channel + payload` (0 stdin, 1 stdout, 2 stderr,
3 error/status, 4 resize), see channels.py. v5 adds channel 255: `[255, 0]` from the client
half-closes stdin. v4+ put a JSON Status on channel 3 (Success, NonZeroExitCode with an
ExitCode cause, or InternalError); older versions put only a failure message there. Then we
close the WebSocket.

SPDY (`POST`, `Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version: v4.channel.k8s.io` ...): the
client opens one SPDY stream per channel, named by the `streamType` header (error, stdin, stdout,
stderr, resize); we wait for all the query asks for, run, write the status on the error stream,
FIN every stream, send GOAWAY and close once the client has gone (or after a grace period).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kubesim.streams import container as builtin
from kubesim.streams.channels import ChannelCodec
from kubesim.streams.logs import choose_container
from kubesim.streams.spdy_session import SpdySession, SpdyStream, stop_task
from kubesim.streams.status import (
    error_response,
    exec_exit_code,
    exec_internal_error,
    exec_success,
)
from kubesim.streams.upgrade import negotiate, negotiation_failed, switch_protocols

log = logging.getLogger(__name__)

WS_PROTOCOLS = (
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
)
# kubectl 1.32 offers v5 first over SPDY too; there it means exactly v4 (SPDY half-closes stdin
# with a FIN, so the v5 CLOSE signal has no use), which is what kube-apiserver 1.30+ picks.
SPDY_PROTOCOLS = (
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
)
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
STREAM_CREATION_TIMEOUT = 30.0
CLOSE_GRACE = 2.0


@dataclass(frozen=True)
class ExecRequest:
    command: tuple[str, ...]  # empty for attach
    container: str
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool
    attach: bool


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("true", "1")


def parse_exec_request(
    request: web.Request, pod: dict[str, Any], attach: bool
) -> ExecRequest | web.Response:
    """Query → ExecRequest, or the 400 the apiserver would answer."""
    chosen = choose_container(pod, request.query.get("container"))
    if isinstance(chosen, web.Response):
        return chosen
    command = tuple(request.query.getall("command", []))
    if not attach and not command:
        return error_response(400, "you must specify at least one command for the container")
    opts = ExecRequest(
        command,
        chosen,
        _flag(request, "stdin"),
        _flag(request, "stdout"),
        _flag(request, "stderr"),
        _flag(request, "tty"),
        attach,
    )
    if not (opts.stdin or opts.stdout or opts.stderr):
        return error_response(400, "you must specify at least 1 of stdin, stdout, stderr")
    if opts.tty and opts.stderr:
        # kube-apiserver tolerates this (stderr is merged into stdout with a TTY); so do we.
        opts = ExecRequest(command, chosen, opts.stdin, opts.stdout, False, True, attach)
    return opts


async def _attached_process(proc: builtin.Process) -> int:
    """The container's main process: echoes stdin when attached with -i, else keeps logging."""
    if proc.stdin is not None:
        return await builtin.run(["cat"], proc)
    interval = (
        builtin.annotation_int(proc.pod, "log-interval-ms", builtin.DEFAULT_LOG_INTERVAL_MS)
        / 1000.0
    )
    n = builtin.annotation_int(proc.pod, "log-lines", builtin.DEFAULT_LOG_LINES)
    while True:
        await asyncio.sleep(interval)
        n += 1
        await proc.stdout((builtin.log_line(proc.pod, proc.container, n) + "\n").encode())


async def run_exec(
    opts: ExecRequest,
    pod: dict[str, Any],
    stdin: builtin.ReadStdin | None,
    stdout: builtin.Write,
    stderr: builtin.Write,
) -> tuple[bytes, str | None]:
    """Run the command; returns (v4 status JSON, failure text for v1-v3 or None on success)."""

    async def discard(_data: bytes) -> None:
        return None

    if opts.tty:
        raw_stdout = stdout

        async def stdout(data: bytes) -> None:  # a terminal's ONLCR: \n becomes \r\n
            await raw_stdout(data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))

    proc = builtin.Process(
        pod,
        opts.container,
        stdin if opts.stdin else None,
        stdout if opts.stdout else discard,
        stderr if opts.stderr else (stdout if opts.tty else discard),
        opts.tty,
    )
    try:
        if opts.attach:
            code = await _attached_process(proc)
        else:
            code = await builtin.run(list(opts.command), proc)
    except builtin.CommandNotFound as exc:
        message = (
            "error executing command in container: failed to exec in container: "
            f"OCI runtime exec failed: exec failed: unable to start container process: {exc}: "
            "unknown"
        )
        return exec_internal_error(message), f"Internal error occurred: {message}"
    if code == 0:
        return exec_success(), None
    return exec_exit_code(code), f"command terminated with non-zero exit code: exit status {code}"


# -- WebSocket ---------------------------------------------------------------------------------


async def serve_exec_websocket(
    request: web.Request, pod: dict[str, Any], opts: ExecRequest
) -> web.StreamResponse:
    ws = web.WebSocketResponse(protocols=WS_PROTOCOLS, autoping=True, timeout=CLOSE_GRACE)
    await ws.prepare(request)
    codec = ChannelCodec(ws.ws_protocol or "channel.k8s.io")

    stdin_queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def read_client() -> None:
        try:
            async for msg in ws:
                decoded = codec.decode(msg)
                if decoded is None:
                    continue
                channel, payload = decoded
                if channel == STDIN and payload:
                    stdin_queue.put_nowait(payload)
                elif channel == CLOSE and codec.has_close_signal and payload[:1] == b"\x00":
                    stdin_queue.put_nowait(b"")
                # RESIZE: nothing to resize.
        finally:
            stdin_queue.put_nowait(b"")  # the client is gone: stdin ends too

    async def read_stdin() -> bytes:
        return await stdin_queue.get()

    def writer(channel: int) -> Callable[[bytes], Awaitable[None]]:
        async def write(data: bytes) -> None:
            if data and not ws.closed:
                await codec.send(ws, channel, data)

        return write

    reader = asyncio.ensure_future(read_client())
    command = asyncio.ensure_future(run_exec(opts, pod, read_stdin, writer(STDOUT), writer(STDERR)))
    try:
        # The command ends, or the client disconnects (attach otherwise runs forever).
        await asyncio.wait({reader, command}, return_when=asyncio.FIRST_COMPLETED)
        if not command.done() and (opts.attach or ws.closed):
            await stop_task(command)
        if not command.cancelled():
            status, failure = await command
            if not ws.closed:
                if codec.status_is_json:
                    await codec.send(ws, ERROR, status)
                elif failure:
                    await codec.send(ws, ERROR, failure.encode())
    except ConnectionError as exc:
        log.debug("exec client went away: %s", exc)
    finally:
        await stop_task(reader)
        await stop_task(command)
        with contextlib.suppress(ConnectionError):
            await ws.close()
    return ws


# -- SPDY --------------------------------------------------------------------------------------


async def serve_exec_spdy(
    request: web.Request, pod: dict[str, Any], opts: ExecRequest
) -> web.StreamResponse:
    protocol = negotiate(request, SPDY_PROTOCOLS)
    if protocol is None:
        return negotiation_failed(request, SPDY_PROTOCOLS)
    json_status = protocol in ("v5.channel.k8s.io", "v4.channel.k8s.io")
    expected = {"error"}
    if opts.stdin:
        expected.add("stdin")
    if opts.stdout:
        expected.add("stdout")
    if opts.stderr and not opts.tty:
        expected.add("stderr")
    if opts.tty and protocol in ("v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io"):
        expected.add("resize")

    streams: dict[str, SpdyStream] = {}
    ready = asyncio.Event()

    def on_stream(stream: SpdyStream) -> None:
        stream.reply()
        kind = (stream.header("streamtype") or "").lower()
        streams[kind] = stream
        if expected <= streams.keys():
            ready.set()

    session = SpdySession(on_stream)
    headers = {"Upgrade": "SPDY/3.1"}
    if protocol:
        headers["X-Stream-Protocol-Version"] = protocol
    conn = await switch_protocols(request, headers, session.feed, session.connection_lost)
    session.bind(conn.write, conn.drain)

    closed = asyncio.ensure_future(session.closed.wait())
    try:
        waiter = asyncio.ensure_future(ready.wait())
        await asyncio.wait(
            {waiter, closed}, timeout=STREAM_CREATION_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
        waiter.cancel()
        if not ready.is_set():
            log.info("exec client did not create streams %s (got %s)", expected, set(streams))
            return conn.response

        async def write_to(kind: str, data: bytes) -> None:
            stream = streams.get(kind)
            if stream is not None and data:
                stream.write(data)
                await stream.drain()

        async def out_writer(data: bytes) -> None:
            await write_to("stdout", data)

        async def err_writer(data: bytes) -> None:
            await write_to("stderr", data)

        stdin_stream = streams.get("stdin")
        command = asyncio.ensure_future(
            run_exec(opts, pod, stdin_stream.read if stdin_stream else None, out_writer, err_writer)
        )
        await asyncio.wait({command, closed}, return_when=asyncio.FIRST_COMPLETED)
        if not command.done():
            await stop_task(command)
            return conn.response
        status, failure = command.result()
        if json_status:
            streams["error"].write(status)
        elif failure:
            streams["error"].write(failure.encode())
        for stream in streams.values():
            stream.close()
        session.goaway()
        await conn.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(closed), CLOSE_GRACE)
        return conn.response
    finally:
        closed.cancel()
        session.connection_lost()
        conn.close()
