"""gateway.ops.gctune: objects alive after start-up leave the collector's walks."""

from __future__ import annotations

import gc

from gateway.ops import gctune


def test_settle_freezes_what_start_up_left_alive() -> None:
    survivors = [[i] for i in range(1000)]  # container objects, tracked by the collector
    gc.unfreeze()
    try:
        gctune.settle()
        assert gc.get_freeze_count() >= len(survivors)
        assert not any(gc.is_tracked(s) and s in gc.get_objects() for s in survivors[:3])
    finally:
        gc.unfreeze()
