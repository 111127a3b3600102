"""The real kubectl (v1.32) drives kubesim's pod streams: logs, exec, port-forward.

Each flow runs against two servers: the minimal app of test_streams_support (kubesim.streams
alone) and the full kubesim (authentication, RBAC, real pod objects) via kubesim.testing.
`seen`/`received` records prove which wire protocol each kubectl mode used.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import re
import select
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubesim.testing import run_kubesim
from tests.kubesim.test_streams_support import (
    KUBECTL,
    KubectlResult,
    kubectl,
    make_pod,
    streams_server,
)
from tests.support import free_port

SPDY_EXEC = {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"}
SPDY_PORT_FORWARD = {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"}


@dataclass
class Target:
    kubeconfig: Path
    upgrades: Callable[[], list[tuple[str, str, str, str]]]  # (sub, method, Upgrade, WS protocols)


@pytest.fixture(params=["streams-app", "kubesim"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    if request.param == "streams-app":
        async with streams_server(tmp_path) as server:
            yield Target(
                server.kubeconfig,
                lambda: [
                    (s.subresource, s.method, s.upgrade.lower(), s.ws_protocols)
                    for s in server.seen
                ],
            )
        return
    async with run_kubesim(tmp_path) as sim:
        sim.apply(
            [
                make_pod("web"),
                make_pod(
                    "fast",
                    annotations={
                        "kubesim.hubproxy.dev/log-interval-ms": "20",
                        "kubesim.hubproxy.dev/log-lines": "3",
                    },
                ),
            ]
        )
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig", namespace="default")

        def upgrades() -> list[tuple[str, str, str, str]]:
            out = []
            for r in sim.received:
                sub = r.path.split("?")[0].rsplit("/", 1)[-1]
                if sub in ("log", "exec", "attach", "portforward"):
                    out.append(
                        (
                            sub,
                            r.method,
                            (r.header("Upgrade") or [""])[0].lower(),
                            ",".join(r.header("Sec-WebSocket-Protocol") or []),
                        )
                    )
            return out

        yield Target(kubeconfig, upgrades)


async def run(target: Target, *args: str, **kwargs) -> KubectlResult:
    return await kubectl(target.kubeconfig, *args, **kwargs)


async def test_kubectl_logs_and_tail(target: Target) -> None:
    result = await run(target, "logs", "web")
    assert result.code == 0, result.stderr
    assert result.stdout.decode().splitlines() == [f"line {n} web/main" for n in range(1, 11)]
    result = await run(target, "logs", "pod/web", "--tail=1", "--timestamps")
    # RFC 3339 with nanoseconds, as the kubelet writes them (kubesim sets creationTimestamp).
    assert re.fullmatch(
        rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z line 10 web/main\n", result.stdout
    ), result.stdout
    result = await run(target, "logs", "web", "--previous")
    assert result.code == 1
    assert b'previous terminated container "main" in pod "web" not found' in result.stderr


async def test_kubectl_logs_follow_streams_until_stopped(target: Target) -> None:
    proc = await asyncio.create_subprocess_exec(
        KUBECTL,
        f"--kubeconfig={target.kubeconfig}",
        "logs",
        "-f",
        "fast",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(target.kubeconfig.parent)},
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        lines = [
            (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().strip() for _ in range(6)
        ]
        assert lines == [f"line {n} fast/main" for n in range(1, 7)]
        assert proc.returncode is None  # still following
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@pytest.mark.parametrize("env", [{}, SPDY_EXEC], ids=["websocket", "spdy"])
async def test_kubectl_exec_echo_stdin_and_exit_codes(target: Target, env: dict[str, str]) -> None:
    result = await run(target, "exec", "web", "--", "echo", "hi", env=env)
    assert (result.code, result.stdout) == (0, b"hi\n"), result.stderr

    result = await run(target, "exec", "-i", "web", "--", "cat", stdin=b"one\ntwo\n", env=env)
    assert (result.code, result.stdout) == (0, b"one\ntwo\n"), result.stderr

    result = await run(
        target, "exec", "web", "--", "sh", "-c", "echo out; echo err >&2; exit 3", env=env
    )
    assert (result.code, result.stdout) == (3, b"out\n")
    assert result.stderr.startswith(b"err\n")
    assert b"command terminated with exit code 3" in result.stderr

    result = await run(target, "exec", "web", "--", "nosuch", env=env)
    assert result.code == 1
    assert (
        b'exec: \\"nosuch\\": executable file not found in $PATH' in result.stderr
        or b'exec: "nosuch": executable file not found in $PATH' in result.stderr
    )

    kinds = {
        (sub, method, upgrade) for sub, method, upgrade, _ in target.upgrades() if sub == "exec"
    }
    assert kinds == ({("exec", "POST", "spdy/3.1")} if env else {("exec", "GET", "websocket")})


async def _forward_and_echo(target: Target, env: dict[str, str]) -> bytes:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        KUBECTL,
        f"--kubeconfig={target.kubeconfig}",
        "port-forward",
        "--address=127.0.0.1",
        "pod/web",
        f"{port}:8080",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(target.kubeconfig.parent), **env},
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 10)
        assert line.startswith(b"Forwarding from 127.0.0.1:"), line
        replies = b""
        for i in range(2):  # two connections: two stream pairs on one session
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            writer.write(b"ping %d\n" % i)
            await writer.drain()
            replies += await asyncio.wait_for(reader.readline(), 5)
            writer.close()
            await writer.wait_closed()
        return replies
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)


@pytest.mark.parametrize("env", [{}, SPDY_PORT_FORWARD], ids=["websocket-tunnel", "spdy"])
async def test_kubectl_port_forward_echo(target: Target, env: dict[str, str]) -> None:
    assert await _forward_and_echo(target, env) == b"ping 0\nping 1\n"
    used = {
        (sub, method, upgrade, protocols)
        for sub, method, upgrade, protocols in target.upgrades()
        if sub == "portforward"
    }
    if env:
        assert used == {("portforward", "POST", "spdy/3.1", "")}
    else:
        assert used == {("portforward", "GET", "websocket", "SPDY/3.1+portforward.k8s.io")}


@pytest.mark.parametrize("env", [{}, SPDY_EXEC], ids=["websocket", "spdy"])
async def test_kubectl_attach_with_stdin(target: Target, env: dict[str, str]) -> None:
    result = await run(target, "attach", "-i", "web", stdin=b"attached\n", env=env)
    assert (result.code, result.stdout) == (0, b"attached\n"), result.stderr


def _tty_session(kubeconfig: Path, env: dict[str, str], keystrokes: bytes) -> tuple[int, bytes]:
    """kubectl exec -it under a pseudo-terminal: type `keystrokes` after the first prompt."""
    pid, fd = pty.fork()
    if pid == 0:  # child: becomes kubectl with the pty as its terminal
        os.execve(
            KUBECTL,
            [KUBECTL, f"--kubeconfig={kubeconfig}", "exec", "-it", "web", "--", "sh"],
            {**os.environ, "HOME": str(kubeconfig.parent), **env},
        )
    output, typed = b"", False
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: kubectl exited and the pty closed
                break
            if not chunk:
                break
            output += chunk
            if not typed and b"# " in output:
                os.write(fd, keystrokes)
                typed = True
    finally:
        if time.monotonic() >= deadline:
            os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), output


@pytest.mark.parametrize("env", [{}, SPDY_EXEC], ids=["websocket", "spdy"])
async def test_kubectl_exec_with_a_tty(target: Target, env: dict[str, str]) -> None:
    code, output = await asyncio.to_thread(
        _tty_session, target.kubeconfig, env, b"hostname\rexit 6\r"
    )
    assert code == 6, output
    assert b"web\r\n" in output
    assert output.endswith(b"command terminated with exit code 6\r\n")


@pytest.mark.parametrize("env", [{}, SPDY_EXEC], ids=["websocket", "spdy"])
async def test_kubectl_exec_copies_a_megabyte_through_cat(
    target: Target, env: dict[str, str]
) -> None:
    data = os.urandom(1 << 20)
    result = await run(target, "exec", "-i", "web", "--", "cat", stdin=data, env=env)
    assert result.code == 0, result.stderr
    assert result.stdout == data


@pytest.mark.parametrize("env", [{}, SPDY_PORT_FORWARD], ids=["websocket-tunnel", "spdy"])
async def test_kubectl_port_forward_bulk_and_half_close(
    target: Target, env: dict[str, str]
) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        KUBECTL,
        f"--kubeconfig={target.kubeconfig}",
        "port-forward",
        "--address=127.0.0.1",
        "pod/web",
        f"{port}:5432",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(target.kubeconfig.parent), **env},
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), 10)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = os.urandom(2 << 20)

        async def send() -> None:
            writer.write(data)
            await writer.drain()
            writer.write_eof()  # our FIN must reach the pod and come back as its FIN

        sender = asyncio.ensure_future(send())
        echoed = await asyncio.wait_for(reader.readexactly(len(data)), 20)
        await asyncio.wait_for(sender, 5)
        assert echoed == data
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
