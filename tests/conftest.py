from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import ProcessGroup


@pytest.fixture
def processes() -> Iterator[ProcessGroup]:
    """Start background processes; they are stopped (only they) when the test ends."""
    group = ProcessGroup()
    try:
        yield group
    finally:
        group.stop_all()
