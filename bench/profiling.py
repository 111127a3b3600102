"""``--profile``: sample gateway and agent with py-spy while a workload runs.

py-spy attaches to the running processes by PID (``--nonblocking``: the targets are never
stopped), so the gateway and agent run unmodified. Each process gets a collapsed-stack file
(``*.txt``, py-spy's ``raw`` format) and an SVG flamegraph; :func:`top_functions` summarises a
collapsed-stack file as the functions with the most samples (self and inclusive).
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

PY_SPY = shutil.which("py-spy")
INSTALL_HINT = "pip install py-spy"


def record(pids: dict[str, int], seconds: float, outdir: Path, label: str,
           workload: Callable[[], Any], rate: int = 200) -> dict[str, Any]:
    """Run ``workload()`` while py-spy samples every PID; returns file names and top functions."""
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
    try:
        result["workload"] = workload()
    finally:
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
    return result


def top_functions(collapsed: Path, n: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares of the hottest functions in a collapsed-stack file."""
    self_counts: Counter[str] = Counter()
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
        for frame in set(frames):
            total_counts[frame] += k
    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * v / samples, 1)) for f, v in c.most_common(n)] if samples else []
    return {"samples": samples, "self_pct": share(self_counts),
            "inclusive_pct": share(total_counts)}


def _short(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py:123)``; keeps the package for ours."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path, _, line = where.rpartition(":")
    parts = Path(path).parts
    ours = next((i for i, p in enumerate(parts) if p in ("gateway", "tunnel", "certs")), None)
    short = "/".join(parts[ours:]) if ours is not None else (parts[-1] if parts else where)
    return f"{name} ({short}:{line})" if line else f"{name} ({short})"
