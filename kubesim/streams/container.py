"""The built-in "container" every kubesim pod runs: deterministic logs and a tiny shell.

Not a real runtime. It exists so `kubectl logs/exec/attach/port-forward` have something
predictable to talk to. Pod annotations tune it:
  kubesim.hubproxy.dev/log-lines         backlog size (default 10)
  kubesim.hubproxy.dev/log-interval-ms   period of new lines while following (default 100)
  kubesim.hubproxy.dev/log-follow-limit  stop following after N new lines (0 = never)
  kubesim.hubproxy.dev/port-<N>          "127.0.0.1:P": port-forward to port N reaches that local
                                         TCP server instead of the echo (SPDY forms only)
Log line n of container c in pod p reads `line <n> <p>/<c>`.

Executables: echo, cat, sh/bash -c SCRIPT (or a script on stdin), printf, whoami (root),
hostname (the pod name), env, sleep N, true, false, pwd, exit N (inside sh). Anything else is
"executable file not found in $PATH", as the runtime reports it.
"""

from __future__ import annotations

import asyncio
import re
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

ANNOTATION_PREFIX = "kubesim.hubproxy.dev/"
DEFAULT_LOG_LINES = 10
DEFAULT_LOG_INTERVAL_MS = 100
MAX_SLEEP = 3600.0

Write = Callable[[bytes], Awaitable[None]]
ReadStdin = Callable[[], Awaitable[bytes]]  # b"" at end of input


def annotation_int(pod: dict[str, Any], name: str, default: int) -> int:
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_PREFIX + name)
    try:
        return max(0, int(raw)) if raw is not None else default
    except ValueError:
        return default


def pod_name(pod: dict[str, Any]) -> str:
    return str(pod.get("metadata", {}).get("name", ""))


def container_names(pod: dict[str, Any]) -> list[str]:
    return [c.get("name", "") for c in pod.get("spec", {}).get("containers") or []]


def log_line(pod: dict[str, Any], container: str, n: int) -> str:
    return f"line {n} {pod_name(pod)}/{container}"


def log_start_time(pod: dict[str, Any]) -> datetime:
    raw = pod.get("metadata", {}).get("creationTimestamp")
    if isinstance(raw, str):
        try:
            return datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            pass
    return datetime(2024, 1, 1, tzinfo=UTC)


def rfc3339_nano(moment: datetime) -> str:
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond * 1000:09d}Z"


def backlog_time(pod: dict[str, Any], n: int) -> datetime:
    return log_start_time(pod) + timedelta(seconds=n)


class CommandNotFound(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(f'exec: "{name}": executable file not found in $PATH')
        self.name = name


@dataclass
class Process:
    """What one exec sees: its pod/container, stdin, and where output goes."""

    pod: dict[str, Any]
    container: str
    stdin: ReadStdin | None
    stdout: Write
    stderr: Write
    tty: bool = False

    def environment(self) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOSTNAME": pod_name(self.pod),
            "HOME": "/root",
        }
        for spec in self.pod.get("spec", {}).get("containers") or []:
            if spec.get("name") == self.container:
                for item in spec.get("env") or []:
                    if "name" in item and "value" in item:
                        env[str(item["name"])] = str(item["value"])
        if self.tty:
            env["TERM"] = "xterm"
        return env

    async def read_all_stdin(self) -> bytes:
        data = bytearray()
        while self.stdin is not None and (chunk := await self.stdin()):
            data += chunk
        return bytes(data)


def _unescape(text: str) -> str:
    return text.replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")


def _printf(fmt: str, args: list[str]) -> str:
    fmt = _unescape(fmt)
    values = iter(args)

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        value = next(values, "")
        if match.group(1) == "d":
            try:
                return str(int(value or "0"))
            except ValueError:
                return "0"
        return value

    return re.sub(r"%%|%([sd])", sub, fmt)


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


async def run(argv: list[str], proc: Process) -> int:
    """Run one executable; returns its exit status. Raises CommandNotFound for unknown ones."""
    if not argv:
        raise CommandNotFound("")
    name = argv[0].rsplit("/", 1)[-1] if argv[0].startswith("/") else argv[0]
    args = argv[1:]
    if name in ("sh", "bash", "ash"):
        if len(args) >= 2 and args[0] == "-c":
            return await run_script(args[1], proc)
        return await _interactive_shell(proc)
    if name not in _EXECUTABLES:
        raise CommandNotFound(argv[0])
    try:
        return await _EXECUTABLES[name](args, proc)
    except _Exit as exc:
        return exc.code


async def _echo(args: list[str], proc: Process) -> int:
    newline = True
    if args and args[0] == "-n":
        newline, args = False, args[1:]
    await proc.stdout((" ".join(args) + ("\n" if newline else "")).encode())
    return 0


async def _cat(args: list[str], proc: Process) -> int:
    while proc.stdin is not None and (chunk := await proc.stdin()):
        await proc.stdout(chunk)
    return 0


