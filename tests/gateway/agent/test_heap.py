"""The agent's C heap thresholds (``gateway.agent.heap``), seen from glibc's own statistics.

Each case runs in a fresh interpreter, so that this process's heap is left as it is.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.agent.heap import MMAP_THRESHOLD, TRIM_THRESHOLD

# Prints: bytes of a block below MMAP_THRESHOLD that went to a mapping of its own; the same for
# a block at MMAP_THRESHOLD; the free memory at the heap's top once the first block is freed.
PROBE = """
import ctypes, sys
from gateway.agent.heap import tune_heap
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                "usmblks", "fsmblks", "uordblks", "fordblks",
                                                "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
assert tune_heap()
small, large = int(sys.argv[1]), int(sys.argv[2])
mapped = libc.mallinfo2().hblkhd
block = libc.malloc(small)
small_mapped = libc.mallinfo2().hblkhd - mapped
big = libc.malloc(large)
large_mapped = libc.mallinfo2().hblkhd - mapped - small_mapped
libc.free(big)
libc.free(block)
print(small_mapped, large_mapped, libc.mallinfo2().keepcost)
"""


def test_body_sized_blocks_stay_in_the_heap_and_are_not_trimmed_when_freed() -> None:
    """A few MiB (what a read of a large body allocates) come from the heap and stay there when
    freed (the next read does not fault them in again); blocks from MMAP_THRESHOLD up still get
    a mapping of their own, given back when freed."""
    try:
        import ctypes
        ctypes.CDLL(None).mallinfo2  # noqa: B018 (glibc >= 2.33)
    except AttributeError:
        pytest.skip("not glibc")
    small = MMAP_THRESHOLD // 2
    out = subprocess.run([sys.executable, "-c", PROBE, str(small), str(MMAP_THRESHOLD)],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    small_mapped, large_mapped, keep = map(int, out.split())
    assert small_mapped == 0
    assert large_mapped >= MMAP_THRESHOLD
    assert small <= keep < TRIM_THRESHOLD
