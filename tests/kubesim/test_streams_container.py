"""The built-in container: its executables and tiny shell, without any transport."""

from __future__ import annotations

import pytest

from kubesim.streams import container as builtin
from tests.kubesim.test_streams_support import make_pod


async def run(
    argv: list[str], stdin: list[bytes] | None = None, tty: bool = False
) -> tuple[int, bytes, bytes]:
    out, err = bytearray(), bytearray()
    chunks = list(stdin or [])

    async def read() -> bytes:
        return chunks.pop(0) if chunks else b""

    async def write_out(data: bytes) -> None:
        out.extend(data)

    async def write_err(data: bytes) -> None:
        err.extend(data)

    proc = builtin.Process(
        make_pod("box"), "main", read if stdin is not None else None, write_out, write_err, tty
    )
    code = await builtin.run(argv, proc)
    return code, bytes(out), bytes(err)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["echo", "a", "b"], (0, b"a b\n", b"")),
        (["echo", "-n", "x"], (0, b"x", b"")),
        (["/bin/echo", "abs"], (0, b"abs\n", b"")),
        (["printf", "%s=%d\\n", "n", "42"], (0, b"n=42\n", b"")),
        (["whoami"], (0, b"root\n", b"")),
        (["hostname"], (0, b"box\n", b"")),
        (["true"], (0, b"", b"")),
        (["false"], (1, b"", b"")),
        (["sleep", "0"], (0, b"", b"")),
        (["sleep", "soon"], (1, b"", b"sleep: invalid time interval 'soon'\n")),
    ],
)
async def test_executables(argv: list[str], expected: tuple[int, bytes, bytes]) -> None:
    assert await run(argv) == expected


async def test_env_includes_pod_and_container_env() -> None:
    code, out, _ = await run(["env"])
    assert code == 0
    lines = out.decode().splitlines()
    assert "HOSTNAME=box" in lines and "GREETING=hello" in lines and "HOME=/root" in lines


async def test_cat_copies_stdin_until_end() -> None:
    assert await run(["cat"], stdin=[b"a", b"b\n"]) == (0, b"ab\n", b"")
    assert await run(["cat"]) == (0, b"", b"")  # no stdin attached: immediate EOF


async def test_unknown_executable_raises_like_the_runtime() -> None:
    with pytest.raises(builtin.CommandNotFound, match=r'exec: "ls": executable file not found'):
        await run(["ls"])


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("echo a; echo b", (0, b"a\nb\n", b"")),
        ("echo a\necho b", (0, b"a\nb\n", b"")),
        ("false && echo no || echo yes", (0, b"yes\n", b"")),
        ("true && echo yes", (0, b"yes\n", b"")),
        ("echo oops >&2; exit 5; echo never", (5, b"", b"oops\n")),
        ("exit", (0, b"", b"")),
        ("exit 300", (44, b"", b"")),
        ("false; echo $?", (0, b"1\n", b"")),
        ("echo $HOSTNAME ${GREETING}", (0, b"box hello\n", b"")),
        ("echo 'single $HOSTNAME' \"double\"", (0, b"single box double\n", b"")),
        ("nosuch arg", (127, b"", b"sh: nosuch: not found\n")),
        ("echo 'unterminated", (2, b"", b"sh: syntax error: No closing quotation\n")),
    ],
)
async def test_shell_scripts(script: str, expected: tuple[int, bytes, bytes]) -> None:
    assert await run(["sh", "-c", script]) == expected


async def test_shell_reads_a_script_from_stdin_and_prompts_on_a_tty() -> None:
    assert await run(["sh"], stdin=[b"echo one\nwhoami\n", b"exit 4\n", b"echo never\n"]) == (
        4,
        b"one\nroot\n",
        b"",
    )
    code, out, _ = await run(["bash"], stdin=[b"echo hi\r"], tty=True)
    assert code == 0
    assert out == b"# echo hi\nhi\n# "  # the exec layer turns \n into \r\n on a TTY


def test_log_lines_and_annotations() -> None:
    pod = make_pod(
        "p",
        annotations={
            "kubesim.hubproxy.dev/log-lines": "3",
            "kubesim.hubproxy.dev/log-interval-ms": "bad",
        },
    )
    assert builtin.log_line(pod, "c", 7) == "line 7 p/c"
    assert builtin.annotation_int(pod, "log-lines", 10) == 3
    assert builtin.annotation_int(pod, "log-interval-ms", 100) == 100
    assert builtin.rfc3339_nano(builtin.backlog_time(pod, 2)) == "2026-01-01T00:00:02.000000000Z"
