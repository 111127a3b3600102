"""bench.nativeprof: a process's CPU by binary, from perf."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import nativeprof

# ``perf report --sort dso --stdio --no-children -g none`` of a gateway under small GETs.
REPORT = """\
# Samples: 2K of event 'cpu-clock:pppH'
#
# Overhead  Shared Object
# ........  ........................................
#
    69.22%  libpython3.11.so.1.0
    12.37%  [kernel.kallsyms]
     5.61%  libcrypto.so.3
     5.19%  libc.so.6
     4.71%  loop.cpython-311-x86_64-linux-gnu.so
     1.86%  libssl.so.3
     0.43%  [vdso]
     0.29%  _asyncio.cpython-311-x86_64-linux-gnu.so
     0.19%  _ssl.cpython-311-x86_64-linux-gnu.so
     0.13%  libffi.so.8
"""


def test_a_perf_report_is_grouped_by_what_the_binaries_do() -> None:
    assert nativeprof.group_report(REPORT) == [
        ("Python interpreter", 69.2),
        ("kernel (syscalls, TCP, scheduler)", 12.4),
        ("OpenSSL (TLS)", 7.7),
        ("libc (copies, malloc, clocks)", 5.6),
        ("uvloop", 4.7),
        ("other C extensions", 0.3),
        ("other", 0.1),
    ]


def test_the_summary_turns_shares_into_microseconds_per_operation() -> None:
    line = nativeprof.summary_line([("Python interpreter", 80.0), ("kernel", 20.0)], 150.0)
    assert line == "Python interpreter 80.0% 120.0 us; kernel 20.0% 30.0 us"


@pytest.mark.skipif(nativeprof.unavailable() is not None,
                    reason=f"perf cannot sample here: {nativeprof.unavailable()}")
def test_perf_finds_a_busy_python_process_in_the_interpreter(tmp_path: Path) -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.2)
        data = tmp_path / "busy.perf.data"
        nativeprof.start(busy.pid, 1, data).wait(30)
        found = nativeprof.result(data)
    finally:
        busy.kill()
        busy.wait()
    assert "pct" in found, found
    shares = dict(found["pct"])
    assert shares.get("Python interpreter", 0.0) > 50.0, found
    assert os.path.exists(found["file"])
