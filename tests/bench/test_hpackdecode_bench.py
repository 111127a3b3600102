"""``python -m bench hpackdecode``: runs, decodes each kind of block as hpack does (it checks
before timing), and prints one row per kind with both figures."""

from __future__ import annotations

import subprocess
import sys


def test_hpackdecode_bench_prints_a_row_per_kind_of_block() -> None:
    result = subprocess.run([sys.executable, "-m", "bench", "hpackdecode", "--blocks", "30",
                             "--repeat", "1"], capture_output=True, text=True, timeout=60,
                            check=True)
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["go", "nghttp2", "nghttp2-new-token", "kube-first"]
    for _, theirs, ours, speedup in rows:
        assert float(theirs) > 0 and float(ours) > 0 and speedup.endswith("x")
