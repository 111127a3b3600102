"""CPU time and memory of processes, read from /proc (Linux)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    # comm may hold spaces/parentheses: split after the last ')'.
    return text[text.rindex(")") + 2:].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), in seconds; 0 if it is gone."""
    try:
        fields = _stat_fields(pid)
    except (OSError, ValueError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def children(pid: int) -> list[int]:
    """Descendants of ``pid`` (scan of /proc; fine for the few processes we start)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(_stat_fields(int(entry))[1])
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tree(pid: int) -> list[int]:
    return [pid, *children(pid)]


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM, ...), in KiB; 0 if gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_mib(pid: int) -> float:
    return status_kib(pid, "VmRSS") / 1024


def peak_rss_mib(pid: int) -> float:
    return status_kib(pid, "VmHWM") / 1024


class CpuMeter:
    """CPU seconds used by a set of processes between ``start()`` and ``stop()``."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.before: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(p) for p in pids) for name, pids in self.pids.items()}

    def start(self) -> CpuMeter:
        self.before = self._now()
        return self

    def stop(self) -> dict[str, float]:
        after = self._now()
        return {name: after[name] - self.before.get(name, 0.0) for name in after}
