"""Helpers shared by the test suite: loopback ports and background processes we own.

Every process a test starts goes through `ProcessGroup`, which records its PID and stops
exactly those processes (their process groups) and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.machinery
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from bench import nativeprof

T = TypeVar("T")

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent


_HANDED_OUT: set[int] = set()


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free on loopback a moment ago, and that this process never handed
    out before: once released, the kernel may give the same port to the next bind, so
    ``front, tunnel = free_port(), free_port()`` could name one port twice (HAProxy then bound
    both frontends to it with SO_REUSEPORT and split connections between them at random)."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no loopback port left that was not handed out already")


def wait_for_port(port: int, host: str = LOOPBACK, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


# client-go before v1.33 starts reading an exec/attach WebSocket before it has created its
# streams (kubernetes/kubernetes#131189, fixed by #131203 in v1.33): a frame that is already
# there when the 101 is read -- kubesim runs `echo` at once, so the output and the exit Status
# follow the 101 within a millisecond -- is dropped, with this on kubectl's stderr, and kubectl
# exits 0 with no output (or 0 instead of the command's status). Reproduced through the
# gateway with kubectl v1.32 (1 exec in a few hundred under load, more when kubesim's 101 and
# first frames leave in one write). Such a run says nothing about the gateway (a frame the
# gateway lost would not make kubectl say this), so it is run again.
CLIENT_GO_DEMUX_RACE = "Unknown stream id"
KUBECTL_RUNS = 3  # at most, when every run before hit the race


def _kubectl_minor(kubectl: str, env: dict[str, str] | None) -> int:
    """kubectl's client minor version (cached per path; 0 when it cannot say)."""
    if kubectl not in _KUBECTL_MINOR:
        minor = 0
        with contextlib.suppress(OSError, ValueError, KeyError, subprocess.SubprocessError):
            out = subprocess.run([kubectl, "version", "--client", "-o", "json"], env=env,
                                 capture_output=True, text=True, timeout=30).stdout
            version = json.loads(out)["clientVersion"]
            minor = int(version["minor"].rstrip("+")) if version["major"] == "1" else 1000
        _KUBECTL_MINOR[kubectl] = minor
    return _KUBECTL_MINOR[kubectl]


_KUBECTL_MINOR: dict[str, int] = {}


