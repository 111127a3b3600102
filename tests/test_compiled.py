"""The request path runs compiled where the install could build it (setup.py compiles the
modules pyproject.toml lists under [tool.hubproxy.compiled] with mypyc), and the same source
runs as plain Python where it could not."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from tests.support import PURE_SOURCE, REPO, compiled_modules, in_ci, is_compiled, pure_source_run

# Sans-IO cores and in-process hub and agent tests: the source's own behaviour, in seconds.
PURE_RUN = ["tests/tunnel/test_session.py", "tests/tunnel/test_frames.py",
            "tests/gateway/wire/test_http1.py", "tests/gateway/wire/test_h2client.py",
            "tests/gateway/hub/test_forward.py", "tests/gateway/agent/test_fast_path.py",
            # and the tests that patch a module's code (tests.support.needs_pure)
            "tests/gateway/hub/test_request_phases.py", "tests/gateway/hub/test_header_verdict.py"]


def test_every_listed_module_is_compiled_or_none_is() -> None:
    """All or nothing (setup.py): a half-built set would mean a build that failed unnoticed.
    In CI, where the machine has a compiler, all of them; with HUBPROXY_PURE_SOURCE=1, none."""
    compiled = {name: is_compiled(importlib.import_module(name))
                for name in compiled_modules()}
    if pure_source_run():
        assert [name for name, done in compiled.items() if done] == []
    elif in_ci() or any(compiled.values()):
        # If none is: setup.py fell back to pure Python (a type error, no compiler);
        # `pip install -v -e .` shows why.
        assert [name for name, done in compiled.items() if not done] == []
    else:
        pytest.skip("installed without a C compiler: the pure Python modules run")


def test_the_pure_source_passes_the_cores_tests() -> None:
    """The tree's own .py files, with the compiled extensions beside them ignored
    (tests/conftest.py, HUBPROXY_PURE_SOURCE=1): what a machine without a compiler runs."""
    env = {**os.environ, PURE_SOURCE: "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist",
                          "-p", "no:cacheprovider", *PURE_RUN, "tests/test_compiled.py::"
                          "test_every_listed_module_is_compiled_or_none_is"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout.splitlines()[-1]


def test_a_bytes_slice_that_ends_before_it_starts_is_empty() -> None:
    """Python's rule, which mypyc's runtime breaks unless setup.py mends it (SystemError):
    a status line without a reason slices raw[13:12]."""
    from gateway.hub.relayhead import relayed_head

    head = relayed_head(b"HTTP/1.1 204\r\nContent-Length: 0\r\n\r\n")
    assert head is not None and (head.status, head.reason) == (204, b"")
