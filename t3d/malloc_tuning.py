"""The C allocator in a serving process: large buffers go back to the OS once freed.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` (128 KiB at first) with
its own mmap, which free() returns to the OS at once. But the threshold is dynamic: each
time such a block is freed it rises to that block's size, up to 32 MiB, and from then on
blocks that size come from the heap, where freed memory mostly stays in the process.
Measured with three 30 MiB provider lines (``python -m bench.large_lines``): the daemon
kept ~65 MB more than it started with after the turns ended, and none with the
threshold fixed.

`tune_malloc` (called once by ``t3d serve``, before the loop starts) fixes it at
`MMAP_THRESHOLD` (fixing it turns the dynamic rise off). Blocks that large are rare here
(a large provider line, a large item's body, a large snapshot), so the extra mmap/munmap
per block costs nothing measurable. Not on glibc (no ``mallopt``) or with
``MALLOC_MMAP_THRESHOLD_`` set in the environment, it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>


def tune_malloc() -> bool:
    """Fix glibc's mmap threshold at `MMAP_THRESHOLD`; True if it was set."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
