"""``--profile``: sample gateway and agent with py-spy while a workload runs.

py-spy attaches to the running processes by PID (``--nonblocking``: the targets are never
stopped), so the gateway and agent run unmodified. Each process gets a collapsed-stack file
(``*.txt``, py-spy's ``raw`` format) and an SVG flamegraph; :func:`top_functions` summarises a
collapsed-stack file as the functions with the most samples (self and inclusive).

Where each microsecond goes: :func:`record` also reads each process's CPU time over the
workload (``/proc``), and when the workload says how many operations it did (requests, watch
events), turns both into CPU µs per operation per process, and each top function's share into
µs per operation (``top.<role>.self_us``): the share of the samples times the process's CPU
per operation. py-spy samples only the Python stacks (no ``--native``), so time spent in C
(OpenSSL, uvloop's socket calls) counts as the Python line that called it -- and so does all
of the request path once it is compiled (pyproject's ``[tool.hubproxy.compiled]``): its
functions have no Python frames, and py-spy shows them as the event loop's line. The perf
part (:mod:`bench.nativeprof`, ``native.<role>.stacks``) sees them: the CPU by layer with the
compiled modules in their own layers (:func:`layer_of_path`), and our functions' shares.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import nativeprof
from bench.procstats import CpuMeter

PY_SPY = shutil.which("py-spy")
INSTALL_HINT = "pip install py-spy"


def record(pids: dict[str, int], seconds: float, outdir: Path, label: str,
           workload: Callable[[], Any], rate: int = 200) -> dict[str, Any]:
    """Run ``workload()`` while py-spy samples every PID (and perf, where it can: ``native``,
    the CPU by binary, :mod:`bench.nativeprof`); returns file names, top functions and each
    process's CPU seconds (``cpu_s``). A workload that returns ``{"ops": N, ...}`` also gets
    CPU µs per operation per process (``us_per_op``), its top functions in µs per operation
    (``top.<role>.self_us``), its CPU by binary in µs (``native.<role>.us``) and by layer
    and function of ours from perf's stacks (``native.<role>.stacks``, ``*_us``)."""
    if PY_SPY is None:
        return {"skipped": f"py-spy not installed ({INSTALL_HINT})"}
    outdir.mkdir(parents=True, exist_ok=True)
    samplers: list[tuple[str, str, subprocess.Popen[bytes], Path]] = []
    for role, pid in pids.items():
        for fmt, ext in (("raw", "txt"), ("flamegraph", "svg")):
            out = outdir / f"{label}-{role}.{ext}"
            log = open(outdir / f"{label}-{role}-{fmt}.log", "wb")  # noqa: SIM115 (closed below)
            proc = subprocess.Popen(
                [PY_SPY, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
                 "--rate", str(rate), "--nonblocking", "--format", fmt, "--output", str(out)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()
            samplers.append((role, fmt, proc, out))
    result: dict[str, Any] = {"workload": None, "files": {}, "top": {}, "native": {}}
    why_not = nativeprof.unavailable()
    perfs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    for role, pid in pids.items():
        if why_not is None:
            data = outdir / f"{label}-{role}.perf.data"
            perfs.append((role, nativeprof.start(pid, seconds, data), data))
        else:
            result["native"][role] = {"skipped": why_not}
    meter = CpuMeter({role: [pid] for role, pid in pids.items()}).start()
    try:
        result["workload"] = workload()
    finally:
        result["cpu_s"] = meter.stop()
        for role, proc, data in perfs:
            try:
                proc.wait(seconds + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            result["native"][role] = (nativeprof.result(data, layer_of_path) if data.exists() else
                                      {"skipped": data.with_suffix(".log").read_text()[-300:]})
        for role, fmt, proc, out in samplers:
            try:
                proc.wait(seconds + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if out.exists():
                result["files"][f"{role}.{fmt}"] = str(out)
                if fmt == "raw":
                    result["top"][role] = top_functions(out)
            else:
                logfile = outdir / f"{label}-{role}-{fmt}.log"
                result["files"][f"{role}.{fmt}"] = f"(none: {logfile.read_text()[-300:]})"
    ops = result["workload"].get("ops") if isinstance(result["workload"], dict) else None
    if ops:
        result["us_per_op"] = {role: round(1e6 * cpu / ops, 2)
                               for role, cpu in result["cpu_s"].items()}
        for role, top in result["top"].items():
            per_op = result["us_per_op"].get(role, 0.0)
            for key in ("self", "self_fn", "inclusive", "layer"):
                top[f"{key}_us"] = [(f, round(pct * per_op / 100, 2))
                                    for f, pct in top[f"{key}_pct"]]
        for role, native in result["native"].items():
            per_op = result["us_per_op"].get(role, 0.0)
            if "pct" in native:
                native["us"] = [(g, round(pct * per_op / 100, 2)) for g, pct in native["pct"]]
            stacks = native.get("stacks")
            if isinstance(stacks, dict):
                for key in ("layer", "innermost", "inclusive"):
                    stacks[f"{key}_us"] = [(f, round(pct * per_op / 100, 2))
                                           for f, pct in stacks[f"{key}_pct"]]
    return result


# Where a sample's innermost frame is, as a layer of the program: checked in order, the first
# prefix of the frame's file (as :func:`_short` writes it) that matches names the layer.
LAYERS: tuple[tuple[str, str], ...] = (
    ("runners.py", nativeprof.EVENT_LOOP_LAYER),
    ("ssl.py", nativeprof.TLS_LAYER),
    ("tunnel/", "tunnel (framing, flow control, streams)"),
    ("gateway/wire/", "HTTP wire (HTTP/1.1, HTTP/2, HPACK)"),
    ("gateway/hub/admission/", "admission (routing, auth, identity, seats)"),
    ("gateway/ops/", "audit, metrics, logs"),
    ("gateway/hub/", "gateway request handling"),
    ("gateway/agent/", "agent request handling"),
)
OTHER_LAYER = "other Python (stdlib, libraries)"


def layer_of(frame: str) -> str:
    """The layer (:data:`LAYERS`) of a frame written by :func:`_short`."""
    _, _, where = frame.partition(" (")
    return layer_of_path(where)


def layer_of_path(path: str) -> str:
    """The layer (:data:`LAYERS`) of a file as :func:`_short` writes it
    (``gateway/agent/exchange.py``)."""
    for prefix, layer in LAYERS:
        if path.startswith(prefix):
            return layer
    return OTHER_LAYER


def top_functions(collapsed: Path, n: int = 25) -> dict[str, Any]:
    """Sample shares of the hottest code in a collapsed-stack file: ``self_pct`` per line (a
    C call such as a TLS write shows as the line that made it), ``self_fn_pct`` per function,
    ``inclusive_pct`` per function (its calls included; recursion counted once), and
    ``layer_pct``: every sample's innermost frame by layer (:data:`LAYERS`)."""
    self_counts: Counter[str] = Counter()
    self_fn: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    layers: Counter[str] = Counter()
    samples = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        samples += k
        frames = [_short(f) for f in stack.split(";")]
        if frames:
            self_counts[frames[-1]] += k
            self_fn[_function(frames[-1])] += k
            layers[layer_of(frames[-1])] += k
        for function in {_function(f) for f in frames}:
            total_counts[function] += k

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * v / samples, 1)) for f, v in c.most_common(n)] if samples else []
    return {"samples": samples, "self_pct": share(self_counts), "self_fn_pct": share(self_fn),
            "inclusive_pct": share(total_counts),
            "layer_pct": [(layer, round(100 * v / samples, 1)) for layer, v in
                          layers.most_common()] if samples else []}


def _function(frame: str) -> str:
    """``func (file.py:123)`` -> ``func (file.py)``."""
    head, sep, _ = frame.rpartition(":")
    return f"{head})" if sep and frame.endswith(")") else frame


def _short(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py:123)``; keeps the package for ours."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path, _, line = where.rpartition(":")
    parts = Path(path).parts
    ours = next((i for i, p in enumerate(parts) if p in ("gateway", "tunnel", "certs")), None)
    short = "/".join(parts[ours:]) if ours is not None else (parts[-1] if parts else where)
    return f"{name} ({short}:{line})" if line else f"{name} ({short})"


def summary(profile: dict[str, Any], n: int = 8) -> str:
    """The ``profile`` part of ``bench gateway --profile --json`` as text: per workload and
    process, CPU µs per operation, then the functions with the most self time (in µs per
    operation), every layer's share of the time (and its µs), and the most inclusive time
    (functions on nearly every sample, the event loop and the program's entry, left out)."""
    lines = []
    for label, p in profile.items():
        if not isinstance(p, dict) or "top" not in p:
            continue
        work = p.get("workload") if isinstance(p.get("workload"), dict) else {}
        unit = work.get("unit", "op")
        figures = ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in work.items())
        lines.append(f"{label} ({figures})")
        for role, top in p["top"].items():
            per_op = (p.get("us_per_op") or {}).get(role)
            lines.append(f"  {role}: {per_op} CPU us per {unit}, {top['samples']} samples")
            fn_us = dict(top.get("self_fn_us") or [])
            lines.append("    self: " + "; ".join(
                f"{f} {pct}%" + (f" {fn_us[f]} us" if f in fn_us else "")
                for f, pct in top["self_fn_pct"][:n]))
            native = (p.get("native") or {}).get(role) or {}
            if "pct" in native:
                lines.append("    by binary (perf): "
                             + nativeprof.summary_line(native["pct"], per_op))
            lines += stack_lines(native, per_op, n)
            layer_us = dict(top.get("layer_us") or [])
            if top.get("layer_pct"):
                lines.append("    by layer: " + "; ".join(
                    f"{layer} {pct}%" + (f" {layer_us[layer]} us" if layer in layer_us else "")
                    for layer, pct in top["layer_pct"]))
            lines.append("    inclusive: " + "; ".join(
                f"{f} {pct}%" for f, pct in top["inclusive_pct"] if pct < 95)[:1000])
    return "\n".join(lines)


def stack_lines(native: dict[str, Any], per_op: float | None, n: int = 8) -> list[str]:
    """What perf's stacks say of one process (``native.<role>``, :mod:`bench.nativeprof`):
    the CPU by layer, compiled code in its own layers, and our hottest functions."""
    stacks = native.get("stacks")
    if isinstance(stacks, str):
        return [f"    by layer (perf): none ({stacks})"]
    if not isinstance(stacks, dict) or not stacks.get("samples"):
        return []
    return [
        f"    by layer (perf, {stacks['samples']} stacks): "
        + nativeprof.summary_line(stacks["layer_pct"], per_op),
        "    ours, own work (perf): "
        + nativeprof.summary_line(stacks["innermost_pct"][:n], per_op),
        "    ours, inclusive (perf): "
        + nativeprof.summary_line(stacks["inclusive_pct"][:n], per_op),
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.profiling RESULT.json``: :func:`summary` of a gateway run's profile."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.profiling", description=main.__doc__)
    parser.add_argument("result", help="JSON written by python -m bench gateway --profile --json")
    parser.add_argument("--top", type=int, default=8, help="functions per list (default 8)")
    args = parser.parse_args(argv)
    with open(args.result) as f:
        print(summary(json.load(f).get("profile") or {}, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
