"""Where a process's CPU goes by binary: the Python interpreter, the kernel, OpenSSL, uvloop.

py-spy (:mod:`bench.profiling`) sees only Python frames: time in C shows as the Python line
that called it, and so does time the process sat preempted there (on a busy 2-CPU machine a
socket write that wakes the peer is often where the writer loses its CPU). ``perf record``
with the ``cpu-clock`` event counts only time on a CPU, and says in which binary: so the
share of the interpreter against the kernel's syscalls and TCP, OpenSSL's TLS and uvloop's C
tells how much of a request's cost is our Python at all.

The request path is compiled with mypyc (pyproject's ``[tool.hubproxy.compiled]``): its
functions are C, with no Python frame py-spy could see, so py-spy counts them all as the
event loop's line that called them. perf sees them by their C symbols, ``CPyDef_<module>___
<function>``, in its call stacks (DWARF, :func:`start`): :func:`attribute` puts each sample in
the layer of the innermost frame of ours (its module, by :func:`compiled_module`), with the
interpreter's work that frame asked for, and counts our functions' shares (innermost and
inclusive). A sample in the kernel or OpenSSL stays there: that is the cost of a syscall or
of TLS, whoever asked.

Needs Linux ``perf`` and the right to sample another process (``perf_event_paranoid`` <= 1
for the kernel's share, or root); without them :func:`start` says why and the profile goes
on without this part.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

PERF = shutil.which("perf")
PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")

KERNEL_GROUP = "kernel (syscalls, TCP, scheduler)"
TLS_GROUP = "OpenSSL (TLS)"
UVLOOP_GROUP = "uvloop"
# A binary's group, by the first pattern its name matches (perf's "dso" column).
GROUPS: tuple[tuple[str, str], ...] = (
    (r"^libpython|^python3", "Python interpreter"),
    (r"^\[kernel", KERNEL_GROUP),
    (r"^libssl|^libcrypto|^_ssl\.", TLS_GROUP),
    (r"^loop\.cpython", UVLOOP_GROUP),
    (r"^hubproxy_compiled", "hubproxy's compiled request path (mypyc)"),
    (r"^libc\.so|^libm\.so|^\[vdso\]", "libc (copies, malloc, clocks)"),
    (r"\.cpython-", "other C extensions"),
)
OTHER_GROUP = "other"
_ROW = re.compile(r"^\s*([\d.]+)%\s+(\S.*?)\s*$")
# The layers (bench.profiling.LAYERS) of a sample in OpenSSL, and of one whose innermost
# known frame is uvloop's C (before any of ours).
TLS_LAYER = "TLS (OpenSSL)"
EVENT_LOOP_LAYER = "event loop (uvloop: epoll, socket reads, callbacks)"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
# Stack bytes perf copies per sample to unwind with DWARF: enough for the event loop, the
# request path and the C below it; a sample is about this size on disk.
STACK_BYTES = 8192
# mypyc's C names for a compiled function (CPyDef_) and its Python-callable wrapper (CPyPy_).
_COMPILED_PREFIXES = ("CPyDef_", "CPyPy_")


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
    """``perf record`` of ``pid`` for ``seconds`` (cpu-clock, ~1 kHz) into ``out``, with call
    stacks (DWARF, :data:`STACK_BYTES` a sample) for :func:`attribute`."""
    assert PERF is not None
    log = open(out.with_suffix(".log"), "wb")  # noqa: SIM115 (the child holds it)
    try:
        return subprocess.Popen(
            [PERF, "record", "--event", "cpu-clock", "--freq", "999",
             "--call-graph", f"dwarf,{STACK_BYTES}",
             "--pid", str(pid), "--output", str(out), "--", "sleep", f"{seconds:g}"],
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
    return "; ".join(f"{group} {pct}%" + (f" {_us(pct * per_op / 100)} us" if per_op else "")
                     for group, pct in shares)


def _us(value: float) -> str:
    # A watch event costs a fraction of a microsecond: three decimals say how much.
    return f"{value:.1f}" if value >= 1 else f"{value:.3f}"


def compiled_modules(pyproject: Path = PYPROJECT) -> list[str]:
    """The modules setup.py compiles with mypyc: pyproject's ``[tool.hubproxy.compiled]``
    (OSError without the source tree's pyproject.toml)."""
    with open(pyproject, "rb") as f:
        return list(tomllib.load(f)["tool"]["hubproxy"]["compiled"]["modules"])


def compiled_module(symbol: str, modules: Sequence[str]) -> str | None:
    """The compiled module of a mypyc C symbol, or None (not ours). mypyc writes a module as
    the shortest tail of its dotted name that tells it apart in the group, its parts joined
    by ``___`` like the class and function after it (``agent___exchange___HttpExchange___x``
    is gateway.agent.exchange, beside gateway.hub.exchange's ``hub___exchange``): the
    longest tail of the symbol's parts that names exactly one module is it."""
    name = next((symbol[len(p):] for p in _COMPILED_PREFIXES if symbol.startswith(p)), None)
    if name is None:
        return None
    parts = name.split("___")
    for n in range(min(len(parts), 4), 0, -1):
        tail = ".".join(parts[:n])
        found = [m for m in modules if m == tail or m.endswith("." + tail)]
        if len(found) == 1:
            return found[0]
    return None


def function_name(symbol: str, module: str) -> str:
    """``CPyDef_agent___exchange___HttpExchange____setup_now`` -> ``HttpExchange._setup_now
    (gateway/agent/exchange.py)``, as :mod:`bench.profiling` writes a function."""
    name = next(symbol[len(p):] for p in _COMPILED_PREFIXES if symbol.startswith(p))
    tail = module.split(".")
    for n in range(len(tail), 0, -1):
        prefix = "___".join(tail[-n:]) + "___"
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return f"{name.replace('___', '.')} ({module.replace('.', '/')}.py)"


Frame = tuple[str, str]  # (symbol, binary), as perf script writes them


def samples(script: str) -> list[list[Frame]]:
    """``perf script --fields ip,sym,dso`` text -> each sample's frames, innermost first."""
    out: list[list[Frame]] = []
    for block in script.split("\n\n"):
        frames: list[Frame] = []
        for line in block.strip().splitlines():
            _, _, rest = line.strip().partition(" ")
            sym, _, dso = rest.rpartition(" (")
            if not sym:  # no binary given
                sym, dso = rest, ""
            frames.append((sym.strip(), dso.rstrip(")").rsplit("/", 1)[-1]))
        if frames:
            out.append(frames)
    return out


def attribute(stacks: Iterable[list[Frame]], modules: Sequence[str],
              layer_of_path: Callable[[str], str], top: int = 15) -> dict[str, Any]:
    """Samples' shares by layer and our compiled functions' shares (see the module
    docstring): ``layer_pct``; ``innermost_pct``, the innermost function of ours in each
    sample of our layers (its own work and the interpreter's for it; not a syscall or TLS
    it called); ``inclusive_pct``, every function of ours on the stack, whatever it called.
    ``layer_of_path`` names the layer of a module's file (``gateway/agent/exchange.py``)."""
    layers: Counter[str] = Counter()
    innermost: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    ours: dict[str, tuple[str, str] | None] = {}  # symbol -> (function, layer), once each
    total = 0
    for frames in stacks:
        total += 1
        leaf_group = group_of(frames[0][1])
        layer = (KERNEL_GROUP if leaf_group == KERNEL_GROUP
                 else TLS_LAYER if leaf_group == TLS_GROUP else None)
        seen: set[str] = set()
        for sym, dso in frames:
            if sym not in ours:
                module = compiled_module(sym, modules)
                ours[sym] = None if module is None else (
                    function_name(sym, module), layer_of_path(f"{module.replace('.', '/')}.py"))
            found = ours[sym]
            if found is None:
                group = group_of(dso)
                if layer is None and group in (TLS_GROUP, UVLOOP_GROUP):
                    layer = TLS_LAYER if group == TLS_GROUP else EVENT_LOOP_LAYER
                continue
            fn, fn_layer = found
            if not seen and layer is None:  # its own work, not a syscall's or TLS's
                innermost[fn] += 1
                layer = fn_layer
            seen.add(fn)
        for fn in seen:
            inclusive[fn] += 1
        layers[layer or leaf_group] += 1

    def share(c: Counter[str], n: int | None = None) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in c.most_common(n)] if total else []
    return {"samples": total, "layer_pct": share(layers), "innermost_pct": share(innermost, top),
            "inclusive_pct": share(inclusive, top)}


def by_layer(data: Path, layer_of_path: Callable[[str], str]) -> dict[str, Any] | str:
    """:func:`attribute` of a ``perf record`` file with call stacks; a string says why not."""
    assert PERF is not None
    done = subprocess.run([PERF, "script", "--input", str(data), "--fields", "ip,sym,dso"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return f"perf script failed: {done.stderr.strip()[-300:]}"
    try:
        modules = compiled_modules()
    except OSError as exc:
        return f"no list of compiled modules: {exc}"
    return attribute(samples(done.stdout), modules, layer_of_path)


def result(data: Path, layer_of_path: Callable[[str], str] | None = None) -> dict[str, Any]:
    """What :func:`by_binary` found, for the profile's JSON; with ``layer_of_path``, also
    :func:`by_layer` (``stacks``: its shares)."""
    shares = by_binary(data)
    if isinstance(shares, str):
        return {"skipped": shares}
    found: dict[str, Any] = {"pct": shares, "file": str(data)}
    if layer_of_path is not None:
        found["stacks"] = by_layer(data, layer_of_path)
    return found
