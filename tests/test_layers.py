"""The layers of pyproject.toml's import-linter contracts hold, and each kind of break is caught.

The second test copies the packages into a temporary tree, adds one forbidden import there,
and checks that `lint-imports` fails naming the contract: a contract that could not fail would
prove nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "tunnel", "certs", "kubesim", "bench")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
         "sys.exit(lint_imports_command())", "--no-cache"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )


def test_every_import_contract_is_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


# (file to change, line to add, the contract that must break)
BREAKS = [
    ("tunnel/frames.py", "import gateway.wire.http1", "tunnel imports nothing of ours"),
    ("certs/files.py", "import tunnel.connection",
     "certs imports nothing of ours but tunnel's identity rule"),
    ("kubesim/store.py", "import certs.identity", "kubesim imports nothing of ours"),
    ("gateway/hub/admission/routing.py", "import kubesim.store",
     "no production code imports kubesim or bench"),
    ("gateway/agent/agent.py", "from gateway.hub import config",
     "the hub, the agent and the consumer tools do not import each other"),
    ("gateway/access/creds.py", "from gateway.agent import kubeapi",
     "the hub, the agent and the consumer tools do not import each other"),
    ("gateway/wire/status.py", "from gateway.ops import audit",
     "gateway: programs over shared plumbing over the wire"),
    # A type-only import counts: this is the circle the Protocols in exchange.py replaced.
    ("gateway/hub/exchange.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.hub import frontdoor",
     "hub: process, then connection, then request, then relay, then admission"),
    # The lifecycle knows neither door; the doors know nothing of each other.
    ("gateway/hub/request.py", "from gateway.hub import frontdoor_h2",
     "hub: process, then connection, then request, then relay, then admission"),
    ("gateway/hub/frontdoor.py", "from gateway.hub import frontdoor_h2",
     "hub: process, then connection, then request, then relay, then admission"),
    ("gateway/hub/admission/routing.py", "from gateway.hub.admission import chain",
     "admission: the chain over the filters"),
    ("gateway/agent/pool.py", "from gateway.agent import agent",
     "no import cycles inside gateway, tunnel or certs"),
]


@pytest.mark.parametrize(("path", "line", "contract"), BREAKS,
                         ids=[f"{p}:{c[:30]}" for p, _, c in BREAKS])
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, path: str, line: str,
                                                contract: str) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.md", "*.yaml"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / path
    target.write_text(target.read_text() + "\n" + line + "\n")

    result = lint_imports(tmp_path)

    assert result.returncode != 0, result.stdout
    assert f"{contract} BROKEN" in result.stdout, result.stdout
