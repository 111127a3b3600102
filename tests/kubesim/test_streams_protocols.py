"""kubesim.streams over real TLS sockets with our clients (aiohttp; a SPDY client on our framer).

kubectl-driven tests live in test_streams_kubectl.py; these pin the wire details that kubectl
does not show: channel bytes, Status JSON, close signals, port prefixes, error codes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from kubesim.streams import spdy
from tests.kubesim.test_streams_support import PODS, StreamsServer, make_pod, streams_server
from tests.support import free_port

POD = "/api/v1/namespaces/default/pods"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[StreamsServer]:
    async with streams_server(tmp_path) as running:
        yield running


@pytest.fixture
async def http(server: StreamsServer) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(ssl=server.client_ssl)
    async with aiohttp.ClientSession(
        server.url, connector=connector, timeout=aiohttp.ClientTimeout(total=15)
    ) as session:
        yield session


# -- logs ----------------------------------------------------------------------------------------


async def test_log_backlog_is_plain_chunked_text(http: aiohttp.ClientSession) -> None:
    async with http.get(f"{POD}/web/log") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/plain"
        assert resp.headers["Transfer-Encoding"] == "chunked"
        body = await resp.text()
    assert body.splitlines() == [f"line {n} web/main" for n in range(1, 11)]


async def test_log_tail_timestamps_and_limit_bytes(http: aiohttp.ClientSession) -> None:
    async with http.get(f"{POD}/web/log", params={"tailLines": "2", "timestamps": "true"}) as r:
        assert (await r.text()).splitlines() == [
            "2026-01-01T00:00:09.000000000Z line 9 web/main",
            "2026-01-01T00:00:10.000000000Z line 10 web/main",
        ]
    async with http.get(f"{POD}/web/log", params={"limitBytes": "20"}) as r:
        assert await r.read() == b"line 1 web/main\nline"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"previous": "true"}, 'previous terminated container "main" in pod "web" not found'),
        ({"container": "nope"}, "container nope is not valid for pod web"),
        ({"tailLines": "x"}, "tailLines and limitBytes must be non-negative integers"),
    ],
)
async def test_log_errors_are_400_status(
    http: aiohttp.ClientSession, params: dict[str, str], message: str
) -> None:
    async with http.get(f"{POD}/web/log", params=params) as resp:
        assert resp.status == 400
        status = await resp.json()
    assert status["kind"] == "Status" and status["apiVersion"] == "v1"
    assert (status["status"], status["reason"], status["code"]) == ("Failure", "BadRequest", 400)
    assert status["message"] == message


async def test_log_of_multi_container_pod_needs_a_container(http: aiohttp.ClientSession) -> None:
    async with http.get(f"{POD}/two/log") as resp:
        assert resp.status == 400
        assert (await resp.json())["message"] == (
            "a container name must be specified for pod two, choose one of: [a b]"
        )
    async with http.get(f"{POD}/two/log", params={"container": "b", "tailLines": "1"}) as resp:
        assert await resp.text() == "line 10 two/b\n"


async def test_log_follow_streams_each_line_as_it_is_produced(http: aiohttp.ClientSession) -> None:
    # Pod "fast": 3 backlog lines, then one every 20 ms. Read 5 followed lines, then hang up.
    async with http.get(f"{POD}/fast/log", params={"follow": "true"}) as resp:
        lines, arrivals = [], []
        while len(lines) < 8:
            line = await asyncio.wait_for(resp.content.readline(), 5)
            lines.append(line.decode().rstrip("\n"))
            arrivals.append(time.monotonic())
    assert lines == [f"line {n} fast/main" for n in range(1, 9)]
    # Not buffered: the followed lines arrive spread out, not in one burst at the end.
    assert arrivals[-1] - arrivals[3] >= 0.05


# -- exec over WebSocket -----------------------------------------------------------------------


async def _ws_exec(
    http: aiohttp.ClientSession,
    command: list[str],
    *,
    protocol: str,
    stdin: bytes | None = None,
    close_stdin: bool = True,
    **flags: str,
) -> tuple[dict[int, bytes], list[bytes]]:
    params = (
        [("command", c) for c in command]
        + [("stdout", "true"), ("stderr", "true")]
        + list(flags.items())
    )
    if stdin is not None:
        params.append(("stdin", "true"))
    channels: dict[int, bytes] = {}
    status: list[bytes] = []
    async with http.ws_connect(f"{POD}/web/exec", params=params, protocols=(protocol,)) as ws:
        assert ws.protocol == protocol
        if stdin is not None:
            await ws.send_bytes(b"\x00" + stdin)
            if close_stdin:
                await ws.send_bytes(b"\xff\x00")
        async for msg in ws:
            assert msg.type == aiohttp.WSMsgType.BINARY
            if msg.data[0] == 3:
                status.append(msg.data[1:])
            else:
                channels[msg.data[0]] = channels.get(msg.data[0], b"") + msg.data[1:]
    return channels, status


async def test_v5_exec_echo_reports_success_status(http: aiohttp.ClientSession) -> None:
    channels, status = await _ws_exec(http, ["echo", "hi", "there"], protocol="v5.channel.k8s.io")
    assert channels == {1: b"hi there\n"}
    assert [json.loads(s) for s in status] == [{"metadata": {}, "status": "Success"}]


async def test_v5_close_signal_ends_stdin_of_cat(http: aiohttp.ClientSession) -> None:
    channels, status = await _ws_exec(http, ["cat"], protocol="v5.channel.k8s.io", stdin=b"abc\n")
    assert channels == {1: b"abc\n"}
    assert json.loads(status[0])["status"] == "Success"


async def test_v4_exit_code_and_stderr(http: aiohttp.ClientSession) -> None:
    channels, status = await _ws_exec(
        http, ["sh", "-c", "echo out; echo err >&2; exit 7"], protocol="v4.channel.k8s.io"
    )
    assert channels == {1: b"out\n", 2: b"err\n"}
    (body,) = [json.loads(s) for s in status]
    assert body["status"] == "Failure" and body["reason"] == "NonZeroExitCode"
    assert body["details"]["causes"] == [{"reason": "ExitCode", "message": "7"}]


async def test_unknown_executable_is_an_internal_error_status(http: aiohttp.ClientSession) -> None:
    _, status = await _ws_exec(http, ["nosuch"], protocol="v4.channel.k8s.io")
    body = json.loads(status[0])
    assert (body["reason"], body["code"]) == ("InternalError", 500)
    assert 'exec: "nosuch": executable file not found in $PATH' in body["message"]


async def test_v1_channel_protocol_sends_only_failure_text(http: aiohttp.ClientSession) -> None:
    channels, status = await _ws_exec(
        http, ["sh", "-c", "printf '%s-%d' a 5; false"], protocol="channel.k8s.io"
    )
    assert channels == {1: b"a-5"}
    assert status == [b"command terminated with non-zero exit code: exit status 1"]
    _, ok = await _ws_exec(http, ["true"], protocol="channel.k8s.io")
    assert ok == []


async def test_shell_builtins_see_the_pod(http: aiohttp.ClientSession) -> None:
    channels, _ = await _ws_exec(
        http,
        ["/bin/sh", "-c", "whoami && hostname; echo $GREETING $HOSTNAME; false || echo x"],
        protocol="v5.channel.k8s.io",
    )
    assert channels[1] == b"root\nweb\nhello web\nx\n"


async def test_exec_without_command_or_upgrade_is_400(http: aiohttp.ClientSession) -> None:
    async with http.post(f"{POD}/web/exec", params={"stdout": "true"}) as resp:
        assert resp.status == 400
        assert (await resp.json())["message"] == (
            "you must specify at least one command for the container"
        )
    async with http.post(f"{POD}/web/exec", params={"command": "ls", "stdout": "true"}) as resp:
        assert resp.status == 400
        assert (await resp.json())["message"] == "Upgrade request required"


async def test_attach_with_stdin_echoes_and_ends_on_close_signal(
    http: aiohttp.ClientSession,
) -> None:
    params = {"stdin": "true", "stdout": "true"}
    async with http.ws_connect(
        f"{POD}/web/attach", params=params, protocols=("v5.channel.k8s.io",)
    ) as ws:
        await ws.send_bytes(b"\x00ping\n")
        msg = await ws.receive(timeout=5)
        assert msg.data == b"\x01ping\n"
        await ws.send_bytes(b"\xff\x00")
        msg = await ws.receive(timeout=5)
        assert msg.data[0] == 3 and json.loads(msg.data[1:])["status"] == "Success"


# -- port-forward over WebSocket channels and tunnelled SPDY -----------------------------------


async def test_channel_portforward_prefixes_ports_and_echoes(http: aiohttp.ClientSession) -> None:
    async with http.ws_connect(
        f"{POD}/web/portforward", params={"ports": "8080,9090"}, protocols=("v4.channel.k8s.io",)
    ) as ws:
        assert ws.protocol == "v4.channel.k8s.io"
        first = [await ws.receive_bytes(timeout=5) for _ in range(4)]
        assert first == [
            b"\x00" + struct.pack("<H", 8080),
            b"\x01" + struct.pack("<H", 8080),
            b"\x02" + struct.pack("<H", 9090),
            b"\x03" + struct.pack("<H", 9090),
        ]
        await ws.send_bytes(b"\x02hello 9090")
        assert await ws.receive_bytes(timeout=5) == b"\x02hello 9090"


class SpdyClient:
    """Client half of a SPDY connection, driven by our own framer (what spdystream does)."""

    def __init__(self) -> None:
        self.encoder, self.decoder = spdy.FrameEncoder(), spdy.FrameDecoder()
        self.frames: list[spdy.Frame] = []
        self.next_id = 1

    def syn(self, **headers: str) -> tuple[int, bytes]:
        sid, self.next_id = self.next_id, self.next_id + 2
        return sid, self.encoder.encode(spdy.SynStream(sid, tuple(headers.items())))

    def data_for(self, sid: int) -> bytes:
        return b"".join(
            f.data for f in self.frames if isinstance(f, spdy.Data) and f.stream_id == sid
        )

    def finished(self, sid: int) -> bool:
        return any(isinstance(f, spdy.Data) and f.stream_id == sid and f.fin for f in self.frames)


async def test_tunnelled_spdy_portforward_pairs_streams_by_request_id(
    http: aiohttp.ClientSession,
) -> None:
    client = SpdyClient()
    async with http.ws_connect(
        f"{POD}/web/portforward", protocols=("SPDY/3.1+portforward.k8s.io",)
    ) as ws:
        assert ws.protocol == "SPDY/3.1+portforward.k8s.io"
        err_id, syn_err = client.syn(streamtype="error", port="8080", requestid="0")
        data_id, syn_data = client.syn(streamtype="data", port="8080", requestid="0")
        # Message boundaries mean nothing: split frames across messages on purpose.
        wire = syn_err + syn_data + client.encoder.encode(spdy.Data(err_id, b"", fin=True))
        await ws.send_bytes(wire[:5])
        await ws.send_bytes(wire[5:])
        await ws.send_bytes(client.encoder.encode(spdy.Data(data_id, b"tunnel hi")))
        await ws.send_bytes(client.encoder.encode(spdy.Data(data_id, b"", fin=True)))
        while not (client.finished(data_id) and client.finished(err_id)):
            client.frames += client.decoder.feed(await ws.receive_bytes(timeout=5))
        assert spdy.SynReply(err_id) in client.frames and spdy.SynReply(data_id) in client.frames
        assert client.data_for(data_id) == b"tunnel hi"
        assert client.data_for(err_id) == b""


# -- exec and port-forward over a raw SPDY/3.1 upgrade -------------------------------------------


async def _spdy_upgrade(
    server: StreamsServer, target: str, protocol: str, method: str = "POST"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=server.client_ssl, server_hostname="127.0.0.1"
    )
    writer.write(
        (
            f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
            f"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {protocol}\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return reader, writer, head


async def _pump(reader: asyncio.StreamReader, client: SpdyClient, until) -> None:
    while not until():
        chunk = await asyncio.wait_for(reader.read(65536), 5)
        if not chunk:
            return
        client.frames += client.decoder.feed(chunk)


async def test_spdy_exec_runs_once_all_streams_exist(server: StreamsServer) -> None:
    target = f"{POD}/web/exec?command=cat&stdin=true&stdout=true&stderr=true"
    reader, writer, head = await _spdy_upgrade(
        server, target, "v4.channel.k8s.io, v3.channel.k8s.io"
    )
    try:
        assert head.startswith(b"HTTP/1.1 101 ")
        assert b"Upgrade: SPDY/3.1\r\n" in head
        assert b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n" in head
        client = SpdyClient()
        ids = {}
        for kind in ("error", "stdin", "stdout", "stderr"):
            ids[kind], frame = client.syn(streamtype=kind)
            writer.write(frame)
        writer.write(client.encoder.encode(spdy.Data(ids["stdin"], b"over spdy")))
        writer.write(client.encoder.encode(spdy.Data(ids["stdin"], b"", fin=True)))
        writer.write(client.encoder.encode(spdy.Ping(1)))
        await _pump(reader, client, lambda: client.finished(ids["error"]))
        assert client.data_for(ids["stdout"]) == b"over spdy"
        assert json.loads(client.data_for(ids["error"])) == {"metadata": {}, "status": "Success"}
        assert spdy.Ping(1) in client.frames
        assert all(spdy.SynReply(i) in client.frames for i in ids.values())
        assert all(client.finished(ids[k]) for k in ("stdout", "stderr"))
        await _pump(reader, client, lambda: any(isinstance(f, spdy.GoAway) for f in client.frames))
        assert any(isinstance(f, spdy.GoAway) for f in client.frames)
    finally:
        writer.close()


async def test_spdy_exec_with_unsupported_protocol_is_403(server: StreamsServer) -> None:
    _reader, writer, head = await _spdy_upgrade(
        server, f"{POD}/web/exec?command=ls&stdout=true", "v9.channel.k8s.io"
    )
    writer.close()
    assert head.startswith(b"HTTP/1.1 403 ")


async def test_spdy_portforward_reports_bad_ports_on_the_error_stream(
    server: StreamsServer,
) -> None:
    reader, writer, head = await _spdy_upgrade(
        server, f"{POD}/web/portforward", "portforward.k8s.io"
    )
    try:
        assert b"X-Stream-Protocol-Version: portforward.k8s.io\r\n" in head
        client = SpdyClient()
        err_id, frame_err = client.syn(streamtype="error", port="0", requestid="7")
        _data_id, frame_data = client.syn(streamtype="data", port="0", requestid="7")
        writer.write(frame_err + frame_data)
        await _pump(reader, client, lambda: client.finished(err_id))
        assert client.data_for(err_id) == b'invalid port value "0" for pod web'
        # Old clients without requestID: error stream first, data stream = error id + 2.
        _err2, f1 = client.syn(streamtype="error", port="22")
        data2, f2 = client.syn(streamtype="data", port="22")
        writer.write(f1 + f2 + client.encoder.encode(spdy.Data(data2, b"ssh?", fin=True)))
        await _pump(reader, client, lambda: client.finished(data2))
        assert client.data_for(data2) == b"ssh?"
    finally:
        writer.close()


# -- base64 variants and TTY -------------------------------------------------------------------


async def test_base64_channel_protocol_uses_text_frames(http: aiohttp.ClientSession) -> None:
    params = [("command", "cat"), ("stdin", "true"), ("stdout", "true")]
    async with http.ws_connect(
        f"{POD}/web/exec", params=params, protocols=("v4.base64.channel.k8s.io",)
    ) as ws:
        assert ws.protocol == "v4.base64.channel.k8s.io"
        await ws.send_str("0" + base64.b64encode(b"b64 in\n").decode())
        reply = await ws.receive_str(timeout=5)
        assert reply[0] == "1" and base64.b64decode(reply[1:]) == b"b64 in\n"


async def test_tty_exec_takes_resize_and_writes_crlf(http: aiohttp.ClientSession) -> None:
    params = [("command", "sh"), ("stdin", "true"), ("stdout", "true"), ("tty", "true")]
    async with http.ws_connect(
        f"{POD}/web/exec", params=params, protocols=("v5.channel.k8s.io",)
    ) as ws:
        await ws.send_bytes(b"\x04" + json.dumps({"Width": 80, "Height": 24}).encode())
        await ws.send_bytes(b"\x00echo tty\r")
        await ws.send_bytes(b"\x00exit 2\r")
        out, status = b"", b""
        async for msg in ws:
            if msg.data[0] == 1:
                out += msg.data[1:]
            elif msg.data[0] == 3:
                status = msg.data[1:]
    assert out == b"# echo tty\r\ntty\r\n# exit 2\r\n"
    assert json.loads(status)["details"]["causes"][0]["message"] == "2"


async def test_spdy_exec_negotiates_v5_first_like_kubectl_offers(server: StreamsServer) -> None:
    # kubectl 1.32 sends one X-Stream-Protocol-Version line per protocol, v5 first.
    reader, writer, head = await _spdy_upgrade(
        server,
        f"{POD}/web/exec?command=true&stdout=true",
        "v5.channel.k8s.io\r\nX-Stream-Protocol-Version: v4.channel.k8s.io",
    )
    try:
        assert b"X-Stream-Protocol-Version: v5.channel.k8s.io\r\n" in head
        client = SpdyClient()
        err_id, frame_err = client.syn(streamtype="error")
        _out_id, frame_out = client.syn(streamtype="stdout")
        writer.write(frame_err + frame_out)
        await _pump(reader, client, lambda: client.finished(err_id))
        assert json.loads(client.data_for(err_id))["status"] == "Success"
    finally:
        writer.close()


async def test_server_shutdown_ends_streams_that_never_end_by_themselves(tmp_path: Path) -> None:
    """Followed logs, a sleeping exec, an idle port-forward: cleanup must not wait for them."""
    async with contextlib.AsyncExitStack() as stack:
        server_cm = streams_server(tmp_path)
        server = await server_cm.__aenter__()
        http = await stack.enter_async_context(
            aiohttp.ClientSession(server.url, connector=aiohttp.TCPConnector(ssl=server.client_ssl))
        )
        logs = await http.get(f"{POD}/fast/log", params={"follow": "true"})
        await logs.content.readline()
        ws_exec = await http.ws_connect(
            f"{POD}/web/exec",
            params={"command": ["sleep", "600"], "stdout": "true"},
            protocols=("v5.channel.k8s.io",),
        )
        tunnel = await http.ws_connect(
            f"{POD}/web/portforward", protocols=("SPDY/3.1+portforward.k8s.io",)
        )
        _, spdy_writer, _ = await _spdy_upgrade(
            server, f"{POD}/web/exec?command=sleep&command=600&stdout=true", "v4.channel.k8s.io"
        )
        started = time.monotonic()
        await asyncio.wait_for(server_cm.__aexit__(None, None, None), 10)
        assert time.monotonic() - started < 5
        spdy_writer.close()
        logs.close()
        await ws_exec.close()
        await tunnel.close()


async def test_port_annotation_relays_to_a_local_tcp_server(server: StreamsServer) -> None:
    async def upper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HELLO\n")
        writer.write((await reader.read()).upper())  # until the forwarded FIN
        writer.close()

    backend = await asyncio.start_server(upper, "127.0.0.1", 0)
    backend_port = backend.sockets[0].getsockname()[1]
    closed_port = free_port()
    PODS["relay"] = make_pod(
        "relay",
        annotations={
            "kubesim.hubproxy.dev/port-80": f"127.0.0.1:{backend_port}",
            "kubesim.hubproxy.dev/port-81": f"127.0.0.1:{closed_port}",
        },
    )
    reader, writer, _ = await _spdy_upgrade(
        server, f"{POD}/relay/portforward", "portforward.k8s.io"
    )
    try:
        client = SpdyClient()
        err_id, frame_err = client.syn(streamtype="error", port="80", requestid="0")
        data_id, frame_data = client.syn(streamtype="data", port="80", requestid="0")
        writer.write(frame_err + frame_data)
        writer.write(client.encoder.encode(spdy.Data(data_id, b"quiet", fin=True)))
        await _pump(reader, client, lambda: client.finished(data_id) and client.finished(err_id))
        assert client.data_for(data_id) == b"HELLO\nQUIET"
        assert client.data_for(err_id) == b""

        err2, frame_err = client.syn(streamtype="error", port="81", requestid="1")
        _, frame_data = client.syn(streamtype="data", port="81", requestid="1")
        writer.write(frame_err + frame_data)
        await _pump(reader, client, lambda: client.finished(err2))
        assert client.data_for(err2).startswith(b"error forwarding port 81 to pod relay: ")
    finally:
        writer.close()
        del PODS["relay"]
        backend.close()
        await backend.wait_closed()
