from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, ProcessGroup, compiled_modules, pure_source_run

if pure_source_run():
    # The project's modules from their .py files, though compiled ones sit beside them
    # (tests/test_compiled.py): a finder for the tree's folders that knows only source files.
    def _source_only(path: str) -> importlib.machinery.FileFinder:
        if not Path(path).resolve().is_relative_to(REPO):
            raise ImportError(path)  # everything else as usual
        return importlib.machinery.FileFinder(
            path, (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES))

    sys.path_hooks.insert(0, _source_only)
    sys.path_importer_cache.clear()


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test compiled modules that are older than their source: the tests would run
    the last build, not the code on disk (see setup.py)."""
    if pure_source_run():
        return
    stale = []
    # Each module's .so is a small shim over the group's one library, which holds the code: a
    # rebuild in place rewrites the library but leaves a shim that did not change as it was.
    library = max((p.stat().st_mtime for p in REPO.glob("*__mypyc.*.so")), default=0.0)
    for name in compiled_modules():
        source = REPO.joinpath(*name.split(".")).with_suffix(".py")
        for built in source.parent.glob(source.stem + ".*.so"):
            if max(built.stat().st_mtime, library) < source.stat().st_mtime:
                stale.append(str(source.relative_to(REPO)))
    if stale:
        raise pytest.UsageError(
            f"compiled modules older than their source: {', '.join(stale)}. Build them again "
            "(python3 -m pip install -e '.[test]'), or remove them (git clean -fX -- '*.so') "
            "to test the Python source")


@pytest.fixture
def processes() -> Iterator[ProcessGroup]:
    """Start background processes; they are stopped (only they) when the test ends."""
    group = ProcessGroup()
    try:
        yield group
    finally:
        group.stop_all()
