"""Where a process's CPU goes by binary: the Python interpreter, the kernel, OpenSSL, uvloop.

py-spy (:mod:`bench.profiling`) sees only Python frames: time in C shows as the Python line
that called it, and so does time the process sat preempted there (on a busy 2-CPU machine a
socket write that wakes the peer is often where the writer loses its CPU). ``perf record``
with the ``cpu-clock`` event counts only time on a CPU, and says in which binary: so the
share of the interpreter against the kernel's syscalls and TCP, OpenSSL's TLS and uvloop's C
tells how much of a request's cost is our Python at all.

Needs Linux ``perf`` and the right to sample another process (``perf_event_paranoid`` <= 1
for the kernel's share, or root); without them :func:`start` says why and the profile goes
on without this part.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

PERF = shutil.which("perf")
PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")

# A binary's group, by the first pattern its name matches (perf's "dso" column).
GROUPS: tuple[tuple[str, str], ...] = (
    (r"^libpython|^python3", "Python interpreter"),
    (r"^\[kernel", "kernel (syscalls, TCP, scheduler)"),
    (r"^libssl|^libcrypto|^_ssl\.", "OpenSSL (TLS)"),
    (r"^loop\.cpython", "uvloop"),
    (r"^libc\.so|^libm\.so|^\[vdso\]", "libc (copies, malloc, clocks)"),
    (r"\.cpython-", "other C extensions"),
)
OTHER_GROUP = "other"
_ROW = re.compile(r"^\s*([\d.]+)%\s+(\S.*?)\s*$")


def unavailable() -> str | None:
    """Why perf cannot sample here, or None."""
    if PERF is None:
        return "perf not installed (Debian: apt-get install linux-perf)"
    try:
        paranoid = int(PARANOID.read_text())
    except (OSError, ValueError):
        return None  # let perf itself say
    if paranoid > 1 and shutil.which("id") and subprocess.run(
            ["id", "-u"], capture_output=True, text=True).stdout.strip() != "0":
        return (f"perf_event_paranoid is {paranoid}: run as root or "
                "echo 1 > /proc/sys/kernel/perf_event_paranoid")
    return None


def start(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """``perf record`` of ``pid`` for ``seconds`` (cpu-clock, ~1 kHz) into ``out``."""
    assert PERF is not None
    log = open(out.with_suffix(".log"), "wb")  # noqa: SIM115 (the child holds it)
    try:
        return subprocess.Popen(
            [PERF, "record", "--event", "cpu-clock", "--freq", "999", "--pid", str(pid),
             "--output", str(out), "--", "sleep", f"{seconds:g}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        log.close()


def by_binary(data: Path) -> list[tuple[str, float]] | str:
    """The shares of a ``perf record`` file by group (:data:`GROUPS`), largest first; a
    string says why there are none."""
    assert PERF is not None
    done = subprocess.run(
        [PERF, "report", "--input", str(data), "--sort", "dso", "--stdio", "--no-children",
         "-g", "none"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return f"perf report failed: {done.stderr.strip()[-300:]}"
    return group_report(done.stdout)


def group_report(report: str) -> list[tuple[str, float]]:
    """``perf report --sort dso --stdio`` text -> shares by group, largest first."""
    shares: dict[str, float] = {}
    for line in report.splitlines():
        if line.startswith("#"):
            continue
        row = _ROW.match(line)
        if row is None:
            continue
        group = group_of(row.group(2))
        shares[group] = shares.get(group, 0.0) + float(row.group(1))
    return sorted(((g, round(p, 1)) for g, p in shares.items()), key=lambda gp: -gp[1])


def group_of(dso: str) -> str:
    for pattern, group in GROUPS:
        if re.search(pattern, dso):
            return group
    return OTHER_GROUP


def summary_line(shares: list[tuple[str, float]], per_op: float | None) -> str:
    """``Python interpreter 69.2% 114.7 us; kernel ...`` (µs when the CPU per op is known)."""
    return "; ".join(f"{group} {pct}%" + (f" {pct * per_op / 100:.1f} us" if per_op else "")
                     for group, pct in shares)


def result(data: Path) -> dict[str, Any]:
    """What :func:`by_binary` found, for the profile's JSON."""
    shares = by_binary(data)
    if isinstance(shares, str):
        return {"skipped": shares}
    return {"pct": shares, "file": str(data)}
