"""Background processes the benchmark starts: recorded PIDs, logs in files, stopped by PID only.

Each process runs in its own session (``start_new_session``), so stopping it signals exactly its
process group (the process and the children it forked, e.g. nginx or upstream workers) and
nothing else on the machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


class Proc:
    """One child process; stdout+stderr go to ``log``. With ``pipe_stdin`` its stdin is a pipe
    (:meth:`send` writes a line to it), else ``/dev/null``."""

    def __init__(self, name: str, args: Sequence[str], log: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None,
                 pipe_stdin: bool = False) -> None:
        self.name = name
        self.args = list(args)
        self.log = log
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.PIPE if pipe_stdin
                                          else subprocess.DEVNULL, cwd=cwd,
                                          env={**os.environ, **(env or {})},
                                          start_new_session=True)
        self.pid = self.popen.pid

    def send(self, line: str) -> None:
        """One line to the process's stdin (``pipe_stdin``); nothing if it has gone."""
        assert self.popen.stdin is not None, "started without pipe_stdin"
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.popen.stdin.write(line.encode() + b"\n")
            self.popen.stdin.flush()

    def output(self, tail: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-tail:]
        return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_for_line(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.output(1 << 20)
            for line in text.splitlines():
                if needle in line:
                    return line
            if not self.alive():
                break
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not print {needle!r} within {timeout:g}s "
                           f"(exit {self.popen.poll()}):\n{self.output()}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to its process group, SIGKILL after ``timeout``."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait(5)
        else:
            # The leader may be gone while forked workers linger in its group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)


class Procs:
    """Every process one benchmark run started, stopped in reverse order."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.started: list[Proc] = []

    def start(self, name: str, args: Sequence[str], **kw: object) -> Proc:
        proc = Proc(name, args, self.logdir / f"{name}.log", **kw)  # type: ignore[arg-type]
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {LOOPBACK}:{port} after {timeout:g}s")
