"""gateway.ops.rlimits: the soft open-file limit is raised to the hard one, in a child process."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import json, logging, resource, sys
logging.basicConfig(stream=sys.stderr)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
from gateway.ops.rlimits import raise_open_file_limit
got = raise_open_file_limit(int(sys.argv[1]))
print(json.dumps([got, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard]))
"""


def run_child(wanted: int) -> tuple[list[int], str]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(wanted)], capture_output=True,
                         text=True, timeout=30, check=True)
    return json.loads(out.stdout), out.stderr


def test_soft_limit_rises_to_the_hard_limit() -> None:
    (got, soft, hard), err = run_child(100)
    assert got == soft
    assert got == hard if hard != -1 else got >= 256  # -1: unlimited, nothing to raise to
    assert "below" not in err


def test_a_hard_limit_below_the_configured_connections_is_reported() -> None:
    (_got, _soft, hard), err = run_child(10**9)
    assert f"open-file limit {hard} is below the 1000000000 connections" in err