def run_kubectl(command: Sequence[str], *, env: dict[str, str] | None, timeout: float,
                input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` of a kubectl command line (``command[0]`` is kubectl), run again --
    at most :data:`KUBECTL_RUNS` times in all -- only when it is an ``exec`` or ``attach``,
    kubectl is older than v1.33, and it reported :data:`CLIENT_GO_DEMUX_RACE` (see there).
    Any other outcome, good or bad, is returned as it is."""
    command = list(command)
    words = command[1:command.index("--")] if "--" in command else command[1:]
    retry = bool({"exec", "attach"} & set(words)) and _kubectl_minor(command[0], env) < 33
    for _ in range(KUBECTL_RUNS):
        got = subprocess.run(command, env=env, capture_output=True, text=True,
                             timeout=timeout, input=input)
        if not (retry and CLIENT_GO_DEMUX_RACE in got.stderr):
            return got
        print(f"kubectl hit client-go's exec demux race, running it again: {got.stderr!r}",
              file=sys.stderr)
    return got


class BackgroundProcess:
    """A child process whose output lines are collected, so tests can wait for them."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None, cwd: Path | None) -> None:
        self.args = list(args)
        self.popen = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def final_output(self, timeout: float = 5.0) -> str:
        """Everything the process printed, once it has exited and its pipe is read to the end."""
        self.popen.wait(timeout)
        self._reader.join(timeout)
        return self.output

    def wait_for_line(self, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                remaining = deadline - time.monotonic()
                exited = self.popen.poll() is not None and not self._reader.is_alive()
                if remaining <= 0 or exited:
                    raise TimeoutError(
                        f"{needle!r} not printed by {self.args[:3]} "
                        f"(exit {self.popen.poll()}); output:\n{self.output[-4000:]}"
                    )
                self._changed.wait(min(remaining, 0.2))

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            os.killpg(self.pid, signum)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait(5)
        self._reader.join(2)
        return self.popen.returncode


class ProcessGroup:
    """The background processes one test started; `stop_all` stops only those."""

    def __init__(self) -> None:
        self.started: list[BackgroundProcess] = []

    def start(
        self,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> BackgroundProcess:
        proc = BackgroundProcess(args, env, cwd)
        self.started.append(proc)
        return proc

    def hubproxy(self, *args: str, env: dict[str, str] | None = None) -> BackgroundProcess:
        """Start `hubproxy ARGS...` with this interpreter (no PATH lookup)."""
        return self.start([sys.executable, "-m", "gateway.cli", *args], env=env)

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()


POLL_INTERVAL = 0.02


class ManualClock:
    """A clock for code that takes one (``clock=``): time moves only when the test moves it,
    so a test of a TTL, a refill or a grace neither sleeps nor races a busy machine."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def eventually(check: Callable[[], T], timeout: float = 10.0,
                     what: str = "condition") -> T:
    """Until ``check()`` is true, polling, and what it returned then; fails the test, naming
    ``what``, after ``timeout`` seconds. The tests' one polling helper
    (:func:`eventually_blocking` outside a loop)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (found := check()):
        assert asyncio.get_running_loop().time() < deadline, f"{what} not reached in {timeout}s"
        await asyncio.sleep(POLL_INTERVAL)
    return found


def in_ci() -> bool:
    """Whether this run is CI (``CI=true``, which .ci/run sets)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


# Set to "1": the tree's modules are imported from their .py files even where compiled ones
# sit beside them (tests/conftest.py; tests/test_compiled.py runs a subset that way).
PURE_SOURCE = "HUBPROXY_PURE_SOURCE"


def pure_source_run() -> bool:
    """Whether this run imports the project's source only (:data:`PURE_SOURCE`)."""
    return os.environ.get(PURE_SOURCE) == "1"


def compiled_modules() -> list[str]:
    """The modules setup.py compiles: pyproject.toml's [tool.hubproxy.compiled]."""
    return nativeprof.compiled_modules(REPO / "pyproject.toml")


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a C extension, not from its .py file."""
    return str(module.__file__).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def needs_pure(module: ModuleType) -> None:
    """Skip a test that patches ``module``'s code when it is compiled (a compiled module cannot
    be patched); tests/test_compiled.py runs the test's file on the pure source."""
    import pytest

    if is_compiled(module):
        pytest.skip(f"patches {module.__name__}, which is compiled here: "
                    "tests/test_compiled.py runs this test on the pure source")


@contextlib.contextmanager
def tasks_started() -> Iterator[list[str]]:
    """The names of the coroutines the running loop starts as tasks while the block runs. A
    name is the coroutine's qualified name, or, compiled by mypyc, its class's name (which
    holds the function's: ``_setup_HttpExchange_gen`` for ``HttpExchange._setup``), so test
    it with ``in``. A way to see that a path took no task without patching the code, which a
    compiled module does not allow."""
    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()
    names: list[str] = []

    def recording(loop: asyncio.AbstractEventLoop, coro: object, **kwargs: object) -> object:
        names.append(getattr(coro, "__qualname__", None) or type(coro).__name__)
        if previous is not None:
            return previous(loop, coro, **kwargs)  # type: ignore[arg-type]
        return asyncio.Task(coro, loop=loop, **kwargs)  # type: ignore[arg-type]

    loop.set_task_factory(recording)  # type: ignore[arg-type]
    try:
        yield names
    finally:
        loop.set_task_factory(previous)


def eventually_blocking(check: Callable[[], T], timeout: float = 10.0,
                        what: str = "condition", interval: float = POLL_INTERVAL) -> T:
    """:func:`eventually` for tests that run outside an event loop (processes, kubectl):
    ``interval`` spaces checks that are themselves expensive."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        time.sleep(interval)
    return found
