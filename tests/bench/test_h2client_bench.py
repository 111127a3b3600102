"""``python -m bench h2client``: runs both HTTP/2 client connections on the same workloads and
prints the figures."""

from __future__ import annotations

import re
import subprocess
import sys


def test_h2client_bench_prints_both_figures_for_both_workloads() -> None:
    result = subprocess.run([sys.executable, "-m", "bench", "h2client", "--requests", "60",
                             "--reads", "3", "--repeat", "1"], capture_output=True, text=True,
                            timeout=60, check=True)
    figures = re.findall(r"^(short request|watch event)\s+h2 library\s+([\d.]+) us, "
                         r"h2client\s+([\d.]+) us", result.stdout, re.MULTILINE)
    assert [name for name, _, _ in figures] == ["short request", "watch event"]
    assert all(float(a) > 0 and float(b) > 0 for _, a, b in figures)
