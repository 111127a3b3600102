"""The C heap's thresholds for a process that relays large bodies (glibc ``mallopt``).

A large body goes through the agent as a few transient buffers of 256 KiB to a few MiB per read
(the chunk it becomes, TLS's output for the tunnel, the tunnel's queue while the hub is slower).
With glibc's defaults every such buffer is a fresh mapping, or heap memory that was handed back
to the kernel the moment the previous one was freed (the trim threshold follows the largest
freed block, so about two of them): each read then page-faults its buffers in again, zeroed,
and charged to the cgroup. That was a fifth of the agent's CPU per GB of body. Fixed thresholds
keep those buffers in the heap and keep up to ``TRIM_THRESHOLD`` of free memory at its top,
which costs a few MiB of RSS after a transfer (measured: +4.9 MiB after 64 MiB bodies), never
more than ``TRIM_THRESHOLD`` (measured: half of it costs the agent 8% more CPU per GB, four
times it saves nothing more). Blocks from ``MMAP_THRESHOLD`` up are still mapped and unmapped
on their own. Without glibc (another libc: no ``mallopt``) nothing changes.
"""

from __future__ import annotations

import ctypes

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

TRIM_THRESHOLD = 8 << 20  # free memory the heap keeps at its top rather than trim
MMAP_THRESHOLD = 4 << 20  # blocks at least this large get a mapping of their own


def tune_heap() -> bool:
    """Set the thresholds for this process; True if the C library took them."""
    # The process's own symbols: libc is loaded already. find_library would run ldconfig in a
    # subprocess, which a minimal image may not have (then nothing would be tuned).
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) \
        and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