async def _printf_cmd(args: list[str], proc: Process) -> int:
    if not args:
        await proc.stderr(b"printf: usage: printf format [arguments]\n")
        return 2
    await proc.stdout(_printf(args[0], args[1:]).encode())
    return 0


async def _whoami(args: list[str], proc: Process) -> int:
    await proc.stdout(b"root\n")
    return 0


async def _hostname(args: list[str], proc: Process) -> int:
    await proc.stdout(pod_name(proc.pod).encode() + b"\n")
    return 0


async def _env(args: list[str], proc: Process) -> int:
    text = "".join(f"{k}={v}\n" for k, v in proc.environment().items())
    await proc.stdout(text.encode())
    return 0


async def _sleep(args: list[str], proc: Process) -> int:
    try:
        seconds = float(args[0]) if args else 0.0
    except ValueError:
        await proc.stderr(f"sleep: invalid time interval '{args[0]}'\n".encode())
        return 1
    await asyncio.sleep(min(max(seconds, 0.0), MAX_SLEEP))
    return 0


async def _true(args: list[str], proc: Process) -> int:
    return 0


async def _false(args: list[str], proc: Process) -> int:
    return 1


async def _pwd(args: list[str], proc: Process) -> int:
    await proc.stdout(b"/\n")
    return 0


_EXECUTABLES: dict[str, Callable[[list[str], Process], Awaitable[int]]] = {
    "echo": _echo,
    "cat": _cat,
    "printf": _printf_cmd,
    "whoami": _whoami,
    "hostname": _hostname,
    "env": _env,
    "sleep": _sleep,
    "true": _true,
    "false": _false,
    "pwd": _pwd,
}

_OPERATORS = {";", "&&", "||", "\n"}


def _split_script(script: str) -> list[str | list[str]]:
    """Tokens into [simple-command-argv, operator, argv, ...]. No expansion beyond $? and $VAR."""
    lexer = shlex.shlex(script.replace("\n", " ; "), posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    items: list[str | list[str]] = []
    current: list[str] = []
    for token in lexer:
        if token in _OPERATORS:
            items.append(current)
            items.append(token)
            current = []
        else:
            current.append(token)
    items.append(current)
    return items


async def run_script(script: str, proc: Process) -> int:
    """A very small POSIX-ish shell: `;`, `&&`, `||`, `exit N`, `>&2`, `$?`, `$NAME`."""
    try:
        items = _split_script(script)
    except ValueError as exc:
        await proc.stderr(f"sh: syntax error: {exc}\n".encode())
        return 2
    status = 0
    skip = False
    env = proc.environment()
    for item in items:
        if isinstance(item, str):
            skip = (item == "&&" and status != 0) or (item == "||" and status == 0)
            continue
        if skip or not item:
            continue
        argv = [_expand(word, status, env) for word in item]
        try:
            status = await _run_simple(argv, proc)
        except _Exit as exc:
            return exc.code
    return status


def _expand(word: str, status: int, env: dict[str, str]) -> str:
    word = word.replace("$?", str(status))
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), word)


async def _run_simple(argv: list[str], proc: Process) -> int:
    to_stderr = False
    if len(argv) >= 2 and argv[-2] in (">&", "1>&") and argv[-1] == "2":
        to_stderr, argv = True, argv[:-2]
    elif argv[-1] in (">&2", "1>&2"):
        to_stderr, argv = True, argv[:-1]
    if not argv:
        return 0
    if argv[0] == "exit":
        try:
            raise _Exit(int(argv[1]) & 0xFF if len(argv) > 1 else 0)
        except ValueError:
            raise _Exit(2) from None
    target = Process(
        proc.pod,
        proc.container,
        proc.stdin,
        proc.stderr if to_stderr else proc.stdout,
        proc.stderr,
        proc.tty,
    )
    try:
        return await run(argv, target)
    except CommandNotFound:
        await proc.stderr(f"sh: {argv[0]}: not found\n".encode())
        return 127


async def _interactive_shell(proc: Process) -> int:
    """`sh` with no -c: run stdin line by line (prompting when there is a TTY)."""
    status = 0
    pending = b""
    if proc.tty:
        await proc.stdout(b"# ")
    while proc.stdin is not None:
        chunk = await proc.stdin()
        if not chunk:
            break
        if proc.tty:
            await proc.stdout(chunk.replace(b"\r", b"\n"))  # a terminal echoes input
        pending += chunk.replace(b"\r", b"\n")
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            text = line.decode(errors="replace").strip()
            if text:
                try:
                    status = await run_script(text, proc)
                except _Exit as exc:
                    return exc.code
                if text.split()[0] == "exit":
                    return status
            if proc.tty:
                await proc.stdout(b"# ")
    if pending.strip():
        status = await run_script(pending.decode(errors="replace"), proc)
    return status
