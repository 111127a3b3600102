from __future__ import annotations

from pathlib import Path

import pytest

from certs import layout


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `certs init` tree with agents c1 and prod.eu-west, shared read-only by a module."""
    root = tmp_path_factory.mktemp("pki")
    layout.init(root, layout.InitOptions(clusters=["c1", "prod.eu-west"]))
    return root


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unrelated tree: same names, different CAs."""
    root = tmp_path_factory.mktemp("other-pki")
    layout.init(root, layout.InitOptions(clusters=["c1"]))
    return root
