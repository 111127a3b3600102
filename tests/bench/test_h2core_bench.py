"""``python -m bench h2core``: runs both HTTP/2 server connections on the same requests and
prints the two figures."""

from __future__ import annotations

import re
import subprocess
import sys


def test_h2core_bench_prints_both_figures() -> None:
    result = subprocess.run([sys.executable, "-m", "bench", "h2core", "--requests", "60",
                             "--repeat", "1"], capture_output=True, text=True, timeout=60,
                            check=True)
    figures = re.findall(r"^(h2 library|h2server)\s+([\d.]+) us per request", result.stdout,
                         re.MULTILINE)
    assert [name for name, _ in figures] == ["h2 library", "h2server"]
    assert all(float(value) > 0 for _, value in figures)
