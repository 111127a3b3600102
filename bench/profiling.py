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
(OpenSSL, uvloop's socket calls) counts as the Python line that called it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.procstats import CpuMeter

PY_SPY = shutil.which("py-spy")
INSTALL_HINT = "pip install py-spy"


def record(pids: dict[str, int], seconds: float, outdir: Path, label: str,
           workload: Callable[[], Any], rate: int = 200) -> dict[str, Any]:
    """Run ``workload()`` while py-spy samples every PID; returns file names, top functions and
    each process's CPU seconds (``cpu_s``). A workload that returns ``{"ops": N, ...}`` also
    gets CPU µs per operation per process (``us_per_op``) and its top functions in µs per
    operation (``top.<role>.self_us``)."""
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
    result: dict[str, Any] = {"workload": None, "files": {}, "top": {}}
    meter = CpuMeter({role: [pid] for role, pid in pids.items()}).start()
    try:
        result["workload"] = workload()
    finally:
        result["cpu_s"] = meter.stop()
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
            for key in ("self", "self_fn", "inclusive"):
                top[f"{key}_us"] = [(f, round(pct * per_op / 100, 2))
                                    for f, pct in top[f"{key}_pct"]]
    return result


def top_functions(collapsed: Path, n: int = 25) -> dict[str, Any]:
    """Sample shares of the hottest code in a collapsed-stack file: ``self_pct`` per line (a
    C call such as a TLS write shows as the line that made it), ``self_fn_pct`` per function,
    ``inclusive_pct`` per function (its calls included; recursion counted once)."""
    self_counts: Counter[str] = Counter()
    self_fn: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
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
        for function in {_function(f) for f in frames}:
            total_counts[function] += k

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * v / samples, 1)) for f, v in c.most_common(n)] if samples else []
    return {"samples": samples, "self_pct": share(self_counts), "self_fn_pct": share(self_fn),
            "inclusive_pct": share(total_counts)}


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
    operation) and the most inclusive time (functions on nearly every sample, the event loop
    and the program's entry, left out)."""
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
            lines.append("    inclusive: " + "; ".join(
                f"{f} {pct}%" for f, pct in top["inclusive_pct"] if pct < 95)[:1000])
    return "\n".join(lines)


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
